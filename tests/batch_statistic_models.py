"""Models reading a statistic of the whole batch, written the ordinary way: Deep Embedded
Clustering (Student-t soft assignments to learned centres, the target distribution
p = q ** 2 / tf.reduce_sum(q, 0) normalised per row under tf.stop_gradient, KL(p || q) plus
the autoencoder's reconstruction) and features centred by the batch's mean by hand
(h - tf.reduce_mean(h, 0)), shifted by the batch's maximum, standardised by its mean and
tf.math.reduce_std or whitened by tf.nn.moments before a Keras classifier; VICReg's variance
term and Barlow Twins' cross-correlation (losses that are functions of batch statistics:
more in tests/batch_loss_models.py). What the CS does not carry out: min-max scaling (a
difference of two statistics), scaling by the batch's max."""
from __future__ import annotations

import numpy as np
import tensorflow as tf
from inbatch_models import minimize_with

from tf_model.estimator_spec import CSEstimatorSpec

BATCH, STEPS, CLUSTERS = 8, 4, 3


def input_fn(params):
    rng = np.random.default_rng(21)
    n = params["batch_size"] * STEPS * 2
    centres = rng.normal(scale=2.0, size=(CLUSTERS, 6))
    members = rng.integers(CLUSTERS, size=n)
    x = (centres[members] + rng.normal(size=(n, 6))).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((x, members.astype(np.int32))).batch(
        params["batch_size"], drop_remainder=True)


def _train(loss, params):
    optimizer = tf.compat.v1.train.AdamOptimizer(params.get("learning_rate", 0.01))
    return optimizer.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())


def dec_model_fn(features, labels, mode, params):
    """IDEC: an autoencoder whose embedding is softly assigned to learned cluster centres."""
    z = tf.keras.layers.Dense(8, activation="relu")(features)
    z = tf.keras.layers.Dense(4)(z)
    reconstruction = tf.keras.layers.Dense(6)(tf.keras.layers.Dense(8, activation="relu")(z))
    centres = tf.compat.v1.get_variable("cluster_centres", [CLUSTERS, 4],
                                        initializer=tf.compat.v1.glorot_uniform_initializer())
    distance = tf.reduce_sum(tf.square(tf.expand_dims(z, 1) - centres), axis=2)
    q = 1.0 / (1.0 + distance)  # Student's t, one degree of freedom
    q = q / tf.reduce_sum(q, axis=1, keepdims=True)
    weight = q ** 2 / tf.reduce_sum(q, 0)
    p = tf.stop_gradient(weight / tf.reduce_sum(weight, axis=1, keepdims=True))
    kl = tf.reduce_mean(tf.reduce_sum(p * tf.math.log(p / q), axis=1))
    loss = 0.1 * kl + tf.compat.v1.losses.mean_squared_error(features, reconstruction)
    if mode == "eval":
        metrics = {"cluster_agreement": tf.compat.v1.metrics.mean(tf.reduce_max(q, axis=1)),
                   "kl": tf.compat.v1.metrics.mean(kl)}
        return CSEstimatorSpec(mode=mode, loss=loss, eval_metric_ops=metrics)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=_train(loss, params))


def centred_model_fn(features, labels, mode, params):
    """Hidden features centred by the batch's mean (keepdims, and not) between Keras layers."""
    h = tf.keras.layers.Dense(8, activation="tanh")(features)
    h = h - tf.reduce_mean(h, axis=0)
    h = tf.keras.layers.Dense(6, activation="softplus")(h)
    h = h - tf.reduce_mean(h, axis=0, keepdims=True)
    logits = tf.keras.layers.Dense(CLUSTERS)(h)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=_train(loss, params))


def vicreg_model_fn(features, labels, mode, params):
    """VICReg's variance term: a hinge on each feature's standard deviation over the batch
    (the loss a function of batch statistics, not a sum of per-sample values)."""
    za = tf.keras.layers.Dense(4)(features)
    zb = tf.keras.layers.Dense(4)(features + 0.1)
    invariance = tf.compat.v1.losses.mean_squared_error(za, zb)
    std = tf.sqrt(tf.math.reduce_variance(za, axis=0) + 1e-4)
    loss = invariance + tf.reduce_mean(tf.nn.relu(1.0 - std))
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=_train(loss, params))


def barlow_twins_model_fn(features, labels, mode, params):
    """Barlow Twins: the [n, n] cross-correlation of two views over the batch."""
    za = tf.keras.layers.Dense(4)(features)
    zb = tf.keras.layers.Dense(4)(features * 0.5)
    c = tf.matmul(za, zb, transpose_a=True) / params["batch_size"]
    loss = tf.reduce_sum(tf.square(c - tf.eye(4)))
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=_train(loss, params))


def max_shifted_model_fn(features, labels, mode, params):
    """Each feature shifted by its largest value in the batch (the batch's max subtracted)."""
    h = tf.keras.layers.Dense(8, activation="tanh")(features)
    h = h - tf.reduce_max(h, axis=0)
    logits = tf.keras.layers.Dense(CLUSTERS)(h)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=_train(loss, params))


def standardised_model_fn(features, labels, mode, params):
    """Features standardised by the batch's mean and standard deviation by hand."""
    h = tf.keras.layers.Dense(8, activation="tanh")(features)
    h = (h - tf.reduce_mean(h, axis=0)) / (tf.math.reduce_std(h, axis=0) + 1e-3)
    logits = tf.keras.layers.Dense(CLUSTERS)(h)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=_train(loss, params))


def moments_whitened_model_fn(features, labels, mode, params):
    """Features whitened by tf.nn.moments over the batch by hand (no scale or offset)."""
    h = tf.keras.layers.Dense(8, activation="tanh")(features)
    mean, variance = tf.nn.moments(h, axes=[0])
    h = (h - mean) * tf.math.rsqrt(variance + 1e-3)
    logits = tf.keras.layers.Dense(CLUSTERS)(h)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=_train(loss, params))


def max_scaled_model_fn(features, labels, mode, params):
    """Each feature scaled by its largest value in the batch."""
    h = tf.keras.layers.Dense(8, activation="relu")(features)
    h = h / (tf.reduce_max(h, axis=0) + 1e-6)
    logits = tf.keras.layers.Dense(CLUSTERS)(h)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=_train(loss, params))


def min_max_model_fn(features, labels, mode, params):
    """Min-max scaling over the batch: the range is a difference of two batch statistics."""
    h = tf.keras.layers.Dense(8, activation="relu")(features)
    low = tf.reduce_min(h, axis=0)
    h = (h - low) / (tf.reduce_max(h, axis=0) - low + 1e-6)
    logits = tf.keras.layers.Dense(CLUSTERS)(h)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=_train(loss, params))


def random_model_fn(seed: int):
    """A classifier whose hidden features are normalised by batch statistics, drawn from
    `seed`: widths, Keras activations, per layer one of centring, standardising (tf.math
    .reduce_std or tf.nn.moments), max-shifting or dividing by the batch's sum of a positive
    value, keepdims or not, and the optimizer."""
    rng = np.random.default_rng(seed)
    # (no relu or elu: a feature in their linear part for the whole batch, centred, has a
    # bias gradient 0 in exact arithmetic, rounding noise Adam turns into steps on both
    # sides: docs/design.md, *Amplified noise*)
    layers = [(int(rng.integers(3, 9)), str(rng.choice(["tanh", "sigmoid", "softplus"])),
               str(rng.choice(["centre", "std", "moments", "max", "share"])), bool(rng.integers(2)))
              for _ in range(int(rng.integers(1, 3)))]
    optimizer = str(rng.choice(["adam", "sgd", "momentum"]))

    def normalise(h, kind, keepdims):
        if kind == "centre":
            return h - tf.reduce_mean(h, axis=0, keepdims=keepdims)
        if kind == "std":
            return (h - tf.reduce_mean(h, 0, keepdims=keepdims)) / \
                (tf.math.reduce_std(h, 0, keepdims=keepdims) + 1e-3)
        if kind == "moments":
            mean, variance = tf.nn.moments(h, axes=[0], keepdims=keepdims)
            return (h - mean) * tf.math.rsqrt(variance + 1e-3)
        if kind == "max":
            return h - tf.reduce_max(h, axis=0, keepdims=keepdims)
        positive = tf.nn.softplus(h)  # each sample's share of the batch's total
        return positive / tf.reduce_sum(positive, axis=0, keepdims=keepdims) * 4.0

    def model_fn(features, labels, mode, params):
        h = features
        for width, activation, kind, keepdims in layers:
            h = normalise(tf.keras.layers.Dense(width, activation=activation)(h), kind, keepdims)
        logits = tf.keras.layers.Dense(CLUSTERS)(h)
        loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
        return CSEstimatorSpec(mode=mode, loss=loss, train_op=minimize_with(optimizer, loss))

    model_fn.__name__ = f"random_batch_statistics_{seed}"
    return model_fn
