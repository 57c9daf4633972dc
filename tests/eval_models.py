"""Models that train on the CS and once failed to evaluate or predict there (issue 20),
written the way users write them: a binary classifier of Keras Dense layers whose loss
carries weight penalties, with AUC, precision and recall as eval_metric_ops, and labels
given as a dict; threshold metrics of one and of three values.

    params["model"]["penalty"]:  "keras"   kernel_regularizer, get_regularization_loss() + layer.losses
                                 "l2_loss" tf.nn.l2_loss of every kernel
                                 "none"
    params["model"]["dict_labels"]: labels={"clicked": ..., "weight": ...}
    params["model"]["single_prediction"]: predictions is one tensor, not a dict

`train_input_fn` repeats its samples forever; `eval_input_fn` ends after them.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

BATCH = 16
SAMPLES = 8 * BATCH
FEATURES = 12


def params_for(penalty: str = "keras", dict_labels: bool = False, single_prediction: bool = False) -> dict:
    return {"input": {"batch_size": BATCH},
            "model": {"penalty": penalty, "dict_labels": dict_labels,
                      "single_prediction": single_prediction},
            "runconfig": {"tf_random_seed": 7}}


def samples(params: dict) -> tf.data.Dataset:
    rng = np.random.default_rng(11)
    x = rng.normal(size=(SAMPLES, FEATURES)).astype(np.float32)
    clicked = (x[:, :3].sum(axis=1) + 0.5 * rng.normal(size=SAMPLES) > 0).astype(np.int32)[:, None]
    labels = clicked
    if params["model"]["dict_labels"]:
        labels = {"clicked": clicked, "weight": rng.uniform(0.5, 1.5, size=(SAMPLES, 1)).astype(np.float32)}
    return tf.data.Dataset.from_tensor_slices((x, labels))


def train_input_fn(params):
    return samples(params).repeat().batch(params["input"]["batch_size"], drop_remainder=True)


def eval_input_fn(params):
    return samples(params).batch(params["input"]["batch_size"], drop_remainder=True)


def model_fn(features, labels, mode, params):
    config = params["model"]
    regularizer = tf.keras.regularizers.l2(1e-3) if config["penalty"] == "keras" else None
    layers = [tf.keras.layers.Dense(16, activation="relu", kernel_regularizer=regularizer),
              tf.keras.layers.Dense(1, kernel_regularizer=regularizer)]
    logits = layers[1](layers[0](features))
    probability = tf.sigmoid(logits)
    if mode == ModeKeys.PREDICT:
        if config["single_prediction"]:
            return CSEstimatorSpec(mode=mode, predictions=probability)
        return CSEstimatorSpec(mode=mode, predictions={
            "probability": probability, "clicked": tf.cast(probability > 0.5, tf.int32)})
    clicked = labels["clicked"] if isinstance(labels, dict) else labels
    cross_entropy = tf.compat.v1.losses.sigmoid_cross_entropy(clicked, logits)
    loss = cross_entropy
    if config["penalty"] == "keras":  # Keras 3 layers keep their penalties in layer.losses
        loss += tf.compat.v1.losses.get_regularization_loss() + tf.add_n(layers[0].losses + layers[1].losses)
    elif config["penalty"] == "l2_loss":
        loss += 1e-3 * tf.add_n([tf.nn.l2_loss(v) for v in tf.compat.v1.trainable_variables()
                                 if "kernel" in v.name])
    train_op = None
    if mode == ModeKeys.TRAIN:
        train_op = tf.compat.v1.train.AdamOptimizer(0.01).minimize(
            loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    metrics = {"auc": tf.compat.v1.metrics.auc(clicked, probability),
               "precision": tf.compat.v1.metrics.precision(clicked, probability > 0.5),
               "recall": tf.compat.v1.metrics.recall(clicked, probability > 0.5),
               "mean_probability": tf.compat.v1.metrics.mean(probability),
               "mean_logit": tf.compat.v1.metrics.mean(logits),  # a value the CS computes
               "cross_entropy": tf.compat.v1.metrics.mean(cross_entropy),  # the loss without penalties
               # metrics of several values: one threshold gives a [1] value, three a [3]
               "recall_at_0.3": tf.compat.v1.metrics.recall_at_thresholds(clicked, probability, [0.3]),
               "precision_at": tf.compat.v1.metrics.precision_at_thresholds(clicked, probability, [0.3, 0.5, 0.7])}
    if isinstance(labels, dict):
        metrics["weighted_accuracy"] = tf.compat.v1.metrics.accuracy(
            clicked, tf.cast(probability > 0.5, tf.int32), weights=labels["weight"])
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op, eval_metric_ops=metrics)
