"""A convolution's bias followed by BatchNormalization in training, written the usual way
(Conv2D and DepthwiseConv2D keep use_bias=True), under Adam: the normalization subtracts the
batch's mean per channel, so the bias's gradient is 0 in exact arithmetic
(coordinator/compiler/training/shift.py). TF float32 computes rounding noise that Adam turns
into steps of about the learning rate, in directions no two machines share; the CS applies
the exact 0. A bias whose convolution also reaches the loss past the normalization keeps
its real gradient."""
from __future__ import annotations

import tempfile

import cs_inprocess
import numpy as np
import pytest
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec

STEPS = 4
PARAMS = {"batch_size": 8, "runconfig": {"tf_random_seed": 7}, "residual": False}
BIASES = {"conv/bias", "depthwise/bias"}


def input_fn(params):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(48, 8, 8, 2)).astype(np.float32)
    y = (x[:, :4, :4, 0].mean((1, 2)) > 0).astype(np.int32) + (x[:, 4:, 4:, 1].mean((1, 2)) > 0)
    return tf.data.Dataset.from_tensor_slices((x, y.astype(np.int32))).batch(
        params["batch_size"], drop_remainder=True)


def model_fn(features, labels, mode, params):
    """Conv2D -> BatchNormalization -> ReLU -> DepthwiseConv2D -> BatchNormalization -> ReLU,
    pooled, classified. params["residual"]: the depthwise convolution's output is also added
    past its normalization (its bias then reaches the loss another way)."""
    layers = tf.keras.layers
    training = mode == "train"
    x = layers.Conv2D(8, 3, padding="same", name="conv")(features)
    x = tf.nn.relu(layers.BatchNormalization(name="bn1")(x, training=training))
    d = layers.DepthwiseConv2D(3, padding="same", name="depthwise")(x)
    h = tf.nn.relu(layers.BatchNormalization(name="bn2")(d, training=training))
    if params["residual"]:
        h = h + d
    logits = layers.Dense(3, name="classes")(layers.GlobalAveragePooling2D()(h))
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    with tf.control_dependencies(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)):
        train_op = tf.compat.v1.train.AdamOptimizer(0.01).minimize(
            loss, tf.compat.v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op)


@pytest.fixture(scope="module")
def trained():
    with tempfile.TemporaryDirectory() as model_dir:
        return cs_inprocess.compare(model_fn, input_fn, PARAMS, model_dir, steps=STEPS)


def test_biases_before_batch_normalization_get_the_exact_zero(trained):
    assert cs_inprocess.zero_gradient_variables(trained.compiled) == BIASES
    for bias in BIASES:
        assert np.array_equal(trained.cs.state[bias], trained.compiled.initial_weights[bias])
        assert f"{bias}: gradient 0 exactly (softmax ignores a shift shared along its axis, " \
               "batch normalization in training one per channel, a difference of two values that both " \
               "carry it)" in \
            trained.compiled.report_text.splitlines()
    cs_inprocess.assert_same_training(trained)  # the biases against their start, the rest against TF


@pytest.mark.slow
def test_a_bias_that_also_reaches_the_loss_past_the_normalization_keeps_its_gradient():
    with tempfile.TemporaryDirectory() as model_dir:
        result = cs_inprocess.compare(model_fn, input_fn, {**PARAMS, "residual": True},
                                      model_dir, steps=STEPS)
    assert cs_inprocess.zero_gradient_variables(result.compiled) == {"conv/bias"}
    start = result.compiled.initial_weights["depthwise/bias"]
    assert np.abs(result.cs.state["depthwise/bias"] - start).max() > 1e-3
    cs_inprocess.assert_same_training(result)


def ghost_model(features, labels, mode, params):
    """A GhostNet-style stem (unseen16): Conv2D with its bias, a cheap 1 x 1 branch
    normalized and added back to it, max-pooled, then a convolution (1 x 1, or params["window"])
    normalized again: the stem's bias is a shift per channel that the pool passes and the
    1 x 1 convolution keeps constant over the batch and the pixels, so the second
    normalization removes it (gradient 0). A 3 x 3 convolution with SAME padding sees the
    zero padding at the borders: the shift is no longer constant there, the gradient real."""
    layers = tf.keras.layers
    training = mode == "train"
    h = layers.Conv2D(8, 3, padding="same", name="stem")(features)
    g = tf.nn.relu(layers.BatchNormalization(name="bn1")(
        layers.Conv2D(8, 1, use_bias=False, name="cheap")(h), training=training))
    h = layers.MaxPooling2D(2)(g + h)
    h = tf.nn.relu(layers.BatchNormalization(name="bn2")(
        layers.Conv2D(8, params["window"], padding="same", use_bias=False, name="mix")(h),
        training=training))
    logits = layers.Dense(3, name="classes")(layers.GlobalAveragePooling2D()(h))
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    with tf.control_dependencies(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)):
        train_op = tf.compat.v1.train.MomentumOptimizer(0.05, 0.9).minimize(
            loss, tf.compat.v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op)


@pytest.mark.parametrize("window, zero", [(1, {"stem/bias"}), (3, set())])
def test_a_bias_past_a_residual_pool_and_pointwise_convolution_gets_the_exact_zero(
        tmp_path, window, zero):
    result = cs_inprocess.compare(ghost_model, input_fn, {**PARAMS, "window": window},
                                  str(tmp_path), steps=STEPS)
    assert cs_inprocess.zero_gradient_variables(result.compiled) == zero
    moved = np.abs(result.cs.state["stem/bias"] - result.compiled.initial_weights["stem/bias"]).max()
    assert (moved == 0) == bool(zero)
    cs_inprocess.assert_same_training(result)
