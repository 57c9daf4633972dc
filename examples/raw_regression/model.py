"""model_fn of the raw-ops regression: layers made of tf.compat.v1.get_variable and
tf.matmul, the mean squared error written by hand, momentum (`optimizer` params); the
root mean squared error is computed on the host."""
from __future__ import annotations

import tensorflow as tf

from examples.digits import INPUT_SPEC
from examples.optimizer import OPTIMIZER_SPEC, build_optimizer
from launcher.estimator import CSEstimatorSpec, ModeKeys
from launcher.params_spec import Key

# Every params key the model and its input read, checked before any work (run.py).
PARAMS_SPEC = {**INPUT_SPEC, **OPTIMIZER_SPEC, "model": {"hidden_sizes": Key("ints", minimum=1)}}


def build_prediction(features: tf.Tensor, config: dict) -> tf.Tensor:
    """(batch, 1): tanh hidden layers, then a linear output."""
    sizes = [int(features.shape[1]), *config["hidden_sizes"], 1]
    h = features
    for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:])):
        with tf.compat.v1.variable_scope(f"layer{i}"):
            w = tf.compat.v1.get_variable("weights", [n_in, n_out],
                                          initializer=tf.compat.v1.glorot_uniform_initializer())
            b = tf.compat.v1.get_variable("bias", [n_out], initializer=tf.zeros_initializer())
        h = tf.matmul(h, w) + b
        if i < len(sizes) - 2:
            h = tf.nn.tanh(h)
    return h


def host_metrics(prediction: tf.Tensor, labels: tf.Tensor):
    return {"rmse": tf.compat.v1.metrics.root_mean_squared_error(labels, tf.reshape(prediction, [-1]))}


def model_fn(features, labels, mode, params):
    prediction = build_prediction(features, params["model"])
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode=mode, predictions={"target": tf.reshape(prediction, [-1])})
    loss = tf.reduce_mean(tf.square(prediction - tf.reshape(labels, [-1, 1])))
    train_op = None
    if mode == ModeKeys.TRAIN:
        train_op = build_optimizer(params["optimizer"]).minimize(
            loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op,
                           host_call=(host_metrics, [prediction, labels]))
