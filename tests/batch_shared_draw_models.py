"""Models drawing random numbers once a step for the whole batch (no batch axis), every
sample reading the same numbers other than as a product's weight, written as users write
them: random Fourier features with a fresh phase each step (cos(x w + b), b ~ U(0, 2 pi));
NoisyNet's factorised Gaussian noise (Fortunato et al. 2018), its output noise in the kernel
and in the bias; Bayes by backprop with the drawn bias added to every sample and the KL of
the weights; a dropout mask shared by the batch (noise_shape [1, d], tf.nn.dropout and
Keras Dropout) next to a locked (variational) one, drawn per sample and shared by the time
steps; Gaussian dropout by one drawn scale for the batch; a temperature drawn each step;
noise added to activations. The dropouts draw only in training (`training = mode ==
TRAIN`), as users switch dropout off.
Also a draw the CS refuses: one scaling the batch's loss."""
from __future__ import annotations

import math

import numpy as np
import tensorflow as tf
from projection_models import classifier  # the classifier head of that corpus

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

v1 = tf.compat.v1
L = tf.keras.layers
FEATURES, HIDDEN, CLASSES, TIME, SAMPLES = 6, 12, 3, 5, 128


def points_input_fn(params):
    """Points of FEATURES values; the class is where the first two fall around a ring."""
    rng = np.random.default_rng(31)
    x = rng.normal(size=(SAMPLES, FEATURES)).astype(np.float32)
    radius = np.hypot(x[:, 0], x[:, 1])
    y = np.where(radius < 0.8, 0, np.where(x[:, 0] > 0, 1, 2)).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(params["batch_size"],
                                                            drop_remainder=True)


def sequences_input_fn(params):
    """Sequences of TIME steps of FEATURES values; the class of the largest summed feature
    among the first CLASSES."""
    rng = np.random.default_rng(32)
    x = rng.normal(size=(SAMPLES, TIME, FEATURES)).astype(np.float32)
    y = np.argmax(x[:, :, :CLASSES].sum(1), 1).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(params["batch_size"],
                                                            drop_remainder=True)


def fourier_phase(features, labels, mode, params):
    """Random Fourier features of an RBF kernel (Rahimi & Recht 2007), the textbook form
    sqrt(2 / D) cos(x w / length_scale + b), w ~ N(0, 1) [d, D] and the phase b ~ U(0, 2 pi)
    [D] drawn afresh every step (in evaluation too: TF's graph draws them), a learned length
    scale, a linear classifier on the features."""
    count = 16
    log_scale = v1.get_variable("log_length_scale", [], initializer=v1.zeros_initializer())
    w = tf.random.normal([FEATURES, count])
    b = tf.random.uniform([count], 0.0, 2 * math.pi)
    z = math.sqrt(2.0 / count) * tf.cos(features @ w / tf.exp(log_scale) + b)
    logits = L.Dense(CLASSES, name="logits")(z)
    return classifier(mode, labels, logits, v1.train.AdamOptimizer(0.05))


class NoisyDense(L.Layer):
    """NoisyNet's linear layer (Fortunato et al. 2018) with factorised Gaussian noise:
    w = mu_w + sigma_w * f(eps_in) f(eps_out)^T, b = mu_b + sigma_b * f(eps_out),
    f(e) = sign(e) sqrt(|e|), eps drawn once per call for the whole batch; the means alone
    outside training."""

    def __init__(self, units, sigma0=0.5, **kwargs):
        super().__init__(**kwargs)
        self.units, self.sigma0 = units, sigma0

    def build(self, input_shape):
        fan_in = int(input_shape[-1])
        bound = 1.0 / math.sqrt(fan_in)
        uniform = tf.keras.initializers.RandomUniform(-bound, bound, seed=5)
        sigma = tf.keras.initializers.Constant(self.sigma0 / math.sqrt(fan_in))
        self.w_mu = self.add_weight(name="w_mu", shape=(fan_in, self.units), initializer=uniform)
        self.w_sigma = self.add_weight(name="w_sigma", shape=(fan_in, self.units), initializer=sigma)
        self.b_mu = self.add_weight(name="b_mu", shape=(self.units,), initializer=uniform)
        self.b_sigma = self.add_weight(name="b_sigma", shape=(self.units,), initializer=sigma)

    def call(self, inputs, training=None):
        if not training:
            return inputs @ self.w_mu + self.b_mu

        def f(e):
            return tf.sign(e) * tf.sqrt(tf.abs(e))
        eps_in = f(tf.random.normal([int(self.w_mu.shape[0])]))
        eps_out = f(tf.random.normal([self.units]))
        w = self.w_mu + self.w_sigma * (eps_in[:, None] * eps_out[None, :])
        b = self.b_mu + self.b_sigma * eps_out
        return inputs @ w + b


def noisy_net(features, labels, mode, params):
    """Two NoisyDense layers (a NoisyNet Q-head's shape), trained as a classifier."""
    training = mode == ModeKeys.TRAIN
    hidden = tf.nn.relu(NoisyDense(HIDDEN, name="noisy1")(features, training=training))
    logits = NoisyDense(CLASSES, name="noisy2")(hidden, training=training)
    return classifier(mode, labels, logits, v1.train.AdamOptimizer(0.02))


def bayes_by_backprop(features, labels, mode, params):
    """Bayes by backprop (Blundell et al. 2015) of a hidden layer: w = w_mu + softplus(w_rho)
    * eps_w and b = b_mu + softplus(b_rho) * eps_b drawn once a step, x @ w + b (the drawn
    bias added to every sample), the closed-form KL of the weights from N(0, 1) over the
    data set's size; the means in evaluation and prediction."""
    training = mode == ModeKeys.TRAIN
    normal = v1.random_normal_initializer(stddev=0.3, seed=6)
    rho = v1.constant_initializer(-4.0)
    w_mu = v1.get_variable("w_mu", [FEATURES, HIDDEN], initializer=normal)
    w_rho = v1.get_variable("w_rho", [FEATURES, HIDDEN], initializer=rho)
    b_mu = v1.get_variable("b_mu", [HIDDEN], initializer=v1.zeros_initializer())
    b_rho = v1.get_variable("b_rho", [HIDDEN], initializer=rho)
    w_sigma, b_sigma = tf.nn.softplus(w_rho), tf.nn.softplus(b_rho)
    if training:
        w = w_mu + w_sigma * tf.random.normal([FEATURES, HIDDEN])
        b = b_mu + b_sigma * tf.random.normal([HIDDEN])
    else:
        w, b = w_mu, b_mu
    hidden = tf.nn.relu(tf.matmul(features, w) + b)
    logits = L.Dense(CLASSES, name="logits")(hidden)
    kl = sum(tf.reduce_sum(0.5 * (tf.square(s) + tf.square(m) - 1.0) - tf.math.log(s))
             for m, s in ((w_mu, w_sigma), (b_mu, b_sigma)))
    return classifier(mode, labels, logits, v1.train.AdamOptimizer(0.02), kl / SAMPLES)


def shared_dropout(features, labels, mode, params):
    """Dropout of features with one mask for the whole batch: tf.nn.dropout(h, 0.3,
    noise_shape=[1, HIDDEN]) of the hidden layer and Keras Dropout(0.25, noise_shape=(1,
    HIDDEN)) of the next (every sample loses the same units in a step)."""
    training = mode == ModeKeys.TRAIN
    h = L.Dense(HIDDEN, activation="relu", name="hidden1")(features)
    if training:
        h = tf.nn.dropout(h, rate=0.3, noise_shape=[1, HIDDEN])
    h = L.Dense(HIDDEN, activation="relu", name="hidden2")(h)
    h = L.Dropout(0.25, noise_shape=(1, HIDDEN))(h, training=training)
    logits = L.Dense(CLASSES, name="logits")(h)
    return classifier(mode, labels, logits, v1.train.AdamOptimizer(0.02))


def locked_dropout(features, labels, mode, params):
    """Variational (locked) dropout of a sequence's steps (Gal & Ghahramani 2016, AWD-LSTM's
    LockedDropout): each sample's mask drawn once, [batch, 1, d], shared by its time steps;
    params["shared"]: one mask for the batch and its steps, noise_shape [1, 1, d]."""
    training = mode == ModeKeys.TRAIN
    h = L.Dense(HIDDEN, activation="tanh", name="embed")(features)
    if training:
        rows = 1 if params.get("shared") else tf.shape(h)[0]
        h = tf.nn.dropout(h, rate=0.3, noise_shape=[rows, 1, HIDDEN])
    h = L.GRU(HIDDEN, name="gru")(h)
    logits = L.Dense(CLASSES, name="logits")(h)
    return classifier(mode, labels, logits, v1.train.AdamOptimizer(0.02))


def shared_gaussian_dropout(features, labels, mode, params):
    """Gaussian dropout (Srivastava et al. 2014) with one multiplicative mask for the batch:
    h * tf.random.normal([1, d], 1, sqrt(p / (1 - p))), and a temperature drawn each step
    dividing the logits (tf.random.uniform([], 0.5, 1.5)); neither outside training."""
    training = mode == ModeKeys.TRAIN
    h = L.Dense(HIDDEN, activation="relu", name="hidden")(features)
    rate = 0.2
    if training:
        h = h * tf.random.normal([1, HIDDEN], 1.0, math.sqrt(rate / (1.0 - rate)))
    logits = L.Dense(CLASSES, name="logits")(h)
    if training:
        logits = logits / tf.random.uniform([], 0.5, 1.5)
    return classifier(mode, labels, logits, v1.train.MomentumOptimizer(0.05, 0.9))


def shared_noise(features, labels, mode, params):
    """One noise vector for the whole batch added to a Dense layer's activations."""
    h = L.Dense(HIDDEN, name="hidden")(features) + tf.random.normal([HIDDEN])
    logits = L.Dense(CLASSES, name="logits")(tf.nn.relu(h))
    return classifier(mode, labels, logits, v1.train.GradientDescentOptimizer(0.1))


def noisy_activations(features, labels, mode, params):
    """One draw both on a weight and added to the activations it computes (its bias)."""
    w = v1.get_variable("w", [FEATURES, HIDDEN])
    eps = tf.random.normal([HIDDEN])
    hidden = tf.nn.relu(features @ (w + 0.1 * eps) + eps)
    logits = L.Dense(CLASSES, name="logits")(hidden)
    return classifier(mode, labels, logits, v1.train.AdamOptimizer(0.02))


# ---- a draw the CS refuses ----

def drawn_loss_scale(features, labels, mode, params):
    """The batch's mean loss times a number drawn each step: the draw meets the loss, a
    value of the whole batch, not the samples."""
    logits = L.Dense(CLASSES, name="logits")(features)
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits) * \
        tf.random.uniform([], 0.5, 1.5)
    return CSEstimatorSpec(mode, loss=loss, train_op=v1.train.GradientDescentOptimizer(
        0.1).minimize(loss, global_step=v1.train.get_or_create_global_step()))
