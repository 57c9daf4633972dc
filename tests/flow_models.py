"""Models computing on weights with linear algebra and masks, written the way users write
them: Glow (actnorm, an invertible 1x1 map by tf.linalg.slogdet or in its LU form with
tf.linalg.diag, an affine coupling; the log-determinant accumulated from
tf.zeros(tf.shape(z)[:1])) and SINDy (a sparse regression over a polynomial library whose
small coefficients are masked out by tf.cast(tf.abs(xi) > t, tf.float32) when evaluating)."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

L, v1 = tf.keras.layers, tf.compat.v1
D, BATCH = 8, 16


def _batches(features, labels):
    return tf.data.Dataset.from_tensor_slices((features, labels)).batch(BATCH, drop_remainder=True)


def density_input_fn(params):
    """Correlated Gaussian vectors (no labels of interest)."""
    rng = np.random.default_rng(11)
    x = rng.normal(size=(4 * BATCH, D)) @ rng.normal(size=(D, D)) * 0.5
    return _batches(x.astype(np.float32), np.zeros(4 * BATCH, np.float32))


def _invertible_1x1(z, lu):
    """z W with log|det W|: W a weight (tf.linalg.slogdet), or Glow's LU form
    (L + I) U, U's diagonal sign * exp(log_s), whose log|det| is that of U's diagonal.
    (Each log-determinant term reads what z reads: a loss term reading a weight alone, as
    tf.reduce_sum(log_s), may run after TF's update in the same session.run, and TF
    reports the loss after the step then.)"""
    w0 = np.linalg.qr(np.random.default_rng(5).normal(size=(D, D)))[0].astype(np.float32)
    if not lu:
        w = v1.get_variable("w", initializer=w0)
        return tf.matmul(z, w), tf.linalg.slogdet(w)[1]
    lower = v1.get_variable("lower", initializer=np.tril(w0, -1))
    upper = v1.get_variable("upper", initializer=np.triu(w0, 1))
    log_s = v1.get_variable("log_s", initializer=np.log(np.abs(np.diag(w0)) + 0.5))
    sign = np.sign(np.diag(w0)).astype(np.float32)
    strict = tf.linalg.band_part(lower, -1, 0) - tf.linalg.diag(tf.linalg.diag_part(lower))
    u = tf.linalg.set_diag(tf.linalg.band_part(upper, 0, -1), sign * tf.exp(log_s))
    w = tf.matmul(strict + tf.eye(D), u)
    return tf.matmul(z, w), tf.reduce_sum(tf.math.log(tf.abs(tf.linalg.diag_part(u))))


def glow(features, labels, mode, params):
    """One Glow step: actnorm, an invertible 1x1 map, an affine coupling; -log p(x)."""
    logs = v1.get_variable("actnorm_logs", [D], initializer=v1.zeros_initializer())
    bias = v1.get_variable("actnorm_bias", [D], initializer=v1.zeros_initializer())
    scale = tf.exp(logs)
    z = (features + bias) * scale
    logdet = tf.zeros(tf.shape(z)[:1])
    logdet += tf.reduce_sum(tf.math.log(tf.abs(scale)))
    z, log_det_w = _invertible_1x1(z, params.get("lu", False))
    logdet += log_det_w
    za, zb = z[:, :D // 2], z[:, D // 2:]
    st = L.Dense(D, name="coupling")(L.Dense(16, activation="tanh", name="hidden")(za))
    gate = tf.sigmoid(st[:, D // 2:] + 2.0)
    zb = zb * gate + st[:, :D // 2]
    logdet += tf.reduce_sum(tf.math.log(gate), 1)
    z = tf.concat([za, zb], 1)
    log_px = -0.5 * tf.reduce_sum(tf.square(z) + np.log(2 * np.pi), 1) + logdet
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"z": z, "log_px": log_px})
    loss = -tf.reduce_mean(log_px)
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss, eval_metric_ops={"nll": v1.metrics.mean(-log_px)})
    return CSEstimatorSpec(mode, loss=loss, train_op=v1.train.AdamOptimizer(1e-2).minimize(
        loss, global_step=v1.train.get_or_create_global_step()))


def lorenz_input_fn(params):
    """States of the Lorenz system and their time derivatives."""
    rng = np.random.default_rng(12)
    x = rng.normal(size=(4 * BATCH, 3)).astype(np.float32)
    dx = np.stack([10 * (x[:, 1] - x[:, 0]), x[:, 0] * (28 - x[:, 2]) - x[:, 1],
                   x[:, 0] * x[:, 1] - 8 / 3 * x[:, 2]], 1)
    return _batches(x, (dx / 10).astype(np.float32))


def sindy(features, labels, mode, params):
    """Sparse identification of dynamics: dx/dt = Theta(x) xi, L1 by the proximal step; the
    coefficients below a threshold masked out when evaluating and predicting."""
    x, y, z = features[:, 0:1], features[:, 1:2], features[:, 2:3]
    library = tf.concat([tf.ones_like(x), x, y, z, x * x, x * y, x * z, y * y, y * z, z * z], 1)
    xi = v1.get_variable("coefficients", [10, 3],
                         initializer=tf.random_normal_initializer(stddev=0.1, seed=3))
    if mode != ModeKeys.TRAIN:
        xi = xi * tf.cast(tf.abs(xi) > 0.05, tf.float32)
    pred = tf.matmul(library, xi)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"dxdt": pred})
    loss = v1.losses.mean_squared_error(labels, pred)
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss, eval_metric_ops={
            "rmse": v1.metrics.root_mean_squared_error(labels, pred)})
    optimizer = v1.train.ProximalGradientDescentOptimizer(0.01, l1_regularization_strength=1e-3)
    return CSEstimatorSpec(mode, loss=loss, train_op=optimizer.minimize(
        loss, global_step=v1.train.get_or_create_global_step()))


def per_sample_log_det(features, labels, mode, params):
    """log|det| of each sample's own matrix."""
    m = tf.reshape(L.Dense(4, name="factor")(features), [-1, 2, 2]) + tf.eye(2)
    sign, log_abs_det = tf.linalg.slogdet(m)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"sign": sign, "log_abs_det": log_abs_det})
    loss = -tf.reduce_mean(log_abs_det)
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss)
    return CSEstimatorSpec(mode, loss=loss, train_op=v1.train.AdamOptimizer(1e-2).minimize(
        loss, global_step=v1.train.get_or_create_global_step()))
