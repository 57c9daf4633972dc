"""What an example's run.py needs around the estimator: params, flags, checks (the original's
`run_utils`). The mode flow itself lives in `launcher.run_flow`.

Params are YAML with a `runconfig` section; its keys are checked (an unknown key or a wrong
type names the key and the file) and missing ones get defaults. A command-line flag
overrides the YAML when it is given. This module is the one reader of run.py's flags and
params: `csrun_wse` reads a job's fabric through it too.

The CS system a run uses (`runconfig.cs_ip`): the `--cs_ip` flag, else the CS of the job
the task runs in (`coordinator.roles.TaskRole.cs_ip`, which `csrun_wse` sets), else the
YAML's; none: the run stays on the CPU.
"""
from __future__ import annotations

import argparse
import os
from typing import Any

import yaml

from common import tf_startup
from common.errors import ArgumentParser, CSRunError, install_excepthook
from coordinator.replicas import requested_replicas
from wafer.fabric import DEFAULT_FABRIC

install_excepthook()  # a CSRunError escaping the user's script: one line, not a traceback
tf_startup.install()  # TensorFlow's start-up chatter off the terminal (the .pth did it already)

MODES = ("train", "eval", "eval_all", "train_and_eval", "predict")
CPU_ONLY_MODES = ("eval_all", "train_and_eval")
_STEP_KEYS = ("max_steps", "steps", "eval_steps", "save_summary_steps", "save_checkpoints_steps",
              "keep_checkpoint_max", "log_step_count_steps")
RUNCONFIG_DEFAULTS: dict[str, Any] = {
    "mode": "train", "model_dir": None, "cs_ip": None, "fabric": DEFAULT_FABRIC, "tf_random_seed": None,
    "max_steps": None, "steps": None, "eval_steps": None, "save_summary_steps": 100,
    "save_checkpoints_steps": None, "keep_checkpoint_max": 5, "log_step_count_steps": 100,
    "validate_only": False, "compile_only": False,
    "multireplica": False, "num_replicas": None,  # coordinator.compiler.replicas reads them
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
    unknown = sorted(set(runconfig) - set(RUNCONFIG_DEFAULTS))
    if unknown:
        raise CSRunError(f"unknown runconfig key {unknown[0]!r} in {path}",
                         f"known keys: {', '.join(sorted(RUNCONFIG_DEFAULTS))}")
    for key, value in runconfig.items():
        if value is None:
            continue
        if key in _STEP_KEYS + ("tf_random_seed",):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise CSRunError(f"runconfig.{key} in {path} is {value!r}, not a whole number >= 0",
                                 f"set {key} to a number like 100")
        elif key in ("multireplica", "num_replicas"):
            requested_replicas(runconfig, path)
        elif key in ("validate_only", "compile_only"):
            if not isinstance(value, bool):
                raise CSRunError(f"runconfig.{key} in {path} is {value!r}, not true or false")
        elif key == "mode":
            if value not in MODES:
                raise CSRunError(f"runconfig.mode in {path} is {value!r}",
                                 f"use one of {', '.join(MODES)}")
        elif not isinstance(value, str):
            raise CSRunError(f"runconfig.{key} in {path} is {value!r}, not a string")


def params_path(params_flag: str | None, here: str) -> str:
    """The params file a run reads: `-p/--params`, else `<here>/configs/params.yaml`
    (`here`: the example's folder)."""
    return params_flag or os.path.join(here, "configs", "params.yaml")


def get_params(path: str) -> dict:
    """The params of the YAML file at `path`, with a checked, completed `runconfig`."""
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
    params["runconfig"] = {**RUNCONFIG_DEFAULTS, **runconfig}
    return params


def create_arg_parser(default_model_dir: str) -> argparse.ArgumentParser:
    """The original run.py flags. Flags left out stay None, so the YAML decides."""
    p = ArgumentParser(description="Train, evaluate, predict, validate or compile a model.")
    p.add_argument("-p", "--params", help="the params YAML file (default: configs/params.yaml)")
    p.add_argument("-o", "--model_dir",
                   help=f"checkpoints, summaries and compiles go here (default: {default_model_dir})")
    p.add_argument("--cs_ip", help="HOST[:PORT] of the CS system (port 9000 if left out)")
    p.add_argument("--steps", type=int, help="train this many more steps")
    p.add_argument("--max_steps", type=int, help="train up to this global step")
    p.add_argument("--eval_steps", type=int, help="evaluate this many batches")
    p.add_argument("-m", "--mode", choices=MODES, help="what to run (default: runconfig.mode)")
    p.add_argument("--validate_only", action="store_true", help="check the model maps onto the CS")
    p.add_argument("--compile_only", action="store_true", help="compile for the CS, do not run")
    p.add_argument("--multireplica", action="store_true",
                   help="train several copies of the model data-parallel on the wafer")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.set_defaults(default_model_dir=default_model_dir)
    return p


def update_params_from_args(args: argparse.Namespace, runconfig: dict, job_cs_ip: str | None = None) -> None:
    """Flags given on the command line override `runconfig` (in place); `--steps` replaces
    the YAML's `max_steps` and the other way round; the job's CS (`job_cs_ip`) overrides
    the YAML's `cs_ip` as `--cs_ip` does (the flag wins); `cs_ip` gets port 9000 if it has none."""
    for key in ("model_dir", "cs_ip", "steps", "max_steps", "eval_steps", "mode"):
        value = getattr(args, key, None)
        if key == "cs_ip" and value is None:
            value = job_cs_ip
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
    if runconfig.get("cs_ip"):
        runconfig["cs_ip"] = normalize_cs_ip(runconfig["cs_ip"])


def is_cs(runconfig: dict) -> bool:
    """Does this run use a CS system?"""
    return bool(runconfig.get("cs_ip"))


def check_env(runconfig: dict) -> None:
    """Combinations of settings that cannot run, as one-line errors."""
    if runconfig.get("validate_only") and runconfig.get("compile_only"):
        raise CSRunError("--validate_only and --compile_only both given",
                         "validate_only checks the model, compile_only compiles it: pick one")
    mode = runconfig.get("mode")
    if is_cs(runconfig) and mode in CPU_ONLY_MODES:
        raise CSRunError(f"mode {mode} runs on the CPU only, not on the CS system",
                         "drop --cs_ip, or use --mode train / eval")
    if is_cs(runconfig) and mode == "eval" and not runconfig.get("eval_steps"):
        raise CSRunError("eval on the CS system needs eval_steps",
                         "give --eval_steps N (the CS streams a fixed number of batches)")


def save_params(params: dict, model_dir: str) -> str:
    """Write `params` to `model_dir/params.yaml` (atomically); returns the path."""
    path = os.path.join(model_dir, PARAMS_FILE)
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
