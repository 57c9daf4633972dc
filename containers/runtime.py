"""The container runtime (Apptainer, Singularity, or Charliecloud): find it, build `exec`.

Like the original installation, a task runs as

    env -u PYTHONPATH -u LD_LIBRARY_PATH apptainer exec --bind A,B,CWD --pwd CWD IMAGE CMD…

or, with Charliecloud (a directory image, e.g. the one `make image` builds):

    env -u PYTHONPATH -u LD_LIBRARY_PATH USER=U ch-run --set-env -b A:A -b CWD:CWD -c CWD IMAGE -- CMD…

(`ch-run` refuses to start without $USER; `--set-env` applies the image's /ch/environment,
the recipe's %environment; a bind's destination must exist in the image, so missing mount
points are made in the directory image before the task starts.)

The host's PYTHONPATH and LD_LIBRARY_PATH are unset before the runtime starts (they name
host libraries that would shadow the image's), not set to empty inside, so the image's
own values apply; everything else (CSRUN_*, SLURM_*, the user's variables) passes through
as the runtime passes the host environment by default — no `--cleanenv`. `env -u` is one
argv prefix, so the command works the same from csrun_cpu, srun and an sbatch script,
with either runtime and any of their versions.
"""
from __future__ import annotations

import getpass
import os
import shutil
from dataclasses import dataclass
from typing import Sequence

from common.errors import CSRunError

RUNTIMES = ("apptainer", "singularity", "charliecloud")  # looked for in this order
EXECUTABLES = {"apptainer": "apptainer", "singularity": "singularity", "charliecloud": "ch-run"}
UNSET_VARIABLES = ("PYTHONPATH", "LD_LIBRARY_PATH")
_IMAGE_HINT = ("build it from the csrun sources with `apptainer build csrun.sif containers/csrun.def` "
               "(Charliecloud: `make image`), or fix container.image in csrun.yaml")


@dataclass(frozen=True)
class ContainerRuntime:
    name: str        # "apptainer", "singularity" or "charliecloud"
    executable: str  # where it was found on this machine

    def exec_command(self, image: str, command: Sequence[str], binds: Sequence[str],
                     workdir: str) -> list[str]:
        """The argv that runs `command` in `image` from `workdir`, with `binds` and
        `workdir` bound (each once, in order), and the host's PYTHONPATH/LD_LIBRARY_PATH unset."""
        if not command:
            raise ValueError("exec_command needs a command")
        unset = [arg for name in UNSET_VARIABLES for arg in ("-u", name)]
        if self.name == "charliecloud":
            mounts = [arg for bind in charliecloud_binds(binds, workdir) for arg in ("-b", bind)]
            return ["env", *unset, f"USER={os.environ.get('USER') or getpass.getuser()}", "ch-run",
                    "--set-env", *mounts, "-c", workdir, image, "--", *command]
        return ["env", *unset, self.name, "exec", "--bind", ",".join(bind_list(binds, workdir)),
                "--pwd", workdir, image, *command]

    def prepare(self, image: str, binds: Sequence[str], workdir: str) -> None:
        """Make the mount points Charliecloud needs in a directory image (ch-run binds onto
        existing directories only); nothing for the other runtimes."""
        if self.name != "charliecloud":
            return
        if not os.path.isdir(image):
            raise CSRunError(f"container image {image} is not a directory: ch-run runs directory images",
                             "build one with `make image`, or choose apptainer for a .sif file")
        for bind in charliecloud_binds(binds, workdir):
            target = os.path.join(image, bind.split(":", 1)[1].lstrip("/"))
            if os.path.isdir(target):
                continue
            try:
                os.makedirs(target)
            except OSError as error:
                raise CSRunError(f"cannot make the mount point {target} in the image: {error.strerror}",
                                 "make it in the image once (as its owner), or bind elsewhere") from None


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


def charliecloud_binds(binds: Sequence[str], workdir: str) -> list[str]:
    """`bind_list` as ch-run's SRC:DST (DST defaults to SRC); it takes no mount options."""
    result = []
    for bind in bind_list(binds, workdir):
        parts = bind.split(":")
        if len(parts) > 2:
            raise CSRunError(f"cannot bind {bind!r} with Charliecloud: ch-run takes SRC or SRC:DST, "
                             "no mount options", "drop the options from the mount dir")
        spec = f"{parts[0]}:{parts[-1]}"
        if spec not in result:
            result.append(spec)
    return result


def check_binds(binds: Sequence[str]) -> None:
    """Stop, naming it, when the source of a bind is missing (the runtime would refuse it)."""
    for bind in binds:
        source = bind.split(":", 1)[0]
        if not os.path.exists(source):
            raise CSRunError(f"cannot bind {source} into the container: no such file or directory",
                             "fix --mount-dirs or mount_dirs in csrun.yaml")


def find_runtime(preferred: str | None = None) -> ContainerRuntime:
    """The runtime on PATH: `preferred` if given, else apptainer, else singularity, else
    charliecloud (`ch-run`)."""
    if preferred is not None and preferred not in RUNTIMES:
        raise CSRunError(f"unknown container runtime {preferred!r}",
                         f"use one of {', '.join(RUNTIMES)} in csrun.yaml's container.runtime")
    names = (preferred,) if preferred else RUNTIMES
    for name in names:
        executable = shutil.which(EXECUTABLES[name])
        if executable is not None:
            return ContainerRuntime(name, executable)
    raise CSRunError(
        f"csrun.yaml names a container image, but no container runtime is installed here "
        f"({' or '.join(EXECUTABLES[n] for n in names)} not found on PATH)",
        "install Apptainer or Charliecloud on this node (or load its module), or leave "
        "container.image out of csrun.yaml to run without a container")


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
    argv = runtime.exec_command(image, command, binds, workdir)
    runtime.prepare(image, binds, workdir)
    return runtime, argv
