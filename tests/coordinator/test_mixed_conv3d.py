"""Conv3D under Keras' mixed_float16 (unseen30's R(2+1)D, refused before): TF 2.21's CPU
float16 Conv3D, Conv3DBackpropInputV2 and Conv3DBackpropFilterV2 (Eigen's CuboidConvolution
on Eigen::half) sum in float16; the CS's conv3d sums in float32 and rounds once, as its
float16 conv2d (docs/design.md, "Mixed precision"). So an R(2+1)D block model is held to TF
mixed's numbers by the mixed rule (1e-2 element by element, else the float32 twin's), with
BatchNormalization on the 5-D activations and without (unseen30's), and evaluates and
predicts like the CPU path."""
import os

import cs_inprocess
import factorised_video_models as m
import numpy as np
import pytest
import tensorflow as tf

from cs_api.attrs import from_attr

STEPS = 4


def params(loss_scale, batch_norm=True):
    return {**m.params, "loss_scale": loss_scale, "batch_norm": batch_norm,
            "runconfig": {"tf_random_seed": 1}}


@pytest.mark.parametrize("loss_scale, batch_norm", [
    pytest.param("dynamic", True, marks=pytest.mark.slow), (128.0, True), (128.0, False)],
                         ids=["dynamic", "static_128", "static_128_no_batch_norm"])
def test_an_r2plus1d_model_trains_evaluates_and_predicts_like_tensorflow_mixed(tmp_path, loss_scale,
                                                                               batch_norm):
    p = params(loss_scale, batch_norm)
    result = cs_inprocess.compare(m.model_fn, m.input_fn, p, str(tmp_path), steps=STEPS)
    convs = [k for k in result.compiled.program.kernels if k.type == "conv3d"]
    assert len(convs) == 9 and all(from_attr(k.attrs["precision"]) == "float16" for k in convs)
    problems = cs_inprocess.mixed_training_problems(m.model_fn, m.input_fn, p, result, STEPS)
    assert not problems, problems
    problem = cs_inprocess.evaluation_mismatch(m.model_fn, m.input_fn, p, str(tmp_path), result,
                                               rtol=1e-2)
    assert not problem, problem
    problem = cs_inprocess.prediction_mismatch(m.model_fn, m.input_fn, p, str(tmp_path), result,
                                               rtol=1e-2, of_largest=True)
    assert not problem, problem


def test_tensorflows_float16_conv3d_sums_in_float16_and_the_cs_in_float32():
    """What the design doc says of TF's kernel, measured: its float16 Conv3D is not the
    float32 sum rounded once (Conv2D's is) and is farther from float64 than that rounding."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 4, 8, 8, 8)).astype(np.float16)
    w = (0.2 * rng.normal(size=(1, 3, 3, 8, 16))).astype(np.float16)
    half = tf.nn.conv3d(x, w, [1] * 5, "SAME").numpy().astype(np.float64)
    exact = tf.nn.conv3d(x.astype(np.float64), w.astype(np.float64), [1] * 5, "SAME").numpy()
    single = tf.nn.conv3d(x.astype(np.float32), w.astype(np.float32), [1] * 5, "SAME").numpy()
    rounded = single.astype(np.float16).astype(np.float64)  # the CS's
    assert os.environ.get("TF_ENABLE_ONEDNN_OPTS") == "0"  # (the suite's reference: Eigen's)
    assert np.mean(half == rounded) < 0.5
    assert np.abs(half - exact).max() > 2 * np.abs(rounded - exact).max()
