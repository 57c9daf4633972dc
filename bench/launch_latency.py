"""Launch latency: from the command to the first line of the task's output.

csrun_wse through Slurm (the one-host cluster of slurm/cluster/, started here if it is not
up, and stopped again), next to `srun echo` on the same cluster and to csrun_wse's local
backend; medians of a few runs, measured side by side in one run.

    python bench/launch_latency.py
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.table import Row, print_table  # noqa: E402

CLUSTER_SH = ROOT / "slurm" / "cluster" / "cluster.sh"
MARKER = "first-line-of-the-task"
RUNS = 3


def first_line_seconds(argv: list[str], env: dict[str, str], cwd: str) -> float:
    """Seconds from starting `argv` to the first stdout line holding MARKER; waits for its end."""
    start = time.perf_counter()
    process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               text=True)
    elapsed = float("nan")
    for line in process.stdout:
        if MARKER in line and elapsed != elapsed:
            elapsed = time.perf_counter() - start
    if process.wait() != 0 or elapsed != elapsed:
        raise RuntimeError(f"{argv[:4]}… failed (exit {process.returncode})")
    return elapsed


def median_of(argv: list[str], env: dict[str, str], cwd: str) -> float:
    return statistics.median(first_line_seconds(argv, env, cwd) for _ in range(RUNS))


def measure() -> list[Row]:
    base = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    base["PYTHONPATH"] = str(ROOT)
    conf = Path(os.environ.get("CSRUN_SLURM_DIR", "/tmp/csrun-slurm")) / "etc" / "slurm.conf"
    slurm_env = {**base, "SLURM_CONF": str(conf)}
    was_up = subprocess.run(["bash", str(CLUSTER_SH), "status"], capture_output=True).returncode == 0
    if not was_up and subprocess.run(["bash", str(CLUSTER_SH), "up"], capture_output=True).returncode != 0:
        nan = float("nan")
        return [("csrun_wse via Slurm", nan, "s", "the one-host Slurm did not start (root needed)")]
    csrun_wse = [sys.executable, "-m", "launcher.csrun_wse", "--tasks-per-node", "2", "--cs_ip", "127.0.0.1:1",
                 "--", "echo", MARKER]
    try:
        with TemporaryDirectory() as cwd:
            local = median_of(csrun_wse, base, cwd)
            srun = median_of(["srun", "-n", "2", "echo", MARKER], slurm_env, cwd)
            slurm = median_of(csrun_wse, slurm_env, cwd)
    finally:
        if not was_up:
            subprocess.run(["bash", str(CLUSTER_SH), "down"], capture_output=True)
    note = f"median of {RUNS}, 2 tasks, command to first output line"
    return [
        ("csrun_wse via Slurm (submitit, sbatch)", slurm, "s", note),
        ("srun -n 2 echo (same cluster)", srun, "s", note),
        ("csrun_wse local backend", local, "s", note),
        ("Slurm path / srun", slurm / srun, "ratio", "sbatch + submitit overhead over a bare step"),
        ("Slurm path / local path", slurm / local, "ratio", ""),
    ]


def main() -> None:
    print_table(measure())


if __name__ == "__main__":
    main()
