"""Quantization-aware training on the CS (issue 21): fake quantization of the input (a fixed
range), of activations with learned min/max variables and of weights (their range from the
weight, or learned per channel) in a conv + BatchNormalization + dense model, trained 4
steps against TensorFlow (tests/cs_inprocess.py) and evaluated on the CS."""
from __future__ import annotations

import cs_inprocess
import numpy as np
import pytest
import tensorflow as tf

from common.errors import CSRunError
from coordinator.compiler import compile_model
from tf_model.estimator_spec import CSEstimatorSpec

v1 = tf.compat.v1
BATCH, STEPS = 8, 4


def input_fn(params):
    rng = np.random.default_rng(11)
    n = BATCH * STEPS * 2
    x = (rng.normal(size=(n, 6, 6, 2)) * 2 + 0.5).astype(np.float32)
    y = rng.integers(0, 3, size=n).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(params["batch_size"],
                                                                     drop_remainder=True)


def quantized(w):
    """A weight fake-quantized over its own range (8 bits, narrow: symmetric int8)."""
    return tf.quantization.fake_quant_with_min_max_vars(w, tf.reduce_min(w), tf.reduce_max(w),
                                                        num_bits=8, narrow_range=True)


def qat_model(features, labels, mode, params):
    """input fake-quantized to a fixed range -> conv (its kernel fake-quantized) -> BN ->
    fake quant with learned min/max -> dense (its kernel fake-quantized per output channel
    with learned 4-bit ranges) -> cross-entropy, Adam (min and max learn too)."""
    x = tf.quantization.fake_quant_with_min_max_args(features, -4.0, 6.0, num_bits=8)
    kernel = v1.get_variable("conv/kernel", [3, 3, 2, 4], initializer=v1.glorot_uniform_initializer())
    h = tf.nn.conv2d(x, quantized(kernel), strides=1, padding="VALID")
    h = tf.keras.layers.BatchNormalization(momentum=0.9)(h, training=mode == "train")
    low = v1.get_variable("act_quant/min", initializer=-1.0)
    high = v1.get_variable("act_quant/max", initializer=1.5)
    h = tf.quantization.fake_quant_with_min_max_vars(h, low, high, num_bits=params["bits"])
    dense = v1.get_variable("dense/kernel", [64, 3], initializer=v1.glorot_uniform_initializer())
    w_low = v1.get_variable("dense/w_min", initializer=tf.fill([3], -0.15))
    w_high = v1.get_variable("dense/w_max", initializer=tf.fill([3], 0.2))
    w = tf.quantization.fake_quant_with_min_max_vars_per_channel(dense, w_low, w_high, num_bits=4,
                                                                 narrow_range=True)
    logits = tf.matmul(tf.reshape(h, [-1, 64]), w) + v1.get_variable("dense/bias", [3])
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    train_op = v1.train.AdamOptimizer(0.01).minimize(loss, global_step=v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op)


def params(**extra):
    return {"batch_size": BATCH, "bits": 8, "runconfig": {"tf_random_seed": 5}, **extra}


@pytest.mark.parametrize("bits", [8, 5])
def test_a_quantization_aware_model_trains_and_evaluates_like_tensorflow(tmp_path, bits):
    run = cs_inprocess.compare(qat_model, input_fn, params(bits=bits), str(tmp_path / "train"),
                               steps=STEPS)
    kernels = run.compiled.program.kernels
    assert [k.type for k in kernels].count("fake_quant") == 2  # input, activations
    weight_kernels = [k.type for p in [run.compiled.program.weight_program] if p for k in p.kernels]
    assert weight_kernels.count("fake_quant") == 2  # the conv's and the dense's kernels
    cs_inprocess.assert_same_training(run)
    for name, start in (("act_quant/min", -1.0), ("act_quant/max", 1.5), ("dense/w_min", -0.15),
                        ("dense/w_max", 0.2)):
        assert np.all(run.cs.state[name] != np.float32(start)), name  # the ranges learned
    assert cs_inprocess.evaluation_mismatch(qat_model, input_fn, params(bits=bits),
                                            str(tmp_path / "eval"), run) == ""


def batch_range_model(features, labels, mode, params):
    """The activations' range taken from the batch itself: not a per-sample computation."""
    h = tf.keras.layers.Dense(4)(tf.reshape(features, [-1, 72]))
    h = tf.quantization.fake_quant_with_min_max_vars(h, tf.reduce_min(h), tf.reduce_max(h))
    logits = tf.keras.layers.Dense(3)(h)
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=v1.train.GradientDescentOptimizer(0.1).minimize(loss))


def test_a_fake_quant_over_the_batchs_range_is_refused_in_one_line(tmp_path):
    with pytest.raises(CSRunError) as error:
        compile_model(batch_range_model, input_fn, params(), str(tmp_path), validate_only=True)
    words = cs_inprocess.model_op_words(batch_range_model, input_fn, params())
    assert cs_inprocess.refusal_problem(error.value, __file__, words) == ""
    assert "FakeQuantWithMinMaxVars" in str(error.value)
