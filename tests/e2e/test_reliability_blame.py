"""The reliability suite, blame: when a job fails, csrun_wse's one line names the process that
failed first and why, not one that failed because of it (a killed CS is not the input
worker's failure; a worker's input_fn error is not the chief's). Real jobs of a chief and
an input worker; the verdict itself (`slurm.blame`) on recorded failures."""
from __future__ import annotations

import os
import signal
import subprocess
import textwrap
from pathlib import Path

import pytest

from common.task_failure import CS, OWN, TaskFailure, rank_cause
from slurm.blame import Blame, blame
from slurm.submitit_api import TaskResult
from tests.e2e.test_reliability_bad_inputs import write_params
from tests.fc_mnist_runs import EXAMPLE, REPO
from tests.processes import start, wait_for_line


def _failed(*ranks: int) -> list[TaskResult]:
    return [TaskResult(rank, False, "TaskFailed: exit code 1", 1000 + i) for i, rank in enumerate(ranks)]


def test_a_tasks_own_failure_is_named_before_the_consequence_reported_first():
    # the chief's result came first, its failure follows worker 0's (task 1), whose record is there
    records = {0: TaskFailure(0, 5, rank_cause(1)), 1: TaskFailure(1, 7, OWN)}
    assert blame(_failed(0), records, 2, waited_out=False) == Blame(rank=1)
    # task 1 has reported nothing yet: wait for it, then (waited out) name the first result
    assert blame(_failed(0), {0: records[0]}, 2, waited_out=False).waiting
    assert blame(_failed(0), {0: records[0]}, 2, waited_out=True) == Blame(rank=0)
    # a task that failed without a record (a traceback, a signal) failed on its own
    assert blame(_failed(1, 0), {0: records[0]}, 2, waited_out=False) == Blame(rank=1)


def test_tasks_that_lost_the_cs_blame_the_cs_and_two_own_failures_the_earlier():
    lost = {0: TaskFailure(0, 9, CS), 1: TaskFailure(1, 8, CS)}
    assert blame(_failed(1, 0), lost, 2, waited_out=False) == Blame(cs=True)
    # the chief's failure follows worker 1's (task 2), which lost the CS: the CS
    chain = {0: TaskFailure(0, 9, rank_cause(2)), 2: TaskFailure(2, 8, CS)}
    assert blame(_failed(0), chain, 3, waited_out=False) == Blame(cs=True)
    both = {1: TaskFailure(1, 9, OWN), 2: TaskFailure(2, 4, OWN)}
    assert blame(_failed(1, 2), both, 3, waited_out=False) == Blame(rank=2)


def _job(tmp_path: Path, script: Path, params: Path) -> subprocess.Popen:
    return start(["-m", "launcher.csrun_wse", "--tasks-per-node", "2", "--job-dir", str(tmp_path / "job"),
                   "python", str(script), "-p", str(params), "-o", str(tmp_path / "m")], tmp_path)


@pytest.mark.slow
def test_a_killed_embedded_cs_is_named_not_the_input_worker(tmp_path):
    params = write_params(tmp_path, {"runconfig.max_steps": 100000, "runconfig.log_step_count_steps": 10})
    wse = _job(tmp_path, EXAMPLE / "run.py", params)
    try:
        wait_for_line(wse, r"^global step \d+:")
        children = " ".join(Path(f"/proc/{wse.pid}/task/{t}/children").read_text()
                            for t in os.listdir(f"/proc/{wse.pid}/task"))
        (simulator,) = [int(pid) for pid in children.split()
                        if b"wse_sim.cli" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        os.kill(simulator, signal.SIGKILL)
        _, err = wse.communicate(timeout=120)
    finally:
        if wse.poll() is None:
            wse.kill()
    last = err.strip().splitlines()[-1]
    assert wse.returncode == 1
    assert last.startswith("csrun_wse: error: the embedded CS system at 127.0.0.1:"), err
    assert "ended while the job ran (killed by SIGKILL; its log: wse_sim.log)" in last, err


# FC-MNIST whose input_fn meets a corrupt record in batch 3, in the input worker (the chief
# never iterates it); the worker's process then takes 3 s longer to end than the chief's (a
# slow teardown), so the chief's consequence ("the input stream of worker 0 broke") is always
# the first result the launcher sees.
FAILING_INPUT = """
import atexit, os, sys, time
sys.path.insert(0, {repo!r})
import tensorflow as tf
from examples.fc_mnist.data import eval_input_fn, train_input_fn as fc_mnist_input_fn
from examples.fc_mnist.model import PARAMS_SPEC, model_fn
from launcher.run_flow import run

def train_input_fn(params):
    def check(index, batch):
        tf.debugging.assert_less(index, tf.constant(3, tf.int64), message="corrupt record in batch 3")
        return batch
    return fc_mnist_input_fn(params).enumerate().map(check)

if os.environ.get("SUBMITIT_LOCAL_GLOBALID") == "1":
    atexit.register(time.sleep, 3)
run(model_fn, train_input_fn, eval_input_fn, here={example!r}, params_spec=PARAMS_SPEC)
"""


@pytest.mark.slow
def test_an_input_workers_failing_input_fn_is_named_not_the_chief(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(FAILING_INPUT.format(repo=str(REPO), example=str(EXAMPLE))))
    params = write_params(tmp_path, {"runconfig.max_steps": 100})
    done = _job(tmp_path, script, params)
    _, err = done.communicate(timeout=300)
    last = err.strip().splitlines()[-1]
    assert done.returncode == 1
    assert last.startswith("csrun_wse: error: task 1 (input worker) failed: run.py: error: "), err
    assert "corrupt record in batch 3" in last, err
