"""Several nodes: input workers on 1, 2, 4 Slurm hosts streaming to the CS host over the bridge
vs the same workers on loopback; launch latency of a 3-node vs a 1-node job.

FC-MNIST (784-500-300-10, batch 256: 800 KB per batch). Over the bridge: a Slurm job on the
namespace cluster of slurm/cluster/ (NODES=5 in its own folder and ports, started here if it
is not up and stopped again), the chief alone on the first host (--single-task-nodes 1), one
worker on each of the next k hosts, the CS system on its own host. On loopback: the same
chief and k workers as local processes, the CS system a `wse_sim serve` on 127.0.0.1 of this
host. The rate is the chief's training-phase samples/s (launch and compile excluded).
Launch latency: `csrun_wse -- echo` to its first output line, medians of a few runs.

    python bench/multinode.py
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from bench.launch_latency import MARKER, RUNS, median_of  # noqa: E402
from bench.table import Row, print_table  # noqa: E402
from launcher.csrun_wse import EmbeddedSimulator  # noqa: E402

CLUSTER_SH = ROOT / "slurm" / "cluster" / "cluster.sh"
EXAMPLE = ROOT / "examples" / "fc_mnist"
WORKERS = (1, 2, 4)
STEPS, BATCH = 200, 256
DIR = os.environ.get("CSRUN_BENCH_MULTINODE_DIR", "/tmp/csrun-slurm-bench-multinode")
BASE = os.environ.get("CSRUN_BENCH_MULTINODE_PORT_BASE", "17000")
RATE = re.compile(r"Training finished with \d+ samples in [\d.]+ seconds, ([\d.]+) samples/second")


def cluster(command: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "CSRUN_SLURM_DIR": DIR, "CSRUN_SLURM_PORT_BASE": BASE,
           "CSRUN_SLURM_NODES": str(1 + max(WORKERS)), "CSRUN_PYTHON": sys.executable}
    return subprocess.run(["bash", str(CLUSTER_SH), command], env=env, capture_output=True, text=True)


def user_dir(folder: Path) -> Path:
    """FC-MNIST's params for a run without checkpoints, and the site's csrun.yaml (CS license)."""
    params = yaml.safe_load((EXAMPLE / "configs" / "params.yaml").read_text())
    params["train_input"]["batch_size"] = BATCH
    params["runconfig"].update(max_steps=STEPS, save_checkpoints_steps=None, save_summary_steps=100,
                               log_step_count_steps=100)
    (folder / "params.yaml").write_text(yaml.safe_dump(params))
    (folder / "csrun.yaml").write_text(yaml.safe_dump({"slurm": {"gres": None, "licenses": "cs:1"}}))
    return folder


def training_rate(env: dict[str, str], folder: Path, cs_ip: str, job: str, *flags: str) -> float:
    command = [sys.executable, "-m", "launcher.csrun_wse", *flags, "--cs_ip", cs_ip, "--job-dir",
               str(folder / job), "--", "python", str(EXAMPLE / "run.py"), "--mode", "train", "-p",
               str(folder / "params.yaml"), "-o", str(folder / f"model-{job}")]
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)
    match = RATE.search(done.stdout)
    if done.returncode != 0 or not match:
        raise RuntimeError(f"{job} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return float(match.group(1))


def measure() -> list[Row]:
    was_up = cluster("status").returncode == 0
    if not was_up and (up := cluster("up")).returncode != 0:
        return [("bridge vs loopback", float("nan"), "ratio", f"the namespace cluster did not start: "
                                                             f"{up.stderr.strip().splitlines()[-1:]}")]
    cs_ip = re.search(r"--cs_ip (\S+)", cluster("env").stdout).group(1)
    base = {**{k: v for k, v in os.environ.items() if k != "SLURM_CONF"}, "PYTHONPATH": str(ROOT),
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}", "TF_CPP_MIN_LOG_LEVEL": "2"}
    slurm = {**base, "SLURM_CONF": f"{DIR}/etc/slurm.conf"}
    rows: list[Row] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = user_dir(Path(tmp))
            local_cs = EmbeddedSimulator("cs1", folder / "loopback-cs.log")
            local_cs.start()
            try:
                for k in WORKERS:
                    bridge = training_rate(slurm, folder, cs_ip, f"bridge-{k}", "--total-nodes", str(k + 1),
                                           "--tasks-per-node", "1", "--single-task-nodes", "1")
                    loopback = training_rate(base, folder, local_cs.address, f"loopback-{k}",
                                             "--tasks-per-node", str(k + 1))
                    rows += [(f"{k} worker(s) on {k} host(s), over the bridge", bridge, "samples/s",
                              "Slurm job; the CS on its own host"),
                             (f"{k} worker(s) on this host, over loopback", loopback, "samples/s",
                              "local processes; the CS on 127.0.0.1"),
                             (f"{k} worker(s): bridge / loopback", bridge / loopback, "ratio", "")]
            finally:
                local_cs.stop()
            echo = [sys.executable, "-m", "launcher.csrun_wse", "--tasks-per-node", "2", "--cs_ip", cs_ip]
            three = median_of([*echo, "--total-nodes", "3", "--", "echo", MARKER], slurm, str(folder))
            one = median_of([*echo, "--total-nodes", "1", "--", "echo", MARKER], slurm, str(folder))
    finally:
        if not was_up:
            cluster("down")
    note = f"median of {RUNS}, 2 tasks per node, command to first output line"
    return rows + [("launch, 3-node job (6 tasks)", three, "s", note),
                   ("launch, 1-node job (2 tasks)", one, "s", note),
                   ("launch: 3-node / 1-node", three / one, "ratio", "")]


def main() -> None:
    print_table(measure())


if __name__ == "__main__":
    main()
