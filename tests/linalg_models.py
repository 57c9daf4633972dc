"""Models solving small dense linear systems, written the way users write them: a sparse
variational GP (SVGP, the batch first) whose Cholesky factor of the inducing points' kernel
matrix and its inverse are computed from weights alone (tf.linalg.cholesky,
tf.linalg.triangular_solve of the identity; unwhitened: tf.linalg.cholesky_solve, a lower
solve and its adjoint), and a Lagrangian neural network whose accelerations solve each
sample's 2x2 Hessian block (tf.linalg.solve, or tf.linalg.inv times the right-hand side)
built by tf.gradients; a per-sample determinant (tf.linalg.det) and eigenvalues
(tf.linalg.eigvalsh)."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

L, v1 = tf.keras.layers, tf.compat.v1
BATCH, M = 16, 8


def _batches(features, labels):
    return tf.data.Dataset.from_tensor_slices((features, labels)).batch(BATCH, drop_remainder=True)


def _step():
    return v1.train.get_or_create_global_step()


def gp_input_fn(params):
    """Noisy 1-D regression."""
    rng = np.random.default_rng(19)
    x = rng.uniform(-3, 3, size=(4 * BATCH, 1))
    y = np.sin(2 * x) + 0.3 * x + 0.15 * rng.normal(size=x.shape)
    return _batches(x.astype(np.float32), y.astype(np.float32))


def _rbf(a, b, lengthscale, variance):
    return variance * tf.exp(-0.5 * tf.square(a - tf.transpose(b)) / tf.square(lengthscale))


def svgp(features, labels, mode, params):
    """SVGP regression, its ELBO over the batch; params whitened (default True): q(v) over
    L^-1 u, else q(u) with K^-1 by tf.linalg.cholesky_solve."""
    z = v1.get_variable("inducing_inputs", initializer=np.linspace(-2.5, 2.5, M)[:, None].astype(np.float32))
    raw_len = v1.get_variable("raw_lengthscale", [], initializer=v1.constant_initializer(0.0))
    raw_var = v1.get_variable("raw_variance", [], initializer=v1.constant_initializer(0.5))
    raw_noise = v1.get_variable("raw_noise", [], initializer=v1.constant_initializer(-2.0))
    q_mu = v1.get_variable("q_mu", [M, 1], initializer=v1.zeros_initializer())
    q_sqrt = tf.linalg.band_part(v1.get_variable("q_sqrt", initializer=np.eye(M, dtype=np.float32)), -1, 0)
    lengthscale, variance = tf.nn.softplus(raw_len), tf.nn.softplus(raw_var)
    noise = tf.nn.softplus(raw_noise) + 1e-4
    kzz = _rbf(z, z, lengthscale, variance) + 1e-5 * tf.eye(M)
    chol = tf.linalg.cholesky(kzz)
    kxz = _rbf(features, z, lengthscale, variance)  # [batch, M]
    if params.get("whitened", True):
        a = tf.matmul(kxz, tf.linalg.triangular_solve(chol, tf.eye(M), lower=True), transpose_b=True)
        var = variance - tf.reduce_sum(tf.square(a), 1, keepdims=True)
    else:
        a = tf.matmul(kxz, tf.linalg.cholesky_solve(chol, tf.eye(M)))  # k(x, Z) K^-1
        var = variance - tf.reduce_sum(a * kxz, 1, keepdims=True)
    mean = tf.matmul(a, q_mu)
    var += tf.reduce_sum(tf.square(tf.matmul(a, q_sqrt)), 1, keepdims=True)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"mean": mean, "variance": var + noise})
    exp_loglik = -0.5 * np.log(2 * np.pi) - 0.5 * tf.math.log(noise) - 0.5 * (tf.square(labels - mean) + var) / noise
    kl = 0.5 * (tf.reduce_sum(tf.square(q_sqrt)) + tf.reduce_sum(tf.square(q_mu)) - M
                - 2.0 * tf.reduce_sum(tf.math.log(tf.abs(tf.linalg.diag_part(q_sqrt)))))
    loss = -tf.reduce_mean(exp_loglik) + kl / (4 * BATCH)
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss, eval_metric_ops={
            "rmse": v1.metrics.root_mean_squared_error(labels, mean)})
    return CSEstimatorSpec(mode, loss=loss, train_op=v1.train.AdamOptimizer(0.02).minimize(loss, global_step=_step()))


def pendulum_input_fn(params):
    """Coupled anharmonic oscillators: (q, qdot) and the accelerations."""
    rng = np.random.default_rng(12)
    q = rng.uniform(-1.5, 1.5, size=(4 * BATCH, 2))
    qd = rng.uniform(-1, 1, size=(4 * BATCH, 2))
    grad_v = np.stack([q[:, 0] + q[:, 0] ** 3 + 0.5 * q[:, 1], 2 * q[:, 1] + 0.5 * q[:, 0]], 1)
    return _batches(np.concatenate([q, qd], 1).astype(np.float32),
                    (-grad_v / np.array([1.0, 2.0])).astype(np.float32))


def lagrangian(features, labels, mode, params):
    """A Lagrangian neural network: qddot = (d2L/dqdot2)^-1 (dL/dq - d2L/dqdot dq qdot);
    params inverse: by tf.linalg.inv instead of tf.linalg.solve."""
    mlp = [L.Dense(32, activation="softplus", name=f"lag{i}") for i in range(2)] + [L.Dense(1, name="lag_out")]

    def lagrangian_of(x):
        for layer in mlp:
            x = layer(x)
        return tf.reduce_sum(x)

    x = features
    g = tf.gradients(lagrangian_of(x), x)[0]
    hess = tf.stack([tf.gradients(g[:, i], x)[0] for i in range(4)], 1)  # [batch, 4, 4]
    h_vv = hess[:, 2:, 2:] + 1e-3 * tf.eye(2)
    rhs = g[:, :2] - tf.squeeze(tf.matmul(hess[:, 2:, :2], x[:, 2:, None]), -1)
    if params.get("inverse"):
        qdd = tf.squeeze(tf.matmul(tf.linalg.inv(h_vv), rhs[:, :, None]), -1)
    else:
        qdd = tf.squeeze(tf.linalg.solve(h_vv, rhs[:, :, None]), -1)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"qddot": qdd})
    loss = v1.losses.mean_squared_error(labels, qdd)
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss, eval_metric_ops={
            "qddot_mae": v1.metrics.mean_absolute_error(labels, qdd)})
    opt = v1.train.AdamOptimizer(1e-3)
    grads = [(tf.clip_by_norm(gr, 1.0), v) for gr, v in opt.compute_gradients(loss)
             if gr is not None]  # (L's bias has none: a constant shift of L changes nothing)
    return CSEstimatorSpec(mode, loss=loss, train_op=opt.apply_gradients(grads, global_step=_step()))


def per_sample_determinant(features, labels, mode, params):
    """The determinant of each sample's own matrix fitted to the first label."""
    m = tf.reshape(L.Dense(4, name="factor")(features), [-1, 2, 2]) + tf.eye(2)
    det = tf.linalg.det(m)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"det": det})
    loss = tf.reduce_mean(tf.square(det - labels[:, 0]))
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss)
    return CSEstimatorSpec(mode, loss=loss, train_op=v1.train.AdamOptimizer(1e-2).minimize(loss, global_step=_step()))


def per_sample_eigenvalues(features, labels, mode, params):
    """The eigenvalues of each sample's own symmetric matrix (refused: no CS kernel)."""
    m = tf.reshape(L.Dense(4, name="factor")(features), [-1, 2, 2])
    eigenvalues = tf.linalg.eigvalsh(m + tf.transpose(m, [0, 2, 1]))
    loss = tf.reduce_mean(tf.square(eigenvalues - labels))
    return CSEstimatorSpec(mode, loss=loss, train_op=v1.train.AdamOptimizer(1e-2).minimize(loss, global_step=_step()))
