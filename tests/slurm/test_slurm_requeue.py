"""Requeue with an exact resume on the one-host Slurm: a `csrun_wse --requeue` job is requeued
twice while it trains, once by an admin (`scontrol requeue`: SIGTERM to every task) and once
by the signal Slurm sends before a time limit or a preemption (SIGUSR2, here by `scancel -s
USR2`: the task's checkpoint hook requeues the job); each time the chief checkpoints at the step
the CS reached and the requeued run resumes from it. The final weights equal, bit for bit, those
of the same steps run without interruption."""
from __future__ import annotations

import re
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from fc_mnist_runs import ENV, EXAMPLE, fc_mnist_params, losses

from tf_model import checkpoints

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

STEPS = 400  # one segment: the only checkpoints before the end are the stops'
CSRUN_WSE = str(Path(ENV["PATH"].split(":")[0]) / "csrun_wse")
STEP = re.compile(r"^global step (\d+):")
REVOKED_CREDENTIAL_S = 2.0  # from a requeue's end to the next launch: past the revocation's second


def _train(params: Path, model: Path, job_dir: Path, env: dict, *flags: str) -> subprocess.Popen:
    return subprocess.Popen([CSRUN_WSE, "--tasks-per-node", "2", *flags, "--job-dir", str(job_dir), "--",
                             "python", "run.py", "--mode", "train", "-p", str(params), "-o", str(model)],
                            cwd=EXAMPLE, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _final_weights(model: Path) -> dict[str, np.ndarray]:
    newest = checkpoints.latest_checkpoint(str(model))
    assert checkpoints.checkpoint_step(newest) == STEPS
    return checkpoints.read_checkpoint(newest)


def test_a_requeued_job_resumes_to_the_weights_of_an_uninterrupted_run(slurm_cluster, tmp_path):
    params = fc_mnist_params(tmp_path, steps=STEPS, every=STEPS)
    # the uninterrupted run: the local backend (no SLURM_CONF), the same tasks, meanwhile
    local_env = {k: v for k, v in ENV.items() if k != "SLURM_CONF"}
    reference = _train(params, tmp_path / "reference", tmp_path / "job0", local_env)
    reference_out: list[str] = []
    reader = threading.Thread(target=lambda: reference_out.extend(reference.communicate(timeout=600)))
    reader.start()

    job = _train(params, tmp_path / "model", tmp_path / "job", {**ENV, **slurm_cluster.env, "PATH": ENV["PATH"]},
                 "--requeue")
    out: list[str] = []
    try:
        job_id = re.search(r"csrun_wse: job (\d+):", _line(job.stderr, [], "csrun_wse: job")).group(1)
        stopped_after = _step_at_least(job.stdout, out, 30)
        assert slurm_cluster.run(["scontrol", "requeue", job_id]).returncode == 0  # an admin's requeue
        _release(slurm_cluster, job_id, 1)
        first = _restored_step(job.stdout, out)
        _step_at_least(job.stdout, out, first + 30)
        # what Slurm sends before a time limit (--signal=USR2@90) or a preemption
        assert slurm_cluster.run(["scancel", "-s", "USR2", job_id]).returncode == 0
        _release(slurm_cluster, job_id, 2)
        second = _restored_step(job.stdout, out)
        rest, err = job.communicate(timeout=300)
    except AssertionError as error:  # with what the launcher said
        job.kill()
        raise AssertionError(f"{error}\ncsrun_wse's stderr: {job.stderr.read()}") from None
    finally:
        job.kill()
    out.append(rest)
    assert job.returncode == 0, "".join(out) + err
    # each stop checkpointed at the step the CS reached (mid-segment), the requeued run resumed there
    assert stopped_after <= first and first + 30 < second < STEPS
    text = "".join(out)
    for restart in (1, 2):
        assert f"csrun: Slurm requeued job {job_id} (restart {restart})" in text
    assert sorted(losses(rest))[-1] == STEPS

    reader.join()
    assert reference.returncode == 0, "".join(reference_out)
    expected, got = _final_weights(tmp_path / "reference"), _final_weights(tmp_path / "model")
    assert sorted(got) == sorted(expected)
    for name, value in expected.items():
        assert np.array_equal(got[name], value), name


def _release(cluster, job_id: str, restarts: int, timeout_s: float = 60.0) -> None:
    """Once Slurm requeued the job: let it start now. Slurm holds a requeued job for about
    two minutes (its BeginTime: the lifetime of the job credentials slurmd revoked at the
    requeue), which an admin may lift; not within the second of the revocation, though
    (credential times are whole seconds: a launch then is refused "Job credential revoked"
    and the job ends FAILED)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        shown = cluster.run(["scontrol", "show", "job", "-o", job_id]).stdout
        if f"Restarts={restarts} " in shown and "JobState=PENDING" in shown:
            time.sleep(REVOKED_CREDENTIAL_S)
            assert cluster.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"]).returncode == 0
            return
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} was not requeued ({restarts}) within {timeout_s:.0f} s: {shown}")


def _restored_step(stream, out: list[str]) -> int:
    return checkpoints.checkpoint_step(_line(stream, out, "Restoring parameters from").split("from ", 1)[1].strip())


def _line(stream, out: list[str], text: str) -> str:
    """Read `stream` (kept in `out`) until a line containing `text`."""
    for line in stream:
        out.append(line)
        if text in line:
            return line
    raise AssertionError(f"the output ended without {text!r}: {''.join(out)}")


def _step_at_least(stream, out: list[str], step: int) -> int:
    """Read `stream` (kept in `out`) until the chief logs a step of at least `step`; that step."""
    for line in stream:
        out.append(line)
        match = STEP.match(line)
        if match and int(match.group(1)) >= step:
            return int(match.group(1))
    raise AssertionError(f"the output ended before step {step}: {''.join(out)}")
