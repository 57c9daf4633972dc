"""Values laid out stacked in front of the batch by forms other than tf.stack(values, axis=0)
(unseen22): timm-style attention's qkv permute (tf.transpose(qkv, [2, 0, 3, 1, 4]) then
unstacked or indexed) trains 4 steps with TF's numbers, evaluates and predicts with the CPU
path's; what reads such a value other than the stack-first layout supports stays refused in
one line."""
from __future__ import annotations

import cs_inprocess
import numpy as np
import pytest
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

L = tf.keras.layers
PARAMS = {"runconfig": {"tf_random_seed": 1}, "heads": 2, "dim": 8}
TOKENS, FEATURES, STEPS = 5, 6, 4


def input_fn(params):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, TOKENS, FEATURES)).astype(np.float32)
    y = rng.integers(0, 3, size=(64,)).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(16, drop_remainder=True)


def _spec(mode, labels, logits):
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"logits": logits, "class": tf.argmax(logits, 1)})
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss, eval_metric_ops={
            "accuracy": tf.compat.v1.metrics.accuracy(labels, tf.argmax(logits, 1))})
    step = tf.compat.v1.train.get_or_create_global_step()
    return CSEstimatorSpec(mode, loss=loss, train_op=tf.compat.v1.train.MomentumOptimizer(
        0.05, 0.9).minimize(loss, global_step=step))  # (Adam would blow up the key bias's noise)


def _attention(x, heads, dim, unstack):
    """timm's Attention: one Dense for q, k and v, permuted to [3, batch, heads, tokens, dh]."""
    n, dh = x.shape[1], dim // heads
    qkv = tf.reshape(L.Dense(3 * dim)(x), [-1, n, 3, heads, dh])
    qkv = tf.transpose(qkv, [2, 0, 3, 1, 4])
    q, k, v = tf.unstack(qkv, axis=0) if unstack else (qkv[0], qkv[1], qkv[2])
    attn = tf.nn.softmax(tf.matmul(q, k, transpose_b=True) * dh ** -0.5, axis=-1)
    out = tf.reshape(tf.transpose(tf.matmul(attn, v), [0, 2, 1, 3]), [-1, n, dim])
    return L.Dense(dim)(out)


def vit_block(features, labels, mode, params):
    """A pre-norm ViT encoder block, the attention written as timm's."""
    x = L.Dense(params["dim"])(features)
    x = x + _attention(L.LayerNormalization()(x), params["heads"], params["dim"],
                       params.get("unstack", True))
    x = x + L.Dense(params["dim"])(L.Dense(2 * params["dim"], activation="gelu")(
        L.LayerNormalization()(x)))
    return _spec(mode, labels, L.Dense(3)(tf.reduce_mean(x, 1)))


CASES = {
    "vit_block_unstacked": (vit_block, PARAMS),
    "vit_block_indexed": (vit_block, {**PARAMS, "unstack": False}),
}


@pytest.mark.parametrize("name", CASES)
def test_trains_evaluates_and_predicts_like_tensorflow(tmp_path, name):
    model_fn, params = CASES[name]
    result = cs_inprocess.compare(model_fn, input_fn, params, str(tmp_path), STEPS)
    cs_inprocess.assert_same_training(result, 1e-5)
    assert cs_inprocess.cpu_path_mismatches(model_fn, input_fn, params, str(tmp_path), result) == []
