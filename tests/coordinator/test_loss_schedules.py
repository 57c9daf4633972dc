"""Loss terms weighted by a value of the global step (a VAE's KL annealing, an auxiliary
loss's polynomial_decay, warm-ups with tf.cond / tf.where): the CS evaluates the weight's
scalar program at the step it computes (in evaluation the checkpoint's) and multiplies the
term's per-sample values by it. Trained 4 steps across the weight's change with TF's
numbers, resumed mid-annealing, evaluated as the CPU path (a weight penalty on the schedule
too); a per-step value that is no schedule, or one scaling a weight inside a penalty,
refused in one line saying what to write."""
from __future__ import annotations

import blind_finding_models as bm
import cs_inprocess
import loss_schedule_models as lm
import pytest

from common.errors import CSRunError
from coordinator.compiler import compile_model

BASE = {"batch_size": 8, "anneal": 2, "runconfig": {"tf_random_seed": 7}}  # the same initial weights every run


def kernel_types(run: cs_inprocess.Comparison) -> list[str]:
    return [k.type for k in run.compiled.program.kernels]


@pytest.mark.parametrize("beta, inside", [("minimum", False), ("polynomial", True)])
def test_a_kl_annealed_vae_trains_and_evaluates_like_tensorflow(tmp_path, beta, inside):
    """beta * mean(kl) and mean(recon + beta * kl), beta 0, 0.5, 1, 1 over the 4 steps;
    evaluated at a checkpoint of step 1 (beta 0.5), as TF's eval graph reads its step."""
    params = {**BASE, "beta": beta, "inside": inside}
    run = cs_inprocess.compare(lm.vae, lm.input_fn, params, str(tmp_path / "train"), steps=4)
    assert kernel_types(run).count("schedule") == 1
    assert "step 0: 0, step 1: 0.5, step 2: 1, step 3: 1" in run.compiled.report_text
    assert cs_inprocess.mismatches(run) == []
    assert cs_inprocess.evaluation_mismatch(lm.vae, lm.input_fn, params, str(tmp_path / "eval"),
                                            run, global_step=1) == ""


def test_the_annealing_continues_across_a_resume(tmp_path):
    """Annealed over 6 steps, resumed at step 4 (beta 2/3): the next 4 steps are an unbroken
    run's and TF's."""
    cs_inprocess.assert_resume_is_unbroken(lm.vae, lm.input_fn, {**BASE, "beta": "minimum",
                                                                 "anneal": 6},
                                           str(tmp_path), {"z_mean/kernel/Adam"})


@pytest.mark.parametrize("beta, penalised", [("decay", False), ("cond", False),
                                             ("where", False), ("decay", True)])
def test_an_auxiliary_loss_weighted_on_a_schedule_trains_like_tensorflow(tmp_path, beta,
                                                                        penalised):
    """polynomial_decay from 1 to 0.1, a tf.cond warm-up 0.1 -> 1 at step 2, a tf.where
    ramp 0.25, 0.5 -> 0.75: under momentum, 4 steps; a weight decay on the schedule too
    (beta * 1e-3 * tf.nn.l2_loss(w): the weight program's scalar times the schedule's)."""
    params = {**BASE, "beta": beta, "penalised": penalised}
    run = cs_inprocess.compare(lm.auxiliary, lm.input_fn, params, str(tmp_path / "train"),
                               steps=4)
    assert "schedule" in kernel_types(run)
    assert cs_inprocess.mismatches(run) == []
    if beta == "cond":  # the conditional's live branch at the checkpoint's step
        assert cs_inprocess.evaluation_mismatch(lm.auxiliary, lm.input_fn, params,
                                                str(tmp_path / "eval"), run, global_step=1) == ""


WRITE = "tf.minimum(1.0, tf.cast(global_step, tf.float32) / n)"


@pytest.mark.parametrize("model, extra, says, instead", [
    (lm.vae, {"beta": "written"}, "reads beta, a value the train_op writes every step", WRITE),
    (lm.vae, {"beta": "written", "inside": True}, "reads beta, a value the train_op writes",
     WRITE),
    (lm.auxiliary, {"beta": "decay", "penalised": "inside"},
     "adds weights or a weight penalty times a value of the global step",
     "multiply the layer's output, or the whole penalty")])
def test_a_per_step_value_the_cs_cannot_compute_is_refused_in_one_line(tmp_path, model, extra,
                                                                      says, instead):
    """One line naming the op and its line, what the CS computes and what to write instead
    (never "weights" for the global step)."""
    params = {**BASE, **extra}
    with pytest.raises(CSRunError) as error:
        compile_model(model, lm.input_fn, params, str(tmp_path), validate_only=True)
    words = cs_inprocess.model_op_words(model, lm.input_fn, params)
    assert cs_inprocess.refusal_problem(error.value, lm.__file__, words) == ""
    message = str(error.value)
    assert says in message and instead in message
    assert "computed from weights that is not" not in message


def test_a_capacity_schedule_inside_a_loss_of_the_whole_batch_trains_like_tensorflow(tmp_path):
    """The controlled-capacity beta-VAE's gamma * |mean(KL) - C|, C = tf.minimum(C_max,
    C_max * step / N) (N 2: C 0, 12.5, 25, 25 over 4 steps, crossing the KL): the batch tail
    reads the schedule's value at the step computed; Adam's 4 steps are TF's (the CS's eps
    TF's draws); evaluated at a checkpoint of step 1 (C 12.5) with TF's draws, TF's losses."""
    params = {**bm.CAPACITY_VAE_PARAMS, "capacity_steps": 2, "runconfig": {"tf_random_seed": 7}}
    run = cs_inprocess.compare_drawn(bm.capacity_vae, bm.capacity_vae_input_fn, params,
                                     str(tmp_path / "train"), steps=4)
    assert {"schedule", "batch_tail_loss"} <= set(kernel_types(run))
    assert cs_inprocess.mismatches(run) == []
    checkpoint = cs_inprocess.trained_checkpoint(str(tmp_path / "eval"), run, step=1)
    cs_inprocess.assert_evaluation_draws_every_batch(bm.capacity_vae, bm.capacity_vae_input_fn,
                                                     params, str(tmp_path / "eval"), checkpoint)


def test_a_capacity_kept_in_a_variable_is_refused_saying_it_reads_the_global_step(tmp_path):
    """C = min(C_max, raised + step), `raised` raised by the train_op: one line naming the
    op, its line, the global step's value and the variable (not "a value of weights")."""
    line = cs_inprocess.refusal(bm.capacity_kept_in_a_variable, bm.capacity_vae_input_fn,
                                dict(bm.CAPACITY_VAE_PARAMS), str(tmp_path),
                                "tests/blind_finding_models.py")
    assert "the value of the global step Minimum" in line
    assert "reads raised, which the train_op writes (Minimum 'Minimum' at " \
        "tests/blind_finding_models.py:" in line
    assert "a value of weights" not in line
