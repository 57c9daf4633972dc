"""Models with decoupled weight decay written by hand after (or before) the optimizer, the
modelzoo's AdamW-by-hand style, written the way users write them: an MLP and a CNN, Adam
and Momentum, a constant learning rate and a schedule, `v.assign_sub(wd * lr * v)` and
`v.assign(v * (1 - wd))`, every trainable variable or the kernels only."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

FEATURES, HIDDEN, CLASSES = 10, 16, 4


def input_fn(params):
    """Vectors of FEATURES values, a class each."""
    batch = params.get("batch_size", 8)
    rng = np.random.default_rng(11)
    x = rng.normal(size=(4 * batch, FEATURES)).astype(np.float32)
    y = (np.arange(4 * batch) % CLASSES).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)


def image_input_fn(params):
    """6 x 6 images of 2 channels, a class each."""
    batch = params.get("batch_size", 8)
    rng = np.random.default_rng(12)
    x = rng.uniform(size=(4 * batch, 6, 6, 2)).astype(np.float32)
    y = (np.arange(4 * batch) % CLASSES).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)


def _learning_rate(params, step):
    if params.get("schedule"):
        return tf.compat.v1.train.exponential_decay(0.05, step, 2, 0.5, staircase=True)
    return params.get("learning_rate", 0.05)


def _optimizer(params, lr):
    if params.get("optimizer") == "momentum":
        return tf.compat.v1.train.MomentumOptimizer(lr, 0.9)
    return tf.compat.v1.train.AdamOptimizer(lr)


def _decays(params, lr):
    """The decay of each variable it covers, as the user writes it."""
    wd = params.get("weight_decay", 0.1)
    variables = tf.compat.v1.trainable_variables()
    if params.get("kernels_only"):
        variables = [v for v in variables if "kernel" in v.name]
    if params.get("form") == "scale":
        return [v.assign(v * (1 - wd)) for v in variables]
    return [v.assign_sub(wd * lr * v) for v in variables]


def _spec(mode, labels, logits, params):
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode=mode, predictions={"classes": tf.argmax(logits, -1)})
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    train_op = None
    if mode == ModeKeys.TRAIN:
        step = tf.compat.v1.train.get_or_create_global_step()
        lr = _learning_rate(params, step)
        optimizer = _optimizer(params, lr)
        if params.get("decay_first"):
            decay = tf.group(*_decays(params, lr))
            with tf.control_dependencies([decay]):
                train_op = optimizer.minimize(loss, global_step=step)
        else:
            train = optimizer.minimize(loss, global_step=step)
            with tf.control_dependencies([train]):
                train_op = tf.group(*_decays(params, lr))
    metrics = {"accuracy": tf.compat.v1.metrics.accuracy(labels, tf.argmax(logits, -1))}
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op, eval_metric_ops=metrics)


def mlp(features, labels, mode, params):
    h = tf.keras.layers.Dense(HIDDEN, activation="relu")(features)
    return _spec(mode, labels, tf.keras.layers.Dense(CLASSES)(h), params)


def cnn(features, labels, mode, params):
    h = tf.keras.layers.Conv2D(4, 3, activation="relu")(features)
    h = tf.keras.layers.Flatten()(h)
    return _spec(mode, labels, tf.keras.layers.Dense(CLASSES)(h), params)

