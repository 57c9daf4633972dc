"""Models drawing random numbers for their weights, once a step, written the way users write
Bayes by backprop (Blundell et al. 2015): w = mu + softplus(rho) * eps with eps drawn in the
weight's shape (no batch axis), every sample of the batch using the same drawn w; the loss
the data's plus the KL divergence of the weights' posterior from their prior over the data
set's size. A linear regression with a normal or uniform draw (the unseen13 tester's model),
a Keras-style layer holding mu and rho (add_weight) that draws its kernel and bias, two of
them in an MLP with a Monte Carlo KL of the drawn weights, one draw shared by two layers, and
a draw the CS refuses (drawn weights a prediction reads)."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

FEATURES, HIDDEN, CLASSES = 5, 6, 3
SAMPLES = 256  # the data set's size (the KL's divisor)


def regression_input_fn(params):
    """y = x . [1.5, -2, 0, 0.7, 0.3] + 0.5 + noise."""
    rng = np.random.default_rng(17)
    x = rng.normal(size=(SAMPLES, FEATURES)).astype(np.float32)
    y = (x @ np.array([1.5, -2.0, 0.0, 0.7, 0.3]) + 0.5 + 0.3 * rng.normal(size=SAMPLES))[:, None]
    return tf.data.Dataset.from_tensor_slices((x, y.astype(np.float32))).batch(
        params.get("batch_size", 8), drop_remainder=True)


def classes_input_fn(params):
    """Points of FEATURES values, a class each (the largest of the first CLASSES)."""
    rng = np.random.default_rng(18)
    x = rng.normal(size=(SAMPLES, FEATURES)).astype(np.float32)
    y = np.argmax(x[:, :CLASSES], axis=1).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(
        params.get("batch_size", 8), drop_remainder=True)


def _step():
    return tf.compat.v1.train.get_or_create_global_step()


def _gaussian_kl(mu, sigma):
    """KL(N(mu, sigma^2) || N(0, 1)), summed."""
    return tf.reduce_sum(0.5 * (tf.square(sigma) + tf.square(mu) - 1.0) - tf.math.log(sigma))


def bayes_linreg(features, labels, mode, params):
    """Mean-field Bayesian linear regression: one draw of the weights per step (the unseen13
    model); tf.random.normal, or with params["draw"] == "uniform" a uniform eps in [-1, 1]."""
    w_mu = tf.compat.v1.get_variable("w_mu", [FEATURES, 1], initializer=tf.compat.v1.zeros_initializer())
    w_rho = tf.compat.v1.get_variable("w_rho", [FEATURES, 1],
                                      initializer=tf.compat.v1.constant_initializer(-3.0))
    b_mu = tf.compat.v1.get_variable("b_mu", [1], initializer=tf.compat.v1.zeros_initializer())
    log_noise = tf.compat.v1.get_variable("log_noise", [], initializer=tf.compat.v1.zeros_initializer())
    w_sigma = tf.nn.softplus(w_rho)
    if params.get("draw") == "uniform":
        eps = tf.random.uniform(tf.shape(w_mu), -1.0, 1.0)
    else:
        eps = tf.random.normal(tf.shape(w_mu))
    w = w_mu + w_sigma * eps
    pred = features @ w + b_mu
    # (the Gaussian NLL through one read of log_noise: a read only `+ log_noise` used would
    # take no part in the gradient, and TF may run it after the step's update)
    noise_var = tf.exp(2 * log_noise)
    nll = 0.5 * tf.reduce_mean(tf.square(labels - pred)) * tf.math.reciprocal(noise_var) + \
        0.5 * tf.math.log(noise_var)
    kl = _gaussian_kl(w_mu, w_sigma)
    loss = nll + kl / SAMPLES
    mean_pred = tf.matmul(features, w_mu) + b_mu
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"mean": mean_pred, "sample": pred})
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss, eval_metric_ops={
            "rmse": tf.compat.v1.metrics.root_mean_squared_error(labels, mean_pred),
            "kl": tf.compat.v1.metrics.mean(kl)})
    optimizer = tf.compat.v1.train.AdamOptimizer(params.get("learning_rate", 0.05))
    return CSEstimatorSpec(mode, loss=loss, train_op=optimizer.minimize(loss, global_step=_step()))


class BayesDense(tf.keras.layers.Layer):
    """A Dense layer whose kernel and bias are drawn once per call from their mean-field
    Gaussian posterior (the mean outside training); `kl` the Monte Carlo estimate
    log q(w) - log p(w) of the drawn weights, p = N(0, 1), `closed_kl` KL(q || p)."""

    def __init__(self, units, activation=None, **kwargs):
        super().__init__(**kwargs)
        self.units, self.activation = units, tf.keras.activations.get(activation)

    def build(self, input_shape):
        shape = (int(input_shape[-1]), self.units)
        normal = tf.keras.initializers.RandomNormal(stddev=0.3, seed=1)
        self.kernel_mu = self.add_weight(name="kernel_mu", shape=shape, initializer=normal)
        self.kernel_rho = self.add_weight(name="kernel_rho", shape=shape,
                                          initializer=tf.keras.initializers.Constant(-4.0))
        self.bias_mu = self.add_weight(name="bias_mu", shape=(self.units,), initializer="zeros")
        self.bias_rho = self.add_weight(name="bias_rho", shape=(self.units,),
                                        initializer=tf.keras.initializers.Constant(-4.0))

    def call(self, inputs, training=None):
        if not training:
            return self.activation(inputs @ self.kernel_mu + self.bias_mu)
        kernel_sigma, bias_sigma = tf.nn.softplus(self.kernel_rho), tf.nn.softplus(self.bias_rho)
        kernel = self.kernel_mu + kernel_sigma * tf.random.normal(self.kernel_mu.shape)
        bias = self.bias_mu + bias_sigma * tf.random.normal(self.bias_mu.shape)
        self.kl = sum(tf.reduce_sum(-tf.math.log(s) - 0.5 * tf.square((w - m) / s) + 0.5 * tf.square(w))
                      for w, m, s in ((kernel, self.kernel_mu, kernel_sigma),
                                      (bias, self.bias_mu, bias_sigma)))
        self.closed_kl = _gaussian_kl(self.kernel_mu, kernel_sigma) + \
            _gaussian_kl(self.bias_mu, bias_sigma)
        return self.activation(inputs @ kernel + bias)


def _classifier(mode, labels, logits, kl, learning_rate=0.02):
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"logits": logits})
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits) + kl / SAMPLES
    train_op = tf.compat.v1.train.AdamOptimizer(learning_rate).minimize(loss, global_step=_step()) \
        if mode == ModeKeys.TRAIN else None
    return CSEstimatorSpec(mode, loss=loss, train_op=train_op, eval_metric_ops={
        "accuracy": tf.compat.v1.metrics.accuracy(labels, tf.argmax(logits, -1))})


def bayes_mlp(features, labels, mode, params):
    """Two BayesDense layers (each draws its kernel and bias once a step); the mean weights
    in evaluation and prediction (a mode switch); the Monte Carlo KL (params["closed_kl"]:
    the closed form)."""
    training = mode == ModeKeys.TRAIN
    hidden, out = BayesDense(HIDDEN, activation="relu"), BayesDense(CLASSES)
    logits = out(hidden(features, training=training), training=training)
    kl = tf.constant(0.0)
    if training:
        kl = hidden.closed_kl + out.closed_kl if params.get("closed_kl") else hidden.kl + out.kl
    return _classifier(mode, labels, logits, kl)


def shared_draw(features, labels, mode, params):
    """One draw per step scaling both layers' kernels (multiplicative noise shared by the
    layers: eps over the hidden units, broadcast over the first kernel's rows and, reshaped,
    the second's columns)."""
    mu1 = tf.compat.v1.get_variable("mu1", [FEATURES, HIDDEN],
                                    initializer=tf.compat.v1.random_normal_initializer(stddev=0.3, seed=2))
    mu2 = tf.compat.v1.get_variable("mu2", [HIDDEN, CLASSES],
                                    initializer=tf.compat.v1.random_normal_initializer(stddev=0.3, seed=3))
    log_alpha = tf.compat.v1.get_variable("log_alpha", [HIDDEN],
                                          initializer=tf.compat.v1.constant_initializer(-2.0))
    eps = 1.0 + tf.exp(0.5 * log_alpha) * tf.random.normal([HIDDEN])
    hidden = tf.nn.relu(features @ (mu1 * eps))
    logits = hidden @ (mu2 * tf.reshape(eps, [HIDDEN, 1]))
    return _classifier(mode, labels, logits, 0.5 * tf.reduce_sum(tf.square(mu1)) * 1e-2)


# ---- a draw the CS refuses ----

def predicted_weight_sample(features, labels, mode, params):
    """The drawn weights among the predictions, next to the sample computed from them: the
    host would compute them with a draw of its own."""
    w_mu = tf.compat.v1.get_variable("w_mu", [FEATURES, 1])
    w = w_mu + 0.5 * tf.random.normal([FEATURES, 1])
    pred = features @ w
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"sample": pred, "w": tf.tile(
            tf.transpose(w), [tf.shape(features)[0], 1])})
    loss = tf.reduce_mean(tf.square(pred - labels))
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=_step())
    return CSEstimatorSpec(mode, loss=loss, train_op=train_op)
