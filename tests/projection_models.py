"""Models whose random projection is drawn afresh every step, shared by the batch and read
like a weight (unseen23's refusal 1): a Performer (FAVOR+) attention block whose positive
random features project queries and keys by tf.random.normal([dh, m]) in an einsum (dh equal
to the batch size or not), and random Fourier features [cos(x @ w), sin(x @ w)] of the input
(w = tf.random.normal([d, D]) / length_scale) feeding a Dense. In evaluation and prediction
the models draw too (TF's graph does). Also the random Fourier features' textbook phase
cos(x @ w + b), b a uniform draw added to the samples' values (drawn once a step too), and a
draw [batch, d, k] a batched matmul pairs with the batch (each sample's own numbers)."""
from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

v1 = tf.compat.v1
L = tf.keras.layers
TOKENS, WIDTH, CLASSES, SAMPLES = 8, 16, 4, 128


def tokens_input_fn(params):
    """Sequences of TOKENS vectors of WIDTH; the class of the largest mean of 4 features."""
    rng = np.random.default_rng(23)
    x = rng.normal(size=(SAMPLES, TOKENS, WIDTH)).astype(np.float32)
    y = np.argmax(x[:, :, :CLASSES].mean(1), 1).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(params["batch_size"],
                                                            drop_remainder=True)


def points_input_fn(params):
    """Points of 6 values; the class is the quadrant of the first two, ringed by the third."""
    rng = np.random.default_rng(24)
    x = rng.normal(size=(SAMPLES, 6)).astype(np.float32)
    y = ((x[:, 0] > 0) * 2 + (x[:, 1] * x[:, 2] > 0)).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(params["batch_size"],
                                                            drop_remainder=True)


def classifier(mode, labels, logits, optimizer, penalty=None):
    """Softmax cross-entropy (plus a `penalty` of weights, a KL), accuracy, argmax."""
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"class": tf.argmax(logits, 1), "logits": logits})
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    if penalty is not None:
        loss += penalty
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss, eval_metric_ops={
            "accuracy": v1.metrics.accuracy(labels, tf.argmax(logits, 1))})
    return CSEstimatorSpec(mode, loss=loss, train_op=optimizer.minimize(
        loss, global_step=v1.train.get_or_create_global_step()))


def performer(features, labels, mode, params):
    """One Performer block (Choromanski et al. 2021): FAVOR+ features exp(x w - |x|^2 / 2)
    / sqrt(m) of queries and keys, w = tf.random.normal([dh, m]) redrawn every step;
    params["heads"] sets dh = WIDTH / heads (heads 1: dh 16, the batch size of the tests)."""
    heads, m = params["heads"], 8
    dh = WIDTH // heads
    h = L.Dense(WIDTH, name="embed")(features)

    def phi(x, w, is_query):
        x = x * dh ** -0.25
        proj = tf.einsum("bhnd,dm->bhnm", x, w)
        sq = 0.5 * tf.reduce_sum(tf.square(x), -1, keepdims=True)
        stab = tf.reduce_max(proj, axis=-1 if is_query else [-2, -1], keepdims=True)
        return tf.exp(proj - sq - tf.stop_gradient(stab)) / math.sqrt(m) + 1e-6

    def split(t):
        return tf.transpose(tf.reshape(t, [-1, TOKENS, heads, dh]), [0, 2, 1, 3])

    a = L.LayerNormalization(name="ln")(h)
    q, k, v = (split(L.Dense(WIDTH, name=n)(a)) for n in ("q", "k", "v"))
    w = tf.random.normal([dh, m])  # fresh features every step
    qp, kp = phi(q, w, True), phi(k, w, False)
    kv = tf.einsum("bhnm,bhnd->bhmd", kp, v)
    norm = tf.einsum("bhnm,bhm->bhn", qp, tf.reduce_sum(kp, 2))
    out = tf.einsum("bhnm,bhmd->bhnd", qp, kv) / norm[..., None]
    h = h + L.Dense(WIDTH, name="o")(tf.reshape(tf.transpose(out, [0, 2, 1, 3]), [-1, TOKENS, WIDTH]))
    logits = L.Dense(CLASSES, name="head")(tf.reduce_mean(h, 1))
    return classifier(mode, labels, logits, v1.train.RMSPropOptimizer(0.01))


def fourier_features(features, labels, mode, params):
    """Random Fourier features of an RBF kernel (Rahimi & Recht 2007) in their phase-free
    form [cos(x w), sin(x w)] / sqrt(D), w = tf.random.normal([6, D]) / length_scale drawn
    every step, into a Dense; params["phase"]: the textbook cos(x w + b) * sqrt(2 / D), b
    uniform in [0, 2 pi) added to the samples' values."""
    count = 12
    w = tf.random.normal([6, count]) / 1.5
    z = tf.matmul(features, w)
    if params.get("phase"):
        z = tf.cos(z + tf.random.uniform([count], 0.0, 2 * math.pi)) * math.sqrt(2.0 / count)
    else:
        z = tf.concat([tf.cos(z), tf.sin(z)], 1) / math.sqrt(count)
    hidden = L.Dense(16, activation="relu", name="hidden")(z)
    logits = L.Dense(CLASSES, name="logits")(hidden)
    return classifier(mode, labels, logits, v1.train.AdamOptimizer(0.01))


def per_sample_products(features, labels, mode, params):
    """tf.matmul(x, eps) of a draw [batch, WIDTH, 4] (16 = batch = WIDTH): a batched matmul
    pairs eps's first axis with the batch, each sample its own [WIDTH, 4] numbers."""
    h = L.Dense(WIDTH, name="q")(features)
    z = tf.matmul(h, tf.random.normal([params["batch_size"], WIDTH, 4]))
    logits = L.Dense(CLASSES, name="head")(tf.reduce_mean(z, 1))
    return classifier(mode, labels, logits, v1.train.AdamOptimizer(0.01))
