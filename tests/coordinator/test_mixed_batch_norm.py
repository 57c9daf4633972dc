"""BatchNormalization in training under Keras' mixed_float16 policy (docs/design.md, "Mixed
precision"): TF's graph casts the float16 input to float32, computes the moments, the
normalisation and their gradients in float32 and rounds the result (and the input's
gradient) to float16 once; the CS's batch_norm_training kernel computes the same ops in
TF's order between the same two roundings (tests/wafer/test_wse_batch_norm_training.py).
TF's Eigen float16 convolution gradients (the suite's reference) do not accumulate in
float32 as the CS's do, and the gradient of a convolution before a BatchNormalization
cancels, so these models are held to TF mixed's losses and to no more distance from a
float32 run than TF mixed has; static and dynamic loss scales; evaluated on the CS."""
from __future__ import annotations

import cs_inprocess
import numpy as np
import pytest
import tensorflow as tf
import tf_reference

from cs_api.attrs import from_attr
from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

L = tf.keras.layers
RTOL = 1e-2  # the project's mixed-precision tolerance (tests/coordinator/test_mixed_precision.py)


def input_fn(params):
    """8x8 one-channel images of 10 classes (a bright pixel per class, noise), batches of 16."""
    rng = np.random.default_rng(3)
    y = rng.integers(0, 10, size=256).astype(np.int32)
    x = rng.uniform(0.0, 0.3, size=(256, 8, 8, 1)).astype(np.float32)
    x[np.arange(256), y % 8, y // 8 + 2 * (y >= 8), 0] += 1.0
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(16, drop_remainder=True)


def model_fn(features, labels, mode, params):
    """Conv-BN-ReLU twice (params["block"] "mobilenet": a depthwise conv, float32 unless
    params["depthwise_dtype"] (None: the policy's), and a 1x1 conv between them, MobileNet's), global pooling, a float32 Dense; Momentum with a static
    or dynamic loss scale."""
    training = mode == ModeKeys.TRAIN
    tf.keras.mixed_precision.set_global_policy(params.get("policy", "mixed_float16"))
    try:
        h = L.ReLU(6.0)(L.BatchNormalization()(L.Conv2D(16, 3, padding="same", use_bias=False)(
            features), training=training))
        if params.get("block") == "mobilenet":
            h = L.DepthwiseConv2D(3, padding="same", use_bias=False,
                                  depth_multiplier=params.get("depth_multiplier", 1),
                                  dtype=params.get("depthwise_dtype", "float32"))(h)
            h = L.ReLU(6.0)(L.BatchNormalization()(h, training=training))
            h = L.Conv2D(32, 1, use_bias=False)(h)
        else:
            h = L.Conv2D(16, 3, padding="same", use_bias=False)(h)
        h = L.ReLU(6.0)(L.BatchNormalization()(h, training=training))
        logits = L.Dense(10, dtype="float32")(L.GlobalAveragePooling2D()(h))
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss, eval_metric_ops={
            "accuracy": tf.compat.v1.metrics.accuracy(labels, tf.argmax(logits, 1))})
    scale = params.get("loss_scale", 128.0)
    if isinstance(scale, dict):
        scale = tf.compat.v1.mixed_precision.DynamicLossScale(**scale)
    optimizer = tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer(
        tf.compat.v1.train.MomentumOptimizer(0.05, 0.9), scale)
    step = tf.compat.v1.train.get_or_create_global_step()
    return CSEstimatorSpec(mode, loss=loss, train_op=optimizer.minimize(loss, global_step=step))


def params(**extra):
    return {"batch_size": 16, "runconfig": {"tf_random_seed": 1}, **extra}


def float32_run(run, p, steps):
    """TF's all-float32 run from the CS's initial weights (the yardstick of mixed runs)."""
    data = tf_reference.batches(input_fn, p, steps)
    return tf_reference.run(model_fn, input_fn, {**p, "policy": "float32"},
                            run.compiled.initial_weights, data)


def assert_trains_as_tensorflow_mixed(run, p, steps):
    """The losses within the mixed tolerance of TF mixed's; every weight no farther (x2) from
    TF's float32 run than TF mixed is (below 1e-3 of a weight's largest value: noise)."""
    cs, mixed = np.asarray(run.cs.losses), np.asarray(run.reference.losses)
    assert np.max(np.abs(cs - mixed) / mixed) < RTOL
    assert not cs_inprocess.farther_than_tensorflow(run, float32_run(run, p, steps).state,
                                                    factor=2.0, floor=1e-3)


@pytest.mark.parametrize("scale", [128.0, pytest.param(
    {"initial_loss_scale": 2.0 ** 15, "increment_period": 2}, marks=pytest.mark.slow)])
def test_conv_batch_norm_trains_as_tensorflow_mixed_and_evaluates_on_the_cs(tmp_path, scale):
    """Conv-BN-ReLU twice, 4 steps, static and dynamic loss scale: the batch normalizations
    compute in float32 between float16 roundings (TF's graph); the checkpoint evaluates on
    the CS as on the CPU."""
    p = params(loss_scale=scale)
    run = cs_inprocess.compare(model_fn, input_fn, p, str(tmp_path), steps=4)
    norms = [k for k in run.compiled.program.kernels if k.type == "batch_norm_training"]
    assert len(norms) == 2 and all("precision" not in k.attrs for k in norms)  # float32 inside
    assert_trains_as_tensorflow_mixed(run, p, 4)
    assert not cs_inprocess.evaluation_mismatch(model_fn, input_fn, p, str(tmp_path), run,
                                                rtol=RTOL)


@pytest.mark.slow
def test_mobilenet_block_with_batch_norm_trains_as_tensorflow_mixed(tmp_path):
    """A MobileNet block (its depthwise conv given dtype='float32') with three batch
    normalizations over 16 x 8 x 8 values, whose float16 gradients are mostly rounding noise
    (docs/design.md, "Mixed precision"): losses and distance from float32 as TF mixed's;
    evaluated on the CS as on the CPU."""
    p = params(block="mobilenet")
    run = cs_inprocess.compare(model_fn, input_fn, p, str(tmp_path), steps=4)
    assert_trains_as_tensorflow_mixed(run, p, 4)
    assert not cs_inprocess.evaluation_mismatch(model_fn, input_fn, p, str(tmp_path), run,
                                                rtol=RTOL)


@pytest.mark.slow
@pytest.mark.parametrize("multiplier", [1, 2])
def test_mobilenet_block_with_float16_depthwise_trains_as_tensorflow_mixed(tmp_path, multiplier):
    """The block as mixed_float16 builds it (the depthwise conv in float16, TF's Eigen
    kernel's roundings: tests/wafer/test_half_parity.py); with depth_multiplier 2 too
    (refused before)."""
    p = params(block="mobilenet", depthwise_dtype=None, depth_multiplier=multiplier)
    run = cs_inprocess.compare(model_fn, input_fn, p, str(tmp_path), steps=4)
    depthwise = next(k for k in run.compiled.program.kernels if k.type == "depthwise_conv2d")
    assert from_attr(depthwise.attrs["precision"]) == "float16"
    assert_trains_as_tensorflow_mixed(run, p, 4)
