"""A per-pixel segmenter evaluated with tf.compat.v1.metrics.mean_iou, as users write it: its
update op is not a tensor but the confusion matrix variable's assign_add, and the CS once
streamed nothing for it (the chief's evaluation then asked TensorFlow for the labels). The
CS's evaluation of a trained checkpoint equals the CPU path's. Written as one spec for every
mode (metrics returned in PREDICT too, whose float64 confusion matrix the CS once refused to
compute), it predicts on the CS as on the CPU: an Estimator runs only the predictions there."""
from __future__ import annotations

import tempfile

import cs_inprocess
import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

PARAMS = {"batch_size": 4, "runconfig": {"tf_random_seed": 7}}


def input_fn(params):
    rng = np.random.default_rng(2)
    x = rng.normal(0, 0.1, (16, 8, 8, 1)).astype(np.float32)
    y = np.zeros((16, 8, 8), np.int32)
    for i in range(16):
        a, b = rng.integers(0, 5, 2)
        x[i, a:a + 3, b:b + 3, 0] += 1.0
        y[i, a:a + 3, b:b + 3] = 1
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(params["batch_size"],
                                                            drop_remainder=True)


def model_fn(features, labels, mode, params):
    h = tf.keras.layers.Conv2D(4, 3, padding="same", activation="relu")(features)
    logits = tf.keras.layers.Conv2D(2, 1)(h)
    pred = tf.argmax(logits, -1)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    if mode == ModeKeys.TRAIN:
        train_op = tf.compat.v1.train.AdamOptimizer(0.01).minimize(
            loss, tf.compat.v1.train.get_or_create_global_step())
        return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op)
    return CSEstimatorSpec(mode=mode, loss=loss, eval_metric_ops={
        "iou": tf.compat.v1.metrics.mean_iou(labels, pred, num_classes=2),
        "accuracy": tf.compat.v1.metrics.accuracy(labels, pred)})


def test_mean_iou_evaluates_on_the_cs_as_on_the_cpu():
    with tempfile.TemporaryDirectory() as model_dir:
        trained = cs_inprocess.compare(model_fn, input_fn, PARAMS, model_dir, steps=2)
        cs_inprocess.assert_same_training(trained)
        assert cs_inprocess.evaluation_mismatch(model_fn, input_fn, PARAMS, model_dir,
                                                trained) == ""


def one_spec_model_fn(features, labels, mode, params):
    """The segmenter returning everything in every mode, as many users write model_fn."""
    h = tf.keras.layers.Conv2D(4, 3, padding="same", activation="relu")(features)
    logits = tf.keras.layers.Conv2D(2, 1)(h)
    pred = tf.argmax(logits, -1, output_type=tf.int32)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    train_op = tf.compat.v1.train.AdamOptimizer(0.01).minimize(
        loss, tf.compat.v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op,
                           predictions={"mask": pred, "probabilities": tf.nn.softmax(logits)},
                           eval_metric_ops={"iou": tf.compat.v1.metrics.mean_iou(labels, pred, 2)})


def test_metrics_returned_in_predict_mode_are_not_computed_and_the_cs_predicts_as_the_cpu():
    with tempfile.TemporaryDirectory() as model_dir:
        trained = cs_inprocess.compare(one_spec_model_fn, input_fn, PARAMS, model_dir, steps=2)
        cs_inprocess.assert_same_training(trained)
        assert cs_inprocess.cpu_path_mismatches(one_spec_model_fn, input_fn, PARAMS, model_dir,
                                                trained) == []
