"""csrun_job against the one-host Slurm: a detached job listed, queued behind another with
Slurm's reason, followed and cancelled; an attached csrun_wse killed by SIGKILL takes its Slurm
job with it (the launcher's heartbeat)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from slurm import jobs
from slurm.heartbeat import HEARTBEAT_TIMEOUT_S

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

NO_CS = ["--cs_ip", "127.0.0.1:1"]  # these jobs never contact the CS
TICKER = """\
import sys, time
for i in range(int(sys.argv[1])):
    print(f"tick {i}", flush=True)
    time.sleep(0.5)
"""


def squeue(cluster, job_id: str) -> str:
    return cluster.run(["squeue", "-h", "-j", job_id, "-o", "%T"]).stdout.strip()


def wait_for(predicate, timeout: float, what: str) -> float:
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < timeout, what
        time.sleep(0.5)
    return time.monotonic() - start


@pytest.fixture
def cluster_env(slurm_cluster, tmp_path):
    (tmp_path / "ticker.py").write_text(TICKER)
    return {**slurm_cluster.env, jobs.STATE_DIR_ENV: str(tmp_path / "state")}


def csrun_job(env, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launcher.csrun_job", *args], env=env, capture_output=True,
                          text=True, timeout=120)


def detach(env, tmp_path, name: str, ticks: int) -> str:
    done = subprocess.run([sys.executable, "-m", "launcher.csrun_wse", "--detach", *NO_CS, "--job-dir",
                           str(tmp_path / name), "--", sys.executable, "ticker.py", str(ticks)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_detached_slurm_jobs_are_listed_queued_followed_and_cancelled(slurm_cluster, cluster_env, tmp_path):
    first = detach(cluster_env, tmp_path, "a", 400)
    second = detach(cluster_env, tmp_path, "b", 4)  # waits for the CS GRES the first holds
    try:
        _listed_queued_followed_and_cancelled(slurm_cluster, cluster_env, first, second)
    finally:
        slurm_cluster.run(["scancel", first, second])


def _listed_queued_followed_and_cancelled(slurm_cluster, cluster_env, first: str, second: str) -> None:
    wait_for(lambda: squeue(slurm_cluster, first) == "RUNNING", 60, "the first job never ran")
    wait_for(lambda: slurm_cluster.run(["squeue", "-h", "-j", second, "-o", "%r"]).stdout.strip() == "Resources", 60,
             "the second job was never scheduled behind the first")
    listed = csrun_job(cluster_env, "list")
    rows = [line.split() for line in listed.stdout.splitlines()[1:]]
    assert [row[:3] for row in rows] == [[second, "slurm", "PENDING"], [first, "slurm", "RUNNING"]], listed.stdout
    holders = csrun_job(cluster_env, "cs").stdout.splitlines()
    user = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    assert re.fullmatch(rf"Slurm: job {first} of {user} holds the CS system \(GRES cs:1\) since \S+ on \S+",
                        holders[0]), holders
    assert re.fullmatch(rf"Slurm: job {second} of {user} waits \(Resources\), expected start (\S+|not known yet)",
                        holders[1]), holders
    queued = csrun_job(cluster_env, "status", second)
    assert queued.stdout.startswith(f"job {second} (slurm backend): PENDING (Resources)\n"), queued.stdout
    wait_for(lambda: "tick 2\n" in csrun_job(cluster_env, "logs", first).stdout, 60, "no log")
    status = csrun_job(cluster_env, "status", first)
    assert status.stdout.startswith(f"job {first} (slurm backend): RUNNING\n")
    assert re.search(r"task 0 \(chief, on \S+, pid \d+\): \S+_0_log\.out\n", status.stdout), status.stdout
    follower = subprocess.Popen([sys.executable, "-m", "launcher.csrun_job", "logs", first, "--follow"],
                                env=cluster_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cancelled = csrun_job(cluster_env, "cancel", first)
    assert cancelled.returncode == 0 and cancelled.stderr.strip() == f"csrun_job: job {first} cancelled: CANCELLED"
    assert squeue(slurm_cluster, first) in ("", "CANCELLED")
    followed, _ = follower.communicate(timeout=30)
    # submitit's own lines left out (a traceback srun's lines cut into may show: LogCopy's limit)
    assert follower.returncode == 0 and followed.startswith("tick 0\ntick 1\n")
    assert not [line for line in followed.splitlines() if line.startswith("submitit ")]
    again = csrun_job(cluster_env, "cancel", first)
    assert again.returncode == 1 and again.stderr.strip().startswith(f"csrun_job: error: job {first} already ended")
    # the second job gets the CS, runs to its end, and says so
    wait_for(lambda: csrun_job(cluster_env, "status", second).stdout.startswith(
        f"job {second} (slurm backend): COMPLETED"), 90, "the queued job never completed")
    assert csrun_job(cluster_env, "logs", second).stdout == "tick 0\ntick 1\ntick 2\ntick 3\n"


def test_a_sigkilled_attached_launcher_takes_its_slurm_job_with_it(slurm_cluster, cluster_env, tmp_path):
    wse = subprocess.Popen([sys.executable, "-m", "launcher.csrun_wse", *NO_CS, "--job-dir", str(tmp_path / "job"),
                            "--", sys.executable, "ticker.py", "1000"], cwd=tmp_path, env=cluster_env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert wse.stdout.readline() == "tick 0\n"
        os.killpg(wse.pid, signal.SIGKILL)
        wse.wait(10)
    finally:
        if wse.poll() is None:
            wse.kill()
    record = jobs.JobRecord.read(tmp_path / "job")
    assert record is not None and record.launcher_pid == wse.pid
    took = wait_for(lambda: squeue(slurm_cluster, record.job_id) in ("", "COMPLETED", "FAILED", "CANCELLED"),
                    HEARTBEAT_TIMEOUT_S + 20, "the Slurm job outlived its launcher")
    print(f"the Slurm job ended {took:.1f} s after its launcher's SIGKILL")
    log = record.task_log(0).read_text()
    assert "csrun: error: the launcher (csrun_wse) of this job died" in log
    state = csrun_job(cluster_env, "status", record.job_id).stdout.splitlines()[0]
    assert state.startswith(f"job {record.job_id} (slurm backend): FAILED"), state


def test_cancelling_an_attached_job_stops_it_through_its_launcher(slurm_cluster, cluster_env, tmp_path):
    wse = subprocess.Popen([sys.executable, "-m", "launcher.csrun_wse", *NO_CS, "--job-dir", str(tmp_path / "job"),
                            "--", sys.executable, "ticker.py", "1000"], cwd=tmp_path, env=cluster_env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wse.stdout.readline() == "tick 0\n"
        record = jobs.JobRecord.read(tmp_path / "job")
        cancelled = csrun_job(cluster_env, "cancel", record.job_id)
        _, err = wse.communicate(timeout=30)
    finally:
        if wse.poll() is None:
            wse.kill()
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stderr.strip() == f"csrun_job: job {record.job_id} cancelled: CANCELLED"
    assert wse.returncode == 128 + signal.SIGTERM
    assert err.strip().splitlines()[-1] == (f"csrun_wse: stopped by SIGTERM: job {record.job_id} cancelled, every "
                                            "task stopped")
    assert squeue(slurm_cluster, record.job_id) in ("", "CANCELLED")
    assert csrun_job(cluster_env, "status", record.job_id).stdout.startswith(
        f"job {record.job_id} (slurm backend): CANCELLED (cancelled (SIGTERM to csrun_wse))\n")
