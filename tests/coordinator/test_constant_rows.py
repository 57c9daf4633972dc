"""A value of constants alone with the batch's shape that a layer combines with weights
(unseen15's DDPM: the sinusoidal embedding of a fixed timestep tf.fill([batch], t) through a
Dense, joined with each sample's features): each sample's row of it is computed per sample,
and the model trains as TensorFlow trains it and predicts as the CPU path does."""
import cs_inprocess
import numpy as np
import pytest
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

v1 = tf.compat.v1
PARAMS = {"runconfig": {"tf_random_seed": 5}}


def input_fn(params):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(128, 8)).astype(np.float32)
    y = (x @ rng.normal(size=(8, 1))).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(16, drop_remainder=True)


def model_fn(features, labels, mode, params):
    batch = tf.shape(features)[0]
    if params["kind"] == "timestep":  # a fixed timestep's sinusoidal embedding
        angle = tf.cast(tf.fill([batch], 25), tf.float32)[:, None] * tf.constant([[1.0, 0.1]])
        embedding = tf.keras.layers.Dense(4, activation="swish")(
            tf.concat([tf.sin(angle), tf.cos(angle)], -1))
    else:  # ones shaped like a slice of the features, scaled
        embedding = tf.keras.layers.Dense(4, activation="tanh")(tf.ones_like(features[:, :2]) * 0.5)
    hidden = tf.keras.layers.Dense(8, activation="tanh")(tf.concat([features, embedding], 1))
    prediction = tf.keras.layers.Dense(1)(hidden)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode=mode, predictions={"y": prediction})
    loss = v1.losses.mean_squared_error(labels, prediction)
    train_op = v1.train.AdamOptimizer(1e-2).minimize(loss, global_step=v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op)


@pytest.mark.parametrize("kind", ["timestep", "ones"])
def test_constant_rows_through_a_dense_train_and_predict_like_tensorflow(tmp_path, kind):
    params = {**PARAMS, "kind": kind}
    result = cs_inprocess.compare(model_fn, input_fn, params, str(tmp_path), steps=4)
    cs_inprocess.assert_same_training(result, rtol=1e-5)
    assert "sample_constant" in [k.type for k in result.compiled.program.kernels]
    assert cs_inprocess.prediction_mismatch(model_fn, input_fn, params, str(tmp_path), result) == ""
