"""csrun_job on the local backend: a detached job listed, inspected, followed and cancelled
(every process gone within 10 s, the newest checkpoint intact); an attached run's status and
log after its end; unknown ids, another user's job and an ended job are one line each."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time

import pytest

from launcher import csrun_job
from launcher.csrun_wse import free_port
from slurm import jobs
from tests.fc_mnist_runs import ENV, EXAMPLE, fc_mnist_params
from tests.processes import left_running, processes_mentioning
from tf_model import checkpoints

RUN_PY = str(EXAMPLE / "run.py")


@pytest.fixture
def state_dir(tmp_path, monkeypatch) -> dict[str, str]:
    """This test's own job index (the user's registry), in and out of process."""
    folder = tmp_path / "state"
    monkeypatch.setenv(jobs.STATE_DIR_ENV, str(folder))
    return {**ENV, jobs.STATE_DIR_ENV: str(folder)}


def csrun_job_cli(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launcher.csrun_job", *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_unknown_ids_and_another_users_job_are_one_line_each(state_dir, tmp_path, capsys):
    for action in (["status", "4242"], ["logs", "4242"], ["cancel", "4242"], ["logs", "4242", "--follow"]):
        with pytest.raises(SystemExit) as ended:
            csrun_job.main(action)
        assert ended.value.code == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert err == ["csrun_job: error: no job 4242 of yours (hint: csrun_job list shows your jobs (the id "
                       "csrun_wse printed, or a job folder))"]
    folder = tmp_path / "theirs"
    folder.mkdir()
    jobs.register(jobs.JobRecord("77", "local", str(folder), str(tmp_path), ("true",), 1, "127.0.0.1:1", False,
                                 "elsewhere", time.time()))
    os.chown(folder / jobs.RECORD, 65534, 65534)
    for job_id in ("77", str(folder)):
        with pytest.raises(SystemExit):
            csrun_job.main(["cancel", job_id])
        err = capsys.readouterr().err.strip()
        assert re.fullmatch(rf"csrun_job: error: job {re.escape(job_id)} is user \S+'s, not yours \(hint: "
                            r"csrun_job acts on your own jobs only\)", err), err
    with pytest.raises(SystemExit):
        csrun_job.main(["frobnicate", "1"])
    assert capsys.readouterr().err.startswith("csrun_job: error: argument ACTION: invalid choice: 'frobnicate'")


@pytest.mark.slow
def test_a_detached_job_is_listed_inspected_followed_and_cancelled(state_dir, tmp_path):
    port = free_port()
    cs = subprocess.Popen([sys.executable, "-m", "wse_sim.cli", "serve", "--port", str(port)], env=ENV,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        params = fc_mnist_params(tmp_path, steps=100000, every=50)
        deadline = time.monotonic() + 60
        while (idle := csrun_job_cli(["cs", "--cs_ip", f"127.0.0.1:{port}"], state_dir)).returncode != 0:
            assert time.monotonic() < deadline, idle.stderr
            time.sleep(0.2)
        assert idle.stdout == f"CS system at 127.0.0.1:{port}: idle\n"
        job_dir = tmp_path / "job"
        started = subprocess.run(
            [sys.executable, "-m", "launcher.csrun_wse", "--detach", "--tasks-per-node", "2", "--cs_ip",
             f"127.0.0.1:{port}", "--job-dir", str(job_dir), "python", RUN_PY, "-p", str(params), "-o",
             str(tmp_path / "m")], cwd=tmp_path, env=state_dir, capture_output=True, text=True, timeout=120)
        assert started.returncode == 0, started.stderr
        job_id = started.stdout.strip()
        # the job trains on after csrun_wse returned: its progress reaches the registry
        deadline = time.monotonic() + 240
        while (progress := jobs.Progress.read(job_dir)) is None or not progress.checkpoint:
            assert time.monotonic() < deadline, csrun_job_cli(["logs", job_id], state_dir).stdout[-2000:]
            time.sleep(0.2)
        listed = csrun_job_cli(["list"], state_dir)
        assert listed.returncode == 0, listed.stderr
        header, row = listed.stdout.splitlines()[:2]
        assert header.split() == ["ID", "BACKEND", "STATE", "STEP", "LOSS", "SAMPLES/S", "STARTED", "FOLDER"]
        assert row.split()[:3] == [job_id, "local", "RUNNING"] and row.endswith(str(job_dir))
        assert re.fullmatch(r"\d+/100000", row.split()[3])
        status = csrun_job_cli(["status", job_id], state_dir)
        assert status.returncode == 0, status.stderr
        assert status.stdout.startswith(f"job {job_id} (local backend): RUNNING\n")
        assert re.search(r"step: +\d+ / 100000, ETA \d+:\d\d", status.stdout), status.stdout
        assert re.search(r"samples/s: +[\d,]+ wall clock, [\d,]+ simulated CS system", status.stdout)
        assert f"CS system:  127.0.0.1:{port}\n" in status.stdout
        assert re.search(r"checkpoint: .*/m/model\.ckpt-\d+\n", status.stdout)
        assert re.search(r"task 1 \(input worker, on \S+, pid \d+\): ", status.stdout), status.stdout
        held = csrun_job_cli(["cs", "--cs_ip", f"127.0.0.1:{port}"], state_dir)
        assert re.fullmatch(rf"CS system at 127\.0\.0\.1:{port}: busy with job job of \S+ since [\d-]+ [\d:]+, "
                            rf"step \d+ \(your job {job_id}, step \d+/100000, job folder {job_dir}\)\n",
                            held.stdout), held.stdout + held.stderr
        logs = csrun_job_cli(["logs", job_id], state_dir)
        assert re.search(r"^global step \d+: loss = ", logs.stdout, re.M) and "submitit" not in logs.stdout
        follower = subprocess.Popen([sys.executable, "-m", "launcher.csrun_job", "logs", job_id, "--follow"],
                                    env=state_dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first = follower.stdout.readline()  # it follows: the log so far comes first
        cancelled = csrun_job_cli(["cancel", job_id], state_dir)
        assert cancelled.returncode == 0, cancelled.stderr
        assert re.fullmatch(rf"csrun_job: job {job_id} cancelled: CANCELLED; newest checkpoint \S+model\.ckpt-\d+",
                            cancelled.stderr.strip()), cancelled.stderr
        assert left_running(str(job_dir), 10) == []
        rest, _ = follower.communicate(timeout=30)  # --follow ends with the job
        followed = first + rest
        assert follower.returncode == 0 and re.search(r"^global step \d+: loss = ", followed, re.M)
        newest = checkpoints.latest_checkpoint(str(tmp_path / "m"))
        assert newest is not None and checkpoints.read_checkpoint(newest)["global_step"] > 0
        again = csrun_job_cli(["cancel", job_id], state_dir)
        assert again.returncode == 1
        assert again.stderr.strip() == (f"csrun_job: error: job {job_id} already ended: CANCELLED (cancelled "
                                        "(csrun_job cancel)) (hint: nothing to cancel)")
        assert csrun_job_cli(["status", str(job_dir)], state_dir).stdout.startswith(
            f"job {job_id} (local backend): CANCELLED")
    finally:
        cs.terminate()
        cs.wait(10)


def _read_all(fd: int, into: list[bytes]) -> None:
    while True:
        try:
            data = os.read(fd, 4096)
        except OSError:  # EIO: the terminal's other side closed
            return
        if not data:
            return
        into.append(data)


@pytest.mark.slow
def test_an_attached_run_is_in_the_registry_when_it_ends(state_dir, tmp_path):
    """...and its launcher showed a progress line on the terminal (stderr a terminal here),
    none in the log (stdout a pipe), and a summary at the end."""
    params = fc_mnist_params(tmp_path, steps=400, every=200)
    job_dir = tmp_path / "job"
    terminal, other_side = os.openpty()
    seen: list[bytes] = []
    reader = threading.Thread(target=_read_all, args=(terminal, seen))
    reader.start()
    done = subprocess.run([sys.executable, "-m", "launcher.csrun_wse", "--job-dir", str(job_dir), "python",
                           RUN_PY, "-p", str(params), "-o", str(tmp_path / "m")], cwd=tmp_path, env=state_dir,
                          stdout=subprocess.PIPE, stderr=other_side, text=True, timeout=240)
    os.close(other_side)
    reader.join(10)
    os.close(terminal)
    stderr = b"".join(seen).decode()
    assert done.returncode == 0, stderr
    assert "\x1b" not in done.stdout and re.search(r"^global step 400: loss = ", done.stdout, re.M)
    assert re.search(r"\r\x1b\[Kstep \d+/400  loss \S+  [\d,]+ samples/s", stderr), stderr
    job_id = re.search(r"csrun_wse: job (\S+):", stderr).group(1)
    assert re.search(rf"(?:^|\x1b\[K)csrun_wse: job {job_id}: steps 0->400 of 400 in \d+:\d\d, [\d,]+ samples/s wall clock, "
                     rf"[\d,]+ simulated CS system; final loss \S+; newest checkpoint {tmp_path / 'm'}/model\.ckpt-400; "
                     rf"job folder {job_dir}\r?$", stderr, re.M), stderr
    status = csrun_job_cli(["status", job_id], state_dir)
    assert status.stdout.startswith(f"job {job_id} (local backend): COMPLETED\n"), status.stdout
    assert re.search(r"step: +400 / 400 \(finished\)\n", status.stdout)
    assert f"checkpoint: {tmp_path / 'm' / 'model.ckpt-400'}\n" in status.stdout
    assert "(embedded simulator)" in status.stdout
    logs = csrun_job_cli(["logs", job_id, "--follow"], state_dir)  # an ended job: its whole log, at once
    assert logs.returncode == 0 and logs.stdout == done.stdout
    no_task = csrun_job_cli(["logs", job_id, "--task", "3"], state_dir)
    assert no_task.returncode == 1
    assert no_task.stderr.strip() == f"csrun_job: error: job {job_id} has no task 3 (hint: its tasks are 0..0)"
    ended = csrun_job_cli(["cancel", job_id], state_dir)
    assert ended.returncode == 1 and ended.stderr.strip() == (
        f"csrun_job: error: job {job_id} already ended: COMPLETED (hint: nothing to cancel)")


@pytest.mark.slow
def test_cancelling_an_attached_job_stops_it_through_its_launcher(state_dir, tmp_path):
    (tmp_path / "ticker.py").write_text("import time\nfor i in range(1000):\n    print(f'tick {i}', flush=True)\n"
                                        "    time.sleep(0.5)\n")
    job_dir = tmp_path / "job"
    wse = subprocess.Popen([sys.executable, "-m", "launcher.csrun_wse", "--cs_ip", "127.0.0.1:1", "--tasks-per-node",
                            "2", "--job-dir", str(job_dir), "python", "ticker.py"], cwd=tmp_path, env=state_dir,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wse.stdout.readline() == "tick 0\n"
        record = jobs.JobRecord.read(job_dir)
        assert record is not None and record.launcher_pid == wse.pid and record.num_tasks == 2
        cancelled = csrun_job_cli(["cancel", record.job_id], state_dir)
        _, err = wse.communicate(timeout=30)
    finally:
        if wse.poll() is None:
            wse.kill()
    assert cancelled.returncode == 0 and cancelled.stderr.strip() == (
        f"csrun_job: job {record.job_id} cancelled: CANCELLED"), cancelled.stderr
    assert wse.returncode == 143 and err.strip().splitlines()[-1] == (
        f"csrun_wse: stopped by SIGTERM: job {record.job_id} cancelled, every task stopped")
    assert processes_mentioning(str(job_dir)) == []


def test_a_registry_that_cannot_be_written_costs_the_job_nothing(tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    done = subprocess.run([sys.executable, "-m", "launcher.csrun_wse", "--cs_ip", "127.0.0.1:1", "--job-dir",
                           str(tmp_path / "job"), "--", "sh", "-c", "echo ran"], cwd=tmp_path,
                          env={**ENV, jobs.STATE_DIR_ENV: str(blocked / "state")}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout == "ran\n", done.stderr
    assert re.search(rf"^csrun_wse: note: job \d+ runs, but csrun_job will not know it \({blocked}/state/jobs: "
                     r"Not a directory\)$", done.stderr, re.M), done.stderr


def test_csrun_job_cs_names_the_job_holding_the_cs_and_your_own_by_its_id(state_dir, tmp_path, server, capsys):
    from cs_api.client import CSClient, this_user
    from tests.wse_sim.test_wse_server import program, weights

    folder = tmp_path / "20261125-run"  # the CS knows a job by its folder's name
    folder.mkdir()
    jobs.register(jobs.JobRecord("4242", "local", str(folder), str(tmp_path), ("python", "run.py"), 1,
                                 server.address, False, "here", time.time()))
    holder = CSClient(server.address)
    holder.load(folder.name, program(), weights(), num_workers=1, global_step=5, first_batch=5)
    try:
        assert csrun_job.main(["cs", "--cs_ip", server.address]) == 0
        out = capsys.readouterr().out
    finally:
        holder.unload()
        holder.close()
    line = next(line for line in out.splitlines() if line.startswith("CS system at"))
    assert re.fullmatch(rf"CS system at {re.escape(server.address)}: busy with job 20261125-run of "
                        rf"{re.escape(this_user())} since [\d-]+ [\d:]+, step 5 \(your job 4242, job folder "
                        rf"{re.escape(str(folder))}\)", line), out
    with pytest.raises(SystemExit) as ended:
        csrun_job.main(["cs", "--cs_ip", f"127.0.0.1:{free_port()}"])
    assert ended.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("csrun_job: error: cannot reach the CS system at 127.0.0.1:"), err
