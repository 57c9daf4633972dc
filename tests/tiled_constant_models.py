"""Models reading a constant tiled over the batch, written the way users write them: IQN's
fixed quantile fractions `tf.tile(tf.constant(taus)[None], [tf.shape(x)[0], 1])` through a
cosine embedding and a Dense, multiplied with per-sample features (by tf.tile and by
tf.broadcast_to); and the refused kinds of value: a Dense of a constant whose rows differ
(per-position scales as long as the batch) met with per-sample features, and an exact GP's
marginal likelihood over the batch, K + noise * tf.eye(batch)."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

L = tf.keras.layers
FEATURES, QUANTILES, EMBEDDING, WIDTH = 4, 8, 4, 16
# a risk-averse policy's fixed fractions (CVaR at 0.3: the distribution's lowest 30 %)
FRACTIONS = 0.3 * (np.arange(QUANTILES) + 0.5) / QUANTILES


def input_fn(params):
    """Per-sample features and a target each."""
    batch = params.get("batch_size", 8)
    rng = np.random.default_rng(19)
    x = rng.normal(size=(4 * batch, FEATURES)).astype(np.float32)
    y = (x[:, 0] - 0.5 * x[:, 1] ** 2).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)


def _spec(mode, labels, out):
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"q": out})
    loss = tf.compat.v1.losses.mean_squared_error(labels, out)
    train_op = None
    if mode == ModeKeys.TRAIN:
        train_op = tf.compat.v1.train.AdamOptimizer(1e-2).minimize(
            loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode, loss=loss, train_op=train_op,
                           eval_metric_ops={"mae": tf.compat.v1.metrics.mean_absolute_error(labels, out)})


def _quantile_head(x, taus):
    """IQN: psi(x) times a Dense of the fractions' cosine embedding, a value per quantile."""
    psi = L.Dense(WIDTH, activation="relu", name="psi")(x)
    cosines = tf.cos(np.pi * taus[..., None] * tf.range(1, EMBEDDING + 1, dtype=tf.float32))
    phi = L.Dense(WIDTH, activation="relu", name="phi")(cosines)
    return tf.squeeze(L.Dense(1, name="quantile")(psi[:, None, :] * phi), -1)


def iqn_tiled_fractions(features, labels, mode, params):
    """Fixed quantile fractions tiled to the batch (a risk-averse IQN), their mean value."""
    fractions = tf.constant(FRACTIONS, tf.float32)
    taus = tf.tile(fractions[None], [tf.shape(features)[0], 1])
    return _spec(mode, labels, tf.reduce_mean(_quantile_head(features, taus), 1))


def iqn_broadcast_fractions(features, labels, mode, params):
    """The same by tf.broadcast_to, the quantiles read with weights of their own."""
    fractions = tf.constant(FRACTIONS, tf.float32)
    taus = tf.broadcast_to(fractions, [tf.shape(features)[0], QUANTILES])
    q = _quantile_head(features, taus)
    return _spec(mode, labels, tf.reduce_sum(q * tf.nn.softmax(L.Dense(QUANTILES, name="w")(features)), 1))


def per_position_scales(features, labels, mode, params):
    """A Dense of a constant whose rows differ (a scale per position, as long as the batch)
    multiplied with per-sample features: refused."""
    batch = params.get("batch_size", 8)
    scales = tf.constant(np.linspace(0.5, 1.5, batch, dtype=np.float32))[:, None]
    h = L.Dense(WIDTH, activation="relu", name="h")(features) * L.Dense(WIDTH, name="scale")(scales)
    return _spec(mode, labels, tf.squeeze(L.Dense(1, name="out")(h), -1))


def _cholesky(a, n):
    """The lower Cholesky factor of `a`, column by column, written out as unseen19's tester did."""
    rows, columns = np.arange(n), []
    for j in range(n):
        done = tf.stack(columns, 1) if columns else None
        d = tf.sqrt(a[j, j] - (tf.reduce_sum(tf.square(done[j])) if columns else 0.0))
        column = (a[:, j] - (tf.linalg.matvec(done, done[j]) if columns else 0.0)) / d
        columns.append(column * (rows > j).astype(np.float32) + d * (rows == j).astype(np.float32))
    return tf.stack(columns, 1)


def gp_marginal_likelihood(features, labels, mode, params):
    """An exact GP over the batch: learned features, an RBF kernel matrix K of the batch, the
    noise on its diagonal, the negative log marginal likelihood by a Cholesky: refused."""
    n = params.get("batch_size", 8)
    f = L.Dense(FEATURES, name="features")(features)
    log_noise = tf.compat.v1.get_variable("log_noise", [], initializer=tf.compat.v1.constant_initializer(-2.0))
    K = tf.exp(-0.5 * tf.reduce_sum(tf.square(f[:, None, :] - f[None, :, :]), -1))
    Ky = K + (tf.exp(log_noise) + 1e-4) * tf.eye(n)
    chol = _cholesky(Ky, n)
    z = []
    for i in range(n):  # chol z = labels
        z.append((labels[i] - (tf.reduce_sum(chol[i, :i] * tf.stack(z)) if z else 0.0)) / chol[i, i])
    loss = (0.5 * tf.reduce_sum(tf.square(tf.stack(z)))
            + tf.reduce_sum(tf.math.log(tf.linalg.diag_part(chol)))) / n
    return CSEstimatorSpec(mode, loss=loss, train_op=tf.compat.v1.train.AdamOptimizer(1e-2).minimize(
        loss, global_step=tf.compat.v1.train.get_or_create_global_step()))


SPEAKERS = 3
# an episode's two utterances are of speakers 2 and 0 (every episode arranged alike)
ORDER = np.array([2, 0], np.int32)


def _episode_scores(features):
    """GE2E-style episodes: each sample's two utterances folded into the batch for the
    encoder, reshaped back, scored against every speaker: [batch, 2, speakers]."""
    utterances = tf.reshape(features, [-1, FEATURES // 2])
    emb = L.Dense(WIDTH, activation="tanh", name="encoder")(utterances)
    return L.Dense(SPEAKERS, name="speaker")(tf.reshape(emb, [-1, 2, WIDTH]))


def episode_tiled_labels(features, labels, mode, params):
    """Each episode's speaker ids a constant tiled over the batch (tf.tile; tf.broadcast_to
    if params["broadcast"]), a sparse cross-entropy of [batch, 2, speakers] scores; accuracy."""
    scores = _episode_scores(features)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"scores": scores})
    ids = tf.constant(ORDER[None])
    batch = tf.shape(scores)[0]
    target = tf.broadcast_to(ids, tf.stack([batch, 2])) if params.get("broadcast") else \
        tf.tile(ids, [batch, 1])
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=target, logits=scores))
    train_op = None
    if mode == ModeKeys.TRAIN:
        train_op = tf.compat.v1.train.GradientDescentOptimizer(0.5).minimize(
            loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode, loss=loss, train_op=train_op, eval_metric_ops={
        "accuracy": tf.compat.v1.metrics.accuracy(target, tf.argmax(scores, 2, output_type=tf.int32))})
