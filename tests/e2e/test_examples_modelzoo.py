"""The modelzoo-shaped FC-MNIST (`examples/modelzoo_fc_mnist`: the original's run.py, model.py,
data.py, utils.py and params.yaml keys on `launcher.run_utils`, which its run.py calls as
the original's: `update_params_from_args(args, params["runconfig"])`, then
`use_cs=is_cs(runconfig)`) trains on the job's CS under `csrun_wse` in every task, with the
CPU path's losses, mixed_float16 and float16 images as the original ships it, and evaluates
there as the CPU path does; its model reads `model.mixed_precision` for its Keras policy and
`optimizer.loss_scaling_factor` for TensorFlow's loss-scale optimizer."""
from __future__ import annotations

import subprocess
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import yaml
from cs_inprocess import compile_checked
from fc_mnist_runs import ENV, REPO, eval_results, losses
from processes import run_py_in_process, together

from cs_api.attrs import from_attr
from examples.modelzoo_fc_mnist import data, model
from examples.modelzoo_fc_mnist.utils import get_params
from launcher.estimator import ModeKeys

EXAMPLE = REPO / "examples" / "modelzoo_fc_mnist"
STEPS = 30
LARGE = 10  # the first steps, while the loss is large (float16 ULPs amplify as it falls)


def run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    result = subprocess.run(command, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def test_the_model_builds_its_layers_under_the_policy_model_mixed_precision_names():
    params = get_params(str(EXAMPLE / "configs" / "params.yaml"))
    assert params["model"]["mixed_precision"] is True and params["runconfig"]["multireplica"] is False
    for mixed, compute in ((False, tf.float32), (True, tf.float16)):
        params["model"]["mixed_precision"] = mixed
        with tf.Graph().as_default():
            features, labels = tf.compat.v1.data.make_one_shot_iterator(data.train_input_fn(params)).get_next()
            spec = model.model_fn(features, labels, ModeKeys.EVAL, params)
            logits = spec.host_call[1][0]
            assert features.dtype == compute  # the input_fn's images: float16 as the original's
            assert logits.dtype == compute  # the layers compute in float16 under mixed_float16
            assert {v.dtype.base_dtype for v in tf.compat.v1.trainable_variables()} == {tf.float32}


@pytest.mark.slow
def test_loss_scaling_factor_is_a_static_scale_or_tensorflows_dynamic_rule_on_the_cs(tmp_path):
    """A number wraps the optimizer in MixedPrecisionLossScaleOptimizer: S seeds the CS's
    float16 backward and 1/S scales the gradients; 'tf_dynamic' compiles to TensorFlow's dynamic
    rule (its scale and good-step variables, doubling every 2,000 finite steps), 'dynamic' to
    the CS-1's (its scale and two counters, clipped to [2 ** -14, 2 ** 15])."""
    params = get_params(str(EXAMPLE / "configs" / "params.yaml"))
    params["optimizer"]["loss_scaling_factor"] = 1024.0
    compiled = compile_checked(model.model_fn, data.train_input_fn, params, str(tmp_path / "static"))
    loss = next(k for k in compiled.program.kernels if k.type == "loss")
    assert from_attr(loss.attrs["loss_scale"]) == 1024.0
    assert [t.value for t in compiled.program.gradient_transforms] == [1 / 1024]
    assert not compiled.program.HasField("dynamic_loss_scale")
    params["optimizer"]["loss_scaling_factor"] = "tf_dynamic"
    compiled = compile_checked(model.model_fn, data.train_input_fn, params, str(tmp_path / "dynamic"))
    dynamic = compiled.program.dynamic_loss_scale
    assert dynamic.scale_variable and dynamic.good_steps_variable
    assert (dynamic.increment_period, dynamic.multiplier) == (2000, 2.0)
    params["optimizer"]["loss_scaling_factor"] = "dynamic"
    compiled = compile_checked(model.model_fn, data.train_input_fn, params, str(tmp_path / "cs1"))
    cs1 = compiled.program.cs1_dynamic_loss_scale
    assert (cs1.steps_variable, cs1.overflows_variable) == ("steps_since_rescale", "overflows_since_rescale")
    assert (cs1.increment_period, cs1.min_scale, cs1.max_scale) == (2000, 2.0 ** -14, 2.0 ** 15)
    assert compiled.program.step_counts_applied


@pytest.mark.slow
def test_modelzoo_fc_mnist_trains_mixed_on_the_jobs_cs_in_every_task_like_the_cpu_path(tmp_path):
    """The shipped params (mixed_float16, dropout off) for STEPS (30) steps, run.py on the CPU
    (in process, beside the CS run) and `csrun_wse` (3 tasks) on the CS: each of the first LARGE (10) steps' losses
    within 1e-2 relative of the CPU's, and the mean relative difference over all 30 within 1e-2
    (float16 rounds the same values one ULP apart now and then, and the relative difference
    of a small loss grows). Then the CS's checkpoint evaluates (3 batches) on the CS to the CPU's
    accuracy of the same checkpoint (equal), its loss within 1e-2 relative."""
    params = yaml.safe_load((EXAMPLE / "configs" / "params.yaml").read_text())
    assert params["model"]["mixed_precision"] is True
    params["runconfig"].update(max_steps=STEPS, save_checkpoints_steps=STEPS, log_step_count_steps=1)
    params["model"]["dropout"] = 0.0  # the CS draws dropout masks of its own: no step-for-step parity
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    args = ["-p", str(tmp_path / "params.yaml")]
    cpu, cs = together(partial(run_py_in_process, EXAMPLE / "run.py", ["--mode", "train", *args, "-o", "cpu"],
                               tmp_path),
                       partial(run, ["csrun_wse", "--tasks-per-node", "3", "--job-dir", "job", "python",
                                     str(EXAMPLE / "run.py"), "--mode", "train", *args, "-o", "cs"], tmp_path))
    assert "Simulated CS system:" in cs.stdout, cs.stdout + cs.stderr  # the chief trained on the CS
    report = next((tmp_path / "cs" / "cs_compile").glob("*/compile_report.txt")).read_text()
    assert "Inputs: features (784,) float16, labels () int32" in report  # streamed at 2 B a value
    assert sorted(losses(cs.stdout)) == list(range(1, STEPS + 1))
    on_cs = np.array([losses(cs.stdout)[s] for s in range(1, STEPS + 1)])
    on_cpu = np.array([losses(cpu)[s] for s in range(1, STEPS + 1)])
    relative = np.abs(on_cs - on_cpu) / on_cpu
    assert np.all(relative[:LARGE] < 1e-2), relative
    assert relative.mean() < 1e-2, relative
    for worker in (1, 2):  # both input workers streamed to it
        log = next((tmp_path / "job").glob(f"*_{worker}_log.out")).read_text()
        assert f"input worker {worker - 1}: sent" in log, log
    evaluate = ["--mode", "eval", "--eval_steps", "3", *args, "-o", "cs"]
    cpu_out, cs_done = together(
        partial(run_py_in_process, EXAMPLE / "run.py", evaluate, tmp_path),
        partial(run, ["csrun_wse", "--job-dir", "eval_job", "python", str(EXAMPLE / "run.py"), *evaluate],
                tmp_path))
    cpu_eval, cs_eval = eval_results(cpu_out), eval_results(cs_done.stdout)
    served = (tmp_path / "eval_job" / "wse_sim.log").read_text()
    assert "loaded job eval_job: program" in served, served  # it evaluated on the CS
    assert cpu_eval["global_step"] == cs_eval["global_step"] == STEPS
    assert cs_eval["accuracy"] == pytest.approx(cpu_eval["accuracy"], abs=1e-6)
    assert cs_eval["loss"] == pytest.approx(cpu_eval["loss"], rel=1e-2)
