"""The BERT-style masked-LM in the modelzoo's shape (`examples/modelzoo_bert_mlm`: embeddings,
two Transformer blocks, a masked-LM head tied to the embeddings, mixed_float16, a warmup then
linear decay as a list of schedules, dynamic loss scaling) trains on the CS with the CPU
path's losses and evaluates there; and the modelzoo's loss-scaling keys
(`examples/modelzoo_loss_scale.py`) take effect or are refused in one line."""
from __future__ import annotations

import subprocess
from functools import partial

import numpy as np
import pytest
import tensorflow as tf
import yaml
from cs_inprocess import compare, compile_checked, evaluation_mismatch, mismatches
from fc_mnist_runs import ENV, REPO, eval_results, losses
from processes import run_py_in_process, together

from common.errors import CSRunError
from cs_api.attrs import from_attr
from examples.modelzoo_bert_mlm import data, model
from examples.modelzoo_bert_mlm.utils import get_params
from examples.modelzoo_fc_mnist import data as mnist_data
from examples.modelzoo_fc_mnist import model as mnist_model
from examples.modelzoo_fc_mnist.utils import get_params as mnist_params
from examples.modelzoo_loss_scale import CS1DynamicLossScale, loss_scale
from tf_model.checkpoints import latest_checkpoint, read_checkpoint

EXAMPLE = REPO / "examples" / "modelzoo_bert_mlm"
MNIST = REPO / "examples" / "modelzoo_fc_mnist"
STEPS = 10


def run(command: list[str], cwd) -> subprocess.CompletedProcess:
    result = subprocess.run(command, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def bert_params() -> dict:
    """The shipped params with a warmup of 10 steps (the loss moves within a short run)."""
    params = get_params(str(EXAMPLE / "configs" / "params.yaml"))
    schedules = params["optimizer"]["learning_rate"]
    schedules[0].update(steps=10, end_learning_rate=0.003)
    schedules[1].update(initial_learning_rate=0.003)
    return params


def test_the_synthetic_masked_lm_data_is_deterministic_and_masks_what_it_asks_for():
    params = get_params(str(EXAMPLE / "configs" / "params.yaml"))
    first, again = (data.synthetic_examples(params["train_input"], 0) for _ in range(2))
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    input_ids, positions, weights, masked_ids = first
    rows = np.arange(len(input_ids))[:, None]
    assert (input_ids[rows, positions] == data.MASK_ID).all()
    assert (input_ids == data.MASK_ID).sum() == positions.size  # only the masked positions
    assert (masked_ids >= 2).all() and (weights == 1).all()


@pytest.mark.slow
def test_bert_mlm_trains_mixed_on_the_cs_with_the_cpu_losses_and_evaluates_there(tmp_path):
    """STEPS (10) steps in process on the CS and on TF's CPU path from the same weights and
    batches: the losses within 1e-2 relative step by step (measured: 3e-5), the weights too;
    the program carries the schedule, the float16 kernels, the original BERT's AdamW (weight
    decay but of LayerNorm and biases) clipped at global norm 1.0, and the CS-1's
    dynamic loss scale (from 2 ** 15, doubling every 2,000 steps); the CS evaluates the
    trained checkpoint with the CPU path's masked-LM accuracy and loss."""
    params = bert_params()
    run = compare(model.model_fn, data.train_input_fn, params, str(tmp_path), steps=STEPS)
    program = run.compiled.program
    assert program.cs1_dynamic_loss_scale.increment_period == 2000
    assert "dynamic loss scale from 32768" in run.compiled.report_text
    assert "Schedule of learning_rate" in run.compiled.report_text
    assert "Optimizer: adamw, learning rate from a schedule, beta1 0.9, beta2 0.999, epsilon " \
           "1e-06, weight decay 0.01 (not of " in run.compiled.report_text
    assert "Gradient transform: clip_by_global_norm 1 of " in run.compiled.report_text
    assert [k.type for k in program.kernels].count("sample_gather") == 1  # the masked positions
    assert sum(from_attr(k.attrs["precision"]) == "float16" for k in program.kernels
               if "precision" in k.attrs) > 50
    cs, cpu = np.array(run.cs.losses), np.array(run.reference.losses)
    assert np.all(np.abs(cs - cpu) / cpu < 1e-2), (cs, cpu)
    assert not mismatches(run, rtol=1e-2)
    assert not evaluation_mismatch(model.model_fn, data.eval_input_fn, params, str(tmp_path), run,
                                   rtol=1e-2)


def test_modelzoo_loss_scaling_keys_build_the_cs1s_rule_tensorflows_or_a_static_scale():
    with tf.Graph().as_default():
        rule = loss_scale({"loss_scaling_factor": "tf_dynamic", "initial_loss_scale": 1024,
                           "steps_per_increase": 7})
        assert type(rule) is tf.compat.v1.mixed_precision.DynamicLossScale
        assert (rule.initial_loss_scale, rule.increment_period, rule.multiplier) == (1024.0, 7, 2.0)
        default = loss_scale({"loss_scaling_factor": "dynamic"})
        assert isinstance(default, CS1DynamicLossScale)
        assert (default.initial_loss_scale, default.increment_period, default.min_loss_scale,
                default.max_loss_scale, default.overflow_tolerance) == (
            2.0 ** 15, 2000, 2.0 ** -14, 2.0 ** 15, 0.05)  # the original's defaults
    assert loss_scale({"loss_scaling_factor": 128}) == 128.0
    assert loss_scale({"loss_scaling_factor": 1.0}) is None and loss_scale({}) is None


@pytest.mark.parametrize("key, value", [("max_loss_scale", 2.0 ** 15), ("min_loss_scale", 1.0),
                                        ("overflow_tolerance", 0.05)])
def test_the_cs1s_own_loss_scaling_keys_with_tf_dynamic_are_refused_in_one_line(key, value):
    with tf.Graph().as_default(), pytest.raises(CSRunError) as refused:
        loss_scale({"loss_scaling_factor": "tf_dynamic", key: value})
    assert f"optimizer.{key}" in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize("factor", ["cs_dynamic", 0, True])
def test_a_bad_loss_scaling_factor_is_refused_in_one_line(factor):
    with tf.Graph().as_default(), pytest.raises(CSRunError, match="optimizer.loss_scaling_factor"):
        loss_scale({"loss_scaling_factor": factor})


@pytest.mark.slow
def test_modelzoo_fc_mnist_takes_initial_loss_scale_and_steps_per_increase(tmp_path):
    """The modelzoo FC-MNIST's 'tf_dynamic' with initial_loss_scale 1024 and steps_per_increase
    7 compiles to TF's rule with those numbers (they used to be ignored)."""
    params = mnist_params(str(MNIST / "configs" / "params.yaml"))
    params["optimizer"].update(loss_scaling_factor="tf_dynamic", initial_loss_scale=1024.0,
                               steps_per_increase=7)
    compiled = compile_checked(mnist_model.model_fn, mnist_data.train_input_fn, params, str(tmp_path))
    assert compiled.program.dynamic_loss_scale.increment_period == 7
    assert "dynamic loss scale from 1024 (x 2 after 7 finite steps" in compiled.report_text


@pytest.mark.slow
def test_run_py_refuses_min_loss_scale_above_max_in_one_line(tmp_path):
    params = yaml.safe_load((MNIST / "configs" / "params.yaml").read_text())
    params["optimizer"].update(loss_scaling_factor="dynamic", min_loss_scale=2.0 ** 17)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    result = subprocess.run(["python", str(MNIST / "run.py"), "--mode", "train", "--validate_only",
                             "-p", str(tmp_path / "params.yaml"), "-o", str(tmp_path / "out")],
                            cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "optimizer.min_loss_scale 131072 is above max_loss_scale 32768" in result.stderr + result.stdout
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_bert_mlm_trains_under_csrun_wse_with_the_cpu_losses_and_evaluates_on_the_cs(tmp_path):
    """60 steps (warmup of 10 to the shipped peak 0.001) with run.py on the CPU (in process,
    beside the CS run) and with `csrun_wse`: every step's loss within 1e-2 relative (measured
    in process: 1.2e-3 at most), and the loss falls; the CS's checkpoint evaluates on the CS (3 batches) to the
    CPU path's masked-LM accuracy, its loss within 1e-2. (A peak of 0.003 makes this AdamW
    run chaotic: TF against TF with one weight tensor 1 ULP up differs by 5% from step 20.)"""
    params = yaml.safe_load((EXAMPLE / "configs" / "params.yaml").read_text())
    params["runconfig"].update(max_steps=60, save_checkpoints_steps=60, log_step_count_steps=1)
    params["optimizer"]["learning_rate"][0].update(steps=10)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    script, args = str(EXAMPLE / "run.py"), ["-p", str(tmp_path / "params.yaml")]
    cpu, cs = together(partial(run_py_in_process, EXAMPLE / "run.py", ["--mode", "train", *args, "-o", "cpu"],
                               tmp_path),
                       partial(run, ["csrun_wse", "--job-dir", "job", "python", script, "--mode", "train",
                                    *args, "-o", "cs"], tmp_path))
    assert "Simulated CS system:" in cs.stdout, cs.stdout + cs.stderr
    on_cs = np.array([losses(cs.stdout)[s] for s in range(1, 61)])
    on_cpu = np.array([losses(cpu)[s] for s in range(1, 61)])
    assert np.all(np.abs(on_cs - on_cpu) / on_cpu < 1e-2), (on_cs, on_cpu)
    assert on_cs[-5:].mean() < 0.9 * on_cs[:5].mean()  # it learns (measured: 27.7 to 23.4)
    evaluate = ["--mode", "eval", "--eval_steps", "3", *args, "-o", "cs"]
    cpu_out, cs_done = together(
        partial(run_py_in_process, EXAMPLE / "run.py", evaluate, tmp_path),
        partial(run, ["csrun_wse", "--job-dir", "eval_job", "python", script, *evaluate], tmp_path))
    cpu_eval, cs_eval = eval_results(cpu_out), eval_results(cs_done.stdout)
    assert "loaded job eval_job: program" in (tmp_path / "eval_job" / "wse_sim.log").read_text()
    assert cpu_eval["global_step"] == cs_eval["global_step"] == 60
    assert cs_eval["masked_lm_accuracy"] == pytest.approx(cpu_eval["masked_lm_accuracy"], abs=1e-6)
    assert cs_eval["loss"] == pytest.approx(cpu_eval["loss"], rel=1e-2)


@pytest.mark.slow
def test_skipped_steps_leave_the_global_step_on_the_cs_as_on_the_cpu_and_a_resume_starts_there(tmp_path):
    """The CS-1's rule from 2 ** 20 (max_loss_scale 2 ** 20): the first steps overflow
    float16 and are skipped. 8 steps with run.py on the CPU (in process) and with `csrun_wse`
    (the warmup schedule of the global step): the same losses, and model.ckpt-8 holds TF's global step
    (below 8: the skipped steps do not count) and the rule's variables, equal on both paths;
    resumed to max_steps 12, both continue from that global step (its batch) with the same
    losses and end with equal global steps and rule variables."""
    params = yaml.safe_load((EXAMPLE / "configs" / "params.yaml").read_text())
    params["runconfig"].update(max_steps=8, save_checkpoints_steps=100, log_step_count_steps=1)
    params["optimizer"]["learning_rate"][0].update(steps=10, end_learning_rate=0.003)
    params["optimizer"].update(initial_loss_scale=2.0 ** 20, max_loss_scale=2.0 ** 20)
    script, args = str(EXAMPLE / "run.py"), ["-p", str(tmp_path / "params.yaml")]
    ends = []
    for max_steps in (8, 12):
        params["runconfig"]["max_steps"] = max_steps
        (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
        cpu, cs = together(partial(run_py_in_process, EXAMPLE / "run.py", ["--mode", "train", *args, "-o", "cpu"],
                                   tmp_path),
                           partial(run, ["csrun_wse", "--job-dir", f"job{max_steps}", "python", script,
                                        "--mode", "train", *args, "-o", "cs"], tmp_path))
        on_cpu, on_cs = losses(cpu), losses(cs.stdout)
        assert sorted(on_cs) == sorted(on_cpu) and len(on_cs) >= 4, (cs.stdout, cpu)
        assert all(abs(on_cs[s] - on_cpu[s]) < 1e-2 * on_cpu[s] for s in on_cpu), (on_cs, on_cpu)
        stored = [read_checkpoint(latest_checkpoint(str(tmp_path / out))) for out in ("cpu", "cs")]
        for name in ("global_step", "current_loss_scale", "steps_since_rescale",
                     "overflows_since_rescale"):
            assert stored[0][name] == stored[1][name], name
        ends.append((min(on_cpu) - 1, max(on_cpu), int(stored[0]["global_step"])))
    (_, _, counted), (resumed, end, _) = ends
    assert 0 < counted < 8 and resumed == counted and end == 12
