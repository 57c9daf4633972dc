"""T5-style encoders with a learned relative-position bias, written the way users write
them: the bias table read through a constant one-hot by tf.einsum, or gathered at constant
bucket ids (TF's sparse update under RMSProp; t5_block: T5's buckets from tf ops, Keras
Dense q, k, v, the optimizer a parameter), with the per-sample einsums of attention
('bhqd,bhkd->bhqk' scores), a projection by a weight ('bij,jk->bik') and a row-wise dot
product ('bi,bi->b')."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

v1 = tf.compat.v1
L = tf.keras.layers

VOCAB, LENGTH, DIM, HEADS, BUCKETS = 12, 6, 8, 2, 4
T, D, T5_BUCKETS = 6, 8, 12  # t5_block's


def input_fn(params):
    """Sequences of LENGTH tokens, a binary class each."""
    batch = params.get("batch_size", 8)
    rng = np.random.default_rng(5)
    x = rng.integers(0, VOCAB, size=(4 * batch, LENGTH)).astype(np.int32)
    y = ((x == 3).sum(1) > (x == 4).sum(1)).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)


def _buckets() -> np.ndarray:
    """T5's relative-position buckets of key - query, clipped: bucket BUCKETS - 1 is never
    named (the distances it would hold exceed the sequence)."""
    rel = np.arange(LENGTH)[None, :] - np.arange(LENGTH)[:, None]
    return np.where(rel > 0, 1 + np.minimum(rel, 1), np.minimum(-rel, 1)).astype(np.int32)


def _encoder(features, labels, mode, bias):
    """One attention layer with `bias` [HEADS, LENGTH, LENGTH] added to its scores."""
    hd = DIM // HEADS
    h = tf.keras.layers.Embedding(VOCAB, DIM, name="embed")(features)
    proj = tf.compat.v1.get_variable("proj", [DIM, 3 * DIM])
    q, k, v = tf.split(tf.einsum("bij,jk->bik", h, proj), 3, axis=-1)
    heads = [tf.transpose(tf.reshape(t, [-1, LENGTH, HEADS, hd]), [0, 2, 1, 3]) for t in (q, k, v)]
    scores = tf.einsum("bhqd,bhkd->bhqk", heads[0], heads[1]) / np.sqrt(hd) + bias[None]
    att = tf.einsum("bhqk,bhkd->bhqd", tf.nn.softmax(scores, -1), heads[2])
    pooled = tf.reduce_mean(tf.reshape(tf.transpose(att, [0, 2, 1, 3]), [-1, LENGTH, DIM]), 1)
    gate = tf.keras.layers.Dense(DIM, name="gate")(pooled)
    score = tf.einsum("bi,bi->b", pooled, gate)
    logits = tf.keras.layers.Dense(2, name="head")(pooled) + score[:, None] * [0.0, 0.1]
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode=mode, predictions={"label": tf.argmax(logits, 1),
                                                       "probs": tf.nn.softmax(logits)})
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    train_op = None
    if mode == ModeKeys.TRAIN:
        train_op = tf.compat.v1.train.RMSPropOptimizer(1e-2).minimize(
            loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    metrics = {"accuracy": tf.compat.v1.metrics.accuracy(labels, tf.argmax(logits, 1))}
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op, eval_metric_ops=metrics)


def onehot_bias(features, labels, mode, params):
    """The bias as tf.einsum of a constant one-hot of the buckets and the table."""
    onehot = tf.constant(np.eye(BUCKETS, dtype=np.float32)[_buckets()])  # [T, T, BUCKETS]
    table = tf.compat.v1.get_variable("rel_bias", [BUCKETS, HEADS],
                                      initializer=tf.compat.v1.random_normal_initializer(0, 0.5))
    return _encoder(features, labels, mode, tf.einsum("qkn,nh->hqk", onehot, table))


def gathered_bias(features, labels, mode, params):
    """The bias as tf.gather of the table at the constant buckets (TF updates the table
    sparsely: the never-named bucket and its RMSProp slot keep their values)."""
    table = tf.compat.v1.get_variable("rel_bias", [BUCKETS, HEADS],
                                      initializer=tf.compat.v1.random_normal_initializer(0, 0.5))
    bias = tf.transpose(tf.gather(table, tf.constant(_buckets())), [2, 0, 1])
    return _encoder(features, labels, mode, bias)


def mean_bias_per_head(features, labels, mode, params):
    """Each head's mean bias over all positions in one einsum (q and k summed in the
    one-hot alone), which the CS does not run on weights."""
    onehot = tf.constant(np.eye(BUCKETS, dtype=np.float32)[_buckets()])
    table = tf.compat.v1.get_variable("rel_bias", [BUCKETS, HEADS])
    mean = tf.einsum("qkn,nh->h", onehot, table) / LENGTH ** 2
    return _encoder(features, labels, mode, tf.ones([HEADS, LENGTH, LENGTH]) * mean[:, None, None])


OPTIMIZERS = {
    "momentum": lambda: v1.train.MomentumOptimizer(0.1, 0.9),
    "adam": lambda: v1.train.AdamOptimizer(1e-2),
    "adagrad": lambda: v1.train.AdagradOptimizer(0.1),
    # the dense rule would zero the rows the buckets never name (linear stays 0 there)
    "ftrl": lambda: v1.train.FtrlOptimizer(0.1, l1_regularization_strength=0.01,
                                           l2_regularization_strength=0.01),
}


def attention_input_fn(params):
    """Sequences of T vectors, one of 3 classes each."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, T, D)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((x, rng.integers(0, 3, 64).astype(np.int32))) \
        .batch(8, drop_remainder=True)


def relative_buckets(num_buckets=T5_BUCKETS, max_distance=16):
    """T5's bidirectional buckets of key - query (relative_position_bucket)."""
    pos = tf.range(T)
    rel = pos[None, :] - pos[:, None]
    num_buckets //= 2
    ret = tf.cast(rel > 0, tf.int32) * num_buckets
    n = tf.abs(rel)
    max_exact = num_buckets // 2
    large = max_exact + tf.cast(tf.math.log(tf.cast(n, tf.float32) / max_exact + 1e-6)
                                / np.log(max_distance / max_exact) * (num_buckets - max_exact),
                                tf.int32)
    return ret + tf.where(n < max_exact, n, tf.minimum(large, num_buckets - 1))


def t5_block(features, labels, mode, params):
    """Two attention layers (Keras Dense q, k, v) adding one T5 bias, tf.gather of the table at
    T5's buckets, trained by params["optimizer"] (under clip_by_global_norm at params["clip_norm"])."""
    rel_bias = v1.get_variable("rel_bias", [T5_BUCKETS, HEADS],
                               initializer=v1.random_normal_initializer(stddev=0.1))
    bias = tf.transpose(tf.gather(rel_bias, relative_buckets()), [2, 0, 1])[None]  # [1,H,T,T]
    h = features
    for i in range(2):  # both layers add the one bias (or each gathers its own)
        if params.get("gather_per_layer"):
            bias = tf.transpose(tf.gather(rel_bias, relative_buckets()), [2, 0, 1])[None]
        q, k, v = (tf.reshape(L.Dense(D, use_bias=False, name=f"{n}{i}")(h), [-1, T, HEADS, D // HEADS])
                   for n in "qkv")
        scores = tf.einsum("bqhd,bkhd->bhqk", q, k) + bias
        ctx = tf.einsum("bhqk,bkhd->bqhd", tf.nn.softmax(scores, -1), v)
        h = h + L.Dense(D, use_bias=False, name=f"o{i}")(tf.reshape(ctx, [-1, T, D]))
    logits = L.Dense(3, name="head")(tf.reduce_mean(h, 1))
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"class": tf.argmax(logits, 1),
                                                  "probs": tf.nn.softmax(logits)})
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss, eval_metric_ops={
            "accuracy": v1.metrics.accuracy(labels, tf.argmax(logits, 1))})
    opt, step = OPTIMIZERS[params["optimizer"]](), v1.train.get_or_create_global_step()
    if not params.get("clip_norm"):
        return CSEstimatorSpec(mode, loss=loss, train_op=opt.minimize(loss, global_step=step))
    grads, variables = zip(*opt.compute_gradients(loss))
    grads, _ = tf.clip_by_global_norm(list(grads), params["clip_norm"])
    return CSEstimatorSpec(mode, loss=loss,
                           train_op=opt.apply_gradients(zip(grads, variables), global_step=step))
