"""csrun_cpu: run a command in the toolkit's environment on a CPU node.

    csrun_cpu [--alloc-node=True|False] [--exclude-gres=True|False] [--mount-dirs=A,B]
              [--dry-run] [--debug] [--] [COMMAND…]

e.g. `csrun_cpu python run.py --validate_only`. The command runs inside the container
when csrun.yaml names an image (`containers.runtime`: the configured mount dirs,
`--mount-dirs` and the current directory bound, the host's PYTHONPATH/LD_LIBRARY_PATH
unset), through `srun --nodes=1 --exclusive` when `--alloc-node` is true (the default)
and a Slurm controller answers, and plainly on this host otherwise; one line on stderr
says which. As the original's, srun keeps off the CS's node (`--exclude=` csrun.yaml's
`slurm.gres_node`) unless `--exclude-gres=False`. No command, or a shell alone (`bash`),
is an interactive shell in the container (`srun --pty` on an allocated node).
`--dry-run` prints the exact command and runs nothing. The exit code is the command's.
The original spellings `--alloc_node`, `--exclude_gres` and `--mount_dirs` are accepted.
"""
from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass

from common.errors import ArgumentParser, CSRunError, cli_entry
from containers.runtime import add_mount_dirs_flag, container_exec, mount_dirs_of
from launcher.site_config import SiteConfig, SlurmConfig, load_site_config
from slurm.slurm_backend import slurm_answers

PROG = "csrun_cpu"
_TRUE, _FALSE = ("true", "yes", "1"), ("false", "no", "0")
SHELLS = ("bash", "sh", "zsh")  # alone, an interactive shell


def _bool(text: str) -> bool:
    if text.lower() in _TRUE + _FALSE:
        return text.lower() in _TRUE
    raise argparse.ArgumentTypeError(f"expected True or False, not {text!r}")


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog=PROG, allow_abbrev=False,
                description="Run a command in the csrun environment on a CPU node.")
    p.add_argument("--alloc-node", "--alloc_node", dest="alloc_node", type=_bool, default=True,
                   metavar="True|False", help="run on a node of its own through srun (default: True)")
    p.add_argument("--exclude-gres", "--exclude_gres", dest="exclude_gres", type=_bool, default=True,
                   metavar="True|False", help="keep srun off the CS's node, slurm.gres_node (default: True)")
    add_mount_dirs_flag(p)
    p.add_argument("--dry-run", action="store_true", help="print the command, run nothing")
    p.add_command("the command to run (default: an interactive bash)")
    return p


@dataclass(frozen=True)
class CpuArgs:
    alloc_node: bool
    mount_dirs: tuple[str, ...]
    dry_run: bool
    command: tuple[str, ...]
    exclude_gres: bool = True

    @property
    def interactive(self) -> bool:
        return len(self.command) == 1 and os.path.basename(self.command[0]) in SHELLS


@dataclass(frozen=True)
class Plan:
    argv: tuple[str, ...]  # what runs (and what --dry-run prints)
    where: str             # the one stderr line saying how and where


def parse_args(argv: list[str]) -> CpuArgs:
    parser = _parser()
    ns = parser.parse_args(argv)
    command = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    return CpuArgs(ns.alloc_node, mount_dirs_of(ns.mount_dirs), ns.dry_run, tuple(command) or ("bash",),
                   ns.exclude_gres)


def srun_prefix(slurm: SlurmConfig, pty: bool = False, exclude: str | None = None) -> list[str]:
    """srun for a whole CPU node of the site's partition (a terminal with `pty`; never the
    node `exclude`)."""
    argv = ["srun", *(["--pty"] if pty else []), "--nodes=1", "--exclusive", f"--job-name={PROG}"]
    if exclude:
        argv.append(f"--exclude={exclude}")
    if slurm.partition:
        argv.append(f"--partition={slurm.partition}")
    if slurm.time:
        argv.append(f"--time={slurm.time}")
    return argv


def plan(args: CpuArgs, config: SiteConfig, workdir: str, slurm_answers: bool) -> Plan:
    """The command to run for `args` under `config`: container and srun as they apply."""
    argv = list(args.command)
    image = config.container.image
    if image is not None:
        runtime, argv = container_exec(image, argv, (*config.mount_dirs, *args.mount_dirs), workdir,
                                       config.container.runtime)
        how = f"in the {runtime.name} container {image}"
    else:
        source = f"no container.image in {config.path}" if config.path else "no csrun.yaml found"
        unused = "; --mount-dirs unused" if args.mount_dirs else ""
        how = f"without a container ({source}{unused})"
    if args.interactive:
        how = f"an interactive shell, {how}"
    if args.alloc_node and slurm_answers:
        exclude = config.slurm.gres_node if args.exclude_gres else None
        argv = [*srun_prefix(config.slurm, pty=args.interactive, exclude=exclude), *argv]
        partition = config.slurm.partition or "the default partition"
        off = f", not {exclude} (the CS's node)" if exclude else ""
        where = f"on a node of its own through srun ({partition}{off})"
    elif args.alloc_node:
        where = "on this host (no Slurm controller answers)"
    else:
        where = "on this host (--alloc-node=False)"
    return Plan(tuple(argv), f"{PROG}: running {how}, {where}")


def run(argv: tuple[str, ...]) -> int:
    """Run `argv` to its end and return its exit code (128 + N for a signal N).

    Ctrl-C reaches the command too (same process group): wait for it to end.
    """
    try:
        process = subprocess.Popen(argv)
    except FileNotFoundError:
        raise CSRunError(f"command not found: {argv[0]}",
                         "check the command's spelling and PATH") from None
    except PermissionError:
        raise CSRunError(f"cannot execute {argv[0]}: permission denied") from None
    while True:
        try:
            code = process.wait()
            break
        except KeyboardInterrupt:
            continue
    return 128 - code if code < 0 else code


@cli_entry(PROG)
def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    config = load_site_config()
    chosen = plan(args, config, os.getcwd(), args.alloc_node and slurm_answers())
    print(chosen.where, file=sys.stderr, flush=True)
    if args.dry_run:
        print(shlex.join(chosen.argv))
        return 0
    return run(chosen.argv)


if __name__ == "__main__":
    sys.exit(main())
