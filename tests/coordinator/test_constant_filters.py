"""Convolutions by a constant filter (unseen16): tf.image.ssim as a loss and a metric,
tf.image.sobel_edges in an edge loss, a tf.constant Gaussian blur (tf.nn.conv2d) and box
filters (tf.nn.conv1d, conv3d) train 4 Adam steps as TensorFlow does (1e-5), the filter frozen in
its kernel (no weight), and evaluate and predict as the CPU path does; so does a blur-pool CNN
under mixed_float16 (by the mixed rule); a filter drawn each step trains with TF's draws."""
import constant_filter_models as m
import cs_inprocess
import pytest

from cs_api.attrs import from_attr

PARAMS = {"runconfig": {"tf_random_seed": 2}}


@pytest.mark.slow
@pytest.mark.parametrize("model_fn, kinds", [
    (m.ssim_autoencoder, {"depthwise_conv2d"}), (m.sobel_edge_loss, {"depthwise_conv2d"}),
    (m.blurred_classifier, {"conv2d", "conv3d"})], ids=["ssim", "sobel_edges", "blur_conv1d_conv3d"])
def test_a_constant_filter_trains_evaluates_and_predicts_like_tensorflow(tmp_path, model_fn, kinds):
    result = cs_inprocess.compare(model_fn, m.images_input_fn, PARAMS, str(tmp_path), steps=4)
    cs_inprocess.assert_same_training(result, rtol=1e-5)
    held = [k for k in result.compiled.program.kernels if "filter" in k.attrs]
    assert {k.type for k in held} == kinds
    assert not any(p.role == "kernel" for k in held for p in k.params)
    for variable, start in result.compiled.initial_weights.items():
        if variable != "global_step":
            assert (result.cs.state[variable] != start).any(), f"{variable} was not trained"
    assert cs_inprocess.evaluation_mismatch(model_fn, m.images_input_fn, PARAMS, str(tmp_path),
                                            result) == ""
    assert cs_inprocess.prediction_mismatch(model_fn, m.images_input_fn, PARAMS, str(tmp_path),
                                            result) == ""


def test_a_blurpool_cnn_under_mixed_float16_trains_evaluates_and_predicts_like_tensorflow(tmp_path):
    """Float16 constant filters (a blur-pool's depthwise_conv2d, a Gaussian tf.nn.conv2d) were
    refused ('a convolution by a constant filter in float16'): now held by float16 kernels
    (TF's Eigen depthwise rounding, a float32-summed conv2d), trained with a dynamic loss
    scale within TF mixed's float16 noise, evaluated and predicted like the CPU path."""
    result = cs_inprocess.compare(m.blurpool_mixed, m.images_input_fn, PARAMS, str(tmp_path), steps=4)
    problems = cs_inprocess.mixed_training_problems(m.blurpool_mixed, m.images_input_fn, PARAMS, result, 4)
    assert not problems, problems
    held = [(k.type, from_attr(k.attrs["precision"])) for k in result.compiled.program.kernels
            if "filter" in k.attrs]
    assert sorted(held) == [("conv2d", "float16")] + [("depthwise_conv2d", "float16")] * 2
    for check in (cs_inprocess.evaluation_mismatch, cs_inprocess.prediction_mismatch):
        problem = check(m.blurpool_mixed, m.images_input_fn, PARAMS, str(tmp_path), result, rtol=1e-2)
        assert not problem, problem


def test_a_filter_drawn_each_step_trains_like_tensorflow_with_its_draws(tmp_path):
    """A convolution by tf.random.normal([3, 3, 4, 4]) (no weight, no constant) was refused;
    a draw read only as a product's shared operand is drawn once a step by the weight program
    (docs/design.md "Random projections"): with TF's draws replayed, TF's numbers."""
    result = cs_inprocess.compare_drawn(m.random_filter, m.images_input_fn, PARAMS, str(tmp_path),
                                        steps=4)
    cs_inprocess.assert_same_training(result, rtol=1e-5)
