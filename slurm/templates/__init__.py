"""The sbatch templates (`csrun_wse.sbatch`, `csrun_cpu.sbatch`) and how csrun_wse fills one in.

The templates are plain scripts a user copies, edits and submits with `sbatch`; their
settings are `#SBATCH` lines and the `NAME=…` lines of the settings block.
`csrun_wse --emit-sbatch FILE` rewrites those lines with the job's settings.
"""
from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from common.errors import CSRunError
from slurm.backend import JobRequest
from slurm.slurm_backend import slurm_options

TEMPLATES = Path(__file__).resolve().parent


def fill(template: str, sbatch: dict[str, str], settings: dict[str, str]) -> str:
    """`template` with its `#SBATCH --key=` lines set from `sbatch` (new keys added after the
    last one) and its `NAME=` settings lines replaced by `settings` (shell text)."""
    lines = template.splitlines()
    sbatch_lines = [i for i, ln in enumerate(lines) if ln.startswith("#SBATCH --")]
    left = dict(sbatch)
    for i in sbatch_lines:
        key = lines[i][len("#SBATCH --"):].split("=", 1)[0]
        if key in left:
            lines[i] = f"#SBATCH --{key}={left.pop(key)}"
    extra = [f"#SBATCH --{k}={v}" for k, v in left.items()]
    lines[sbatch_lines[-1] + 1:sbatch_lines[-1] + 1] = extra
    for name, value in settings.items():
        index = next((i for i, ln in enumerate(lines) if ln.startswith(f"{name}=")), None)
        if index is None:
            raise ValueError(f"the template has no setting {name}")
        lines[index] = f"{name}={value}"
    return "\n".join(lines) + "\n"


def write_wse_sbatch(path: Path, request: JobRequest, command: tuple[str, ...], cs_ip: str | None,
                     image: str | None, mount_dirs: tuple[str, ...], fabric: str) -> None:
    """Write `csrun_wse.sbatch` filled in for `request` to `path` (atomically, executable)."""
    options = slurm_options(request)
    if options.get("single_task_nodes") == "1":
        raise CSRunError("--single-task-nodes is not in the sbatch template",
                         "submit through csrun_wse, or edit the emitted script's srun line")
    sbatch = {"job-name": request.name, "nodes": str(request.total_nodes),
              "ntasks-per-node": str(request.tasks_per_node), "cpus-per-task": str(request.cpus_per_task)}
    for key in ("partition", "time", "gres"):
        if key in options:
            sbatch[key] = shlex.quote(options[key])
    if options.get("cyclic") == "1":
        sbatch["distribution"] = "cyclic"
    template = (TEMPLATES / "csrun_wse.sbatch").read_text()
    if "gres" not in options:
        template = "\n".join(ln for ln in template.splitlines() if not ln.startswith("#SBATCH --gres=")) + "\n"
    text = fill(template, sbatch, {
        "COMMAND": f"({shlex.join(command)})",
        "CS_IP": shlex.quote(cs_ip or ""),
        "FABRIC": shlex.quote(fabric),
        "CSRUN_ENV": shlex.quote(sys.prefix),
        "IMAGE": shlex.quote(image or ""),
        "MOUNT_DIRS": shlex.quote(",".join(mount_dirs)),
    })
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text)
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
    except OSError as error:
        raise CSRunError(f"cannot write {path}: {error.strerror}") from None
