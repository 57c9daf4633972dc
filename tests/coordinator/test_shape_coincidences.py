"""Layouts the compiler decides (stack-first [S, B, ...], folded rows [B*k, ...]) attacked by
sizes equal to the batch (tests/coincidence_models.py): heads, time steps, Dense widths and
patches equal to the batch, a [B, B] pairing beside a stack, the batch sizes 1 and 2 train 4
steps with TF's numbers and evaluate and predict as the CPU path does; where TF's broadcast
meets one value's batch axis with another's sample axis (a VIB's K == B Monte Carlo draw,
labels [B] minus predictions [B, 1]), which the CS trained differently from TF before, the
model is refused in one line naming the op. Noise [T, F] with T == B added to [B, T, F] is
TF's broadcast over the batch: one draw a step for every sample (test_batch_shared_draws),
TF's training with TF's draws."""
from __future__ import annotations

import coincidence_models as m
import cs_inprocess
import pytest

PARAMS = {"runconfig": {"tf_random_seed": 1}}
STEPS = 4

TRAINED = {
    "heads_equal_batch": (m.heads_equal_batch, {}),
    "stack_then_step_first": (m.stack_then_step_first, {}),
    "patches_at_batch_1": (m.patches_equal_batch, {"batch": 1}),
    "pairwise_at_batch_1": (m.pairwise_distance_and_stack, {"batch": 1}),
    "two_heads_at_batch_2": (m.two_heads_width_b, {"batch": 2}),
    "square_transposed": (m.square_transposed, {}),
    "folded_then_reshaped_across": (m.folded_then_reshaped_across, {}),
}
SLOW = {"heads_equal_batch", "stack_then_step_first", "two_heads_at_batch_2", "square_transposed",
        "folded_then_reshaped_across"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n
                                  for n in TRAINED])
def test_sizes_equal_to_the_batch_train_evaluate_and_predict_like_tensorflow(tmp_path, name):
    model_fn, extra = TRAINED[name]
    params = {**PARAMS, **extra}
    result = cs_inprocess.compare(model_fn, m.input_fn, params, str(tmp_path), STEPS)
    cs_inprocess.assert_same_training(result, 1e-5)
    assert cs_inprocess.cpu_path_mismatches(model_fn, m.input_fn, params, str(tmp_path), result) == []


RANKS = "combines per-sample values of different ranks"


@pytest.mark.parametrize("model_fn", [m.noise_pattern_shared, m.noise_pattern_per_row],
                         ids=["noise_shared", "noise_first_of_four"])
def test_noise_of_a_samples_shape_with_t_equal_to_b_is_drawn_once_for_the_batch(tmp_path, model_fn):
    """features + 0.1 * tf.random.normal([T, F]) (or [4, T, F][0]) at T == B: TF broadcasts
    the draw over the batch; the weight program draws it once a step and every sample reads
    it (it was refused as per-sample numbers of another rank): TF's training with TF's
    draws (1e-5)."""
    result = cs_inprocess.compare_drawn(model_fn, m.input_fn, PARAMS, str(tmp_path), STEPS)
    assert len(cs_inprocess.weight_draws(result.compiled.program)) == 1
    assert cs_inprocess.mismatches(result, rtol=1e-5) == []


@pytest.mark.parametrize("model_fn, extra, named", [
    (m.vib, {"samples": 8}, ("Mul 'mul_1'", RANKS)),
    (m.vib, {"samples": 2, "batch": 2}, ("Mul 'mul_1'", RANKS)),
    (m.regression_labels_broadcast, {}, ("Sub 'sub'", RANKS)),
    (m.step_weights_times_batch, {}, ("Mul 'mul'", RANKS)),
    (m.pairs_of_samples, {}, ("Reshape 'Reshape'", "reshapes (8, 4) to (4, 8)")),
], ids=["vib_k_equals_batch", "vib_k_equals_batch_2",
        "labels_minus_column", "steps_times_batch", "two_samples_a_row"])
def test_a_batch_axis_meeting_a_sample_axis_is_refused_in_one_line(tmp_path, model_fn, extra, named):
    """The op and why, in the one line (refusal: it names a line of coincidence_models.py)."""
    op, why = named
    line = cs_inprocess.refusal(model_fn, m.input_fn, {**PARAMS, **extra}, str(tmp_path),
                                m.__file__)
    assert line.startswith(f"validation failed: {op} at ") and why in line, line
