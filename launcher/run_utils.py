"""What an example's run.py needs around the estimator: params, flags, checks (the original's
`run_utils`). The mode flow itself lives in `launcher.run_flow`.

Params are YAML with a `runconfig` section; its keys are checked (an unknown key or a wrong
type names the key and the file) and missing ones get defaults. A command-line flag
overrides the YAML when it is given. This module is the one reader of run.py's flags and
params: `csrun_wse` reads a job's fabric through it too.

The CS system a run uses (`runconfig.cs_ip`): the `--cs_ip` flag, else the CS of the job
the task runs in (`csrun_wse` names it), else the YAML's (`coordinator.roles.run_cs_ip`);
none: the run stays on the CPU. A script written against the original's helpers
(`update_params_from_args(args, params["runconfig"])`, then `is_cs(runconfig)`) gets it so.
"""
from __future__ import annotations

import argparse
import os
from typing import Any

import yaml

from common import tf_startup
from common.errors import ArgumentParser, CSRunError, install_excepthook
from coordinator.replicas import requested_replicas
from coordinator.roles import run_cs_ip, task_role
from launcher.params_spec import Key, check_original_keys, check_section, refuse_misspelling
from wafer.fabric import DEFAULT_FABRIC

install_excepthook()  # a CSRunError escaping the user's script: one line, not a traceback
tf_startup.install()  # TensorFlow's start-up chatter off the terminal (the .pth did it already)

MODES = ("train", "eval", "eval_all", "train_and_eval", "predict")
# train_and_eval's sequence of train and evaluate calls starts at the newest checkpoint each
# task finds: on the CS, an input worker starting after the chief's first checkpoint would
# call another sequence than the chief's (every task runs the script; calls are matched by number).
CPU_ONLY_MODES = ("train_and_eval",)
_STEPS = Key("int", minimum=0, required=False)
_FLAG = Key("bool", required=False)
_TEXT = Key("str", required=False)
# Every runconfig key: csrun's and the original's. A key with a `note` is accepted although it
# means nothing here; a run prints its note when it is set.
RUNCONFIG_SPEC: dict[str, Key] = {
    "mode": Key("str", choices=MODES, required=False), "model_dir": _TEXT, "cs_ip": _TEXT,
    "fabric": _TEXT, "tf_random_seed": _STEPS, "max_steps": _STEPS, "steps": _STEPS,
    "eval_steps": _STEPS, "save_summary_steps": _STEPS, "save_checkpoints_steps": _STEPS,
    "keep_checkpoint_max": _STEPS, "log_step_count_steps": _STEPS,
    "validate_only": _FLAG, "compile_only": _FLAG,
    "checkpoint_path": _TEXT,  # eval / predict read it; a training run without a checkpoint starts from it
    "throttle_secs": Key("number", minimum=0, required=False),  # train_and_eval: seconds between evaluations
    "disable_standard_logs": _FLAG,  # no `global step N: loss = …` lines
    # data-parallel copies on the wafer (coordinator.replicas reads them; checked there)
    "multireplica": Key("any", required=False), "num_replicas": Key("any", required=False),
    "device": Key("str", required=False, note=(
        "the original's device for the CPU/GPU path; csrun's CPU path runs on this host's CPU")),
    "enable_distributed": Key("bool", required=False, note=(
        "the original's multi-GPU tf.distribute strategy; csrun's CPU path trains in one process: not used")),
    "multiple_workers": Key("bool", required=False, note=(
        "the original's multi-worker GPU strategy; csrun's CPU path trains in one process: not used")),
    "enable_gpu_optimizations": Key("bool", required=False, note=(
        "GPU-specific layers in the original's models; csrun has no GPU path: not used")),
    "num_wgt_servers": Key("int", minimum=1, required=False, note=(
        "weight streaming's weight servers; csrun's CS runs layer-pipelined, every weight "
        "resident on the wafer: not used")),
    "disable_input_pipeline_ckpt": Key("bool", required=False, note=(
        "a resumed run here continues input_fn's batches from the checkpoint's step, on the CS "
        "and the CPU alike: not used")),
}
RUNCONFIG_DEFAULTS: dict[str, Any] = {
    **{key: None for key in RUNCONFIG_SPEC}, "mode": "train", "fabric": DEFAULT_FABRIC,
    "save_summary_steps": 100, "keep_checkpoint_max": 5, "log_step_count_steps": 100,
    "validate_only": False, "compile_only": False, "multireplica": False,
    "disable_standard_logs": False,
}
PARAMS_FILE = "params.yaml"


def normalize_cs_ip(cs_ip: str) -> str:
    """HOST[:PORT] → HOST:PORT (default port 9000)."""
    host, _, port = cs_ip.rpartition(":") if ":" in cs_ip else (cs_ip, "", "9000")
    if not host or not port.isdigit():
        raise CSRunError(f"--cs_ip {cs_ip!r} is not HOST:PORT", "e.g. --cs_ip 10.0.0.5:9000")
    if not 1 <= int(port) <= 65535:
        raise CSRunError(f"--cs_ip {cs_ip!r}: port {port} is not between 1 and 65535",
                         "e.g. --cs_ip 10.0.0.5:9000")
    return f"{host}:{port}"


def _check_runconfig(runconfig: dict, path: str) -> None:
    for key in runconfig:
        if key not in RUNCONFIG_SPEC:
            refuse_misspelling("runconfig", key, RUNCONFIG_SPEC, path)
            raise CSRunError(f"unknown runconfig key {key!r} in {path}",
                             f"known keys: {', '.join(sorted(RUNCONFIG_SPEC))}")
    check_section(runconfig, RUNCONFIG_SPEC, "runconfig", path)
    requested_replicas(runconfig, path)


def _runconfig_notes(runconfig: dict) -> list[str]:
    notes = []
    for key, spec in RUNCONFIG_SPEC.items():
        value = runconfig.get(key)
        if not spec.note or value in (None, False) or (key == "device" and "cpu" in str(value).lower()):
            continue
        notes.append(f"runconfig.{key} = {value}: {spec.note}")
    return notes


def _say_notes(notes: list[str]) -> None:
    for note in notes:
        print(f"note: {note}", flush=True)


def get_params(path: str, notes: bool = True) -> dict:
    """The params of the YAML file at `path`, with a checked, completed `runconfig` and the
    original's keys checked (`launcher.params_spec.ORIGINAL_SPEC`); prints a note for each key
    set that means nothing here (runconfig's: `update_params_from_args`), unless `notes` is false."""
    try:
        with open(path) as f:
            params = yaml.safe_load(f)
    except FileNotFoundError:
        raise CSRunError(f"params file {path} not found",
                         "give an existing YAML file with -p/--params") from None
    except OSError as error:
        raise CSRunError(f"cannot read params file {path}: {error.strerror}") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise CSRunError(f"params file {path} is not valid YAML{where}: {problem}",
                         "fix the YAML syntax (indentation, colons, quotes)") from None
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise CSRunError(f"params file {path} holds a {type(params).__name__}, not a mapping",
                         "write sections like train_input:, model:, runconfig:")
    runconfig = params.get("runconfig") or {}
    if not isinstance(runconfig, dict):
        raise CSRunError(f"runconfig in {path} is not a mapping", "write runconfig: with keys below it")
    _check_runconfig(runconfig, path)
    found = check_original_keys(params, path)
    if notes:
        _say_notes(found)
    params["runconfig"] = {**RUNCONFIG_DEFAULTS, **runconfig}
    return params


def create_arg_parser(default_model_dir: str) -> argparse.ArgumentParser:
    """The original run.py flags. `default_model_dir` is `<the script's folder>/model_dir`;
    the default params file is `configs/params.yaml` beside it. Flags left out stay None, so
    the YAML decides."""
    p = ArgumentParser(description="Train, evaluate, predict, validate or compile a model.")
    p.add_argument("-p", "--params", default=os.path.join(os.path.dirname(default_model_dir), "configs", PARAMS_FILE),
                   help="the params YAML file (default: configs/params.yaml beside run.py)")
    p.add_argument("-o", "--model_dir",
                   help=f"checkpoints, summaries and compiles go here (default: {default_model_dir})")
    p.add_argument("--cs_ip", help="HOST[:PORT] of the CS system (port 9000 if left out)")
    p.add_argument("--steps", type=int, help="train this many more steps")
    p.add_argument("--max_steps", type=int, help="train up to this global step")
    p.add_argument("--eval_steps", type=int, help="evaluate this many batches")
    p.add_argument("-m", "--mode", choices=MODES, help="what to run (default: runconfig.mode)")
    p.add_argument("--validate_only", action="store_true", help="check the model maps onto the CS")
    p.add_argument("--compile_only", action="store_true", help="compile for the CS, do not run")
    p.add_argument("--checkpoint_path",
                   help="the checkpoint eval / predict read, and a new training run starts from")
    p.add_argument("--multireplica", action="store_true",
                   help="train several copies of the model data-parallel on the wafer")
    p.add_argument("--device", help="the original's device for the CPU/GPU path (the CPU here)")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.set_defaults(default_model_dir=default_model_dir)
    return p


def update_params_from_args(args: argparse.Namespace, runconfig: dict) -> None:
    """Flags given on the command line override `runconfig` (in place); `--steps` replaces
    the YAML's `max_steps` and the other way round; `cs_ip` is the run's CS
    (`coordinator.roles.run_cs_ip`: the flag, the job's, the YAML's), with port 9000 if it has
    none. Prints a note for each runconfig key set that means nothing here."""
    for key in ("model_dir", "steps", "max_steps", "eval_steps", "mode", "checkpoint_path", "device"):
        value = getattr(args, key, None)
        if value is not None:
            if key in ("steps", "max_steps") and value < 0:
                raise CSRunError(f"--{key} {value}: must be >= 0")
            runconfig[key] = value
    if getattr(args, "steps", None) is not None and getattr(args, "max_steps", None) is None:
        runconfig["max_steps"] = None
    elif getattr(args, "max_steps", None) is not None and getattr(args, "steps", None) is None:
        runconfig["steps"] = None
    for flag in ("validate_only", "compile_only", "multireplica"):
        if getattr(args, flag, False):
            runconfig[flag] = True
    if not runconfig.get("model_dir"):
        runconfig["model_dir"] = getattr(args, "default_model_dir", None) or "model_dir"
    cs_ip = run_cs_ip(getattr(args, "cs_ip", None), runconfig.get("cs_ip"))
    runconfig["cs_ip"] = normalize_cs_ip(cs_ip) if cs_ip else None
    _say_notes(_runconfig_notes(runconfig))


def get_csrunconfig_dict(runconfig: dict) -> dict[str, Any]:
    """The `CSRunConfig` settings of `runconfig` (the original's helper): how often a run
    logs, summarizes and checkpoints, and its seed; `disable_standard_logs` turns the step
    lines off."""
    keys = ("tf_random_seed", "save_summary_steps", "save_checkpoints_steps", "keep_checkpoint_max",
            "log_step_count_steps")
    settings = {key: runconfig[key] for key in keys if key in runconfig}
    if runconfig.get("disable_standard_logs"):
        settings["log_step_count_steps"] = None
    return settings


def is_cs(runconfig: dict) -> bool:
    """Does this run use a CS system (`runconfig.cs_ip`, or the job's CS inside a csrun_wse task)?"""
    return bool(run_cs_ip(configured=runconfig.get("cs_ip")))


def check_env(runconfig: dict) -> None:
    """Combinations of settings that cannot run, as one-line errors."""
    if runconfig.get("validate_only") and runconfig.get("compile_only"):
        raise CSRunError("--validate_only and --compile_only both given",
                         "validate_only checks the model, compile_only compiles it: pick one")
    mode = runconfig.get("mode")
    if is_cs(runconfig) and mode in CPU_ONLY_MODES:
        raise CSRunError(f"mode {mode} runs on the CPU only, not on the CS system",
                         "drop --cs_ip, or use --mode train then --mode eval")


def save_params(params: dict, model_dir: str) -> str:
    """Write `params` to `model_dir/params.yaml` (atomically); returns the path. In a
    csrun_wse job only the chief writes it (one writer per model_dir: the chief's lock
    clears other writers' temporary files); input workers, whose params are the same, write
    nothing."""
    path = os.path.join(model_dir, PARAMS_FILE)
    if not task_role().is_chief:
        return path
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        os.makedirs(model_dir, exist_ok=True)
        with open(tmp, "w") as f:
            yaml.safe_dump(params, f, sort_keys=False)
        os.replace(tmp, path)
    except OSError as error:
        raise CSRunError(f"cannot write to model_dir {model_dir}: {error.strerror}",
                         "choose a writable directory with -o/--model_dir") from None
    return path
