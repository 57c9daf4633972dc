"""The user API: `CSEstimator` and `CSRunConfig` (the run's configuration,
`launcher.run_config`), with the original's signatures.

    estimator = CSEstimator(model_fn, model_dir="model_dir", config=CSRunConfig(...), params=params)
    estimator.compile(train_input_fn, validate_only=True)
    estimator.train(train_input_fn, max_steps=1000)
    estimator.evaluate(eval_input_fn, steps=3)

A CS is in use when `config.cs_ip` is set or, when it is not, the script runs in a
`csrun_wse` job (the job's CS: `launcher.run_config.the_cs`); then train (and evaluate /
predict with `use_cs=True`) go to
`coordinator.dispatch.run`. Otherwise everything runs on the CPU with plain TensorFlow
(`tf_model.cpu_session`).

`recorded_compiles()` collects the compiles CSEstimator.compile runs meanwhile (what it
handed the compiler and what came out): cs_input_analyzer runs an unmodified user script
inside it.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from common import tf_startup
from common.errors import CSRunError, install_excepthook
from common.params_reads import ReadParams
from common.run_kinds import RunKind
from common.run_settings import RunSettings, WarmStart, check_steps
from coordinator import dispatch
from coordinator.compiler import CompileResult, compile_model
from launcher.params_spec import ORIGINAL_SPEC
from launcher.run_config import CSRunConfig, FullConfig, the_cs
from launcher.site_config import cs_tls_ca
from tf_model import checkpoints, cpu_session
from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

install_excepthook()  # a CSRunError escaping the user's script: one line, not a traceback
tf_startup.install()  # TensorFlow's start-up chatter off the terminal (the .pth did it already)

__all__ = ["CSEstimator", "CSEstimatorSpec", "CSRunConfig", "FullConfig", "ModeKeys", "cs_disable_summaries",
           "cs_enable_summaries"]


@contextlib.contextmanager
def cs_enable_summaries() -> Iterator[None]:
    """The original's switch (`modelzoo.common.tf.estimator.utils`) that has the CS compute
    model_fn's tf.summary ops; its run.py wraps the run in it, or in `cs_disable_summaries`
    under --multireplica. Here a CS run's summaries are the chief's either way (loss,
    global_step/sec, cs/samples_per_sec: `tf_model.events`), and the CPU path writes
    model_fn's own."""
    yield


cs_disable_summaries = cs_enable_summaries


@dataclass(frozen=True)
class CompileCall:
    """One CSEstimator.compile: what it handed the compiler and what the compiler returned."""

    input_fn: Callable
    params: dict
    mode: str
    result: CompileResult  # its program is None after validate_only


recorders: list[list[CompileCall]] = []  # one list per open recorded_compiles()


@contextlib.contextmanager
def recorded_compiles() -> Iterator[list[CompileCall]]:
    """The compiles every CSEstimator runs inside the block, in order."""
    calls: list[CompileCall] = []
    recorders.append(calls)
    try:
        yield calls
    finally:
        recorders.remove(calls)


class CSEstimator:
    """An Estimator-style front for model_fn on the CPU or the CS system."""

    def __init__(self, model_fn: Callable, model_dir: str | None = None,
                 compile_dir: str | None = None, config: CSRunConfig | None = None,
                 params: dict | None = None, warm_start_from: str | WarmStart | None = None):
        config = config or CSRunConfig()
        config = dataclasses.replace(config, cs_ip=the_cs(config.cs_ip))
        if config.cs_ip is not None and config.cs_tls_ca is None:
            config = dataclasses.replace(config, cs_tls_ca=cs_tls_ca())
        model_dir = model_dir if model_dir is not None else config.model_dir
        params = copy.deepcopy(params) if params is not None else {}
        if config.tf_random_seed is not None:  # model_graph and input workers read it here
            params.setdefault("runconfig", {})["tf_random_seed"] = config.tf_random_seed
        params = ReadParams(params, quiet=ORIGINAL_SPEC)  # notes keys model_fn and input_fn never read
        if model_dir is None:
            model_dir = tempfile.mkdtemp(prefix="csrun_model_")
            print(f"Using a temporary model_dir: {model_dir}", flush=True)
        self.model_fn = model_fn
        self.model_dir = str(model_dir)
        self.compile_dir = str(compile_dir) if compile_dir is not None else self.model_dir
        self.config = config
        self.params = params
        if isinstance(warm_start_from, str):
            warm_start_from = WarmStart(warm_start_from)
        self.warm_start_from = warm_start_from
        # what the CPU path, the dispatch and the chief read: built once, here
        self.settings = RunSettings(
            self.model_dir, params, config.save_summary_steps, config.save_checkpoints_steps,
            config.keep_checkpoint_max, config.step_log_steps, self.warm_start_from,
            compile_dir=self.compile_dir, cs_ip=config.cs_ip, cs_tls_ca=config.cs_tls_ca)

    def _on_cs(self, use_cs: bool) -> bool:
        return bool(use_cs and self.config.cs_ip)

    def compile(self, input_fn: Callable, validate_only: bool = False,
                mode: str = ModeKeys.TRAIN) -> CompileResult:
        """Validate (and unless validate_only, compile) the model for the CS system; prints
        the report and returns the compiler's result. Artifacts go to
        `compile_dir/cs_compile/` (compile_dir defaults to model_dir)."""
        result = compile_model(self.model_fn, input_fn, self.params, self.compile_dir,
                               mode=mode, validate_only=validate_only)
        for calls in recorders:
            calls.append(CompileCall(input_fn, self.params, mode, result))
        print(result.report_text, end="", flush=True)
        return result

    def train(self, input_fn: Callable, steps: int | None = None, max_steps: int | None = None,
              hooks: Sequence[Any] | None = None, use_cs: bool = True) -> "CSEstimator":
        """Train to `max_steps` (absolute) or `steps` more, from the newest checkpoint."""
        check_steps(steps, max_steps)
        if self._on_cs(use_cs):
            if hooks:
                raise CSRunError("hooks run on the CPU path only", "train without hooks on the CS")
            if self.warm_start_from is not None and checkpoints.latest_checkpoint(self.model_dir) is None:
                raise CSRunError(f"starting a training run from {self.warm_start_from.checkpoint} (warm start, "
                                 "checkpoint_path) runs on the CPU path only for now",
                                 "train a first step on the CPU (python run.py --steps 1), then "
                                 "continue on the CS from that model_dir")
            dispatch.run(self.model_fn, self.settings, RunKind.TRAIN, input_fn, steps=steps, max_steps=max_steps)
        else:
            cpu_session.train(self.model_fn, input_fn, self.settings, steps=steps,
                              max_steps=max_steps, hooks=list(hooks or ()))
        return self

    def evaluate(self, input_fn: Callable, steps: int | None = None,
                 checkpoint_path: str | None = None, use_cs: bool = False) -> dict | None:
        """The metrics of a checkpoint (the newest by default) over `steps` batches."""
        if self._on_cs(use_cs):
            return dispatch.run(self.model_fn, self.settings, RunKind.EVALUATE, input_fn, steps=steps,
                                checkpoint_path=checkpoint_path)
        return cpu_session.evaluate(self.model_fn, input_fn, self.settings, steps=steps,
                                    checkpoint_path=checkpoint_path)

    def predict(self, input_fn: Callable, predict_keys: Sequence[str] | None = None,
                checkpoint_path: str | None = None, yield_single_examples: bool = True,
                num_samples: int | None = None, use_cs: bool = False) -> Iterator[Any]:
        """Predictions of a checkpoint (the newest by default) for the whole input (or
        `num_samples`), computed now and written to `model_dir/predict/`; the iterator yields
        what tf.estimator.Estimator.predict yields: a dict per sample (only `predict_keys`
        when given), or an array per sample when model_fn's predictions are one tensor; a
        batch at a time with `yield_single_examples=False`. An input worker's is empty."""
        if self._on_cs(use_cs):
            predictions = dispatch.run(self.model_fn, self.settings, RunKind.PREDICT, input_fn,
                                       checkpoint_path=checkpoint_path, num_samples=num_samples)
            if predictions is None:  # an input worker: it streamed its shard
                return iter(())
        else:
            predictions = cpu_session.predict(self.model_fn, input_fn, self.settings,
                                              checkpoint_path=checkpoint_path, num_samples=num_samples)
        return predictions.iterate(predict_keys, yield_single_examples)
