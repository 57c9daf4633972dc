"""model_fn of FC-MNIST: fully connected layers (784-500-300-10 by default) with dropout,
sparse softmax cross-entropy, and the optimizer the params name."""
from __future__ import annotations

import tensorflow as tf

from examples.optimizer import build_optimizer
from launcher.estimator import CSEstimatorSpec, ModeKeys

NUM_CLASSES = 10


def build_logits(features: tf.Tensor, config: dict, training: bool) -> tf.Tensor:
    h = features
    for units in config["hidden_sizes"]:
        h = tf.keras.layers.Dense(units, activation=config.get("activation_fn", "relu"))(h)
        if config.get("dropout", 0.0) > 0:
            h = tf.keras.layers.Dropout(config["dropout"])(h, training=training)
    return tf.keras.layers.Dense(NUM_CLASSES)(h)


def host_metrics(logits: tf.Tensor, labels: tf.Tensor):
    """Computed on the host from the logits and labels (streamed back from the CS)."""
    return {"accuracy": tf.compat.v1.metrics.accuracy(labels, tf.argmax(logits, axis=1))}


def model_fn(features, labels, mode, params):
    logits = build_logits(features, params["model"], training=mode == ModeKeys.TRAIN)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode=mode, predictions={"classes": tf.argmax(logits, axis=1),
                                                       "probabilities": tf.nn.softmax(logits)})
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    train_op = None
    if mode == ModeKeys.TRAIN:
        train_op = build_optimizer(params["optimizer"]).minimize(
            loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op,
                           host_call=(host_metrics, [logits, labels]))
