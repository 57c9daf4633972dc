"""The reliability suite, processes: SIGTERM / SIGHUP to csrun_wse leave nothing running,
a job with nothing to do ends at once, a frozen CS ends the job with one line, kill -9 of
the chief while it writes checkpoints never loses the newest one and a rerun resumes
exactly, and a second run on a model_dir is refused naming the first. Real processes."""
from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from launcher.csrun_wse import free_port
from tests.e2e.test_reliability_bad_inputs import TINY, write_params
from tests.fc_mnist_runs import ENV, EXAMPLE, losses
from tests.processes import left_running, run_py_in_process, start, wait_for_line
from tf_model import checkpoints

pytestmark = pytest.mark.slow
RUN_PY = str(EXAMPLE / "run.py")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_to_csrun_wse_leaves_nothing_running(signum, tmp_path):
    params = write_params(tmp_path, {"runconfig.max_steps": 100000, "runconfig.log_step_count_steps": 10})
    job_dir = tmp_path / "job"
    model_dir = tmp_path / "m"
    wse = start(["-m", "launcher.csrun_wse", "--tasks-per-node", "2", "--job-dir", str(job_dir),
                  "python", RUN_PY, "-p", str(params), "-o", str(model_dir)], tmp_path,
                 start_new_session=True)
    try:
        wait_for_line(wse, r"^global step \d+:")
        wse.send_signal(signum)
        sent = time.monotonic()
        out, err = wse.communicate(timeout=30)
        print(f"{signal.Signals(signum).name}: csrun_wse ended {time.monotonic() - sent:.1f} s "
              "after the signal")
    finally:
        if wse.poll() is None:
            wse.kill()
    name = signal.Signals(signum).name
    assert wse.returncode == 128 + signum
    assert err.strip().splitlines()[-1] == (
        f"csrun_wse: stopped by {name}: job {err.split('job ')[1].split(':')[0]} cancelled, every task "
        "stopped, the embedded CS system stopped")
    assert left_running(str(job_dir), 10) == []
    index = model_dir / "checkpoint"
    before = index.stat().st_mtime_ns if index.exists() else None
    time.sleep(3)
    assert (index.stat().st_mtime_ns if index.exists() else None) == before


def test_kill_9_of_csrun_wse_ends_its_embedded_cs_and_then_its_tasks(tmp_path):
    """...and leaves nothing in the temporary folder (the fork server's socket is abstract)."""
    params = write_params(tmp_path, {"runconfig.max_steps": 100000, "runconfig.log_step_count_steps": 10})
    job_dir = tmp_path / "job"
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    wse = start(["-m", "launcher.csrun_wse", "--tasks-per-node", "2", "--job-dir", str(job_dir),
                  "python", RUN_PY, "-p", str(params), "-o", str(tmp_path / "m")], tmp_path,
                 env={**ENV, "TMPDIR": str(scratch)})
    try:
        wait_for_line(wse, r"^global step \d+:")
        wse.kill()
        _, err = wse.communicate(timeout=30)
    finally:
        if wse.poll() is None:
            wse.kill()
    port = re.search(r"embedded CS system .* at [\d.]+:(\d+)", err).group(1)
    simulator = f"serve\0--fabric\0cs1\0--host\0127.0.0.1\0--port\0{port}\0"
    assert left_running(simulator, 10, 0.2) == [], "the embedded CS outlived csrun_wse"
    # the chief notices the CS gone (liveness, 30 s) and stops
    assert left_running(str(job_dir), 90, 0.2) == [], "a task outlived its CS by 90 s"
    assert sorted(os.listdir(scratch)) == []


def test_a_job_with_nothing_to_do_ends_at_once_and_tells_its_workers(tmp_path):
    params = write_params(tmp_path)
    model_dir = tmp_path / "m"
    run_py_in_process(EXAMPLE / "run.py", ["-p", params, "-o", model_dir], tmp_path)  # to its max_steps
    job_dir = tmp_path / "job"
    done = subprocess.run([sys.executable, "-m", "launcher.csrun_wse", "--tasks-per-node", "3", "--job-dir",
                           str(job_dir), "python", RUN_PY, "-p", str(params), "-o", str(model_dir)],
                          cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Skipping training since max_steps has already saved: 2" in done.stdout
    for rank in (1, 2):
        (log,) = job_dir.glob(f"*_{rank}_log.out")
        assert "nothing to stream: the chief had nothing to do" in log.read_text()


def _serve(tmp_path: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "wse_sim.cli", "serve", "--port", str(port)],
                              env=ENV, stdout=open(tmp_path / "wse_sim.log", "w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return server, f"127.0.0.1:{port}"
        time.sleep(0.2)
    server.kill()
    raise AssertionError("wse_sim serve did not start")


def test_a_frozen_cs_ends_the_job_with_one_line_within_60_s(tmp_path):
    server, address = _serve(tmp_path)
    params = write_params(tmp_path, {"runconfig.max_steps": 100000, "runconfig.save_checkpoints_steps": 50,
                                     "runconfig.log_step_count_steps": 10})
    chief = start([RUN_PY, "-p", str(params), "-o", str(tmp_path / "m"), "--cs_ip", address], tmp_path)
    try:
        wait_for_line(chief, r"^global step \d+:")
        server.send_signal(signal.SIGSTOP)
        frozen = time.monotonic()
        _, err = chief.communicate(timeout=120)
        took = time.monotonic() - frozen
    finally:
        server.send_signal(signal.SIGCONT)
        server.kill()
        server.wait()
        if chief.poll() is None:
            chief.kill()
    print(f"frozen CS: the job ended {took:.1f} s after SIGSTOP")
    assert chief.returncode == 1 and took < 60, (took, err)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and f"the CS system at {address} stopped answering" in lines[0], err


def test_a_second_run_on_a_model_dir_is_refused_naming_the_first(tmp_path):
    params = write_params(tmp_path, {"runconfig.max_steps": 100000, "runconfig.log_step_count_steps": 10})
    model_dir = tmp_path / "m"
    first = start([RUN_PY, "-p", str(params), "-o", str(model_dir)], tmp_path)
    try:
        wait_for_line(first, r"^global step \d+:")
        second = subprocess.run([sys.executable, RUN_PY, "-p", str(params), "-o", str(model_dir)], env=ENV,
                                capture_output=True, text=True, timeout=300)
        job = subprocess.run([sys.executable, "-m", "launcher.csrun_wse", "--job-dir", str(tmp_path / "job"),
                              "python", RUN_PY, "-p", str(params), "-o", str(model_dir)], cwd=tmp_path,
                             env=ENV, capture_output=True, text=True, timeout=300)
    finally:
        first.kill()
        first.wait()
    holder = f"is in use by another run: pid {first.pid} on host {socket.gethostname()}"
    assert second.returncode == 1 and "Traceback" not in second.stderr
    assert second.stderr.strip().startswith(f"run.py: error: model_dir {model_dir} {holder}"), second.stderr
    assert job.returncode == 1 and holder in job.stderr.strip().splitlines()[-1], job.stderr
    after = subprocess.run([sys.executable, RUN_PY, "-p", str(params), "-o", str(model_dir), "--steps", "1"],
                           env=ENV, capture_output=True, text=True, timeout=300)
    assert after.returncode == 0, after.stderr  # the killed run's lock is taken over
    assert f"ended without releasing it (pid {first.pid}" in after.stdout


KILLS = 10
REFERENCE_STEPS = 400
BATCH = TINY["train_input"]["batch_size"]


def test_kill_9_of_the_chief_while_it_writes_checkpoints(tmp_path):
    """A checkpoint every step, SIGKILL at varied points, 10 times: the newest checkpoint
    always loads, no leftovers pile up, and every rerun resumes exactly (its losses are the
    unbroken run's, step for step; the unbroken run trains meanwhile, in process); a last
    rerun, not killed, resumes from the newest checkpoint, trains only the steps left and
    ends with the unbroken run's weights, bit for bit."""
    (tmp_path / "reference").mkdir()
    reference_params = write_params(tmp_path / "reference", {"runconfig.max_steps": REFERENCE_STEPS,
                                                             "runconfig.save_checkpoints_steps": None})
    with ThreadPoolExecutor(1) as meanwhile:
        unbroken = meanwhile.submit(run_py_in_process, EXAMPLE / "run.py",
                                    ["-p", reference_params, "-o", tmp_path / "reference"], tmp_path)
        params = write_params(tmp_path, {"runconfig.max_steps": REFERENCE_STEPS, "runconfig.keep_checkpoint_max": 3})
        model_dir = tmp_path / "m"
        rng = random.Random(12)
        newest, resumed, rerun_losses = 0, 0, []
        for _ in range(KILLS):
            chief = start([RUN_PY, "-p", str(params), "-o", str(model_dir)], tmp_path)
            try:
                seen = wait_for_line(chief, r"^Saving checkpoints for \d+")
                time.sleep(rng.uniform(0.0, 0.4))
            finally:
                chief.kill()
                rest, _ = chief.communicate()
            output = "".join(seen) + rest
            restored = re.search(r"Restoring parameters from .*model\.ckpt-(\d+)", output)
            assert (int(restored.group(1)) if restored else 0) == newest
            resumed += restored is not None
            rerun_losses.append(losses(output))
            latest = checkpoints.latest_checkpoint(str(model_dir))
            assert latest is not None and checkpoints.damage(latest) is None
            assert checkpoints.checkpoint_step(latest) >= newest
            newest = checkpoints.checkpoint_step(latest)
            if newest >= REFERENCE_STEPS:
                break
        expected = losses(unbroken.result())
        for run in rerun_losses:
            for step, loss in run.items():
                assert loss == expected[step], (step, loss, expected[step])
    leftovers = [p.name for p in model_dir.iterdir() if ".tmp-" in p.name]
    assert len(leftovers) <= 4  # at most the last kill's, cleaned by the next run
    assert resumed >= min(KILLS - 1, 10)
    assert newest < REFERENCE_STEPS  # the kills land early: the last rerun has steps left
    last = subprocess.run([sys.executable, RUN_PY, "-p", str(params), "-o", str(model_dir)], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert last.returncode == 0, last.stderr
    assert f"Restoring parameters from {model_dir}/model.ckpt-{newest}\n" in last.stdout, last.stdout
    assert f"Training finished with {(REFERENCE_STEPS - newest) * BATCH} samples" in last.stdout, last.stdout
    ended = checkpoints.read_checkpoint(checkpoints.latest_checkpoint(str(model_dir)))
    unbroken_end = checkpoints.read_checkpoint(checkpoints.latest_checkpoint(str(tmp_path / "reference")))
    assert ended["global_step"] == REFERENCE_STEPS and sorted(ended) == sorted(unbroken_end)
    for name in unbroken_end:
        np.testing.assert_array_equal(ended[name], unbroken_end[name], err_msg=name)
    print(f"{KILLS} kills: newest checkpoint always intact; {resumed} reruns resumed exactly, up to step {newest}")
