"""A run's settings, built once by the user API (`launcher.estimator.CSEstimator`, from its
arguments and `CSRunConfig`) and read by the CPU path (`tf_model.cpu_session`), the CS
dispatch and the chief (`coordinator.dispatch`, `coordinator.chief`); and the rules on
numbers of steps every run follows."""
from __future__ import annotations

from dataclasses import dataclass

from common.errors import CSRunError
from common.param_keys import STEPS


@dataclass(frozen=True)
class WarmStart:
    """A training run's first weights when its model_dir has no checkpoint: the trainable
    variables of `checkpoint` (a model.ckpt-N prefix, or a model_dir: its newest) whose names
    `variables` matches (a regular expression matched at the name's start, as
    tf.estimator.WarmStartSettings' vars_to_warm_start)."""

    checkpoint: str
    variables: str = ".*"


@dataclass(frozen=True)
class RunSettings:
    """Where a run reads and writes, how often it logs, summarizes and checkpoints (in
    steps; None: never, or only at the end), and the user's params."""

    model_dir: str
    params: dict
    save_summary_steps: int | None
    save_checkpoints_steps: int | None
    keep_checkpoint_max: int | None  # None or 0: keep all
    log_step_count_steps: int | None
    warm_start_from: WarmStart | None = None
    compile_dir: str = ""  # where compiles go; "": model_dir
    cs_ip: str | None = None  # the CS in use; None: the CPU
    cs_tls_ca: str | None = None  # the CA file the CS's TLS is verified with

    def __post_init__(self) -> None:
        if not self.compile_dir:
            object.__setattr__(self, "compile_dir", self.model_dir)


def check_steps(steps: int | None, max_steps: int | None) -> None:
    """A training run's length as train() takes it: `steps` more or `max_steps` (absolute),
    one of them, a whole number."""
    if steps is not None and max_steps is not None:
        raise CSRunError("train got both steps and max_steps", "give one of them")
    for name, value in (("steps", steps), ("max_steps", max_steps)):
        if value is not None and not STEPS.accepts(value):
            raise CSRunError(f"{name}={value!r} is not {STEPS.describe()}")
    if steps is None and max_steps is None:
        raise CSRunError("training needs a number of steps", "give steps or max_steps "
                         "(--steps, --max_steps or runconfig.max_steps)")


def end_step(step: int, steps: int | None, max_steps: int | None) -> int:
    """The global step a training run from `step` ends at: `max_steps`, else `steps` more."""
    if max_steps is not None:
        return max_steps
    assert steps is not None, "check_steps refuses a run without steps or max_steps"
    return step + steps
