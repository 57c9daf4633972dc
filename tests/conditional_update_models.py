"""Train ops that apply their updates inside a tf.cond, written the way users write them,
for tests/coordinator/test_conditional_updates.py: hand-written gradient accumulation
(non-trainable accumulators, assign_add of each step's gradients, every `every` steps the
optimizer applies them inside a tf.cond and zeroes them; the global step increments every
step), the updates applied every N steps without accumulating, and a cond whose predicate
is the batch's accuracy (refused: no value of the global step).

A small classifier on scikit-learn's digits; `params["optimizer"]`: "momentum" or "adam";
`params["every"]`: N."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from examples.digits import digits_split
from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

v1 = tf.compat.v1
L = tf.keras.layers


def input_fn(params):
    """Digits flattened to 64 values in [0, 1] and their class."""
    images, labels = digits_split(training=True)
    n = 16 * params["batch_size"]
    return tf.data.Dataset.from_tensor_slices((images[:n].reshape(n, 64), labels[:n])).batch(
        params["batch_size"], drop_remainder=True)


def _optimizer(params):
    if params["optimizer"] == "adam":
        return v1.train.AdamOptimizer(0.01)
    return v1.train.MomentumOptimizer(0.05, 0.9)


def _classifier(features, labels):
    """Dense(32, relu), Dense(10) and sparse softmax cross-entropy: (the loss, the logits)."""
    logits = L.Dense(10)(L.Dense(32, activation="relu")(features))
    return v1.losses.sparse_softmax_cross_entropy(labels, logits), logits


def _spec(mode, loss, logits, labels, train_op_fn):
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"class": tf.argmax(logits, axis=-1)})
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss, eval_metric_ops={
            "accuracy": v1.metrics.accuracy(labels, tf.argmax(logits, axis=-1))})
    return CSEstimatorSpec(mode, loss=loss, train_op=train_op_fn())


def accumulated(features, labels, mode, params):
    """Gradients accumulated over `every` steps (each divided by `every`; with
    `params["divide_after"]` the sums divided when applied: refused), applied and zeroed
    inside a tf.cond on (step + 1) % every == 0."""
    loss, logits = _classifier(features, labels)

    def train_op_fn():
        k = params["every"]
        opt = _optimizer(params)
        tvars = v1.trainable_variables()
        accum = [v1.get_variable(v.op.name + "/accum", v.shape, trainable=False,
                                 initializer=tf.zeros_initializer()) for v in tvars]
        grads = tf.gradients(loss, tvars)
        after = params.get("divide_after", False)  # the sums divided when applied
        add = [a.assign_add(g if after else g / k) for a, g in zip(accum, grads)]
        step = v1.train.get_or_create_global_step()
        with tf.control_dependencies(add):
            def apply():
                with tf.control_dependencies([opt.apply_gradients(  # apply
                        zip([a.read_value() / k if after else a.read_value() for a in accum],
                            tvars))]):
                    return tf.group(*[a.assign(tf.zeros_like(a)) for a in accum])
            do = tf.cond(tf.equal(tf.math.floormod(step + 1, k), 0), apply, tf.no_op)  # cond
        with tf.control_dependencies([do]):
            return v1.assign_add(step, 1)
    return _spec(mode, loss, logits, labels, train_op_fn)


def every_n(features, labels, mode, params):
    """The step's gradients applied only on steps the global step's remainder by `every`
    is 0 (no accumulation); `params["minimize_inside"]`: opt.minimize(loss) in the branch;
    `params["negated"]`: tf.cond(remainder != 0, tf.no_op, apply); `params["uncounted"]`:
    nothing increments the global step (TF's cond decides alike every step)."""
    loss, logits = _classifier(features, labels)

    def train_op_fn():
        opt = _optimizer(params)
        step = v1.train.get_or_create_global_step()
        if params.get("minimize_inside"):  # the gradients computed in the branch
            def apply():
                return opt.minimize(loss)
        else:
            grads_and_vars = opt.compute_gradients(loss)

            def apply():
                return opt.apply_gradients(grads_and_vars)
        if params.get("negated"):  # the updates in the false branch
            do = tf.cond(tf.not_equal(step % params["every"], 0), tf.no_op, apply)
        else:
            do = tf.cond(tf.equal(step % params["every"], 0), apply, tf.no_op)
        if params.get("uncounted"):
            return do
        with tf.control_dependencies([do]):
            return v1.assign_add(step, 1)
    return _spec(mode, loss, logits, labels, train_op_fn)


def accuracy_gated(features, labels, mode, params):
    """The update applied only while the batch's accuracy is below 0.9: a predicate
    computed from the batch (refused)."""
    loss, logits = _classifier(features, labels)

    def train_op_fn():
        opt = _optimizer(params)
        step = v1.train.get_or_create_global_step()
        hits = tf.cast(tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32), labels),
                       tf.float32)
        accuracy = tf.reduce_mean(hits)
        do = tf.cond(accuracy < 0.9, lambda: opt.minimize(loss), tf.no_op)
        with tf.control_dependencies([do]):
            return v1.assign_add(step, 1)
    return _spec(mode, loss, logits, labels, train_op_fn)


def diverging_input_fn(params):
    """input_fn's digits, the third batch's first image all NaN (a corrupt sample)."""
    images, labels = digits_split(training=True)
    n, size = 16 * params["batch_size"], params["batch_size"]
    features = images[:n].reshape(n, 64).copy()
    features[2 * size] = np.nan
    return tf.data.Dataset.from_tensor_slices((features, labels[:n])).batch(
        size, drop_remainder=True)


def skip_non_finite(features, labels, mode, params):
    """The update skipped when the loss (`params["check"]` "loss") or a gradient ("gradients")
    is not finite; `params["counted"]`: the global step counts the applied steps only
    (apply_gradients' global_step inside the cond), else every step."""
    loss, logits = _classifier(features, labels)

    def train_op_fn():
        opt = _optimizer(params)
        step = v1.train.get_or_create_global_step()
        grads_and_vars = opt.compute_gradients(loss)
        if params["check"] == "loss":
            finite = tf.math.is_finite(loss)
        else:
            finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g, _ in grads_and_vars])
        counted = params["counted"]
        do = tf.cond(finite, lambda: opt.apply_gradients(
            grads_and_vars, global_step=step if counted else None), tf.no_op)
        if counted:
            return do
        with tf.control_dependencies([do]):
            return v1.assign_add(step, 1)
    return _spec(mode, loss, logits, labels, train_op_fn)


def warm_head(features, labels, mode, params):
    """A body and a head; for the first `params["warmup"]` steps only the head trains (the
    body frozen), then both: tf.cond(step < warmup, apply the head's, apply all)."""
    h = L.Dense(32, activation="relu", name="body")(features)
    logits = L.Dense(10, name="head")(h)
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)

    def train_op_fn():
        opt = _optimizer(params)
        step = v1.train.get_or_create_global_step()
        grads_and_vars = opt.compute_gradients(loss)
        head = [(g, v) for g, v in grads_and_vars if v.name.startswith("head/")]
        do = tf.cond(step < params["warmup"], lambda: opt.apply_gradients(head),
                     lambda: opt.apply_gradients(grads_and_vars))
        with tf.control_dependencies([do]):
            return v1.assign_add(step, 1)
    return _spec(mode, loss, logits, labels, train_op_fn)
