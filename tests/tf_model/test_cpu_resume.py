"""A `python run.py --mode train` killed with SIGKILL mid-way resumes from its newest
checkpoint and ends with the weights of an unbroken run."""
from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import yaml

from examples.fc_mnist import data, model
from launcher.estimator import CSEstimator, CSRunConfig
from tf_model.checkpoints import checkpoint_step, latest_checkpoint, read_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN_PY = os.path.join(ROOT, "examples", "fc_mnist", "run.py")
MAX_STEPS = 600
EVERY = 50


def params() -> dict:
    with open(os.path.join(ROOT, "examples", "fc_mnist", "configs", "params.yaml")) as f:
        p = yaml.safe_load(f)
    p["train_input"]["data_dir"] = None
    p["runconfig"].update(max_steps=MAX_STEPS, save_checkpoints_steps=EVERY, keep_checkpoint_max=3,
                          save_summary_steps=EVERY, log_step_count_steps=EVERY)
    return p


def start(params_path: str, model_dir: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, RUN_PY, "-p", params_path, "-o", model_dir],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))


def train_unbroken(model_dir: str) -> None:
    """The same run in process, without a stop: one checkpoint, at its end."""
    CSEstimator(model.model_fn, model_dir=model_dir,
                config=CSRunConfig(save_checkpoints_steps=MAX_STEPS, tf_random_seed=1234, log_step_count_steps=None,
                                   save_summary_steps=None),
                params=copy.deepcopy(params())).train(data.train_input_fn, max_steps=MAX_STEPS)


@pytest.mark.slow
def test_a_killed_run_resumes_and_ends_like_an_unbroken_one(tmp_path):
    params_path = tmp_path / "params.yaml"
    params_path.write_text(yaml.safe_dump(params()))
    broken = str(tmp_path / "broken")
    with ThreadPoolExecutor(1) as meanwhile:
        unbroken = meanwhile.submit(train_unbroken, str(tmp_path / "unbroken"))
        proc = start(str(params_path), broken)
        deadline = time.monotonic() + 300
        while True:  # kill once two checkpoints exist, well before the end
            latest = latest_checkpoint(broken)
            if latest is not None and checkpoint_step(latest) >= 2 * EVERY:
                break
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        killed_at = checkpoint_step(latest_checkpoint(broken))
        assert proc.returncode == -signal.SIGKILL and killed_at < MAX_STEPS

        again = start(str(params_path), broken)
        out, _ = again.communicate(timeout=300)
        assert again.returncode == 0, out
        assert f"Restoring parameters from {broken}/model.ckpt-{killed_at}" in out
        assert f"Training finished with {(MAX_STEPS - killed_at) * 256} samples" in out
        unbroken.result()

    a = read_checkpoint(latest_checkpoint(str(tmp_path / "unbroken")))
    b = read_checkpoint(latest_checkpoint(broken))
    assert b["global_step"] == MAX_STEPS and sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
