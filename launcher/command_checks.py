"""What `csrun_wse` checks of the job's command before it starts or queues anything: a
command that cannot start would otherwise fail in every task, each with its own error."""
from __future__ import annotations

import shutil
from pathlib import Path

from common.errors import CSRunError
from slurm.fork_server import script_of

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
