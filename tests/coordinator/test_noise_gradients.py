"""A gradient that is rounding noise (zero in exact arithmetic: a bias before a batch
normalization in training) under an optimizer that divides by the gradient's size (Adam,
RMSProp) is refused in one line naming the variable and its source line, with what to do
(coordinator/compiler/training/noise.py), unless the compiler proves it 0 and applies the
exact 0 (a bias right before the normalization, or through a matrix product: shift.py), which
stands where no moving statistic follows the batch's mean the bias is in, or under SGD and
momentum, whose steps stay at the noise's level; without the bias the model trains on the CS
like TensorFlow."""
from __future__ import annotations

import dataclasses
import inspect
import tempfile

import cs_inprocess
import numpy as np
import pytest
import random_models as rm
import tensorflow as tf

from common.errors import CSRunError
from coordinator.compiler import compile_model
from coordinator.compiler.training.noise import VISIBLE_AMPLIFICATION, relative_step
from coordinator.compiler.training.numbers import GRADIENT_NOISE
from tf_model.estimator_spec import CSEstimatorSpec
from wafer.optimizers import OptimizerConfig

# Found by the differential test with a fresh seed: image -> Conv2D -> Flatten ->
# Dense(WIDTH) (with a bias) -> Dense(use_bias=False) -> batch normalization in training.
# The bias's gradient was 6.3e-8 (1.3e-7 of the largest) and Adam trained it differently;
# it was refused, and is now proven 0 (shift.py through the matrix product).
DRAWN = rm.ModelSpec(inputs="image", blocks=(), task="regression", loss="huber", optimizer="adam",
                     schedule="constant", transform="none", var_subset=False, l2="none", seed=5,
                     weights="none", replicas=1, batch_norm="batch_norm")


def first_dense_line() -> str:
    """random_models.py's line of first_layer's Dense(WIDTH) for image inputs."""
    lines, start = inspect.getsourcelines(rm.first_layer)
    offset = next(i for i, line in enumerate(lines) if "Dense(WIDTH)(x)" in line)
    return f"random_models.py:{start + offset}"


def refusal(model_fn, input_fn, params) -> CSRunError | None:
    with tempfile.TemporaryDirectory() as model_dir:
        try:
            compile_model(model_fn, input_fn, params, model_dir, validate_only=True)
        except CSRunError as error:
            return error
    return None


@pytest.mark.parametrize("batch_norm, optimizer", [("batch_norm", "adam"),
                                                   ("batch_norm_moments", "momentum")])
def test_a_bias_through_a_dense_into_a_batch_normalization_gets_the_exact_zero(
        batch_norm, optimizer, tmp_path):
    """Once refused as rounding noise: the bias reaches the normalization through a matrix
    product (Dense(use_bias=False)), constant along the batch, which shift.py follows, so
    the CS applies the exact 0 and trains the rest like TensorFlow: Keras' normalization
    here moves no moving statistic (Keras 3 in a tf.compat.v1 graph), and under momentum
    TF's noise steps leave tf.nn.moments' moving mean as the CS's."""
    spec = dataclasses.replace(DRAWN, batch_norm=batch_norm, optimizer=optimizer)
    result = cs_inprocess.compare(rm.model_fn, rm.input_fn, rm.params_for(spec), str(tmp_path),
                                  steps=4)
    assert "dense/bias" in cs_inprocess.zero_gradient_variables(result.compiled)
    assert cs_inprocess.mismatches(result) == []


@pytest.mark.parametrize("optimizer", ["adam", "rmsprop"])
def test_a_proven_zero_bias_whose_batch_mean_a_moving_mean_follows_is_refused(optimizer):
    """tf.nn.moments' moving mean (momentum 0.9) follows the batch's mean, the bias in it:
    TF's Adam moves the bias by its rounding noise, the CS's exact 0 does not, and the
    moving means ended 2.4e-3 apart after 10 steps (test_differential's model, validated
    then trained differently). Refused in one line naming the bias and its line."""
    spec = dataclasses.replace(DRAWN, batch_norm="batch_norm_moments", optimizer=optimizer)
    error = refusal(rm.model_fn, rm.input_fn, rm.params_for(spec))
    assert error is not None
    assert "\n" not in str(error)
    assert str(error).startswith("the gradient of dense/bias is 0 in exact arithmetic")
    assert "bn0/moving_mean" in str(error)
    assert f"'dense/bias' at tests/{first_dense_line()})" in str(error)
    assert "use_bias=False" in error.hint and "var_list" in error.hint


def test_momentum_whose_steps_stay_at_the_noise_level_is_accepted():
    spec = dataclasses.replace(DRAWN, optimizer="momentum")
    assert refusal(rm.model_fn, rm.input_fn, rm.params_for(spec)) is None


def test_the_step_of_a_noise_gradient_relative_to_the_largest():
    """The measured repro: a gradient of 6.3e-8 against 0.5. SGD and momentum keep the ratio
    of the gradients; Adagrad's initial accumulator (0.1) dominates the noise; Adam and
    RMSProp divide by the gradient's own size."""
    g, largest = 6.3e-8, 0.5
    limit = VISIBLE_AMPLIFICATION * GRADIENT_NOISE
    for config in (OptimizerConfig("sgd", 0.1), OptimizerConfig("momentum", 0.1, momentum=0.9),
                   OptimizerConfig("adagrad", 0.1, initial_accumulator_value=0.1)):
        assert relative_step(config, g, largest) <= limit
    assert relative_step(OptimizerConfig("sgd", 0.1), g, largest) == pytest.approx(g / largest)
    adam = OptimizerConfig("adam", 0.01, beta1=0.9, beta2=0.999, epsilon=1e-8)
    rmsprop = OptimizerConfig("rmsprop", 0.01, decay=0.9, epsilon=1e-10)
    assert relative_step(adam, g, largest) == pytest.approx(g / (g + 1e-8) * (largest + 1e-8) / largest)
    assert relative_step(adam, g, largest) > 0.8 and relative_step(rmsprop, g, largest) > limit
    # a gradient far below Adam's epsilon moves at the noise's level
    assert relative_step(adam, 1e-16, largest) < limit
    # Adadelta divides by its accumulator of g * g as RMSProp; FTRL and ProximalAdagrad by
    # their accumulators from TF's initial 0.1, as Adagrad
    adadelta = OptimizerConfig("adadelta", 0.001, decay=0.95, epsilon=1e-8)
    assert relative_step(adadelta, g, largest) > limit
    for kind in ("ftrl", "proximal_adagrad"):
        assert relative_step(OptimizerConfig(kind, 0.1, initial_accumulator_value=0.1), g, largest) <= limit


def resnet_input_fn(params):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(64, 6, 6, 2)).astype(np.float32)
    y = rng.integers(0, 3, size=64).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(params["batch_size"], drop_remainder=True)


def resnet_model_fn(features, labels, mode, params):
    """The Keras ResNet block's stem: Conv2D -> BatchNormalization -> relu, with Adam."""
    h = tf.keras.layers.Conv2D(4, 3, use_bias=params["use_bias"])(features)
    h = tf.nn.relu(tf.keras.layers.BatchNormalization()(h, training=mode == "train"))
    logits = tf.keras.layers.Dense(3)(tf.keras.layers.Flatten()(h))
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    train_op = tf.compat.v1.train.AdamOptimizer(0.01).minimize(
        loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op)


RESNET = {"batch_size": 16, "runconfig": {"tf_random_seed": 3}}


def test_a_conv_bias_right_before_keras_batch_normalization_gets_the_exact_zero_instead():
    """Proven 0 (shift.py: the normalization removes a per-channel shift), not refused."""
    with tempfile.TemporaryDirectory() as model_dir:
        compiled = compile_model(resnet_model_fn, resnet_input_fn, {**RESNET, "use_bias": True},
                                 model_dir, validate_only=True)
    assert "conv2d/bias: gradient 0 exactly" in compiled.report_text


@pytest.mark.slow
def test_without_the_bias_the_resnet_stem_trains_under_adam_like_tensorflow(tmp_path):
    result = cs_inprocess.compare(resnet_model_fn, resnet_input_fn, {**RESNET, "use_bias": False},
                                  str(tmp_path), steps=4)
    cs_inprocess.assert_same_training(result)


@pytest.mark.slow
def test_the_drawn_model_under_sgd_trains_like_tensorflow(tmp_path):
    spec = dataclasses.replace(DRAWN, optimizer="sgd")
    result = cs_inprocess.compare(rm.model_fn, rm.input_fn, rm.params_for(spec), str(tmp_path),
                                  rm.STEPS)
    cs_inprocess.assert_same_training(result)
