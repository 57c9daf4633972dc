"""Embedding tables whose gradients users clip or make dense before the optimizer, written
the way users write them: a char-CNN tagger (char and word Embeddings, a Conv2D over each
word's characters, a padding-masked per-word loss, RMSProp) clipping every gradient of
compute_gradients with tf.clip_by_value, the IndexedSlices of its tables as they are or
made dense first (tf.convert_to_tensor: TF then applies the optimizer's dense rule to the
whole table); a bag of words whose table's gradient is made dense by convert_to_tensor,
tf.math.unsorted_segment_sum or tf.scatter_nd (the optimizer a parameter); signSGD on an
IndexedSlices (refused); and two Adams on disjoint var_lists with an L2 penalty on one
(the S4 recipe) returning the data loss plus that penalty."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

v1 = tf.compat.v1
L = tf.keras.layers

WORDS, CHARS, CHAR_VOCAB, WORD_VOCAB, TAGS = 5, 6, 20, 40, 3
CLIP = 0.02


def tagger_input_fn(params):
    """Sentences of WORDS words (id 0: padding at the end), CHARS character ids each, a tag
    per word."""
    batch = params.get("batch_size", 8)
    rng = np.random.default_rng(7)
    n = 4 * batch
    words = rng.integers(1, WORD_VOCAB // 2, size=(n, WORDS)).astype(np.int32)
    lengths = rng.integers(2, WORDS + 1, size=n)
    words[np.arange(WORDS)[None, :] >= lengths[:, None]] = 0
    chars = rng.integers(1, CHAR_VOCAB, size=(n, WORDS, CHARS)).astype(np.int32)
    chars[words == 0] = 0
    tags = (words % TAGS).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices(
        ({"words": words, "chars": chars}, tags)).batch(batch, drop_remainder=True)


def charcnn_tagger(features, labels, mode, params):
    """Per-word tags from a word embedding and a max-pooled char CNN; every gradient
    clipped by value (params["dense"]: the tables' made dense first)."""
    words, chars = features["words"], features["chars"]
    c = L.Embedding(CHAR_VOCAB, 4, name="char_emb")(chars)  # [B, W, C, 4]
    c = L.Conv2D(6, (1, 3), padding="same", activation="relu", name="char_cnn")(c)
    c = tf.reduce_max(c, axis=2)  # [B, W, 6]
    w = L.Embedding(WORD_VOCAB, 8, name="word_emb")(words)
    h = L.Dense(8, activation="tanh", name="hidden")(tf.concat([w, c], axis=-1))
    logits = L.Dense(TAGS, name="tags")(h)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"tags": tf.argmax(logits, -1),
                                                  "logits": logits})
    mask = tf.cast(tf.not_equal(words, 0), tf.float32)
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits, weights=mask)
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss, eval_metric_ops={
            "accuracy": v1.metrics.accuracy(labels, tf.argmax(logits, -1), weights=mask)})
    opt = v1.train.RMSPropOptimizer(1e-2)
    gv = opt.compute_gradients(loss)
    if params.get("dense"):
        gv = [(tf.convert_to_tensor(g), v) for g, v in gv]
    gv = [(tf.clip_by_value(g, -CLIP, CLIP), v) for g, v in gv]
    return CSEstimatorSpec(mode, loss=loss, train_op=opt.apply_gradients(
        gv, global_step=v1.train.get_or_create_global_step()))


def bag_input_fn(params):
    """BAG word ids per sample from a vocabulary whose rows each batch names only some of."""
    batch = params.get("batch_size", 8)
    rng = np.random.default_rng(3)
    x = rng.integers(0, WORD_VOCAB, size=(4 * batch, 4)).astype(np.int32)
    y = (x[:, 0] % 2).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)


def _densify(g, v, how: str):
    if not isinstance(g, tf.IndexedSlices):
        return g
    if how == "convert":
        return tf.convert_to_tensor(g)
    if how == "sign":  # signSGD of the dense gradient (a gradient program)
        return 1e-2 * tf.sign(tf.convert_to_tensor(g))
    if how == "segment_sum":
        return tf.math.unsorted_segment_sum(g.values, g.indices, v.shape[0])
    return tf.scatter_nd(tf.expand_dims(g.indices, 1), g.values, v.shape)


def bag_of_words(features, labels, mode, params):
    """A mean of embedded words into a classifier; the table's gradient made dense
    (params["densify"]: convert, segment_sum, scatter_nd, or sign: convert then signSGD;
    params["sign"]: signSGD of the IndexedSlices instead)."""
    e = tf.reduce_mean(L.Embedding(WORD_VOCAB, 6, name="emb")(features), axis=1)
    logits = L.Dense(2, name="out")(e)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"logits": logits})
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss)
    opt = {"adam": lambda: v1.train.AdamOptimizer(1e-2),
           "momentum": lambda: v1.train.MomentumOptimizer(0.5, 0.9)}[params["optimizer"]]()
    gv = opt.compute_gradients(loss)
    if params.get("sign"):
        gv = [(tf.IndexedSlices(tf.sign(g.values), g.indices, g.dense_shape)
               if isinstance(g, tf.IndexedSlices) else g, v) for g, v in gv]
    else:
        gv = [(_densify(g, v, params["densify"]), v) for g, v in gv]
    return CSEstimatorSpec(mode, loss=loss, train_op=opt.apply_gradients(
        gv, global_step=v1.train.get_or_create_global_step()))


def sequence_input_fn(params):
    batch = params.get("batch_size", 16)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4 * batch, 12)).astype(np.float32)
    y = rng.integers(0, 4, size=4 * batch).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)


def two_adams(features, labels, mode, params):
    """The S4 recipe: the "ssm" parameters on their own Adam without weight decay, the rest
    on an Adam minimizing loss + an L2 penalty on their kernels; model_fn returns that sum
    (params["returned"] == "data": the data loss alone)."""
    with v1.variable_scope("ssm"):
        a = v1.get_variable("a", [12], initializer=v1.ones_initializer())
    h = L.Dense(8, activation="tanh", name="hidden")(features * a)
    logits = L.Dense(4, name="out")(h)
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"logits": logits})
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss)
    ssm = [v for v in v1.trainable_variables() if v.name.startswith("ssm")]
    other = [v for v in v1.trainable_variables() if not v.name.startswith("ssm")]
    reg = 1e-2 * tf.add_n([tf.nn.l2_loss(v) for v in other if "kernel" in v.name])
    first = v1.train.AdamOptimizer(1e-3).minimize(loss, var_list=ssm)
    second = v1.train.AdamOptimizer(1e-2).minimize(
        loss + reg, var_list=other, global_step=v1.train.get_or_create_global_step())
    returned = loss if params.get("returned") == "data" else loss + reg
    return CSEstimatorSpec(mode, loss=returned, train_op=tf.group(first, second))
