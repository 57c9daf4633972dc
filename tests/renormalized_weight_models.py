"""Models that renormalize a weight after the optimizer's update, written the way users write
them: TransE (entity embeddings looked up for head, tail and a corrupted tail, a margin
ranking loss, `ent.assign(tf.nn.l2_normalize(ent, axis=1))` under the step's control
dependency), an MLP whose kernel columns get a max-norm constraint
`w * tf.minimum(1.0, c / tf.norm(w, axis=0, keepdims=True))` or tf.clip_by_norm (its
tf.where guard of a zero norm), and magnitude pruning by a cast mask, a write the CS does
not carry out."""
from __future__ import annotations

import numpy as np
import tensorflow as tf
from weight_decay_models import CLASSES, FEATURES, HIDDEN, input_fn

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

ENTITIES, RELATIONS, DIM = 12, 3, 6
__all__ = ["input_fn", "transe", "max_norm_mlp", "clipped_by_norm_mlp", "pruned_mlp"]


def triples_input_fn(params):
    """(head, relation, tail, corrupted tail) ids."""
    batch = params.get("batch_size", 8)
    rng = np.random.default_rng(17)
    n = 4 * batch
    h, r = rng.integers(0, ENTITIES, n), rng.integers(0, RELATIONS, n)
    features = {"head": h.astype(np.int32), "rel": r.astype(np.int32),
                "tail": ((h + 3 * r + 1) % ENTITIES).astype(np.int32),
                "tail_neg": rng.integers(0, ENTITIES, n).astype(np.int32)}
    return tf.data.Dataset.from_tensor_slices((features, np.zeros(n, np.float32))).batch(
        batch, drop_remainder=True)


def transe(features, labels, mode, params):
    init = tf.compat.v1.random_uniform_initializer(-1.0, 1.0)
    ent = tf.compat.v1.get_variable("entities", [ENTITIES, DIM], initializer=init)
    rel = tf.compat.v1.get_variable("relations", [RELATIONS, DIM], initializer=init)
    h = tf.nn.embedding_lookup(ent, features["head"])
    r = tf.nn.l2_normalize(tf.nn.embedding_lookup(rel, features["rel"]), axis=1)
    t = tf.nn.embedding_lookup(ent, features["tail"])
    tn = tf.nn.embedding_lookup(ent, features["tail_neg"])
    d_pos = tf.reduce_sum(tf.abs(h + r - t), axis=1)
    d_neg = tf.reduce_sum(tf.abs(h + r - tn), axis=1)
    loss = tf.reduce_mean(tf.nn.relu(1.0 + d_pos - d_neg))
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode=mode, predictions={"distance": d_pos})
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode=mode, loss=loss, eval_metric_ops={
            "ranking_accuracy": tf.compat.v1.metrics.mean(tf.cast(d_pos < d_neg, tf.float32))})
    step = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
        loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    with tf.control_dependencies([step]):
        train_op = tf.compat.v1.assign(ent, tf.nn.l2_normalize(ent, axis=1))
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op)


def _constrained_mlp(features, labels, mode, constrain):
    kernel = tf.compat.v1.get_variable("hidden_kernel", [FEATURES, HIDDEN])
    logits = tf.keras.layers.Dense(CLASSES)(tf.nn.relu(tf.matmul(features, kernel)))
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    step = tf.compat.v1.train.MomentumOptimizer(0.2, 0.9).minimize(
        loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    with tf.control_dependencies([step]):
        train_op = tf.compat.v1.assign(kernel, constrain(kernel))
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op)


def max_norm_mlp(features, labels, mode, params):
    """Each hidden unit's incoming weights at most 0.5 long after every update."""
    return _constrained_mlp(features, labels, mode, lambda w: w * tf.minimum(
        1.0, 0.5 / tf.norm(w, axis=0, keepdims=True)))


def clipped_by_norm_mlp(features, labels, mode, params):
    """tf.clip_by_norm of each hidden unit's incoming weights after every update."""
    return _constrained_mlp(features, labels, mode, lambda w: tf.clip_by_norm(w, 0.5, axes=[0]))


def pruned_mlp(features, labels, mode, params):
    """The kernel's small weights zeroed after every update by a cast mask (a Cast the CS
    does not write with)."""
    return _constrained_mlp(features, labels, mode,
                            lambda w: w * tf.cast(tf.abs(w) > 0.05, tf.float32))
