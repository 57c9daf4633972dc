"""Random numbers drawn once a step for the whole batch and read by every sample as a weight
is (broadcast over the batch, no batch axis or a first axis of 1): random Fourier features'
fresh phase, NoisyNet's and Bayes by backprop's drawn biases, a dropout mask shared by the
batch (noise_shape [1, d]), Gaussian dropout by one drawn scale, a drawn temperature, noise
added to activations. The weight program draws them (as noise on weights), every
micro-batch of the step reads the same numbers; a select reads a shared mask as the weight
program's 0/1. A locked (variational) dropout mask [batch, 1, d] stays each sample's own,
shared by its time steps. Proven here: (1) with TF's draws replayed (its masks' uniform
numbers too) the models train 4 steps to TF's losses and weights (1e-5), at micro-batches
of 1 too; (2) evaluation and prediction with dropout off, as users switch it, are the CPU
path's; the random phase, drawn in evaluation too, is TF's batch by batch with TF's draws
and new every batch with the CS's own; (3) a draw meeting the batch's loss stays refused in
one line naming it."""
from __future__ import annotations

import batch_shared_draw_models as m
import cs_inprocess
import projection_models as pm
import pytest
import tf_reference

from cs_api.attrs import from_attr

BASE = {"batch_size": 8, "runconfig": {"tf_random_seed": 1}}
CASES = {"fourier_phase": (m.fourier_phase, m.points_input_fn, {}),
         "fourier_features_phase": (pm.fourier_features, pm.points_input_fn, {"phase": True}),
         "noisy_net": (m.noisy_net, m.points_input_fn, {}),
         "bayes_by_backprop": (m.bayes_by_backprop, m.points_input_fn, {}),
         "shared_dropout": (m.shared_dropout, m.points_input_fn, {}),
         "locked_dropout_shared": (m.locked_dropout, m.sequences_input_fn, {"shared": True}),
         "shared_gaussian_dropout": (m.shared_gaussian_dropout, m.points_input_fn, {}),
         "noisy_activations": (m.noisy_activations, m.points_input_fn, {}),
         "shared_noise": (m.shared_noise, m.points_input_fn, {})}
# the draws each case's weight program makes once a step
DRAWS = {"fourier_phase": 2, "fourier_features_phase": 2, "noisy_net": 4,
         "bayes_by_backprop": 2, "shared_dropout": 2, "locked_dropout_shared": 1,
         "shared_gaussian_dropout": 2, "noisy_activations": 1, "shared_noise": 1}
# dropout off outside training: evaluation and prediction are the CPU path's
MODE_SWITCHED = ["noisy_net", "bayes_by_backprop", "shared_dropout", "locked_dropout_shared",
                 "shared_gaussian_dropout"]


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    """compare_drawn() of each case, once."""
    cases = {**CASES, "locked_dropout": (m.locked_dropout, m.sequences_input_fn, {})}
    return cs_inprocess.cached_comparisons(cases, BASE, tmp_path_factory, drawn=True)


@pytest.mark.parametrize("name", sorted(CASES))
def test_with_tfs_draws_numbers_shared_by_the_batch_train_like_tensorflow(drawn, name):
    result = drawn(name)
    program = result.compiled.program
    assert len(cs_inprocess.weight_draws(program)) == DRAWS[name]
    assert not {"random", "dropout"} & {k.type for k in program.kernels}  # (none per sample)
    assert cs_inprocess.mismatches(result, rtol=1e-5) == []
    assert result.cs.losses[0] != result.cs.losses[-1]  # it trained


def test_a_mask_shared_by_the_batch_is_a_select_of_the_weight_programs_draw(drawn):
    """tf.nn.dropout(h, 0.3, noise_shape=[1, d]): the weight program draws the uniform numbers
    and compares them with the rate; the samples' select reads the 0/1 mask as a weight."""
    program = drawn("shared_dropout").compiled.program
    selects = [k for k in program.kernels if k.type == "select"]
    assert len(selects) == 2
    assert all(from_attr(k.attrs["operands"]) == "pic" for k in selects)
    types = [k.type for k in program.weight_program.kernels]
    assert types.count("random") == 2 and types.count("cast") == 2


def test_every_micro_batch_reads_the_steps_one_mask_and_scale(drawn):
    """At micro-batches of 1 each sample reads the step's one mask (and drawn scale and
    temperature): TF's training (1e-5), whose batch used one draw."""
    for name in ("shared_dropout", "shared_gaussian_dropout"):
        result = drawn(name)
        program = cs_inprocess.at_micro_batch(result.compiled.program, 1)
        model_fn, input_fn, extra = CASES[name]
        data = tf_reference.batches(input_fn, {**BASE, **extra}, 4)
        with cs_inprocess.tfs_draws(program, result.reference.fetched):
            cs = cs_inprocess.run_on_cs(program, result.compiled.initial_weights, data)
        micro = cs_inprocess.Comparison(result.compiled, cs, result.reference)
        assert cs_inprocess.mismatches(micro, rtol=1e-5) == [], name


def test_a_locked_dropout_mask_is_each_samples_own_shared_by_its_time_steps(drawn):
    """noise_shape [batch, 1, d]: a per-sample dropout kernel of noise_shape (1, d); with TF's
    masks replayed the model trains like TF (1e-5)."""
    result = drawn("locked_dropout")
    program = result.compiled.program
    (dropout,) = [k for k in program.kernels if k.type == "dropout"]
    assert [int(d) for d in from_attr(dropout.attrs["noise_shape"])] == [1, m.HIDDEN]
    assert not cs_inprocess.weight_draws(program)
    assert cs_inprocess.mismatches(result, rtol=1e-5) == []


def test_the_cs_draws_its_own_shared_mask_fresh_every_step(drawn):
    """Without the replay the CS's own masks train differently from TF's; two runs of the
    program draw the same (its seed)."""
    result = drawn("shared_dropout")
    data = tf_reference.batches(m.points_input_fn, BASE, 2)
    runs = [cs_inprocess.run_on_cs(result.compiled.program, result.compiled.initial_weights,
                                   data).losses for _ in range(2)]
    assert runs[0] == runs[1] and runs[0] != result.cs.losses[:2]


@pytest.mark.parametrize("name", MODE_SWITCHED)
def test_with_dropout_off_evaluation_and_prediction_are_the_cpu_paths(drawn, name, tmp_path):
    model_fn, input_fn, extra = CASES[name]
    assert cs_inprocess.cpu_path_mismatches(model_fn, input_fn, {**BASE, **extra},
                                            str(tmp_path), drawn(name)) == []


def test_evaluation_draws_a_new_phase_for_every_batch_like_tensorflow(drawn, tmp_path):
    path = cs_inprocess.trained_checkpoint(str(tmp_path), drawn("fourier_phase"))
    program = cs_inprocess.assert_evaluation_draws_every_batch(
        m.fourier_phase, m.points_input_fn, BASE, str(tmp_path / "eval"), path)
    assert len(cs_inprocess.weight_draws(program)) == 2


def test_a_draw_meeting_the_batchs_loss_is_refused_in_one_line(tmp_path):
    message = cs_inprocess.refusal(m.drawn_loss_scale, m.points_input_fn, BASE, str(tmp_path),
                                   "batch_shared_draw_models.py")
    assert "\n" not in message and message.startswith("validation failed: RandomUniform ")
    assert "not one set per sample" in message

