"""Keras weight regularizers in a model_fn, written the way users write them: Conv2D and
Dense with kernel_regularizer=l2(...), their penalty added by get_regularization_loss()
(which Keras 3 never feeds: no penalty), by tf.add_n(model.losses), by each layer's
layer.losses, or a model without regularizers."""
from __future__ import annotations

import tensorflow as tf
from weight_decay_models import CLASSES, image_input_fn

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

L = tf.keras.layers
input_fn = image_input_fn  # 6 x 6 images of 2 channels, one of CLASSES each


def model_fn(features, labels, mode, params):
    """params["penalty"]: "collection" (get_regularization_loss), "model_losses",
    "layer_losses", or "none" (no regularizers at all)."""
    penalty = params.get("penalty", "collection")
    l2 = tf.keras.regularizers.l2(0.05) if penalty != "none" else None
    conv = L.Conv2D(4, 3, activation="relu", kernel_regularizer=l2)
    dense = L.Dense(CLASSES, kernel_regularizer=l2)
    model = tf.keras.Sequential([conv, L.Flatten(), dense])
    logits = model(features)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode=mode, predictions={"classes": tf.argmax(logits, -1)})
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    if penalty == "collection":
        loss += tf.compat.v1.losses.get_regularization_loss()
    elif penalty == "model_losses":
        loss += tf.add_n(model.losses)
    elif penalty == "layer_losses":
        loss += tf.add_n(conv.losses + dense.losses)
    train_op = None
    if mode == ModeKeys.TRAIN:
        train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
            loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op)
