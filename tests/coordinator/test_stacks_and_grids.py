"""Ordinary code the CS once refused (unseen11-13): CoordConv's coordinate grid tiled over the
batch and cast to mixed_float16 activations (a float16 constant of the batch's shape), two
heads stacked in front of the batch (tf.stack(heads, axis=0), reduced over axis 0 and
predicted as is, or every head's loss) and a mixture's component picked per position (tf.gather(means, k,
batch_dims=2), or along an axis after them, axis=3): each trains 4 steps with TF's numbers (mixed: the mixed precision tests'
1e-2), evaluates and predicts with the CPU path's; what stays refused says so in one line."""
from __future__ import annotations

import cs_inprocess
import numpy as np
import pytest
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

L = tf.keras.layers
PARAMS = {"runconfig": {"tf_random_seed": 1}}
SIZE, STEPS = 6, 4


def input_fn(params):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, SIZE, SIZE, 1)).astype(np.float32)
    y = rng.normal(size=(64, 1)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(16, drop_remainder=True)


def _spec(mode, labels, pred, predictions, metrics=None, loss=None):
    loss = tf.compat.v1.losses.mean_squared_error(labels, pred) if loss is None else loss
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions=predictions)
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss, eval_metric_ops={
            "rmse": tf.compat.v1.metrics.root_mean_squared_error(labels, pred), **(metrics or {})})
    step = tf.compat.v1.train.get_or_create_global_step()
    return CSEstimatorSpec(mode, loss=loss, train_op=tf.compat.v1.train.MomentumOptimizer(
        0.01, 0.9).minimize(loss, global_step=step))


def _add_coords(x, per_sample):
    """CoordConv: the pixel's (x, y) in [-1, 1] as two more channels, in x's dtype."""
    yy, xx = tf.meshgrid(tf.linspace(-1.0, 1.0, x.shape[1]), tf.linspace(-1.0, 1.0, x.shape[2]),
                         indexing="ij")
    grid = tf.stack([xx, yy], -1)[None]
    if per_sample:
        coords = tf.zeros_like(x[..., :1], dtype=tf.float32) + grid
    else:
        coords = tf.tile(grid, [tf.shape(x)[0], 1, 1, 1])
    return tf.concat([x, tf.cast(coords, x.dtype)], -1)


def coordconv(features, labels, mode, params):
    tf.keras.mixed_precision.set_global_policy(params.get("policy", "mixed_float16"))
    try:
        h = L.Conv2D(4, 3, padding="same", activation="relu")(_add_coords(features, params["per_sample"]))
        h = L.Conv2D(4, 3, padding="same", activation="relu")(_add_coords(h, params["per_sample"]))
        pred = L.Dense(1, dtype="float32")(L.Flatten()(h))
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")
    return _spec(mode, labels, pred, {"pred": pred})


def two_heads(features, labels, mode, params):
    h = L.Dense(8, activation="relu")(L.Flatten()(features))
    heads = tf.stack([L.Dense(1)(h), L.Dense(1)(h)], axis=0)  # [2, batch, 1]
    pred = tf.reduce_mean(heads, axis=0)
    spread = tf.math.reduce_std(heads, axis=0)
    first = heads[0] - tf.reduce_max(heads, 0)
    return _spec(mode, labels, pred + 0.1 * spread + 0.01 * first,
                 {"pred": pred, "spread": spread, "heads": heads},
                 {"heads": tf.compat.v1.metrics.mean(tf.abs(heads - labels))})  # (the host's, from the heads)


def three_heads_read_every_way(features, labels, mode, params):
    """A stack read by unstack, x[i], transposes (batch first again, or second), float16
    casts, a weight and a constant row, reductions over the stack and sample axes, a softmax
    and reshapes."""
    h = L.Dense(8, activation="relu")(L.Flatten()(features))
    heads = tf.stack([L.Dense(3)(h) for _ in range(3)], axis=0)  # [3, batch, 3]
    a, b, c = tf.unstack(heads)
    batch_first = tf.transpose(heads, [1, 0, 2])
    swapped = tf.transpose(heads, [2, 1, 0])
    half = tf.cast(tf.cast(heads, tf.float16) * tf.constant(0.5, tf.float16), tf.float32)
    scale = tf.compat.v1.get_variable("scale", initializer=tf.ones([3]))
    scaled = tf.nn.relu(heads * scale + tf.constant([[0.1, 0.2, 0.3]]))
    pred = (tf.reduce_sum(heads[1] * a, -1, keepdims=True) + tf.reduce_mean(batch_first, [1, 2])[:, None]
            + tf.reduce_sum(tf.reduce_mean(swapped, 0), -1, keepdims=True)
            + tf.reduce_mean(half, [0, 2])[:, None] + tf.reduce_max(scaled, [0, 2])[:, None]
            + tf.reduce_sum(b - c, -1, keepdims=True) + tf.reduce_mean(heads - h[:, :3], [0, 2])[:, None])
    probabilities = tf.reduce_mean(tf.nn.softmax(heads), 0)  # an ensemble's classes
    squeezed = tf.squeeze(tf.reshape(heads, [3, -1, 3, 1]), -1)
    pred += tf.reduce_sum(probabilities * tf.reduce_mean(squeezed, 0), -1, keepdims=True)
    return _spec(mode, labels, pred, {"pred": pred, "swapped": swapped, "batch_first": batch_first})


def every_heads_loss(features, labels, mode, params):
    """An ensemble's loss: each head's squared and absolute errors over the whole stack."""
    h = L.Flatten()(features)
    heads = tf.stack([L.Dense(1)(h), L.Dense(1)(h)], axis=0)
    loss = tf.reduce_mean(tf.square(heads - labels)) + tf.reduce_sum(tf.abs(heads - labels)) / 32.0
    if params.get("root"):
        loss = tf.sqrt(loss)
    pred = tf.reduce_mean(heads, 0)
    return _spec(mode, labels, pred, {"pred": pred}, loss=loss)


def picked_components(features, labels, mode, params):
    """A mixture per row: 3 components' means and logits, the best two picked per row."""
    rows = tf.reshape(features, [-1, SIZE, SIZE])
    means = tf.reshape(L.Dense(3 * 2)(rows), [-1, SIZE, 3, 2])  # [batch, row, component, 2]
    logits = L.Dense(3)(rows)
    best = tf.argmax(logits, -1)
    runner_up = tf.argmax(logits - 10.0 * tf.one_hot(best, 3), -1)
    picked = tf.gather(means, tf.stack([best, runner_up], -1), batch_dims=2)  # [batch, row, 2, 2]
    pred = L.Dense(1)(L.Flatten()(picked))
    return _spec(mode, labels, pred, {"pred": pred, "picked": picked})


def gather_after_the_batch_dims(features, labels, mode, params):
    """Per row a value picked along the last axis, the same one for each of its 3 entries
    (tf.gather(values, ids, axis=3, batch_dims=2): the ids broadcast over axis 2)."""
    values = tf.reshape(L.Dense(2 * 3 * SIZE)(L.Flatten()(features)), [-1, 2, 3, SIZE])
    ids = tf.argmax(L.Dense(SIZE)(tf.reshape(features, [-1, SIZE, SIZE]))[:, :2], -1)  # [batch, 2]
    picked = tf.gather(values, ids, axis=3, batch_dims=2)  # [batch, 2, 3]
    pred = L.Dense(1)(L.Flatten()(picked))
    return _spec(mode, labels, pred, {"pred": pred, "picked": picked})


def dense_on_the_stack(features, labels, mode, params):
    """A Dense on the stacked heads (Keras' Tensordot: each sample's (2, 4) rows)."""
    h = L.Flatten()(features)
    heads = tf.stack([L.Dense(4)(h), L.Dense(4)(h)], axis=0)
    pred = tf.reduce_mean(L.Dense(1)(heads), 0)
    return _spec(mode, labels, pred, {"pred": pred})


CASES = {
    "coordconv_tiled": (coordconv, {**PARAMS, "per_sample": False}, 1e-2),
    "coordconv_per_sample": (coordconv, {**PARAMS, "per_sample": True}, 1e-2),
    "two_heads": (two_heads, PARAMS, 1e-4),
    "three_heads_read_every_way": (three_heads_read_every_way, PARAMS, 1e-4),
    "every_heads_loss": (every_heads_loss, PARAMS, 1e-4),
    "picked_components": (picked_components, PARAMS, 1e-4),
    "gather_after_the_batch_dims": (gather_after_the_batch_dims, PARAMS, 1e-4),
    "dense_on_the_stack": (dense_on_the_stack, PARAMS, 1e-4),
}


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.slow) if name == "coordconv_per_sample"
                                  else name for name in CASES])  # (its grid built otherwise: slow)
def test_trains_evaluates_and_predicts_like_tensorflow(tmp_path, name):
    model_fn, params, rtol = CASES[name]
    result = cs_inprocess.compare(model_fn, input_fn, params, str(tmp_path), STEPS)
    cs_inprocess.assert_same_training(result, rtol)
    assert cs_inprocess.evaluation_mismatch(model_fn, input_fn, params, str(tmp_path), result, rtol=rtol) == ""
    assert cs_inprocess.prediction_mismatch(model_fn, input_fn, params, str(tmp_path), result, rtol=rtol) == ""


def flattened_stack(features, labels, mode, params):
    h = L.Flatten()(features)
    heads = tf.stack([L.Dense(4)(h), L.Dense(4)(h)], axis=0)
    return _spec(mode, labels, tf.reduce_mean(tf.reshape(heads, [-1, 8]), 1, keepdims=True), {})


@pytest.mark.parametrize("model_fn, words", [
    (flattened_stack, "tf.reduce_mean(stacked, 0)"),
    (every_heads_loss, "not a sum or mean of its values times constants"),
])
def test_what_stays_refused_says_what_to_write_in_one_line(tmp_path, model_fn, words):
    line = cs_inprocess.refusal(model_fn, input_fn, {**PARAMS, "root": True}, str(tmp_path), __file__)
    assert words in line, line
