"""Input starvation, live: a csrun_wse run whose input_fn reads slowly (a user's slow reader)
logs that the CS waited for input, with the number of input workers that would keep up, and
its end-of-run summary says it too; a run whose input keeps up logs nothing of it."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from coordinator.starvation import StarvationWatch
from cs_api import pb
from slurm import jobs
from tests.fc_mnist_runs import ENV, EXAMPLE, REPO, fc_mnist_params

STARVED = re.compile(r"^Input starvation: the CS system waited for input (\d+)% of the time \(steps (\d+)-(\d+)\): "
                     r"1 input worker\(s\) delivered ([\d,]+) samples/s each, the CS system computed ([\d,]+); "
                     r"(\d+) input workers would keep up$", re.M)

# FC-MNIST's model, trained from a reader that yields one sample at a time after a pause (a
# slow disk or a remote store), as a user writes a Python reader for tf.data.
SLOW_READER = f'''
import os, sys, time
sys.path.insert(0, {str(REPO)!r})
import tensorflow as tf
from examples.fc_mnist.data import digits_as_mnist
from examples.fc_mnist.model import PARAMS_SPEC, model_fn
from launcher.run_flow import run

PAUSE_S = float(os.environ.get("READER_PAUSE_S", "0"))


def train_input_fn(params):
    images, labels = digits_as_mnist(True)

    def read():
        while True:
            for image, label in zip(images, labels):
                time.sleep(PAUSE_S)
                yield image, label

    dataset = tf.data.Dataset.from_generator(read, output_signature=(
        tf.TensorSpec((784,), tf.float32), tf.TensorSpec((), tf.int32)))
    return dataset.batch(params["train_input"]["batch_size"], drop_remainder=True)


if __name__ == "__main__":
    run(model_fn, train_input_fn, train_input_fn, here=os.path.dirname(os.path.abspath(__file__)),
        params_spec=PARAMS_SPEC)
'''


def timing(compute_s: float, wait_s: float) -> pb.StepTiming:
    return pb.StepTiming(wall_seconds=compute_s, input_wait_seconds=wait_s)


def test_a_window_waiting_for_input_names_the_workers_that_would_keep_up():
    watch = StarvationWatch(workers=2, batch_size=100)
    assert watch.step(1, timing(0.1, 30.0)) is None  # the first step: the workers' start
    lines = [watch.step(step, timing(0.5, 1.5)) for step in range(2, 7)]  # 2 s a step: 10 s a window
    assert lines[:4] == [None] * 4
    # 500 samples in 10 s from 2 workers: 25 samples/s each; the CS computed 500 in 2.5 s
    assert lines[4] == ("Input starvation: the CS system waited for input 75% of the time (steps 2-6): 2 input "
                        "worker(s) delivered 25 samples/s each, the CS system computed 200; 8 input workers "
                        "would keep up")
    for step in range(7, 12):  # a window that kept up (5 % waiting)
        assert watch.step(step, timing(1.9, 0.1)) is None
    assert watch.flush() is None
    # the run: 1,000 samples in 20 s from 2 workers, computed in 12 s
    assert watch.summary() == ("the CS system waited for input 40% of the time (steps 2-11): 2 input worker(s) "
                               "delivered 25 samples/s each, the CS system computed 83; 4 input workers would "
                               "keep up")
    kept_up = StarvationWatch(workers=1, batch_size=100)
    for step in range(1, 5):
        assert kept_up.step(step, timing(0.2, 0.02)) is None
    assert kept_up.flush() is None and kept_up.summary() == ""


def _train(tmp_path: Path, pause_s: float | None, steps: int,
           model: dict | None = None) -> tuple[subprocess.CompletedProcess, jobs.Progress]:
    """csrun_wse trains FC-MNIST for `steps` from the slow reader (`pause_s` a sample), or
    from the example's own input_fn (None: arrays in memory, tf.data's from_tensor_slices)."""
    script = tmp_path / "run.py" if pause_s is not None else EXAMPLE / "run.py"
    if pause_s is not None:
        script.write_text(SLOW_READER)
    params = fc_mnist_params(tmp_path, steps=steps, every=steps, model=model)
    job_dir = tmp_path / "job"
    done = subprocess.run([sys.executable, "-m", "launcher.csrun_wse", "--job-dir", str(job_dir), "python",
                           str(script), "-p", str(params), "-o", str(tmp_path / "m")], cwd=tmp_path,
                          env={**ENV, "READER_PAUSE_S": str(pause_s or 0), jobs.STATE_DIR_ENV: str(tmp_path / "state")},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    progress = jobs.Progress.read(job_dir)
    assert progress is not None and progress.finished
    return done, progress


@pytest.mark.slow
def test_a_slow_reader_starves_the_cs_and_the_run_says_how_many_workers_would_keep_up(tmp_path):
    # 256 samples a batch, 2 ms each: about 0.5 s a batch; the CS computes one in a few ms
    done, progress = _train(tmp_path, pause_s=0.002, steps=8)
    found = STARVED.findall(done.stdout)
    assert found, done.stdout
    percent, first, last, per_worker, cs_rate, needed = found[-1]
    assert int(percent) > 10 and (int(first), int(last)) == (2, 8)  # the first step is the workers' start
    rate = lambda text: float(text.replace(",", ""))  # noqa: E731
    assert rate(per_worker) < 600  # at most 500 samples/s: 2 ms a sample
    assert int(needed) >= 2 and abs(int(needed) - rate(cs_rate) / rate(per_worker)) <= 1.5  # (rounded rates)
    assert re.search(r"^Input starvation over the run: the CS system waited for input \d+% of the time", done.stdout,
                     re.M), done.stdout
    assert progress.starvation.startswith("the CS system waited for input")
    assert re.search(r"; input starvation: the CS system waited for input \d+% of the time .*"
                     r"(\d+) input workers would keep up$", done.stderr, re.M), done.stderr[-2000:]


@pytest.mark.slow
def test_a_reader_that_keeps_up_logs_no_starvation(tmp_path):
    # FC-MNIST 500-300 computes ~30k samples/s here, as fast as one worker slices arrays: a
    # wider network keeps the CS the slower side on any machine
    done, progress = _train(tmp_path, pause_s=None, steps=30, model={"hidden_sizes": [2048, 2048, 2048]})
    assert "starvation" not in done.stdout.lower() and "starvation" not in done.stderr.lower(), done.stdout
    assert progress.starvation == ""
