"""FC-MNIST through the real one-host Slurm: csrun_wse trains as a Slurm job with the CPU
path's losses, csrun_cpu validates as a Slurm step, and a job ended by scancel keeps its
newest checkpoint (written at the step the stop found), from which a rerun resumes."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from fc_mnist_runs import ENV, EXAMPLE, fc_mnist_params, losses
from processes import run_py_in_process

from tf_model import checkpoints

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

STEPS, EVERY = 12, 4


def csrun(cluster, tool: str, args: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(ENV["PATH"].split(":")[0]) / tool), *args], cwd=EXAMPLE,
                          env={**ENV, "SLURM_CONF": cluster.env["SLURM_CONF"]},
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def cpu_losses(tmp_path_factory) -> dict[int, float]:
    """FC-MNIST's run.py on the CPU (in process): its losses."""
    folder = tmp_path_factory.mktemp("cpu")
    params = fc_mnist_params(folder, steps=STEPS, every=EVERY)
    return losses(run_py_in_process(EXAMPLE / "run.py", ["--mode", "train", "-p", params, "-o", folder / "model"],
                                    EXAMPLE))


def test_csrun_wse_trains_fc_mnist_as_a_slurm_job_with_the_cpu_losses(slurm_cluster, tmp_path,
                                                                      cpu_losses):
    params = fc_mnist_params(tmp_path, steps=STEPS, every=EVERY)
    done = csrun(slurm_cluster, "csrun_wse", [
        "--total-nodes", "1", "--tasks-per-node", "3", "--job-dir", str(tmp_path / "job"), "--",
        "python", "run.py", "--mode", "train", "-p", str(params), "-o", str(tmp_path / "model")])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "through the slurm backend" in done.stderr
    cs = losses(done.stdout)
    assert sorted(cs) == list(range(1, STEPS + 1))
    np.testing.assert_allclose([cs[s] for s in sorted(cs)], [cpu_losses[s] for s in sorted(cs)],
                               rtol=1e-3)
    job_id = re.search(r"csrun_wse: job (\d+):", done.stderr).group(1)
    for rank in (1, 2):  # both input workers streamed their shard
        log = (tmp_path / "job" / f"{job_id}_{rank}_log.out").read_text()
        assert f"input worker {rank - 1}: sent {STEPS // 2} batches" in log
    assert checkpoints.checkpoint_step(checkpoints.latest_checkpoint(str(tmp_path / "model"))) == STEPS


def test_csrun_cpu_validates_as_a_slurm_step(slurm_cluster, tmp_path):
    done = csrun(slurm_cluster, "csrun_cpu", [
        "--alloc-node=True", "python", "run.py", "--mode", "train", "--validate_only",
        "-o", str(tmp_path / "model")])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "on a node of its own through srun" in done.stderr
    assert "Validation successful" in done.stdout
    assert (tmp_path / "model" / "cs_compile" / "validation_report.txt").exists()


def test_scancel_keeps_the_newest_checkpoint_and_a_rerun_resumes(slurm_cluster, tmp_path):
    params = fc_mnist_params(tmp_path, steps=100_000, every=EVERY)  # cancelled long before
    model = tmp_path / "model"
    command = [str(Path(ENV["PATH"].split(":")[0]) / "csrun_wse"), "--tasks-per-node", "2",
               "--job-dir", str(tmp_path / "job"), "--", "python", "run.py", "--mode", "train",
               "-p", str(params), "-o", str(model)]
    process = subprocess.Popen(command, cwd=EXAMPLE, env={**ENV, **slurm_cluster.env, "PATH": ENV["PATH"]},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        job_id = re.search(r"csrun_wse: job (\d+):", _line_with(process.stderr, "csrun_wse: job")).group(1)
        _line_with(process.stdout, f"Saving checkpoints for {2 * EVERY} ")
        assert slurm_cluster.run(["scancel", job_id]).returncode == 0
        _, err = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode != 0 and f"Slurm job {job_id} was cancelled" in err
    newest = checkpoints.latest_checkpoint(str(model))
    step = checkpoints.checkpoint_step(newest)
    assert step >= 2 * EVERY  # the chief checkpointed where scancel's SIGTERM found it (coordinator.stop_request)
    assert "run.py: stopped by SIGTERM: checkpoint at step" in (model.parent / "job" / f"{job_id}_0_log.out").read_text()
    state = checkpoints.read_checkpoint(newest)  # intact: every tensor reads back, finite
    assert all(np.all(np.isfinite(v)) for v in state.values() if v.dtype.kind == "f")

    fc_mnist_params(tmp_path, steps=step + EVERY, every=EVERY)  # rerun: a little further
    done = csrun(slurm_cluster, "csrun_wse", ["--tasks-per-node", "2", "--job-dir", str(tmp_path / "job2"),
                                              "--", "python", "run.py", "--mode", "train", "-p",
                                              str(params), "-o", str(model)])
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"Restoring parameters from {newest}" in done.stdout
    assert sorted(losses(done.stdout)) == list(range(step + 1, step + EVERY + 1))


def _line_with(stream, text: str) -> str:
    """Read `stream` until a line containing `text` (the process runs until then)."""
    for line in stream:
        if text in line:
            return line
    raise AssertionError(f"the output ended without {text!r}")
