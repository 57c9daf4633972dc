"""A run's configuration, one typed record: `CSRunConfig` holds every `runconfig` key
(params.yaml's section, run.py's flags over it, the job's CS); `run_config` builds it and is
the one place that checks and normalises it. The user API takes it as the original's
`CSRunConfig(cs_ip=…, save_checkpoints_steps=…)`; `launcher.run_utils`' original helpers
keep their dict behaviour on top of it.

Adding a runconfig key is one line: a field with its default and its `Key` (kind, range, and
the note a run prints when a key that means nothing here is set).

The CS system a run uses (`the_cs`): the one given for the run (run.py's `--cs_ip`,
`CSRunConfig.cs_ip`), else the CS of the `csrun_wse` job the task runs in, else the YAML's
(`coordinator.roles.run_cs_ip`), as HOST:PORT (port 9000 if left out); none: the CPU.
"""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import InitVar, dataclass, field
from typing import Any, Mapping

from common.errors import CSRunError
from common.param_keys import STEPS, Key
from coordinator.replicas import requested_replicas
from coordinator.roles import run_cs_ip, task_role
from launcher.params_spec import check_section, refuse_misspelling
from wafer.fabric import DEFAULT_FABRIC

MODES = ("train", "eval", "eval_all", "train_and_eval", "predict")
# train_and_eval's sequence of train and evaluate calls starts at the newest checkpoint each
# task finds: on the CS, an input worker starting after the chief's first checkpoint would
# call another sequence than the chief's (every task runs the script; calls are matched by number).
CPU_ONLY_MODES = ("train_and_eval",)
_FLAG = Key("bool", required=False)
_TEXT = Key("str", required=False)
_CHECKED_BY_REPLICAS = Key("any", required=False)  # coordinator.replicas checks it
_ONE_PROCESS = "csrun's CPU path trains in one process: not used"
# run.py's switches (store_true flags: False when left out, so only True overrides the YAML)
_SWITCH_FLAGS = ("validate_only", "compile_only", "multireplica")


def _key(key: Key, default: Any = None) -> Any:
    """A field of the run configuration: its default, and the `Key` its values are checked against."""
    return field(default=default, metadata={"key": key})


@dataclass(frozen=True)
class CSRunConfig:
    """Every runconfig key: what to run, where the CS is, how often a run logs, summarizes
    and checkpoints (in steps; None: never, or only at the end)."""

    mode: str = _key(Key("str", choices=MODES, required=False), "train")
    model_dir: str | None = _key(_TEXT)
    cs_ip: str | None = _key(_TEXT)
    cs_tls_ca: str | None = _key(_TEXT)  # CA file the CS's TLS is verified with (default: csrun.yaml's cs.tls_ca)
    fabric: str = _key(_TEXT, DEFAULT_FABRIC)
    tf_random_seed: int | None = _key(STEPS)
    max_steps: int | None = _key(STEPS)
    steps: int | None = _key(STEPS)
    eval_steps: int | None = _key(STEPS)
    save_summary_steps: int | None = _key(STEPS, 100)
    save_checkpoints_steps: int | None = _key(STEPS)  # None: only at the end of a run
    keep_checkpoint_max: int | None = _key(STEPS, 5)  # None or 0: keep all
    log_step_count_steps: int | None = _key(STEPS, 100)
    validate_only: bool = _key(_FLAG, False)
    compile_only: bool = _key(_FLAG, False)
    checkpoint_path: str | None = _key(_TEXT)  # eval / predict read it; a training run without a checkpoint starts from it
    predict_steps: int | None = _key(STEPS)  # the modelzoo BERT's run.py: predict's num_samples
    throttle_secs: float | None = _key(Key("number", minimum=0, required=False))  # train_and_eval: seconds between evaluations
    disable_standard_logs: bool = _key(_FLAG, False)  # no `global step N: loss = …` lines
    # data-parallel copies on the wafer
    multireplica: bool = _key(_CHECKED_BY_REPLICAS, False)
    num_replicas: int | None = _key(_CHECKED_BY_REPLICAS)
    # the original's keys that mean nothing here: a run prints the note when one is set
    device: str | None = _key(Key("str", required=False, note=(
        "the original's device for the CPU/GPU path; csrun's CPU path runs on this host's CPU")))
    enable_distributed: bool | None = _key(Key("bool", required=False, note=(
        "the original's multi-GPU tf.distribute strategy; " + _ONE_PROCESS)))
    multiple_workers: bool | None = _key(Key("bool", required=False, note=(
        "the original's multi-worker GPU strategy; " + _ONE_PROCESS)))
    enable_gpu_optimizations: bool | None = _key(Key("bool", required=False, note=(
        "GPU-specific layers in the original's models; csrun has no GPU path: not used")))
    num_wgt_servers: int | None = _key(Key("int", minimum=1, required=False, note=(
        "weight streaming's weight servers; csrun's CS runs layer-pipelined, every weight "
        "resident on the wafer: not used")))
    disable_input_pipeline_ckpt: bool | None = _key(Key("bool", required=False, note=(
        "a resumed run here continues input_fn's batches from the checkpoint's step, on the CS "
        "and the CPU alike: not used")))
    # the original's CSRunConfig(cs_ip, system_name, cs_config, stack_params, **kwargs): the
    # Cerebras stack's settings, which a modelzoo run.py passes; csrun's compiler takes the
    # replicas from multireplica / num_replicas and the CS from cs_ip (not runconfig keys)
    system_name: InitVar[Any] = None
    cs_config: InitVar[Any] = None
    stack_params: InitVar[Any] = None

    def __post_init__(self, system_name: Any, cs_config: Any, stack_params: Any) -> None:
        for name, key in RUNCONFIG_SPEC.items():
            value = getattr(self, name)
            if value is not None and not key.accepts(value):
                raise CSRunError(f"CSRunConfig {name}={value!r} is not {key.describe()}",
                                 f"set {name} to {key.describe()}")
        requested_replicas(self.as_dict())
        _check_stack_replicas(stack_params, self.replicas)

    @property
    def step_log_steps(self) -> int | None:
        """How often a run prints its `global step N: loss = …` line (None: never)."""
        return None if self.disable_standard_logs else self.log_step_count_steps

    @property
    def task_id(self) -> int:
        """This task's rank in its job (RunConfig's task_id: the chief is 0)."""
        return task_role().rank

    @property
    def replicas(self) -> int | None:
        """The copies of the network asked for: 1, a number, or None (as many as fit)."""
        return requested_replicas(self.as_dict())

    def as_dict(self) -> dict[str, Any]:
        """The runconfig section as the original's scripts read it."""
        return dataclasses.asdict(self)

    def notes(self) -> list[str]:
        """One line for each key set that means nothing here."""
        notes = []
        for name, key in RUNCONFIG_SPEC.items():
            value = getattr(self, name)
            if not key.note or value in (None, False) or (name == "device" and "cpu" in str(value).lower()):
                continue
            notes.append(f"runconfig.{name} = {value}: {key.note}")
        return notes


class FullConfig:
    """The original's Cerebras stack configuration (`cerebras.pb.stack.full_pb2.FullConfig`),
    which a modelzoo utils.py's `get_custom_stack_params` fills in for
    `CSRunConfig(stack_params={"config": …})`. Its `target_num_replicas` (0: one copy, -1: as
    many as fit, N) must ask for the replicas runconfig asks for (`multireplica`,
    `num_replicas`: what the compiler reads); its other settings tune the Cerebras compiler's
    placement and matching, which csrun's compiler does not have: each is refused in one line."""

    target_num_replicas: int = 0

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise CSRunError(f"FullConfig.{name} is a setting of the Cerebras stack's compiler, which csrun's "
                         "compiler does not have",
                         "leave it out of get_custom_stack_params (replicas: runconfig.multireplica)")


def _check_stack_replicas(stack_params: Any, replicas: int | None) -> None:
    """A `stack_params` FullConfig's replicas are the run's (`replicas`: 1, N or None: as many as fit)."""
    config = (stack_params or {}).get("config")
    if not isinstance(config, FullConfig):
        return
    target = config.target_num_replicas
    asked = {0: 1, -1: None}.get(target, target)
    if asked != replicas:
        described = {1: "one copy", None: "as many as fit"}
        raise CSRunError(f"stack_params' FullConfig.target_num_replicas = {target} asks for "
                         f"{described.get(asked, asked)}, runconfig for {described.get(replicas, replicas)}",
                         "ask once, in runconfig: multireplica (--multireplica) or num_replicas")


RUNCONFIG_SPEC: dict[str, Key] = {f.name: f.metadata["key"] for f in dataclasses.fields(CSRunConfig)}
_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(CSRunConfig)}


def normalize_cs_ip(cs_ip: str) -> str:
    """HOST[:PORT] → HOST:PORT (default port 9000)."""
    host, _, port = cs_ip.rpartition(":") if ":" in cs_ip else (cs_ip, "", "9000")
    if not host or not port.isdigit():
        raise CSRunError(f"--cs_ip {cs_ip!r} is not HOST:PORT", "e.g. --cs_ip 10.0.0.5:9000")
    if not 1 <= int(port) <= 65535:
        raise CSRunError(f"--cs_ip {cs_ip!r}: port {port} is not between 1 and 65535",
                         "e.g. --cs_ip 10.0.0.5:9000")
    return f"{host}:{port}"


def the_cs(given: str | None = None, configured: str | None = None) -> str | None:
    """The CS system a run uses, as HOST:PORT (`coordinator.roles.run_cs_ip`'s order); None: the CPU."""
    cs_ip = run_cs_ip(given, configured)
    return normalize_cs_ip(cs_ip) if cs_ip else None


def run_config(runconfig: Mapping[str, Any] | CSRunConfig, where: str = "the params",
               args: argparse.Namespace | None = None) -> CSRunConfig:
    """The run's configuration: `runconfig` (params.yaml's section, read from `where`) checked
    (an unknown key or a wrong type is one line naming the key and `where`), run.py's flags
    `args` over it (`--steps` replaces the YAML's `max_steps` and the other way round; the
    model_dir defaults to the script's), and the run's CS (`the_cs`)."""
    if isinstance(runconfig, CSRunConfig):
        runconfig = runconfig.as_dict()
    for name in runconfig:
        if name not in RUNCONFIG_SPEC:
            refuse_misspelling("runconfig", name, RUNCONFIG_SPEC, where)
            raise CSRunError(f"unknown runconfig key {name!r} in {where}",
                             f"known keys: {', '.join(sorted(RUNCONFIG_SPEC))}")
    check_section(runconfig, RUNCONFIG_SPEC, "runconfig", where)
    requested_replicas(runconfig, where)
    # a key left empty takes its default where None means nothing (a switch, the mode, the fabric)
    values = {name: value for name, value in runconfig.items()
              if value is not None or not isinstance(_DEFAULTS[name], (bool, str))}
    if args is not None:
        values.update(_flags(args, values))
    return CSRunConfig(**{**values, "cs_ip": the_cs(getattr(args, "cs_ip", None), values.get("cs_ip"))})


def _flags(args: argparse.Namespace, values: Mapping[str, Any]) -> dict[str, Any]:
    """The settings run.py's flags give: every flag named for a runconfig key, as the
    original's `update_params_from_args` takes them (a modelzoo run.py may add its own, e.g.
    the GPT-2's --save_checkpoints_steps); flags left out (None) give none. The CS is not
    among them (`the_cs`)."""
    given = {name: value for name, value in vars(args).items()
             if name in RUNCONFIG_SPEC and name != "cs_ip" and name not in _SWITCH_FLAGS and value is not None}
    for name, value in given.items():
        if not RUNCONFIG_SPEC[name].accepts(value):
            raise CSRunError(f"--{name} {value} is not {RUNCONFIG_SPEC[name].describe()}")
    if "steps" in given and "max_steps" not in given:
        given["max_steps"] = None
    elif "max_steps" in given and "steps" not in given:
        given["steps"] = None
    given.update({name: True for name in _SWITCH_FLAGS if getattr(args, name, False)})
    if not (given.get("model_dir") or values.get("model_dir")):
        given["model_dir"] = getattr(args, "default_model_dir", None) or "model_dir"
    return given
