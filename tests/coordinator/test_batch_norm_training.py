"""BatchNormalization in training, compiled and trained in process on the simulated CS
against TensorFlow (tests/cs_inprocess.py): a small CNN with Keras' BatchNormalization
(conv -> BN -> relu, training=True in TRAIN mode) and the hand-written tf.nn.moments +
tf.nn.batch_normalization pattern with moving statistics updated through UPDATE_OPS; the
batch's statistics over several micro-batches, the losses, weights and moving statistics
of TF, then evaluation on the CS with the moving statistics, and a resume."""
from __future__ import annotations

import cs_inprocess
import numpy as np
import pytest
import tensorflow as tf
import tf_reference

from common.errors import CSRunError
from coordinator.compiler import compile_model
from tf_model.estimator_spec import CSEstimatorSpec

BATCH, STEPS = 16, 4


def input_fn(params):
    rng = np.random.default_rng(7)
    n = BATCH * STEPS * 2
    x = (rng.normal(size=(n, 6, 6, 2)) * 2 + 1).astype(np.float32)
    y = rng.integers(0, 3, size=n).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(params["batch_size"], drop_remainder=True)


def keras_model_fn(features, labels, mode, params):
    h = tf.keras.layers.Conv2D(4, 3)(features)
    h = tf.keras.layers.BatchNormalization(momentum=0.9)(h, training=mode == "train")
    h = tf.nn.relu(h)
    logits = tf.keras.layers.Dense(3)(tf.keras.layers.Flatten()(h))
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    train_op = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9).minimize(
        loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op)


def batch_norm(x, training: bool, name: str, fused: bool = False):
    """The TF1 way: tf.nn.moments (or tf.compat.v1.nn.fused_batch_norm, whose batch variance
    is Bessel-corrected) in training, moving averages registered in UPDATE_OPS."""
    channels = x.shape[-1]
    with tf.compat.v1.variable_scope(name):
        gamma = tf.compat.v1.get_variable("gamma", [channels], initializer=tf.ones_initializer())
        beta = tf.compat.v1.get_variable("beta", [channels], initializer=tf.zeros_initializer())
        moving_mean = tf.compat.v1.get_variable("moving_mean", [channels], trainable=False,
                                                initializer=tf.zeros_initializer())
        moving_variance = tf.compat.v1.get_variable("moving_variance", [channels], trainable=False,
                                                    initializer=tf.ones_initializer())
    if fused and not training:
        return tf.compat.v1.nn.fused_batch_norm(x, gamma, beta, moving_mean, moving_variance,
                                                epsilon=1e-3, is_training=False)[0]
    if not training:
        return tf.nn.batch_normalization(x, moving_mean, moving_variance, beta, gamma, 1e-3)
    if fused:
        y, mean, variance = tf.compat.v1.nn.fused_batch_norm(x, gamma, beta, epsilon=1e-3)[:3]
    else:
        mean, variance = tf.nn.moments(x, axes=list(range(len(x.shape) - 1)))
    decay = 0.8
    updates = tf.compat.v1.GraphKeys.UPDATE_OPS
    tf.compat.v1.add_to_collection(updates, tf.compat.v1.assign(
        moving_mean, moving_mean * decay + mean * (1 - decay)))
    tf.compat.v1.add_to_collection(updates, tf.compat.v1.assign_sub(
        moving_variance, (moving_variance - variance) * (1 - decay)))
    return y if fused else tf.nn.batch_normalization(x, mean, variance, beta, gamma, 1e-3)


def moments_model_fn(features, labels, mode, params):
    h = tf.keras.layers.Conv2D(4, 3, use_bias=params.get("conv_bias", False))(features)
    h = tf.nn.relu(batch_norm(h, mode == "train", "bn1", fused=params.get("fused", False)))
    h = tf.keras.layers.Dense(5, use_bias=False)(tf.keras.layers.Flatten()(h))
    h = batch_norm(h, mode == "train", "bn2")
    logits = tf.keras.layers.Dense(3)(h)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    with tf.control_dependencies(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)):
        train_op = tf.compat.v1.train.AdamOptimizer(0.01).minimize(
            loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op)


PARAMS = {"batch_size": BATCH, "runconfig": {"tf_random_seed": 3}}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return cs_inprocess.micro_batch_comparisons(input_fn, tmp_path_factory, STEPS)


def train_both(prepared, model_fn, micro: int, params=PARAMS) -> cs_inprocess.Comparison:
    """Compile, then train STEPS batches on the CS (micro-batches of `micro`) and on TF."""
    return prepared(model_fn, params, micro)


@pytest.mark.slow
@pytest.mark.parametrize("micro, replicas", [(16, 1), (4, 1), (1, 1), (4, 2)])
def test_keras_batch_norm_trains_with_the_whole_batchs_statistics_like_tensorflow(tmp_path, prepared,
                                                                                  micro, replicas):
    params = {**PARAMS, "runconfig": {**PARAMS["runconfig"], "num_replicas": replicas}}
    result = train_both(prepared, keras_model_fn, micro, params)
    cs_inprocess.assert_same_training(result)
    assert "batch_norm_training" in {k.type for k in result.compiled.program.kernels}
    # Keras 3 in a v1 graph: nothing runs the layer's assign ops, so TF leaves the moving
    # statistics where they started; the CS does not hold them (host-side variables, written
    # to checkpoints as they are)
    host = result.compiled.host_variables
    for name in ("batch_normalization/moving_mean", "batch_normalization/moving_variance"):
        assert name not in result.cs.state
        np.testing.assert_array_equal(host[name], result.reference.state[name])
    assert "Batch barrier: batch_normalization" in result.compiled.report_text
    assert "Batch normalization batch_normalization: the train_op moves no moving statistics" \
        in result.compiled.report_text  # the user learns it before evaluating
    assert cs_inprocess.evaluation_mismatch(keras_model_fn, input_fn, params, str(tmp_path),
                                            result) == ""


@pytest.mark.slow
@pytest.mark.parametrize("fused", [False, True])
def test_hand_written_batch_norm_moves_the_moving_statistics_like_tensorflow(tmp_path, prepared, fused):
    params = {**PARAMS, "fused": fused}
    result = train_both(prepared, moments_model_fn, 4, params)
    cs_inprocess.assert_same_training(result)
    for name in ("bn1/moving_mean", "bn1/moving_variance", "bn2/moving_mean", "bn2/moving_variance"):
        assert not np.array_equal(result.cs.state[name], result.compiled.initial_weights[name])
        np.testing.assert_allclose(result.cs.state[name], result.reference.state[name], rtol=1e-5,
                                   atol=1e-6)
    # evaluation normalises with the moving statistics (the inference kernel)
    eval_compiled = cs_inprocess.compile_checked(moments_model_fn, input_fn, params, str(tmp_path),
                                                 mode="eval")
    assert "batch_norm_inference" in {k.type for k in eval_compiled.program.kernels}
    assert cs_inprocess.evaluation_mismatch(moments_model_fn, input_fn, params, str(tmp_path),
                                            result) == ""
    assert "Moving statistic: bn1/moving_variance = v - (v - batch) * 0.2" in \
        result.compiled.report_text
    assert "the train_op moves no moving statistics" not in result.compiled.report_text
    if fused:
        return
    # a resume from step 2's state ends where an unbroken run ends
    program, weights = result.compiled.program, result.compiled.initial_weights
    data = tf_reference.batches(input_fn, params, STEPS)
    first = cs_inprocess.run_on_cs(program, weights, data[:2])
    resumed = cs_inprocess.run_on_cs(program, first.state, data[2:], global_step=2, first_batch=2)
    unbroken = cs_inprocess.run_on_cs(program, weights, data)
    assert first.losses + resumed.losses == unbroken.losses
    for name, value in unbroken.state.items():
        np.testing.assert_array_equal(resumed.state[name], value, err_msg=name)


def film_model_fn(features, labels, mode, params):
    """FiLM's conditional normalisation: BatchNormalization(center=False[, scale=False]) then a
    per-sample scale and shift computed from the input (Keras 3 builds x * inv + (-mean) * inv)."""
    h = tf.keras.layers.Conv2D(4, 3)(features)
    h = tf.keras.layers.BatchNormalization(center=False, scale=params["scale"])(
        h, training=mode == "train")
    condition = tf.keras.layers.Dense(8)(tf.reduce_mean(features, axis=[1, 2]))
    gamma, beta = tf.split(condition[:, None, None, :], 2, axis=-1)
    h = tf.nn.relu((1.0 + gamma) * h + beta)
    logits = tf.keras.layers.Dense(3)(tf.keras.layers.Flatten()(h))
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    train_op = tf.compat.v1.train.AdamOptimizer(0.01).minimize(
        loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op)


@pytest.mark.slow
@pytest.mark.parametrize("scale", [False, True])
def test_batch_norm_without_center_trains_and_evaluates_like_tensorflow(tmp_path, prepared, scale):
    params = {**PARAMS, "scale": scale}
    result = train_both(prepared, film_model_fn, 4, params)
    cs_inprocess.assert_same_training(result)
    assert "batch_norm_training" in {k.type for k in result.compiled.program.kernels}
    assert cs_inprocess.evaluation_mismatch(film_model_fn, input_fn, params, str(tmp_path),
                                            result) == ""


def other_reduction_model_fn(features, labels, mode, params):
    h = tf.keras.layers.Dense(4)(tf.keras.layers.Flatten()(features))
    mean, variance = tf.nn.moments(h, axes=[0])
    inv = tf.math.rsqrt(variance + 1e-3)
    h = h * inv - mean * inv  # by hand, its shift a product of two statistics (whitening by
    # (h - mean) * inv trains: tests/coordinator/test_batch_statistics.py)
    logits = tf.keras.layers.Dense(3)(h)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=tf.compat.v1.train.GradientDescentOptimizer(
        0.1).minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step()))


def test_other_batch_statistics_stay_refused_naming_the_op(tmp_path):
    with pytest.raises(CSRunError) as error:
        cs_inprocess.compile_checked(other_reduction_model_fn, input_fn, PARAMS, str(tmp_path))
    words = cs_inprocess.model_op_words(other_reduction_model_fn, input_fn, PARAMS)
    assert cs_inprocess.refusal_problem(error.value, __file__, words) == ""
    assert "tf.nn.moments over every axis but the last" in str(error.value)


def renorm_model_fn(features, labels, mode, params):
    h = tf.keras.layers.Dense(4)(tf.keras.layers.Flatten()(features))
    h = tf.keras.layers.BatchNormalization(renorm=True)(h, training=True)  # batch renormalization
    logits = tf.keras.layers.Dense(3)(h)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=tf.compat.v1.train.GradientDescentOptimizer(
        0.1).minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step()))


def test_a_batch_normalization_the_cs_does_not_carry_out_is_refused_saying_what_it_does(tmp_path):
    with pytest.raises(CSRunError) as error:
        cs_inprocess.compile_checked(renorm_model_fn, input_fn, PARAMS, str(tmp_path))
    words = cs_inprocess.model_op_words(renorm_model_fn, input_fn, PARAMS)
    assert cs_inprocess.refusal_problem(error.value, __file__, words) == ""
    assert "tf.nn.moments over every axis but the last" in str(error.value)


def test_a_batch_norm_whose_statistics_never_move_is_said_on_the_console_at_compile(tmp_path, capsys):
    """Keras 3's layer in a v1 graph: the user learns it when the model compiles, not from a
    stale evaluation; the hand-written pattern moving its statistics says nothing."""
    compile_model(keras_model_fn, input_fn, PARAMS, str(tmp_path / "keras"), validate_only=True)
    said = capsys.readouterr().out
    assert "csrun: warning: batch normalization batch_normalization: the train_op moves no " \
        "moving statistics" in said and "hint: compute them with tf.nn.moments" in said
    compile_model(moments_model_fn, input_fn, PARAMS, str(tmp_path / "moments"), validate_only=True)
    assert "warning" not in capsys.readouterr().out


@pytest.mark.parametrize("fused", [False, True])
def test_a_conv_bias_whose_batch_mean_the_moving_mean_follows_is_refused_under_adam(tmp_path, fused):
    """Conv2D with its bias before the hand-written normalization: the bias's gradient is 0
    exactly (shift.py), but TF's Adam moves it by rounding noise and bn1/moving_mean follows
    the batch's mean, the bias in it; the CS's exact 0 would leave the moving mean apart
    from TF's (noise.check_moving_shift). Refused in one line naming the bias."""
    params = {**PARAMS, "fused": fused, "conv_bias": True}
    with pytest.raises(CSRunError) as error:
        cs_inprocess.compile_checked(moments_model_fn, input_fn, params, str(tmp_path))
    words = cs_inprocess.model_op_words(moments_model_fn, input_fn, params)
    assert cs_inprocess.refusal_problem(error.value, __file__, words) == ""
    assert str(error.value).startswith("the gradient of conv2d/bias is 0 in exact arithmetic")
    assert "bn1/moving_mean" in str(error.value) and "use_bias=False" in error.value.hint
