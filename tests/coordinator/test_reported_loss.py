"""model_fn returns one loss and its optimizer minimizes another (TF trains on the minimized
value and reports the returned one): a detector-style head whose weight decay is in the
objective only, a classifier minimizing its loss plus an auxiliary head's, and
get_total_loss() (Keras kernel_regularizer terms) minimized while the data loss is returned.
The CS trains on the minimized loss and reports the returned one from the same forward pass:
the reported losses and the weights TF's (4 steps, 1e-5), evaluation and prediction the CPU
path's. A returned loss the CS cannot compute so is refused in one line naming its op."""
from __future__ import annotations

import inspect

import cs_inprocess
import numpy as np
import pytest
import tensorflow as tf

from common.errors import CSRunError
from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

v1 = tf.compat.v1
PARAMS = {"runconfig": {"tf_random_seed": 7}}
K = 3  # classes


def input_fn(params):
    rng = np.random.default_rng(4)
    x = rng.normal(size=(64, 6, 6, 2)).astype(np.float32)
    cls = rng.integers(0, K, size=(64, 9)).astype(np.int32)
    box = rng.normal(size=(64, 9, 4)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((x, {"cls": cls, "box": box})).batch(
        16, drop_remainder=True)


def detector(features, labels, mode, params):
    """Anchors on a 3x3 grid: class logits and boxes, loss divided by the positives' count;
    the optimizer minimizes it plus weight decay on the conv kernels, model_fn returns it."""
    h = tf.keras.layers.Conv2D(8, 3, padding="same", activation="relu", name="conv")(features)
    h = tf.keras.layers.MaxPooling2D(2)(h)
    cls_logits = tf.reshape(tf.keras.layers.Conv2D(K, 1, name="cls_head")(h), [-1, 9, K])
    box_pred = tf.reshape(tf.keras.layers.Conv2D(4, 1, name="box_head")(h), [-1, 9, 4])
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"scores": tf.nn.softmax(cls_logits),
                                                  "box": box_pred})
    pos = tf.cast(labels["cls"] > 0, tf.float32)
    num_pos = tf.maximum(tf.reduce_sum(pos), 1.0)
    ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels["cls"], logits=cls_logits)
    box_loss = v1.losses.huber_loss(labels["box"], box_pred, weights=pos[..., None],
                                    reduction=v1.losses.Reduction.SUM) / num_pos
    loss = tf.reduce_sum(ce) / num_pos + 0.5 * box_loss
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss, eval_metric_ops={
            "box_loss": v1.metrics.mean(box_loss)})
    kernels = [v for v in v1.trainable_variables() if "kernel" in v.name]
    total = loss + 1e-2 * tf.add_n([tf.nn.l2_loss(v) for v in kernels])
    train_op = v1.train.MomentumOptimizer(0.05, 0.9).minimize(
        total, global_step=v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode, loss=loss, train_op=train_op)


def auxiliary(features, labels, mode, params):
    """A classifier with an auxiliary head on its first block (Inception's): the optimizer
    minimizes the main loss plus 0.4 times the auxiliary one, model_fn returns the main."""
    flat = tf.keras.layers.Flatten()(features)
    h = tf.keras.layers.Dense(16, activation="relu", name="block1")(flat)
    aux_logits = tf.keras.layers.Dense(K, name="aux_head")(h)
    logits = tf.keras.layers.Dense(K, name="head")(
        tf.keras.layers.Dense(16, activation="relu", name="block2")(h))
    y = labels["cls"][:, 0]
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"class": tf.argmax(logits, -1)})
    loss = v1.losses.sparse_softmax_cross_entropy(y, logits)
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss, eval_metric_ops={
            "accuracy": v1.metrics.accuracy(y, tf.argmax(logits, -1))})
    aux_loss = v1.losses.sparse_softmax_cross_entropy(y, aux_logits)
    if params.get("after_update"):  # the returned loss read after the update: refused
        train_op = v1.train.AdamOptimizer(1e-2).minimize(
            loss + 0.4 * aux_loss, global_step=v1.train.get_or_create_global_step())
        with tf.control_dependencies([train_op]):
            returned = tf.identity(loss) * 1.0  # after update line
        return CSEstimatorSpec(mode, loss=returned, train_op=train_op)
    train_op = v1.train.AdamOptimizer(1e-2).minimize(
        loss + 0.4 * aux_loss, global_step=v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode, loss=loss, train_op=train_op)


def total_loss(features, labels, mode, params):
    """Keras kernel_regularizer penalties registered in the losses collection:
    get_total_loss() minimized, the data loss returned."""
    l2 = tf.keras.regularizers.l2(1e-3)
    flat = tf.keras.layers.Flatten()(features)
    dense = tf.keras.layers.Dense(12, activation="tanh", kernel_regularizer=l2, name="hidden")
    out = tf.keras.layers.Dense(K, kernel_regularizer=l2, name="out")
    logits = out(dense(flat))
    y = labels["cls"][:, 0]
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"probabilities": tf.nn.softmax(logits)})
    loss = v1.losses.sparse_softmax_cross_entropy(y, logits)
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss)
    for penalty in dense.losses + out.losses:
        v1.losses.add_loss(penalty, v1.GraphKeys.REGULARIZATION_LOSSES)
    minimized, returned = v1.losses.get_total_loss(), loss
    if params.get("swapped"):  # the penalties reported, not minimized: refused
        minimized, returned = loss, v1.losses.get_total_loss()  # swapped line
    train_op = v1.train.GradientDescentOptimizer(0.1).minimize(
        minimized, global_step=v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode, loss=returned, train_op=train_op)


def line_of(fragment: str) -> str:
    lines = inspect.getsource(inspect.getmodule(detector)).splitlines()
    return f"test_reported_loss.py:{next(i for i, text in enumerate(lines) if fragment in text) + 1}"


@pytest.mark.parametrize("model_fn", [detector, auxiliary, total_loss])
def test_trains_on_the_minimized_loss_and_reports_the_returned_one(model_fn, tmp_path):
    result = cs_inprocess.compare(model_fn, input_fn, PARAMS, str(tmp_path), steps=4)
    cs_inprocess.assert_same_training(result, rtol=1e-5)
    program = result.compiled.program
    assert program.reported_loss_kernel and program.reported_loss_kernel != program.loss_kernel
    assert "reports the one model_fn returns" in result.compiled.report_text
    # the penalties (the detector's decay, the Keras L2s) the minimized loss's alone: their
    # gradients added, their values left out of the reported loss
    terms = [r for k in program.kernels for p in k.params for r in p.regularizers]
    assert len(terms) == {"detector": 3, "auxiliary": 0, "total_loss": 2}[model_fn.__name__]
    assert all(r.unreported for r in terms)
    assert cs_inprocess.cpu_path_mismatches(model_fn, input_fn, PARAMS, str(tmp_path),
                                            result) == []


def test_a_returned_loss_computed_after_the_update_is_refused_in_one_line(tmp_path):
    with pytest.raises(CSRunError) as info:
        cs_inprocess.compile_checked(auxiliary, input_fn, {**PARAMS, "after_update": True},
                                     str(tmp_path))
    message = info.value.message
    assert "\n" not in message and line_of("after update line") in message
    assert "the loss model_fn returns after a write" in message


def test_a_penalty_reported_but_not_minimized_is_refused_in_one_line(tmp_path):
    """get_total_loss() returned while the data loss is minimized: TF reports penalties
    whose gradients it does not apply, which the CS does not carry."""
    with pytest.raises(CSRunError) as info:
        cs_inprocess.compile_checked(total_loss, input_fn, {**PARAMS, "swapped": True},
                                     str(tmp_path))
    message = info.value.message
    assert "\n" not in message and line_of("swapped line") in message
    assert "holds a weight penalty on hidden/kernel" in message
