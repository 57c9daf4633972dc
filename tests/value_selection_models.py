"""Losses over the elements a condition selects, written the usual ways: an ignore-index
classifier (labels of -1 are unlabeled), a masked-token loss of a small sequence model, and
CFRNet's split of the batch by treatment with a linear MMD between the treated and control
rows' mean representations. Each with tf.boolean_mask or tf.gather(x, tf.where(cond)[:, 0])
(refused: the selection's size depends on the values) and in the masked form the refusal
hints at, sum(mask * f(x)) / sum(mask)."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec

BATCH, STEPS, CLASSES, FEATURES = 8, 4, 3, 6
TOKENS, VOCAB = 5, 7


def _spec(mode, loss, params):
    if mode == "eval":
        return CSEstimatorSpec(mode=mode, loss=loss,
                               eval_metric_ops={"mean_loss": tf.compat.v1.metrics.mean(loss)})
    optimizer = tf.compat.v1.train.AdamOptimizer(0.01)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=optimizer.minimize(
        loss, global_step=tf.compat.v1.train.get_or_create_global_step()))


def ignore_index_input_fn(params):
    """Features and class labels, about a third of them -1 (unlabeled)."""
    rng = np.random.default_rng(5)
    n = params["batch_size"] * STEPS * 2
    x = rng.normal(size=(n, FEATURES)).astype(np.float32)
    y = rng.integers(-1, CLASSES, size=n).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(params["batch_size"],
                                                             drop_remainder=True)


def unlabeled_input_fn(params):
    """Every label -1: nothing is selected."""
    x = np.random.default_rng(6).normal(size=(params["batch_size"] * 2, FEATURES))
    y = -np.ones(params["batch_size"] * 2, np.int32)
    return tf.data.Dataset.from_tensor_slices((x.astype(np.float32), y)).batch(
        params["batch_size"], drop_remainder=True)


def _classifier(features):
    return tf.keras.layers.Dense(CLASSES)(tf.keras.layers.Dense(16, activation="relu")(features))


def ignore_index_model_fn(features, labels, mode, params):
    """The cross entropy of the labeled samples only, by tf.boolean_mask."""
    logits = _classifier(features)
    keep = labels >= 0
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.boolean_mask(labels, keep), logits=tf.boolean_mask(logits, keep)))
    return _spec(mode, loss, params)


def ignore_index_masked_model_fn(features, labels, mode, params):
    """The same loss weighed by the mask (the -1 labels clamped to a valid class first)."""
    logits = _classifier(features)
    mask = tf.cast(labels >= 0, tf.float32)
    per_sample = tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.maximum(labels, 0), logits=logits)
    loss = tf.reduce_sum(per_sample * mask) / tf.reduce_sum(mask)
    return _spec(mode, loss, params)


def tokens_input_fn(params):
    """Token ids [B, TOKENS] and their targets, -1 where a token is not masked (not scored)."""
    rng = np.random.default_rng(9)
    n = params["batch_size"] * STEPS * 2
    ids = rng.integers(0, VOCAB, size=(n, TOKENS)).astype(np.int32)
    targets = np.where(rng.random((n, TOKENS)) < 0.4, (ids + 1) % VOCAB, -1).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((ids, targets)).batch(params["batch_size"],
                                                                     drop_remainder=True)


def _token_logits(ids):
    h = tf.keras.layers.Embedding(VOCAB, 8)(ids)
    return tf.keras.layers.Dense(VOCAB)(tf.keras.layers.Dense(12, activation="tanh")(h))


def masked_token_model_fn(features, labels, mode, params):
    """An MLM-style loss: each token's cross entropy, the masked tokens' kept by
    tf.boolean_mask, averaged."""
    logits = _token_logits(features)
    per_token = tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.maximum(labels, 0), logits=logits)
    loss = tf.reduce_mean(tf.boolean_mask(per_token, labels >= 0))
    return _spec(mode, loss, params)


def masked_token_gather_nd_model_fn(features, labels, mode, params):
    """The same loss, the scored tokens' losses picked by tf.gather_nd at tf.where(mask)."""
    logits = _token_logits(features)
    per_token = tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.maximum(labels, 0), logits=logits)
    loss = tf.reduce_mean(tf.gather_nd(per_token, tf.where(labels >= 0)))
    return _spec(mode, loss, params)


def masked_token_weighed_model_fn(features, labels, mode, params):
    """The same loss weighed by the mask of scored tokens."""
    logits = _token_logits(features)
    per_token = tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.maximum(labels, 0), logits=logits)
    mask = tf.cast(labels >= 0, tf.float32)
    loss = tf.reduce_sum(per_token * mask) / tf.reduce_sum(mask)
    return _spec(mode, loss, params)


def treatment_input_fn(params):
    """Covariates, then the treatment (0 or 1) as the last column; an outcome [B, 1]."""
    rng = np.random.default_rng(13)
    n = params["batch_size"] * STEPS * 2
    x = rng.normal(size=(n, FEATURES)).astype(np.float32)
    t = (rng.random(n) < 0.5).astype(np.float32)
    y = (x[:, :1] + 2.0 * t[:, None] + 0.1 * rng.normal(size=(n, 1))).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((np.concatenate([x, t[:, None]], 1), y)).batch(
        params["batch_size"], drop_remainder=True)


def _outcome_and_representation(features):
    x, t = features[:, :FEATURES], features[:, FEATURES:]
    phi = tf.keras.layers.Dense(8, activation="elu")(x)
    y_hat = tf.keras.layers.Dense(1)(tf.concat([phi, t], 1))
    return phi, t, y_hat


def cfrnet_model_fn(features, labels, mode, params):
    """CFRNet: the factual MSE plus a linear MMD, the squared distance between the mean
    representations of the treated and the control rows (tf.where + tf.gather)."""
    phi, t, y_hat = _outcome_and_representation(features)
    it = tf.where(t[:, 0] > 0)[:, 0]
    ic = tf.where(t[:, 0] < 1)[:, 0]
    mean_t = tf.reduce_mean(tf.gather(phi, it), 0)
    mean_c = tf.reduce_mean(tf.gather(phi, ic), 0)
    imbalance = tf.reduce_sum(tf.square(mean_t - mean_c))
    loss = tf.reduce_mean(tf.square(labels - y_hat)) + 0.5 * imbalance
    return _spec(mode, loss, params)


def cfrnet_masked_model_fn(features, labels, mode, params):
    """The same MMD from the treated and control rows' masked means."""
    phi, t, y_hat = _outcome_and_representation(features)
    mean_t = tf.reduce_sum(phi * t, 0) / tf.reduce_sum(t)
    mean_c = tf.reduce_sum(phi * (1.0 - t), 0) / tf.reduce_sum(1.0 - t)
    imbalance = tf.reduce_sum(tf.square(mean_t - mean_c))
    loss = tf.reduce_mean(tf.square(labels - y_hat)) + 0.5 * imbalance
    return _spec(mode, loss, params)


def sparse_features_model_fn(features, labels, mode, params):
    """A SparseTensor of the nonzero features (tf.sparse.from_dense), summed per sample."""
    positive = tf.nn.relu(features)
    total = tf.sparse.reduce_sum(tf.sparse.from_dense(positive), axis=1, keepdims=True)
    logits = tf.keras.layers.Dense(CLASSES)(tf.concat([features, total], 1))
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.maximum(labels, 0), logits=logits))
    return _spec(mode, loss, params)
