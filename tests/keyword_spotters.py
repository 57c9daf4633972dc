"""The keyword spotter's head as users write it after an audio front end (spectrogram, MFCCs):
two Conv2D, pooled, Dense to the keywords; Adam; accuracy evaluated, classes and
probabilities predicted."""
from __future__ import annotations

import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

v1 = tf.compat.v1
L = tf.keras.layers
WORDS = 4


def keyword_head(image: tf.Tensor, labels: tf.Tensor, mode: str,
                 learning_rate: float) -> CSEstimatorSpec:
    """The spotter's spec from a [B, frames, bands] `image` of the waveform."""
    x = L.Conv2D(8, 3, padding="same", activation="relu")(image[..., tf.newaxis])
    x = L.Conv2D(8, 3, activation="relu")(x)
    logits = L.Dense(WORDS)(L.GlobalAveragePooling2D()(x))
    classes = tf.argmax(logits, 1)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode=mode, predictions={"classes": classes,
                                                       "probabilities": tf.nn.softmax(logits)})
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode=mode, loss=loss, eval_metric_ops={
            "accuracy": v1.metrics.accuracy(labels, classes)})
    train_op = v1.train.AdamOptimizer(learning_rate).minimize(
        loss, global_step=v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op)
