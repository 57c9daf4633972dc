"""Models that compute on a weight before it meets the samples, written the way users write
them: a cosine classifier (l2-normalised features and class weights), weight normalization
(w = g * v / ||v||), a learned temperature (tf.exp(t) * logits), a learned positive scale
(softplus), a masked and transposed kernel, a low-rank kernel, weight standardization of a
convolution, an embedding looked up in its normalised table, a soft decision tree's leaf
distributions (the softmax of a weight), a Kalman filter's covariance recurrence unrolled over
the time steps, SincNet's band-pass filters from learned cutoffs (sinc by tf.where), and ops
the CS cannot run on a weight."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

FEATURES, HIDDEN, CLASSES, VOCAB = 12, 16, 4, 20
STEPS = 16  # the Kalman filter's time steps


def input_fn(params):
    """Vectors of FEATURES values, a class each."""
    batch = params.get("batch_size", 8)
    rng = np.random.default_rng(3)
    x = rng.normal(size=(4 * batch, FEATURES)).astype(np.float32)
    y = (np.arange(4 * batch) % CLASSES).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)


def token_input_fn(params):
    """Sequences of 5 tokens, a class each."""
    batch = params.get("batch_size", 8)
    rng = np.random.default_rng(4)
    x = rng.integers(0, VOCAB, size=(4 * batch, 5)).astype(np.int32)
    y = (np.arange(4 * batch) % CLASSES).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)


def _optimizer(params):
    lr = params.get("learning_rate", 0.05)
    if params.get("optimizer") == "adam":
        return tf.compat.v1.train.AdamOptimizer(lr)
    if params.get("optimizer") == "momentum":
        return tf.compat.v1.train.MomentumOptimizer(lr, 0.9)
    return tf.compat.v1.train.GradientDescentOptimizer(lr)


def spec(mode, labels, logits, params, loss=None):
    """The classifier's spec: `loss` (default: the softmax cross-entropy of `logits`)."""
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode=mode, predictions={"classes": tf.argmax(logits, -1)})
    if loss is None:
        loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    train_op = None
    if mode == ModeKeys.TRAIN:
        train_op = _optimizer(params).minimize(
            loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    metrics = {"accuracy": tf.compat.v1.metrics.accuracy(labels, tf.argmax(logits, -1))}
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op, eval_metric_ops=metrics)


def cosine_classifier(features, labels, mode, params):
    """Logits are scaled cosines between the features and each class's weight vector."""
    x = tf.keras.layers.Dense(HIDDEN, activation="relu")(features)
    w = tf.compat.v1.get_variable("w", [HIDDEN, CLASSES])
    logits = tf.matmul(tf.nn.l2_normalize(x, 1), tf.nn.l2_normalize(w, 0)) * 10.0
    return spec(mode, labels, logits, params)


def weight_normalization(features, labels, mode, params):
    """A Dense-like layer with weight normalization (Salimans & Kingma): w = g * v / ||v||."""
    v = tf.compat.v1.get_variable("v", [FEATURES, HIDDEN])
    g = tf.compat.v1.get_variable("g", [HIDDEN], initializer=tf.compat.v1.ones_initializer())
    b = tf.compat.v1.get_variable("b", [HIDDEN], initializer=tf.compat.v1.zeros_initializer())
    w = g * v / tf.norm(v, axis=0)
    h = tf.nn.relu(tf.matmul(features, w) + b)
    logits = tf.keras.layers.Dense(CLASSES)(h)
    return spec(mode, labels, logits, params)


def learned_temperature(features, labels, mode, params):
    """Logits sharpened by a learned temperature, tf.exp(t) * logits."""
    h = tf.keras.layers.Dense(HIDDEN, activation="tanh")(features)
    t = tf.compat.v1.get_variable("log_temperature", [], initializer=tf.compat.v1.zeros_initializer())
    logits = tf.exp(t) * tf.keras.layers.Dense(CLASSES)(h)
    return spec(mode, labels, logits, params)


def positive_scale_and_mask(features, labels, mode, params):
    """A kernel masked by a constant and read transposed, a softplus scale per unit."""
    kernel = tf.compat.v1.get_variable("kernel", [HIDDEN, FEATURES])
    mask = np.tril(np.ones((HIDDEN, FEATURES), np.float32))
    scale = tf.nn.softplus(tf.compat.v1.get_variable("scale", [HIDDEN]))
    h = tf.nn.tanh(tf.matmul(features, tf.transpose(kernel * mask)) * scale)
    logits = tf.keras.layers.Dense(CLASSES)(h)
    return spec(mode, labels, logits, params)


def low_rank_kernel(features, labels, mode, params):
    """A kernel factorised into two thin matrices (rank 3), their product computed per step."""
    u = tf.compat.v1.get_variable("u", [FEATURES, 3])
    v = tf.compat.v1.get_variable("v", [3, HIDDEN])
    h = tf.nn.relu(tf.matmul(features, tf.matmul(u, v)))
    logits = tf.keras.layers.Dense(CLASSES)(h)
    return spec(mode, labels, logits, params)


def image_input_fn(params):
    """6 x 6 images of 2 channels, a class each."""
    batch = params.get("batch_size", 8)
    rng = np.random.default_rng(5)
    x = rng.uniform(size=(4 * batch, 6, 6, 2)).astype(np.float32)
    y = (np.arange(4 * batch) % CLASSES).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)


def standardized_conv(features, labels, mode, params):
    """Weight standardization: the filters minus their mean, over their standard deviation."""
    w = tf.compat.v1.get_variable("filters", [3, 3, 2, 4])
    mean, variance = tf.nn.moments(w, axes=[0, 1, 2], keepdims=True)
    h = tf.nn.relu(tf.nn.conv2d(features, (w - mean) * tf.math.rsqrt(variance + 1e-5), 1, "SAME"))
    logits = tf.keras.layers.Dense(CLASSES)(tf.keras.layers.Flatten()(h))
    return spec(mode, labels, logits, params)


def normalized_embedding(features, labels, mode, params):
    """Token embeddings looked up in the l2-normalised table (TF's update is then dense)."""
    table = tf.compat.v1.get_variable("table", [VOCAB, 6])
    e = tf.nn.embedding_lookup(tf.nn.l2_normalize(table, 1), features)
    logits = tf.keras.layers.Dense(CLASSES)(tf.reduce_mean(e, axis=1))
    return spec(mode, labels, logits, params)


def soft_decision_tree(features, labels, mode, params):
    """A depth-2 soft decision tree (Frosst & Hinton): sigmoid routing to 4 leaves, each a
    class distribution tf.nn.softmax(leaf_logits) mixed by the path probabilities."""
    p_right = tf.sigmoid(tf.keras.layers.Dense(3)(features))
    mu = tf.ones_like(p_right[:, :1])
    for d in range(2):
        p = p_right[:, 2 ** d - 1: 2 ** (d + 1) - 1]
        mu = tf.reshape(tf.stack([mu * (1 - p), mu * p], axis=2), [-1, 2 ** (d + 1)])
    leaf_logits = tf.compat.v1.get_variable(
        "leaf_logits", [4, CLASSES], initializer=tf.compat.v1.random_normal_initializer(stddev=0.5))
    probs = tf.matmul(mu, tf.nn.softmax(leaf_logits))
    loss = -tf.reduce_mean(tf.math.log(tf.gather(probs, labels, batch_dims=1) + 1e-8))
    return spec(mode, labels, probs, params, loss)


def track_input_fn(params):
    """Noisy positions of a random walk over STEPS time steps, the true ones as labels."""
    rng = np.random.default_rng(19)
    pos = np.cumsum(rng.normal(scale=0.5, size=(32, STEPS)), axis=1)
    z = pos + rng.normal(scale=0.5, size=pos.shape)
    return tf.data.Dataset.from_tensor_slices((z.astype(np.float32), pos.astype(np.float32))) \
        .batch(params.get("batch_size", 8), drop_remainder=True)


def kalman_filter(features, labels, mode, params):
    """An element-wise constant-velocity Kalman filter unrolled over the time steps in Python,
    its learned process and measurement noise (softplus) trained by the innovations' negative
    log-likelihood: the covariance's three entries are weight-only values each step reuses
    several times."""
    q = tf.nn.softplus(tf.compat.v1.get_variable("raw_q", [], initializer=tf.constant_initializer(-1.0)))
    r = tf.nn.softplus(tf.compat.v1.get_variable("raw_r", [], initializer=tf.constant_initializer(0.0)))
    x0 = x1 = tf.zeros_like(features[:, 0])
    p00, p01, p11 = 10.0, 0.0, 10.0
    nlls = []
    for t in range(STEPS):
        x0 = x0 + x1
        p00, p01, p11 = p00 + 2 * p01 + p11 + 0.25 * q, p01 + p11 + 0.5 * q, p11 + q
        s = p00 + r
        k0, k1 = p00 / s, p01 / s
        innovation = features[:, t] - x0
        x0, x1 = x0 + k0 * innovation, x1 + k1 * innovation
        p00, p01, p11 = (1 - k0) * p00, (1 - k0) * p01, p11 - k1 * p01
        nlls.append(0.5 * (tf.math.log(2 * np.pi * s) + tf.square(innovation) / s))
    loss = tf.reduce_mean(tf.stack(nlls, axis=1))
    train_op = tf.compat.v1.train.AdamOptimizer(0.05).minimize(
        loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode, loss=loss, train_op=train_op)


def cumulative_kernel(features, labels, mode, params):
    """A kernel built by a cumulative product of a weight: an op the CS does not run on weights."""
    w = tf.compat.v1.get_variable("w", [FEATURES, CLASSES])
    logits = tf.matmul(features, tf.math.cumprod(w, axis=0))
    return spec(mode, labels, logits, params)


RATE, SAMPLES, TAPS, BANDS = 8000.0, 96, 15, 6


def audio_input_fn(params):
    """Noisy tones of 4 frequencies (SAMPLES at RATE Hz, one channel), the tone's index each."""
    batch = params.get("batch_size", 8)
    rng = np.random.default_rng(23)
    y = (np.arange(4 * batch) % CLASSES).astype(np.int32)
    hz = np.array([300.0, 900.0, 1700.0, 2800.0])[y][:, None]
    t = np.arange(SAMPLES) / RATE
    x = np.sin(2 * np.pi * hz * t + rng.uniform(0, 6, (len(y), 1))) + \
        0.3 * rng.normal(size=(len(y), SAMPLES))
    return tf.data.Dataset.from_tensor_slices((x[..., None].astype(np.float32), y)).batch(
        batch, drop_remainder=True)


def sincnet(features, labels, mode, params):
    """SincNet's first layer (Ravanelli & Bengio): band-pass filters 2 f2 sinc(2 pi f2 n) -
    2 f1 sinc(2 pi f1 n) from learned cutoffs f1, f2, windowed, as a Conv1D kernel; sinc(0)
    = 1 by tf.where on the constant taps n, the divisor kept off 0 by tf.where on its value."""
    low = tf.abs(tf.compat.v1.get_variable(
        "low_hz", initializer=(np.linspace(100, 2400, BANDS) / RATE).astype(np.float32)))
    band = tf.abs(tf.compat.v1.get_variable(
        "band_hz", initializer=np.full(BANDS, 400.0 / RATE, np.float32)))
    high = tf.minimum(low + band, 0.5)
    n = tf.constant(np.arange(-(TAPS // 2), TAPS // 2 + 1), tf.float32)[:, None]

    def lowpass(fc):
        arg = 2 * np.pi * fc[None, :] * n
        safe = tf.where(tf.abs(arg) < 1e-6, tf.ones_like(arg), arg)
        return 2 * fc * tf.where(tf.equal(n, 0.0), tf.ones_like(arg), tf.sin(safe) / safe)

    kernel = (lowpass(high) - lowpass(low)) * tf.constant(np.hamming(TAPS), tf.float32)[:, None]
    h = tf.nn.conv1d(features, kernel[:, None, :], stride=1, padding="VALID")
    h = tf.math.log1p(tf.abs(tf.keras.layers.MaxPooling1D(4)(h)))
    logits = tf.keras.layers.Dense(CLASSES)(tf.keras.layers.GlobalAveragePooling1D()(h))
    return spec(mode, labels, logits, params)


def row_selected_kernel(features, labels, mode, params):
    """tf.compat.v1.where of a vector condition on a kernel: it picks whole rows, which the
    CS does not run on weights."""
    w = tf.compat.v1.get_variable("w", [FEATURES, CLASSES])
    rows = tf.constant(np.arange(FEATURES) % 2 == 0)
    logits = tf.matmul(features, tf.compat.v1.where(rows, w, -w))
    return spec(mode, labels, logits, params)
