"""What `csrun_wse` checks of the job's command before it starts or queues anything: a
command that cannot start would otherwise fail in every task, each with its own error, and
a run that would refuse its flags or params, or find its model_dir or CS unavailable, would
say so only once the job ran (after its wait in the queue)."""
from __future__ import annotations

import shutil
import socket
from pathlib import Path

from common.errors import CSRunError
from launcher.run_config import normalize_cs_ip
from launcher.run_utils import create_arg_parser, read_run_config
from slurm.fork_server import script_of
from tf_model.model_dir_lock import check_model_dir_free

_EXAMPLE = "e.g. csrun_wse python run.py --mode train"


def check_command(command: tuple[str, ...], workdir: Path, in_container: bool) -> None:
    """The program must be found (on PATH, or as a path from `workdir`: outside a container
    only, whose PATH is its own), and a `python SCRIPT.py` command's script must exist and
    compile."""
    if not in_container and shutil.which(command[0]) is None:
        raise CSRunError(f"command {command[0]!r} not found", f"give a program on PATH, {_EXAMPLE}")
    script = script_of(command)
    if script is None:
        return
    path = workdir / script
    try:
        source = path.read_bytes()
    except FileNotFoundError:
        raise CSRunError(f"script {script} not found in {workdir}",
                         "run csrun_wse in the folder of the script, or give its path") from None
    except OSError as error:
        raise CSRunError(f"cannot read script {path}: {error.strerror}") from None
    try:
        compile(source, str(path), "exec")
    except SyntaxError as error:
        raise CSRunError(f"{script}, line {error.lineno}: SyntaxError: {error.msg}",
                         "fix the script; nothing was started") from None
    except ValueError as error:  # a NUL byte in the source
        raise CSRunError(f"{script}: {error}", "fix the script; nothing was started") from None


_CS_MODES = ("train", "eval", "eval_all", "predict")
_CS_ANSWER_S = 5.0


def check_run(command: tuple[str, ...], workdir: Path, cs_ip: str | None) -> None:
    """What a `python SCRIPT.py …` run with a params file (run.py's flags: `-p`, default
    `configs/params.yaml` beside the script) would refuse first, checked here: its flags,
    its params (`get_params`: unknown keys, wrong types), a training run's model_dir held by
    another run, and the CS it would use (`cs_ip`, or run.py's own `--cs_ip`) not answering.
    Another command, or a script without a params file, is left to itself."""
    script = script_of(command)
    if script is None:
        return
    parser = create_arg_parser(str((workdir / script).parent / "model_dir"))
    parser.prog = script
    flags, _ = parser.parse_known_args([a for a in command[2:] if a not in ("-h", "--help")])
    path = workdir / flags.params
    if not path.is_file():
        if flags.params != parser.get_default("params"):
            raise CSRunError(f"{script}: params file {flags.params} not found in {workdir}",
                             "give its path with -p; nothing was started")
        return
    config = read_run_config(str(path), flags)
    if config.validate_only or config.compile_only:
        return
    if config.mode == "train":
        check_model_dir_free(str(workdir / str(config.model_dir)))
    target = flags.cs_ip or cs_ip
    if config.mode in _CS_MODES and target:
        check_cs_answers(normalize_cs_ip(target))


def check_cs_answers(cs_ip: str, timeout_s: float = _CS_ANSWER_S) -> None:
    """The CS system at `cs_ip` accepts a connection (within `timeout_s`)."""
    host, _, port = cs_ip.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return
    except OSError as error:
        why = error.strerror or ("no answer within %.0f s" % timeout_s if isinstance(error, TimeoutError)
                                 else type(error).__name__)
    raise CSRunError(f"cannot reach the CS system at {cs_ip}: {why}",
                     "start it (wse_sim serve) or check --cs_ip; nothing was queued")

