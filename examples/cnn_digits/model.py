"""model_fn of the CNN example: conv2d + max pooling + dense layers on 8x8x1 digits."""
from __future__ import annotations

import tensorflow as tf

from examples.optimizer import build_optimizer
from launcher.estimator import CSEstimatorSpec, ModeKeys


def build_logits(images: tf.Tensor, config: dict, training: bool) -> tf.Tensor:
    h = images
    for filters in config["conv_filters"]:
        h = tf.keras.layers.Conv2D(filters, config.get("kernel_size", 3), padding="same",
                                   activation="relu")(h)
        h = tf.keras.layers.MaxPooling2D(2)(h)
    h = tf.keras.layers.Flatten()(h)
    h = tf.keras.layers.Dense(config["dense_units"], activation="relu")(h)
    if config.get("dropout", 0.0) > 0:
        h = tf.keras.layers.Dropout(config["dropout"])(h, training=training)
    return tf.keras.layers.Dense(10)(h)


def host_metrics(logits: tf.Tensor, labels: tf.Tensor):
    """Evaluated on the host from the logits and labels the CS streams back."""
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
    tf.compat.v1.summary.scalar("loss", loss)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op,
                           host_call=(host_metrics, [logits, labels]))
