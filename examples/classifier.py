"""What the digit classifiers' model_fns return, given their logits: predictions, sparse
softmax cross-entropy, the optimizer the params name, and accuracy computed on the host."""
from __future__ import annotations

import tensorflow as tf

from examples.optimizer import build_optimizer
from launcher.estimator import CSEstimatorSpec, ModeKeys


def host_metrics(logits: tf.Tensor, labels: tf.Tensor):
    """Computed on the host from the logits and labels (streamed back from the CS)."""
    return {"accuracy": tf.compat.v1.metrics.accuracy(labels, tf.argmax(logits, axis=1))}


def classifier_spec(logits: tf.Tensor, labels: tf.Tensor, mode: str, params: dict) -> CSEstimatorSpec:
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
