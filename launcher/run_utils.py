"""What an example's run.py needs around the estimator: params, flags, checks (the original's
`run_utils`). The mode flow itself lives in `launcher.run_flow`.

Params are YAML with a `runconfig` section; its keys are checked (an unknown key or a wrong
type names the key and the file) and missing ones get defaults. A command-line flag
overrides the YAML when it is given. This module reads run.py's params file and parses its
flags (`csrun_wse` reads a job's fabric through it too).

The run's configuration is one typed record (`launcher.run_config.CSRunConfig`, built by
`run_config`); the original's helpers read and write `params["runconfig"]` as a dict on top
of it, for scripts written against them (`update_params_from_args(args, params["runconfig"])`,
then `is_cs(runconfig)`); the run's CS comes with it (`launcher.run_config.the_cs`).
"""
from __future__ import annotations

import argparse
import os
import re
from typing import Any, Iterable

import numpy as np
import yaml

from common import tf_startup
from common.errors import ArgumentParser, CSRunError, install_excepthook
from common.run_settings import WarmStart
from coordinator.roles import task_role
from launcher.params_spec import check_original_keys
from launcher.run_config import CPU_ONLY_MODES, MODES, RUNCONFIG_SPEC, CSRunConfig, run_config

install_excepthook()  # a CSRunError escaping the user's script: one line, not a traceback
tf_startup.install()  # TensorFlow's start-up chatter off the terminal (the .pth did it already)

PARAMS_FILE = "params.yaml"
PREDICTIONS_FILE = "outputs.npz"
PREDICT_DIR = "predict"  # tf_model.predictions' (not imported: csrun_wse reads this module without TensorFlow)


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
    config = run_config(runconfig, path)
    found = check_original_keys(params, path)
    if notes:
        _say_notes(found)
    params["runconfig"] = config.as_dict()
    return params


def read_run_config(path: str, args: argparse.Namespace | None = None) -> CSRunConfig:
    """The run configuration of the params file at `path` with run.py's flags `args` over it
    (no notes printed)."""
    return run_config(get_params(path, notes=False)["runconfig"], path, args)


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
    (`launcher.run_config.the_cs`: the flag, the job's, the YAML's). Prints a note for each
    runconfig key set that means nothing here."""
    apply_args(args, runconfig)


def apply_args(args: argparse.Namespace, runconfig: dict) -> CSRunConfig:
    """`update_params_from_args`, returning the run's configuration."""
    config = run_config(runconfig, args=args)
    runconfig.update(config.as_dict())
    _say_notes(config.notes())
    return config


def _read(runconfig: dict | CSRunConfig) -> CSRunConfig:
    """The run configuration of the keys `runconfig` holds: the original's helpers below read
    their own keys of any dict (a script may keep more in it, or pass its whole params);
    `get_params` and `update_params_from_args` are where runconfig's keys are checked."""
    if isinstance(runconfig, CSRunConfig):
        return run_config(runconfig)
    return run_config({key: value for key, value in runconfig.items() if key in RUNCONFIG_SPEC})


def get_csrunconfig_dict(runconfig: dict | CSRunConfig) -> dict[str, Any]:
    """The `CSRunConfig` settings of `runconfig` (the original's helper): how often a run
    logs, summarizes and checkpoints, and its seed; `disable_standard_logs` turns the step
    lines off; the replicas asked for (which a `stack_params` FullConfig must agree with)."""
    config = _read(runconfig)
    keys = ("tf_random_seed", "save_summary_steps", "save_checkpoints_steps", "keep_checkpoint_max",
            "multireplica", "num_replicas")
    return {**{key: getattr(config, key) for key in keys}, "log_step_count_steps": config.step_log_steps}


def is_cs(runconfig: dict | CSRunConfig) -> bool:
    """Does this run use a CS system (`runconfig.cs_ip`, or the job's CS inside a csrun_wse
    task)? Any dict will do, as for the original's (which reads only cs_ip)."""
    return _read(runconfig).cs_ip is not None


def check_env(runconfig: dict | CSRunConfig) -> None:
    """Combinations of settings that cannot run, as one-line errors."""
    config = _read(runconfig)
    if config.validate_only and config.compile_only:
        raise CSRunError("--validate_only and --compile_only both given",
                         "validate_only checks the model, compile_only compiles it: pick one")
    if config.cs_ip and config.mode in CPU_ONLY_MODES:
        raise CSRunError(f"mode {config.mode} runs on the CPU only, not on the CS system",
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


def get_csconfig(csconfig: dict | None) -> dict:
    """The original's CSConfig of params' `csconfig` section (the CS-1 compiler's settings),
    which a modelzoo run.py hands to `CSRunConfig(cs_config=…)`: the section itself
    (`get_params` notes its keys, which csrun's compiler does not have)."""
    return dict(csconfig or {})


def create_warm_start_settings(runconfig: dict, exclude_string: str | None = None) -> WarmStart | None:
    """Where a training run without a checkpoint of its own takes its first weights
    (`runconfig.checkpoint_path`; None: nowhere), every trainable variable but those whose
    name holds `exclude_string` (a fine-tuning run's new output layer); `CSEstimator`'s
    `warm_start_from` takes it."""
    path = runconfig.get("checkpoint_path")
    if path is None:
        return None
    return WarmStart(path, f"^((?!{re.escape(exclude_string)}).)*$" if exclude_string else ".*")


def save_predictions(model_dir: str, outputs: Iterable[Any], name: str = PREDICTIONS_FILE) -> str | None:
    """Write what `CSEstimator.predict` yielded to `model_dir/predict/name` (numpy's npz:
    one array of them, as the original's helper); an input worker's empty iterator writes
    nothing. Returns the file's path, None when nothing was written."""
    collected = list(outputs)
    if not collected:
        return None
    folder = os.path.join(model_dir, PREDICT_DIR)
    path = os.path.join(folder, name)
    try:
        os.makedirs(folder, exist_ok=True)
        np.savez(path, collected)
    except OSError as error:
        raise CSRunError(f"cannot write predictions to {path}: {error.strerror}",
                         "choose a writable directory with -o/--model_dir") from None
    return path
