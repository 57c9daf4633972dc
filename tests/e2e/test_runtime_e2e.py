"""The CS runtime end to end: real `csrun_wse` subprocesses on FC-MNIST.

One CPU reference run (run.py in this process, plain TensorFlow) and one unbroken CS run
(chief + 1 input worker + embedded simulator) are shared by the tests of this module.
Runs are short (12 Adam steps): the simulator's float32 GEMMs sum in another order than
TensorFlow's, and a ReLU whose input rounds across 0 then flips one sample's gradient,
which Adam's sign-like step amplifies — 12 steps stay well inside the 1e-3 contract.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import yaml
from fc_mnist_runs import ENV, EXAMPLE, REPO, eval_results, fc_mnist_params, losses
from processes import run_py_in_process, together

from common.errors import CSRunError
from cs_api.client import CSClient
from launcher.csrun_wse import free_port
from tf_model import checkpoints

pytestmark = pytest.mark.slow

STEPS, EVERY, EVAL_STEPS = 12, 4, 3


def write_params(folder: Path, **runconfig) -> Path:
    return fc_mnist_params(folder, steps=STEPS, every=EVERY, **runconfig)


def in_process(args: list) -> str:
    """`python run.py ARGS` of the example, in this process (the CPU path): its output."""
    return run_py_in_process(EXAMPLE / "run.py", args, EXAMPLE)


def csrun_wse_command(job_dir: Path, tasks: int, args: list, script: str = "run.py",
                      cs_ip: str | None = None) -> list[str]:
    flags = ["--tasks-per-node", str(tasks), "--job-dir", str(job_dir)]
    flags += ["--cs_ip", cs_ip] if cs_ip else []
    return ["csrun_wse", *flags, "--", "python", script, *map(str, args)]


def csrun_wse(job_dir: Path, tasks: int, args: list, script: str = "run.py", cs_ip: str | None = None,
              cwd: Path = EXAMPLE, ok: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(csrun_wse_command(job_dir, tasks, args, script, cs_ip), cwd=cwd, env=ENV,
                            capture_output=True, text=True, timeout=300)
    if ok:
        assert result.returncode == 0, result.stdout + result.stderr
    return result


def final_state(model_dir: Path) -> dict[str, np.ndarray]:
    path = checkpoints.latest_checkpoint(str(model_dir))
    assert path is not None and checkpoints.checkpoint_step(path) == STEPS
    return checkpoints.read_checkpoint(path)


def assert_losses_match(cs: dict[int, float], cpu: dict[int, float], steps) -> None:
    steps = list(steps)
    assert sorted(cs) == steps
    np.testing.assert_allclose([cs[s] for s in steps], [cpu[s] for s in steps], rtol=1e-3)


def one_error_line(result: subprocess.CompletedProcess) -> str:
    """The run failed with exactly one `csrun_wse: error: … (hint: …)` line, no traceback."""
    assert result.returncode != 0
    assert "Traceback" not in result.stdout + result.stderr, result.stdout + result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith("csrun_wse: error: ")]
    assert len(lines) == 1, result.stderr
    assert "(hint: " in lines[0]
    return lines[0]


@dataclass(frozen=True)
class Run:
    folder: Path
    params: Path
    model_dir: Path
    output: str

    @property
    def losses(self) -> dict[int, float]:
        return losses(self.output)


@pytest.fixture(scope="module")
def reference_runs(tmp_path_factory) -> tuple[Run, Run]:
    """The CPU reference (run.py in process) and an unbroken CS run (chief + 1 input worker +
    the embedded simulator), run at once."""
    cpu, cs = tmp_path_factory.mktemp("cpu"), tmp_path_factory.mktemp("cs")
    cpu_params, cs_params = write_params(cpu), write_params(cs)
    on_cpu, on_cs = together(
        partial(in_process, ["--mode", "train", "-p", cpu_params, "-o", cpu / "model"]),
        partial(csrun_wse, cs / "job", 2, ["--mode", "train", "-p", cs_params, "-o", cs / "model"]))
    return Run(cpu, cpu_params, cpu / "model", on_cpu), Run(cs, cs_params, cs / "model", on_cs.stdout)


@pytest.fixture(scope="module")
def cpu_reference(reference_runs) -> Run:
    run = reference_runs[0]
    assert sorted(run.losses) == list(range(1, STEPS + 1))
    return run


@pytest.fixture(scope="module")
def cs_run(reference_runs) -> Run:
    return reference_runs[1]


@pytest.fixture
def external_cs(tmp_path):
    """A `wse_sim serve` of its own, for --cs_ip; it frees a job after 5 s without a call."""
    port = free_port()
    log = open(tmp_path / "wse_sim.log", "w")
    process = subprocess.Popen(["wse_sim", "serve", "--port", str(port), "--idle-timeout", "5"],
                               env=ENV, stdout=log, stderr=subprocess.STDOUT)
    address = f"127.0.0.1:{port}"
    wait_until(lambda: cs_state(address) is not None, "wse_sim serve answers")
    yield address
    process.terminate()
    process.wait(10)
    log.close()


def cs_state(address: str) -> str | None:
    client = CSClient(address)
    try:
        return client.status().state
    except CSRunError:
        return None
    finally:
        client.close()


def wait_until(condition, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.3)


# ---- parity: every worker count trains like the CPU path ----
def test_two_tasks_train_like_the_cpu_path(cs_run, cpu_reference):
    assert_losses_match(cs_run.losses, cpu_reference.losses, range(1, STEPS + 1))
    for step in range(EVERY, STEPS + 1, EVERY):
        assert f"Saving checkpoints for {step} into" in cs_run.output
    assert re.search(r"Simulated CS system: [\d,]+ samples/second .* wall clock here: [\d,]+ samples/second",
                     cs_run.output)
    assert (cs_run.model_dir / "params.yaml").exists()
    assert list(cs_run.model_dir.glob("events.out.tfevents.*"))
    # every task's log stays in the job folder
    logs = sorted(p.name for p in (cs_run.folder / "job").glob("*_log.out"))
    assert len(logs) == 2 and (cs_run.folder / "job" / "wse_sim.log").exists()


@pytest.mark.parametrize("tasks", [1, 3])
def test_every_worker_count_trains_like_the_cpu_path(tmp_path, cpu_reference, tasks):
    result = csrun_wse(tmp_path / "job", tasks, ["--mode", "train", "-p", cpu_reference.params,
                                                 "-o", tmp_path / "model"])
    assert_losses_match(losses(result.stdout), cpu_reference.losses, range(1, STEPS + 1))


# ---- checkpoints cross between the paths ----
def test_cs_checkpoint_evaluates_the_same_on_the_cpu_and_the_cs(cs_run):
    args = ["--mode", "eval", "--eval_steps", EVAL_STEPS, "-p", cs_run.params, "-o", cs_run.model_dir]
    on_cpu, on_cs = together(partial(in_process, args), partial(csrun_wse, cs_run.folder / "eval_job", 2, args))
    cpu, cs = eval_results(on_cpu), eval_results(on_cs.stdout)
    assert cpu["global_step"] == cs["global_step"] == STEPS
    assert cs["accuracy"] == pytest.approx(cpu["accuracy"], abs=1e-6)
    assert cs["loss"] == pytest.approx(cpu["loss"], rel=1e-4)


def test_cs_predictions_equal_the_cpu_paths(cs_run, tmp_path):
    """Both paths predict at once from the CS run's checkpoint (the CPU path from a copy of
    its model_dir: each writes model_dir/predict/)."""
    copy = tmp_path / "model"
    shutil.copytree(cs_run.model_dir, copy, ignore=shutil.ignore_patterns(".csrun.lock", "predict"))
    args = ["--mode", "predict", "-p", cs_run.params, "-o"]
    together(partial(in_process, [*args, copy]),
             partial(csrun_wse, cs_run.folder / "predict_job", 2, [*args, cs_run.model_dir]))
    with np.load(copy / "predict" / f"predictions-{STEPS}.npz") as f:
        cpu = dict(f)
    with np.load(cs_run.model_dir / "predict" / f"predictions-{STEPS}.npz") as f:
        cs = dict(f)
    assert set(cs) == set(cpu) and cpu
    for key in cpu:
        assert cs[key].shape == cpu[key].shape
        if np.issubdtype(cpu[key].dtype, np.integer):
            np.testing.assert_array_equal(cs[key], cpu[key], err_msg=key)
        else:
            np.testing.assert_allclose(cs[key], cpu[key], rtol=1e-4, atol=1e-6, err_msg=key)


def test_cpu_checkpoint_resumes_on_the_cs(tmp_path, cpu_reference):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    for f in cpu_reference.model_dir.glob(f"model.ckpt-{2 * EVERY}.*"):
        shutil.copy(f, model_dir)
    (model_dir / "checkpoint").write_text(f'model_checkpoint_path: "model.ckpt-{2 * EVERY}"\n'
                                          f'all_model_checkpoint_paths: "model.ckpt-{2 * EVERY}"\n')
    result = csrun_wse(tmp_path / "job", 2, ["--mode", "train", "-p", cpu_reference.params, "-o", model_dir])
    assert "Restoring parameters from" in result.stdout
    assert_losses_match(losses(result.stdout), cpu_reference.losses, range(2 * EVERY + 1, STEPS + 1))


# ---- a killed run resumes and ends like an unbroken one ----
def job_processes(job_dir: Path, model_dir: Path) -> dict[int, int]:
    """rank → pid of the job's two `python run.py` task processes (plain, or forked by the
    local backend's fork server: their command line is the task's, their /proc environ the
    server's), found through /proc; the chief is the pid holding model_dir's lock."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            environ = dict(kv.split(b"=", 1) for kv in (entry / "environ").read_bytes().split(b"\0")
                           if b"=" in kv)
        except OSError:
            continue
        if environ.get(b"CSRUN_JOB_DIR") == str(job_dir).encode() and b"run.py" in cmdline \
                and not any(arg.endswith(b"fork_server.py") for arg in cmdline):
            found.append(int(entry.name))
    chief = int(re.search(r"pid=(\d+)", (model_dir / ".csrun.lock").read_text()).group(1))
    assert chief in found and len(found) == 2, (chief, found)
    return {0: chief, 1: next(pid for pid in found if pid != chief)}


def child_simulator(parent: int) -> int:
    """The pid of the embedded `wse_sim serve` that csrun_wse `parent` started."""
    for entry in Path("/proc").iterdir():
        try:
            status = (entry / "status").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if f"\nPPid:\t{parent}\n" in status and b"wse_sim.cli" in cmdline and b"serve" in cmdline:
            return int(entry.name)
    raise AssertionError(f"no embedded simulator under pid {parent}")


def run_and_kill(command: list[str], victim, at_step: int) -> tuple[int, str, float]:
    """Start `command`, kill `victim(process)`'s pid once the chief saved its checkpoint of
    `at_step`; the exit code, the output, and how long the job took to stop."""
    process = subprocess.Popen(command, cwd=EXAMPLE, env=ENV, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    output = []
    for line in process.stdout:
        output.append(line)
        if line.startswith(f"Saving checkpoints for {at_step} into"):
            os.kill(victim(process), signal.SIGKILL)
            killed = time.monotonic()
            break
    else:
        pytest.fail("the run ended before its first checkpoint:\n" + "".join(output))
    rest, _ = process.communicate(timeout=120)
    return process.returncode, "".join(output) + rest, time.monotonic() - killed


@pytest.mark.parametrize("victim", ["chief", "worker", "simulator"])
def test_killed_run_resumes_to_the_unbroken_runs_weights(tmp_path, cs_run, external_cs, victim):
    job_dir = tmp_path / "job"
    # A checkpoint every step: the run's remaining steps then outlast the kill's latency
    # (checkpointing reads the CS, it does not change the training).
    params = fc_mnist_params(tmp_path, steps=STEPS, every=1)
    args = ["--mode", "train", "-p", params, "-o", tmp_path / "model"]
    cs_ip = external_cs if victim == "chief" else None  # a dead chief's job must be freed
    pick = {"chief": lambda p: job_processes(job_dir, tmp_path / "model")[0],
            "worker": lambda p: job_processes(job_dir, tmp_path / "model")[1],
            "simulator": lambda p: child_simulator(p.pid)}[victim]
    code, output, stop_s = run_and_kill(csrun_wse_command(job_dir, 2, args, cs_ip=cs_ip), pick, 2)
    assert code != 0, output
    assert stop_s < 30, output
    newest = checkpoints.latest_checkpoint(str(tmp_path / "model"))
    assert newest is not None and checkpoints.checkpoint_step(newest) < STEPS
    if cs_ip:  # the CS frees the dead chief's job (at once if a run was in flight, else when idle)
        wait_until(lambda: cs_state(cs_ip) == "idle", "the CS frees the dead chief's job", 30)
    result = csrun_wse(tmp_path / "job2", 2, args, cs_ip=cs_ip)
    assert f"Restoring parameters from {newest}" in result.stdout
    resumed, unbroken = final_state(tmp_path / "model"), final_state(cs_run.model_dir)
    assert set(resumed) == set(unbroken)
    for name in unbroken:
        np.testing.assert_array_equal(resumed[name], unbroken[name], err_msg=name)


# ---- bad inputs: one line, non-zero exit, no traceback ----
def test_unreachable_cs_is_one_line(tmp_path, cs_run):
    address = f"127.0.0.1:{free_port()}"
    result = csrun_wse(tmp_path / "job", 2, ["--mode", "train", "-p", cs_run.params, "-o", tmp_path / "m"],
                       cs_ip=address, ok=False)
    assert f"cannot reach the CS system at {address}" in one_error_line(result)


def test_busy_cs_is_one_line(tmp_path, cs_run, external_cs):
    from coordinator.compiler import compile_model

    sys.path.insert(0, str(REPO))
    from examples.fc_mnist.data import train_input_fn
    from examples.fc_mnist.model import model_fn

    params = yaml.safe_load(cs_run.params.read_text())
    compiled = compile_model(model_fn, train_input_fn, params, str(tmp_path / "held"))
    holder = CSClient(external_cs)
    holder.load("someone-else", compiled.program, dict(compiled.initial_weights), 1, 0, 0)
    done = threading.Event()

    def hold():  # a call now and then, so that the CS does not free the held job as idle
        while not done.wait(1.0):
            holder.snapshot()

    keeper = threading.Thread(target=hold)
    keeper.start()
    try:
        result = csrun_wse(tmp_path / "job", 2, ["--mode", "train", "-p", cs_run.params, "-o", tmp_path / "m"],
                           cs_ip=external_cs, ok=False)
    finally:
        done.set()
        keeper.join()
        holder.unload()
        holder.close()
    line = one_error_line(result)
    assert f"the CS system at {external_cs} is busy" in line and "task 0 (chief)" in line


VARIANT = """\
import os, sys
sys.path.insert(0, {repo!r})
import numpy as np
import tensorflow as tf
from examples.fc_mnist.data import eval_input_fn, train_input_fn
from examples.fc_mnist.model import model_fn
from launcher.run_flow import run

RANK = int(os.environ.get("SUBMITIT_LOCAL_GLOBALID", "0"))


def variant_input_fn(params):
    dataset = train_input_fn(params)
{body}

if __name__ == "__main__":
    run(model_fn, variant_input_fn, eval_input_fn, here={example!r})
"""


def variant(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "variant.py"
    script.write_text(VARIANT.format(repo=str(REPO), example=str(EXAMPLE), body=body))
    return script


def test_worker_with_other_input_shapes_is_stopped_naming_both(tmp_path, cs_run):
    # as when a worker node mounts other data: its samples have 783 features, not 784
    script = variant(tmp_path, "    if RANK > 0:\n"
                               "        dataset = dataset.map(lambda x, y: (x[:, :783], y))\n"
                               "    return dataset\n")
    result = csrun_wse(tmp_path / "job", 2, ["--mode", "train", "-p", cs_run.params, "-o", tmp_path / "m"],
                       script=str(script), ok=False)
    line = one_error_line(result)
    assert "task 1 (input worker)" in line
    assert "(256, 783) float32" in line and "(256, 784) float32" in line


def test_worker_crash_mid_run_stops_the_job_naming_it(tmp_path, cs_run):
    body = ("    def crash(i, x, y):\n"
            "        if RANK > 0 and i == 6:\n"
            "            os._exit(3)\n"
            "        return x\n"
            "    return dataset.enumerate().map(lambda i, xy: (tf.numpy_function(crash, [i, *xy], tf.float32,\n"
            "                                   stateful=True), xy[1])).map(lambda x, y: (tf.ensure_shape(x, [256, 784]), y))\n")
    start = time.monotonic()
    result = csrun_wse(tmp_path / "job", 2, ["--mode", "train", "-p", cs_run.params, "-o", tmp_path / "m"],
                       script=str(variant(tmp_path, body)), ok=False)
    assert time.monotonic() - start < 120
    line = one_error_line(result)
    assert "task 1 (input worker) failed" in line and "exit" in line


def test_nan_loss_stops_naming_the_step_and_keeps_the_last_good_checkpoint(tmp_path, cs_run):
    body = ("    nan = tf.constant(float('nan'))\n"
            "    return dataset.enumerate().map(\n"
            "        lambda i, xy: (tf.where(i == 6, xy[0] * nan, xy[0]), xy[1]))\n")
    result = csrun_wse(tmp_path / "job", 2, ["--mode", "train", "-p", cs_run.params, "-o", tmp_path / "m"],
                       script=str(variant(tmp_path, body)), ok=False)
    line = one_error_line(result)
    assert "the loss became nan at step 7" in line
    newest = checkpoints.latest_checkpoint(str(tmp_path / "m"))
    assert checkpoints.checkpoint_step(newest) == EVERY
    state = checkpoints.read_checkpoint(newest)
    assert all(np.isfinite(v).all() for v in state.values() if np.issubdtype(np.asarray(v).dtype, np.floating))
