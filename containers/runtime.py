"""The container runtime (Apptainer, or Singularity before it): find it, build `exec`.

Like the original installation, a task runs as

    env -u PYTHONPATH -u LD_LIBRARY_PATH apptainer exec --bind A,B,CWD --pwd CWD IMAGE CMD…

The host's PYTHONPATH and LD_LIBRARY_PATH are unset before the runtime starts (they name
host libraries that would shadow the image's), not set to empty inside, so the image's
own values apply; everything else (CSRUN_*, SLURM_*, the user's variables) passes through
as the runtime passes the host environment by default — no `--cleanenv`. `env -u` is one
argv prefix, so the command works the same from csrun_cpu, srun and an sbatch script,
with either runtime and any of their versions.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import Sequence

from launcher.errors import CSRunError

RUNTIMES = ("apptainer", "singularity")  # looked for in this order
UNSET_VARIABLES = ("PYTHONPATH", "LD_LIBRARY_PATH")
_IMAGE_HINT = ("build it with `apptainer build csrun.sif containers/csrun.def` from the csrun "
               "sources, or fix container.image in csrun.yaml")


@dataclass(frozen=True)
class ContainerRuntime:
    name: str        # "apptainer" or "singularity": the command the exec line starts
    executable: str  # where it was found on this machine

    def exec_command(self, image: str, command: Sequence[str], binds: Sequence[str],
                     workdir: str) -> list[str]:
        """The argv that runs `command` in `image` from `workdir`, with `binds` and
        `workdir` bound (each once, in order), and the host's PYTHONPATH/LD_LIBRARY_PATH unset."""
        if not command:
            raise ValueError("exec_command needs a command")
        unset = [arg for name in UNSET_VARIABLES for arg in ("-u", name)]
        return ["env", *unset, self.name, "exec", "--bind", ",".join(bind_list(binds, workdir)),
                "--pwd", workdir, image, *command]


def add_mount_dirs_flag(parser) -> None:
    """The original's `--mount-dirs A,B` (also `--mount_dirs`): directories bound besides
    csrun.yaml's mount_dirs; read back with `mount_dirs_of`."""
    parser.add_argument("--mount-dirs", "--mount_dirs", dest="mount_dirs", default="", metavar="A,B",
                        help="directories to bind into the container besides csrun.yaml's mount_dirs")


def mount_dirs_of(text: str) -> tuple[str, ...]:
    return tuple(d.strip() for d in text.split(",") if d.strip())


def bind_list(binds: Sequence[str], workdir: str) -> list[str]:
    """`binds` then `workdir`, each once; "SRC" or "SRC:DST[:OPTS]" specs as Apptainer takes them."""
    result: list[str] = []
    for bind in (*binds, workdir):
        if not bind or "," in bind:
            raise CSRunError(f"cannot bind {bind!r} into the container",
                             "give one directory per --mount-dirs entry, separated by commas")
        if bind not in result:
            result.append(bind)
    return result


def check_binds(binds: Sequence[str]) -> None:
    """Stop, naming it, when the source of a bind is missing (the runtime would refuse it)."""
    for bind in binds:
        source = bind.split(":", 1)[0]
        if not os.path.exists(source):
            raise CSRunError(f"cannot bind {source} into the container: no such file or directory",
                             "fix --mount-dirs or mount_dirs in csrun.yaml")


def find_runtime(preferred: str | None = None) -> ContainerRuntime:
    """The runtime on PATH: `preferred` if given, else apptainer, else singularity."""
    if preferred is not None and preferred not in RUNTIMES:
        raise CSRunError(f"unknown container runtime {preferred!r}",
                         f"use one of {', '.join(RUNTIMES)} in csrun.yaml's container.runtime")
    names = (preferred,) if preferred else RUNTIMES
    for name in names:
        executable = shutil.which(name)
        if executable is not None:
            return ContainerRuntime(name, executable)
    raise CSRunError(
        f"csrun.yaml names a container image, but no container runtime is installed here "
        f"({' or '.join(names)} not found on PATH)",
        "install Apptainer on this node (or load its module), or leave container.image out "
        "of csrun.yaml to run without a container")


def check_image(image: str) -> None:
    """Stop when the image file is missing (a URI such as docker://… is the runtime's business)."""
    if "://" in image:
        return
    if not os.path.exists(image):
        raise CSRunError(f"container image {image} not found", _IMAGE_HINT)
    if not os.access(image, os.R_OK):
        raise CSRunError(f"container image {image} is not readable", _IMAGE_HINT)


def container_exec(image: str, command: Sequence[str], binds: Sequence[str], workdir: str,
                   preferred: str | None = None) -> tuple[ContainerRuntime, list[str]]:
    """Everything a launcher does to run `command` in `image`: find the runtime, check the
    image and the bind sources, build the exec argv. Returns the runtime and the argv."""
    runtime = find_runtime(preferred)
    check_image(image)
    check_binds(binds)
    return runtime, runtime.exec_command(image, command, binds, workdir)
