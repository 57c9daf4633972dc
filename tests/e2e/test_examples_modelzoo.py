"""The modelzoo-shaped FC-MNIST (`examples/modelzoo_fc_mnist`: the original's run.py, model.py,
data.py, utils.py and params.yaml keys on `launcher.run_utils`, which its run.py calls as
the original's: `update_params_from_args(args, params["runconfig"])`, then
`use_cs=is_cs(runconfig)`) trains on the job's CS under `csrun_wse` in every task, with the
CPU path's losses; its model reads `model.mixed_precision` for its Keras policy."""
from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import yaml
from fc_mnist_runs import ENV, REPO, losses

from examples.modelzoo_fc_mnist import data, model
from examples.modelzoo_fc_mnist.utils import get_params
from launcher.estimator import ModeKeys

EXAMPLE = REPO / "examples" / "modelzoo_fc_mnist"
STEPS = 6


def run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    result = subprocess.run(command, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def test_the_model_builds_its_layers_under_the_policy_model_mixed_precision_names():
    params = get_params(str(EXAMPLE / "configs" / "params.yaml"))
    assert params["model"]["mixed_precision"] is False and params["runconfig"]["multireplica"] is False
    for mixed, compute in ((False, tf.float32), (True, tf.float16)):
        params["model"]["mixed_precision"] = mixed
        with tf.Graph().as_default():
            features, labels = tf.compat.v1.data.make_one_shot_iterator(data.train_input_fn(params)).get_next()
            spec = model.model_fn(features, labels, ModeKeys.EVAL, params)
            logits = spec.host_call[1][0]
            assert logits.dtype == compute  # the layers compute in float16 under mixed_float16
            assert {v.dtype.base_dtype for v in tf.compat.v1.trainable_variables()} == {tf.float32}


@pytest.mark.slow
def test_modelzoo_fc_mnist_trains_on_the_jobs_cs_in_every_task_like_the_cpu_path(tmp_path):
    params = yaml.safe_load((EXAMPLE / "configs" / "params.yaml").read_text())
    params["runconfig"].update(max_steps=STEPS, save_checkpoints_steps=STEPS, log_step_count_steps=1)
    params["model"]["dropout"] = 0.0  # the CS draws dropout masks of its own: no step-for-step parity
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    args = ["--mode", "train", "-p", str(tmp_path / "params.yaml")]
    cpu = run(["python", str(EXAMPLE / "run.py"), *args, "-o", "cpu"], tmp_path)
    cs = run(["csrun_wse", "--tasks-per-node", "3", "--job-dir", "job", "python", str(EXAMPLE / "run.py"),
              *args, "-o", "cs"], tmp_path)
    assert "Simulated CS system:" in cs.stdout, cs.stdout + cs.stderr  # the chief trained on the CS
    assert sorted(losses(cs.stdout)) == list(range(1, STEPS + 1))
    np.testing.assert_allclose([losses(cs.stdout)[s] for s in range(1, STEPS + 1)],
                               [losses(cpu.stdout)[s] for s in range(1, STEPS + 1)], rtol=1e-3)
    for worker in (1, 2):  # both input workers streamed to it
        log = next((tmp_path / "job").glob(f"*_{worker}_log.out")).read_text()
        assert f"input worker {worker - 1}: sent" in log, log
