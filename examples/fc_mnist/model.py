"""model_fn of FC-MNIST: fully connected layers (784-500-300-10 by default) with dropout,
sparse softmax cross-entropy and the optimizer the params name (`examples.classifier`)."""
from __future__ import annotations

import tensorflow as tf

from examples.classifier import classifier_spec
from examples.digits import INPUT_SPEC
from examples.optimizer import OPTIMIZER_SPEC
from launcher.estimator import ModeKeys
from launcher.params_spec import Key

NUM_CLASSES = 10
# Every params key the model and its input read, checked before any work (run.py).
PARAMS_SPEC = {**INPUT_SPEC, **OPTIMIZER_SPEC, "model": {
    "hidden_sizes": Key("ints", minimum=1), "activation_fn": Key("str", required=False),
    "dropout": Key("number", minimum=0, below=1, required=False)}}


def build_logits(features: tf.Tensor, config: dict, training: bool) -> tf.Tensor:
    h = features
    for units in config["hidden_sizes"]:
        h = tf.keras.layers.Dense(units, activation=config.get("activation_fn", "relu"))(h)
        if config.get("dropout", 0.0) > 0:
            h = tf.keras.layers.Dropout(config["dropout"])(h, training=training)
    return tf.keras.layers.Dense(NUM_CLASSES)(h)


def model_fn(features, labels, mode, params):
    logits = build_logits(features, params["model"], training=mode == ModeKeys.TRAIN)
    return classifier_spec(logits, labels, mode, params)
