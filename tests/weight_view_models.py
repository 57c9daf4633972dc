"""Models whose weights are sliced, split, gathered, concatenated or transposed before they
meet the samples, written the way users write them: Keras GRU (reset_after False and True),
a hand-written LSTM cell splitting one kernel with tf.split, a language model whose output
layer is its embedding table transposed, and a kernel built from pieces of two weights."""
from __future__ import annotations

import numpy as np
import tensorflow as tf
from weight_program_models import spec  # the classifier head and optimizers of that corpus

STEPS, FEATURES, UNITS, CLASSES, VOCAB, DIM = 4, 3, 5, 3, 11, 6


def sequence_input_fn(params):
    """Sequences of STEPS vectors of FEATURES values, a class each."""
    batch = params.get("batch_size", 8)
    rng = np.random.default_rng(7)
    x = rng.normal(size=(4 * batch, STEPS, FEATURES)).astype(np.float32)
    y = (np.arange(4 * batch) % CLASSES).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)


def token_input_fn(params):
    """Sequences of STEPS tokens; the label is the next token."""
    batch = params.get("batch_size", 8)
    rng = np.random.default_rng(8)
    x = rng.integers(0, VOCAB, size=(4 * batch, STEPS)).astype(np.int32)
    y = rng.integers(0, VOCAB, size=(4 * batch,)).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)


def gru_reset_before(features, labels, mode, params):
    """Keras GRU with reset_after=False: the reset gate scales the state before it meets
    the candidate's slice of the recurrent kernel."""
    h = tf.keras.layers.GRU(UNITS, reset_after=False)(features)
    return spec(mode, labels, tf.keras.layers.Dense(CLASSES)(h), params)


def gru_reset_after(features, labels, mode, params):
    """Keras GRU (reset_after=True, the default)."""
    h = tf.keras.layers.GRU(UNITS)(features)
    return spec(mode, labels, tf.keras.layers.Dense(CLASSES)(h), params)


def split_kernel_lstm(features, labels, mode, params):
    """An LSTM cell written by hand as Keras' LSTMCell (implementation 1) computes it: the
    input and recurrent kernels each split into the four gates' with tf.split."""
    kernel = tf.compat.v1.get_variable("lstm/kernel", [FEATURES, 4 * UNITS])
    recurrent = tf.compat.v1.get_variable("lstm/recurrent_kernel", [UNITS, 4 * UNITS])
    bias = tf.compat.v1.get_variable("lstm/bias", [4 * UNITS],
                                     initializer=tf.compat.v1.zeros_initializer())
    k_i, k_f, k_c, k_o = tf.split(kernel, 4, axis=1)
    r_i, r_f, r_c, r_o = tf.split(recurrent, 4, axis=1)
    b_i, b_f, b_c, b_o = tf.split(bias, 4)
    h = c = tf.zeros([tf.shape(features)[0], UNITS])
    for x in tf.unstack(features, axis=1):
        i = tf.sigmoid(tf.matmul(x, k_i) + tf.matmul(h, r_i) + b_i)
        f = tf.sigmoid(tf.matmul(x, k_f) + tf.matmul(h, r_f) + b_f + 1.0)
        o = tf.sigmoid(tf.matmul(x, k_o) + tf.matmul(h, r_o) + b_o)
        c = f * c + i * tf.tanh(tf.matmul(x, k_c) + tf.matmul(h, r_c) + b_c)
        h = o * tf.tanh(c)
    return spec(mode, labels, tf.keras.layers.Dense(CLASSES)(h), params)


def tied_embedding_lm(features, labels, mode, params):
    """A language model whose output projection is its embedding table, transposed."""
    table = tf.compat.v1.get_variable("embedding/table", [VOCAB, DIM])
    e = tf.reduce_mean(tf.nn.embedding_lookup(table, features), axis=1)
    h = tf.keras.layers.Dense(DIM, activation="tanh")(e)
    logits = tf.matmul(h, tf.transpose(table))
    return spec(mode, labels, logits, params)


def pieced_kernel(features, labels, mode, params):
    """A kernel put together from weights: rows picked by tf.gather, a reversed slice, a
    reshape and a concatenation, scaled before it meets the samples."""
    flat = tf.reshape(features, [-1, STEPS * FEATURES])
    a = tf.compat.v1.get_variable("a", [STEPS * FEATURES, 4])
    b = tf.compat.v1.get_variable("b", [2, 2 * STEPS * FEATURES])
    picked = tf.gather(a, np.arange(STEPS * FEATURES)[::-1].copy())
    rows = tf.transpose(tf.reshape(b, [4, STEPS * FEATURES]))[::-1, :]
    kernel = tf.concat([picked, rows * 0.5, a[:, 1:3]], axis=1) * 2.0
    h = tf.nn.tanh(tf.matmul(flat, kernel))
    return spec(mode, labels, tf.keras.layers.Dense(CLASSES)(h), params)


def unrolled_ista(features, labels, mode, params):
    """LISTA: a learned iterative soft-thresholding, one threshold and one step size per
    iteration read as scalars of two [STEPS] weights (theta[k], step[k])."""
    x = tf.reshape(features, [-1, STEPS * FEATURES])
    theta = tf.compat.v1.get_variable("theta", [STEPS], initializer=tf.constant_initializer(0.1))
    step = tf.compat.v1.get_variable("step", [STEPS], initializer=tf.constant_initializer(0.5))
    encode = tf.keras.layers.Dense(UNITS, use_bias=False)
    z = tf.zeros_like(encode(x))
    for k in range(STEPS):
        u = z + step[k] * encode(x)
        z = tf.sign(u) * tf.nn.relu(tf.abs(u) - theta[k])
    return spec(mode, labels, tf.keras.layers.Dense(CLASSES)(z), params)


def kernel_with_constant_column(features, labels, mode, params):
    """A kernel concatenated with a constant column (a class whose logit is fixed at 0)."""
    flat = tf.reshape(features, [-1, STEPS * FEATURES])
    w = tf.compat.v1.get_variable("w", [STEPS * FEATURES, CLASSES - 1])
    kernel = tf.concat([w, tf.zeros([STEPS * FEATURES, 1])], axis=1)
    return spec(mode, labels, tf.matmul(flat, kernel), params)
