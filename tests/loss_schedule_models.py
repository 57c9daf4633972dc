"""Losses whose terms are weighted by a value of the global step, written the way users write
them, for tests/coordinator/test_loss_schedules.py: a VAE on scikit-learn's digits with KL
annealing (beta = min(1, step / n) or polynomial_decay of the step; beta * mean(kl) or inside
the mean), an auxiliary loss whose weight decays with polynomial_decay, warm-ups of a loss
weight with tf.cond and tf.where, and a weight the train_op itself moves (not a schedule).

The VAE's reparameterisation noise is a feature (input_fn draws it), so the CS and TF
compute with the same numbers in every mode. `params["anneal"]`: the steps until the weight
reaches its end (2: 4 training steps cross it)."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from examples.digits import digits_split
from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

v1 = tf.compat.v1
PIXELS, HIDDEN, LATENT, CLASSES = 64, 16, 4, 10


def input_fn(params):
    """Digits flattened to 64 values in [0, 1], the VAE's noise eps (N(0, 1) per latent) and
    the digit's class."""
    images, labels = digits_split(training=True)
    n = 16 * params["batch_size"]
    eps = np.random.default_rng(3).normal(size=(n, LATENT)).astype(np.float32)
    features = {"x": images[:n].reshape(n, PIXELS), "eps": eps}
    return tf.data.Dataset.from_tensor_slices((features, labels[:n])).batch(
        params["batch_size"], drop_remainder=True)


def _beta(params: dict) -> tf.Tensor:
    """The loss weight of `params["beta"]`'s form, over `params["anneal"]` steps."""
    step, form, anneal = v1.train.get_or_create_global_step(), params["beta"], params["anneal"]
    if form == "minimum":
        return tf.minimum(1.0, tf.cast(step, tf.float32) / float(anneal))
    if form == "polynomial":
        return v1.train.polynomial_decay(0.0, step, anneal, end_learning_rate=1.0)
    if form == "decay":
        return v1.train.polynomial_decay(1.0, step, anneal + 1, end_learning_rate=0.1)
    if form == "cond":
        return tf.cond(step < anneal, lambda: tf.constant(0.1), lambda: tf.constant(1.0))
    if form == "where":
        return tf.where(step < anneal, 0.25 * tf.cast(step + 1, tf.float32), 0.75)
    if form == "written":  # moved by the train_op each step: not a schedule of the step
        return v1.get_variable("beta", [], trainable=False, initializer=v1.zeros_initializer())
    raise ValueError(form)


def vae(features, labels, mode, params):
    """Dense encoder -> mean, log_var; z = mean + exp(0.5 log_var) * eps; Dense decoder;
    sigmoid cross-entropy reconstruction plus beta times the KL divergence."""
    x = features["x"]
    h = tf.keras.layers.Dense(HIDDEN, activation="relu")(x)
    mean = tf.keras.layers.Dense(LATENT, name="z_mean")(h)
    log_var = tf.keras.layers.Dense(LATENT, name="z_log_var")(h)
    z = mean + tf.exp(0.5 * log_var) * features["eps"]
    d = tf.keras.layers.Dense(HIDDEN, activation="relu")(z)
    logits = tf.keras.layers.Dense(PIXELS)(d)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"z_mean": mean})
    recon = tf.reduce_sum(tf.nn.sigmoid_cross_entropy_with_logits(labels=x, logits=logits), axis=1)
    kl = -0.5 * tf.reduce_sum(1.0 + log_var - tf.square(mean) - tf.exp(log_var), axis=1)
    beta = _beta(params)
    if params.get("inside"):
        loss = tf.reduce_mean(recon + beta * kl)
    else:
        loss = tf.reduce_mean(recon) + beta * tf.reduce_mean(kl)
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss, eval_metric_ops={
            "recon": v1.metrics.mean(recon), "kl": v1.metrics.mean(kl)})
    step = v1.train.get_or_create_global_step()
    train_op = v1.train.AdamOptimizer(0.01).minimize(loss, global_step=step)
    if params["beta"] == "written":
        with tf.control_dependencies([train_op]):
            train_op = beta.assign(tf.minimum(beta + 0.5, 1.0))
    return CSEstimatorSpec(mode, loss=loss, train_op=train_op)


def auxiliary(features, labels, mode, params):
    """A classifier with an auxiliary head on its hidden layer (deep supervision), the
    auxiliary loss weighted by `params["beta"]`'s form ("decay": polynomial_decay from 1 to
    0.1); `params["penalised"]`: the first layer's L2 penalty weighted by it too ("inside":
    the kernel scaled by its square root inside the penalty: not on the CS)."""
    first = tf.keras.layers.Dense(HIDDEN, activation="relu")
    h1 = first(features["x"])
    h2 = tf.keras.layers.Dense(HIDDEN, activation="relu")(h1)
    logits = tf.keras.layers.Dense(CLASSES)(h2)
    aux_logits = tf.keras.layers.Dense(CLASSES)(h1)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"class": tf.argmax(logits, -1)})
    step = v1.train.get_or_create_global_step()
    weight = _beta(params)
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits) + \
        weight * v1.losses.sparse_softmax_cross_entropy(labels, aux_logits)
    if params.get("penalised") == "inside":  # a penalty of the scaled kernel: not on the CS
        loss += 1e-3 * tf.nn.l2_loss(tf.sqrt(weight) * first.kernel)
    elif params.get("penalised"):  # a weight decay on the same schedule
        loss += weight * 1e-3 * tf.nn.l2_loss(first.kernel)
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss, eval_metric_ops={
            "accuracy": v1.metrics.accuracy(labels, tf.argmax(logits, -1))})
    train_op = v1.train.MomentumOptimizer(0.1, 0.9).minimize(loss, global_step=step)
    return CSEstimatorSpec(mode, loss=loss, train_op=train_op)
