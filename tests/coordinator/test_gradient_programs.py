"""Gradient transforms written between compute_gradients and apply_gradients that are none of
the four recognised kinds (gradient centralization, before tf.clip_by_global_norm too;
adaptive gradient clipping; signSGD with a multiplier per layer; a finite guard with pruning
masks) run on the CS as a gradient program and train as TensorFlow trains them (4 steps,
rtol 1e-5), then evaluate and predict with the CPU path's numbers; a transform reading the
loss, another variable's gradient, the global step or random numbers is refused in one line
naming the op."""
from __future__ import annotations

import cs_inprocess
import gradient_transform_models as m
import pytest

BASE = {"batch_size": 8, "runconfig": {"tf_random_seed": 1}}
CASES = {
    "centralized_cnn": (m.centralized_cnn, m.image_input_fn, {}),
    "centralized_clipped_cnn": (m.centralized_cnn, m.image_input_fn, {"clip": 0.05}),
    "agc_mlp": (m.agc_mlp, m.input_fn, {}),
    "sign_sgd_layerwise": (m.sign_sgd_layerwise, m.input_fn, {}),
    "finite_pruned_mlp": (m.finite_pruned_mlp, m.input_fn, {}),
}


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    return cs_inprocess.cached_comparisons(CASES, BASE, tmp_path_factory)


def _programs(result) -> dict[str, list[str]]:
    """The kernels' types of each program transform, by variable."""
    return {t.variables[0]: [k.type for k in t.program.kernels]
            for t in result.compiled.program.gradient_transforms if t.kind == "program"}


@pytest.mark.parametrize("name", CASES)
def test_transformed_gradients_train_evaluate_and_predict_like_tensorflow(compared, name,
                                                                         tmp_path):
    result = compared(name)
    cs_inprocess.assert_same_training(result, rtol=1e-5)
    assert _programs(result), "no gradient program: the test does not test it"
    model_fn, input_fn, extra = CASES[name]
    assert cs_inprocess.cpu_path_mismatches(model_fn, input_fn, {**BASE, **extra},
                                            str(tmp_path), result) == []


def test_each_transformed_gradient_is_its_own_program(compared):
    centralized = _programs(compared("centralized_cnn"))
    assert set(centralized) == {"conv0/kernel", "fc/kernel"}  # (a bias's gradient is rank 1)
    assert "reduce" in centralized["conv0/kernel"]
    clipped = compared("centralized_clipped_cnn").compiled.program.gradient_transforms
    assert [t.kind for t in clipped] == ["program", "program", "clip_by_global_norm"]
    pruned = _programs(compared("finite_pruned_mlp"))
    assert {s.variable for t in compared("finite_pruned_mlp").compiled.program.gradient_transforms
            if t.kind == "program" for s in t.program.sources} >= {
        "hidden_mask", "hidden_kernel:grad", "bias_multiplier"}
    assert set(pruned) == {"hidden_kernel", "head/kernel", "head/bias"}


def test_the_pruned_weights_stay_where_they_were(compared):
    result = compared("finite_pruned_mlp")
    start = result.compiled.initial_weights
    pruned = start["hidden_mask"] <= 0.5
    assert pruned.any()
    moved = result.cs.state["hidden_kernel"] != start["hidden_kernel"]
    assert not moved[pruned].any() and moved[~pruned].any()


@pytest.mark.parametrize("model_fn, words", [
    (m.scaled_by_loss, "is transformed with a value of the batch"),
    (m.normalized_by_other_gradient, "is transformed with a second value of the backward pass"),
    (m.warmed_up_gradients, "is transformed with a value of the global step"),
    (m.noisy_gradients, "is transformed with random numbers"),
])
def test_a_transform_of_the_batch_another_gradient_the_step_or_noise_is_refused(model_fn,
                                                                                  words, tmp_path):
    line = cs_inprocess.refusal(model_fn, m.input_fn, BASE, str(tmp_path), m.__file__)
    assert words in line
    assert line.endswith("(hint: transform each gradient with itself, weights and constants "
                         "only (tf.clip_by_norm(g, c), g * mask); to combine several losses' "
                         "gradients, minimize their weighted sum with one optimizer)")
