"""model_fn of the CNN example: conv2d + max pooling + dense layers on 8x8x1 digits."""
from __future__ import annotations

import tensorflow as tf

from examples.classifier import classifier_spec
from examples.digits import INPUT_SPEC
from examples.optimizer import OPTIMIZER_SPEC
from launcher.estimator import ModeKeys
from launcher.params_spec import Key

# Every params key the model and its input read, checked before any work (run.py).
PARAMS_SPEC = {**INPUT_SPEC, **OPTIMIZER_SPEC, "model": {
    "conv_filters": Key("ints", minimum=1), "kernel_size": Key("int", minimum=1, required=False),
    "dense_units": Key("int", minimum=1), "dropout": Key("number", minimum=0, below=1, required=False)}}


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


def model_fn(features, labels, mode, params):
    logits = build_logits(features, params["model"], training=mode == ModeKeys.TRAIN)
    return classifier_spec(logits, labels, mode, params)
