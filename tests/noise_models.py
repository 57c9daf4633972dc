"""Models with random numbers in the samples' computation, written the way users write them:
a variational autoencoder (Dense encoder -> mean, log_var -> z = mean + exp(0.5 log_var) *
eps -> Dense decoder; sigmoid cross-entropy reconstruction + KL; Adam), classifiers with
Keras' GaussianNoise and GaussianDropout, Gumbel noise on logits, integers drawn per sample
(a random feature per sample, a DDPM's timesteps), and one model per random number the CS
refuses."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

PIXELS, HIDDEN, LATENT, CLASSES = 16, 12, 3, 4


def input_fn(params):
    """Binary 'images' of PIXELS values and a class each; the autoencoder's labels are the
    images themselves."""
    batch = params.get("batch_size", 8)
    rng = np.random.default_rng(7)
    x = (rng.random((8 * batch, PIXELS)) < 0.4).astype(np.float32)
    y = (x[:, :CLASSES].sum(1) % CLASSES).astype(np.int32)
    labels = x if params.get("autoencoder") else y
    return tf.data.Dataset.from_tensor_slices((x, labels)).batch(batch, drop_remainder=True)


def _train_op(loss, params):
    if params.get("optimizer") == "sgd":
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(params.get("learning_rate", 0.1))
    else:
        optimizer = tf.compat.v1.train.AdamOptimizer(params.get("learning_rate", 0.01))
    return optimizer.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())


def vae(features, labels, mode, params):
    """A variational autoencoder; the predictions hold the latent sample and its moments."""
    h = tf.keras.layers.Dense(HIDDEN, activation="relu")(features)
    mean = tf.keras.layers.Dense(LATENT)(h)
    log_var = tf.keras.layers.Dense(LATENT)(h)
    eps = tf.random.normal(tf.shape(mean))
    z = mean + tf.exp(0.5 * log_var) * eps
    d = tf.keras.layers.Dense(HIDDEN, activation="relu")(z)
    logits = tf.keras.layers.Dense(PIXELS)(d)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode=mode, predictions={"z": z, "mean": mean, "log_var": log_var})
    reconstruction = tf.reduce_sum(
        tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits), axis=1)
    kl = -0.5 * tf.reduce_sum(1.0 + log_var - tf.square(mean) - tf.exp(log_var), axis=1)
    loss = tf.reduce_mean(reconstruction + kl)
    train_op = _train_op(loss, params) if mode == ModeKeys.TRAIN else None
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op)


def _classifier_spec(mode, labels, logits, params):
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode=mode, predictions={"logits": logits})
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    train_op = _train_op(loss, params) if mode == ModeKeys.TRAIN else None
    metrics = {"accuracy": tf.compat.v1.metrics.accuracy(labels, tf.argmax(logits, -1))}
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op, eval_metric_ops=metrics)


def gaussian_noise(features, labels, mode, params):
    """Keras GaussianNoise on the inputs and on a hidden layer, active in training only."""
    training = mode == ModeKeys.TRAIN
    x = tf.keras.layers.GaussianNoise(0.3)(features, training=training)
    h = tf.keras.layers.Dense(HIDDEN, activation="relu")(x)
    h = tf.keras.layers.GaussianNoise(0.1)(h, training=training)
    return _classifier_spec(mode, labels, tf.keras.layers.Dense(CLASSES)(h), params)


def gaussian_dropout(features, labels, mode, params):
    """Keras GaussianDropout (multiplicative noise of mean 1) after a hidden layer."""
    h = tf.keras.layers.Dense(HIDDEN, activation="tanh")(features)
    h = tf.keras.layers.GaussianDropout(0.3)(h, training=mode == ModeKeys.TRAIN)
    return _classifier_spec(mode, labels, tf.keras.layers.Dense(CLASSES)(h), params)


def gumbel_logits(features, labels, mode, params):
    """Gumbel noise from tf.random.uniform added to the logits (Gumbel-max exploration),
    and truncated-normal noise on the features, in every mode."""
    x = features + tf.random.truncated_normal(tf.shape(features), stddev=0.2)
    logits = tf.keras.layers.Dense(CLASSES)(tf.keras.layers.Dense(HIDDEN, activation="relu")(x))
    u = tf.random.uniform([params.get("batch_size", 8), CLASSES], minval=1e-6, maxval=1.0)
    return _classifier_spec(mode, labels, logits - tf.math.log(-tf.math.log(u)), params)


def draws(kind: str, shape_of: str = "batch"):
    """A model_fn predicting `features + <kind> draws` (tf.random.normal(mean 0.5, stddev
    2), truncated_normal(stddev 1.5), uniform(-1, 3), uniform integers in [-3, 5) of int32
    or int64) of the features' shape: what the CS draws, for the distribution tests. A Dense
    layer gives the program a weight."""
    def model_fn(features, labels, mode, params):
        shape = tf.shape(features)
        noise = {"normal": lambda: tf.random.normal(shape, mean=0.5, stddev=2.0),
                 "truncated_normal": lambda: tf.random.truncated_normal(shape, stddev=1.5),
                 "uniform": lambda: tf.random.uniform(shape, -1.0, 3.0),
                 "int32": lambda: tf.cast(tf.random.uniform(shape, -3, 5, tf.int32), tf.float32),
                 "int64": lambda: tf.cast(tf.random.uniform(shape, -3, 5, tf.int64), tf.float32),
                 }[kind]()
        drawn = features + noise
        logits = tf.keras.layers.Dense(CLASSES)(drawn)
        return CSEstimatorSpec(mode=mode, predictions={"drawn": drawn, "logits": logits})
    return model_fn


def draw_input_fn(params):
    """Zeros: what the `draws` models predict is the noise itself."""
    batch, width = params.get("batch_size", 256), params.get("width", 1024)
    x = np.zeros((batch, width), np.float32)
    return tf.data.Dataset.from_tensor_slices((x, np.zeros(batch, np.int32))).batch(batch)


# ---- random numbers the CS refuses ----

def weight_noise(features, labels, mode, params):
    """Noise on a weight (a Bayesian layer's sample of its kernel)."""
    w = tf.compat.v1.get_variable("w", [PIXELS, CLASSES])
    logits = tf.matmul(features, w + 0.1 * tf.random.normal([PIXELS, CLASSES]))
    return _classifier_spec(mode, labels, logits, params)


def constant_seed(features, labels, mode, params):
    """A stateless op with a constant seed: the same numbers at every step."""
    noise = tf.random.stateless_normal(tf.shape(features), seed=[1, 2])
    return _classifier_spec(mode, labels, tf.keras.layers.Dense(CLASSES)(features + noise), params)


def value_shaped(features, labels, mode, params):
    """Noise whose shape is computed from the samples' values."""
    n = tf.cast(tf.reduce_max(features), tf.int32) + 1
    noise = tf.random.normal(tf.stack([n, PIXELS]))
    return _classifier_spec(mode, labels, tf.keras.layers.Dense(CLASSES)(features + noise), params)


def stateless_categorical(features, labels, mode, params):
    """Classes drawn by tf.random.stateless_categorical with a constant seed."""
    logits = tf.keras.layers.Dense(CLASSES)(features)
    action = tf.random.stateless_categorical(logits, 1, seed=[3, 4])[:, 0]
    return _classifier_spec(mode, labels, logits * tf.one_hot(action, CLASSES), params)


def sampled_labels(features, labels, mode, params):
    """Label noise: each sample's target class drawn from a smoothed one-hot of its label (the
    CS draws it)."""
    smoothed = tf.one_hot(labels, CLASSES) * 0.9 + 0.1 / CLASSES
    targets = tf.random.categorical(tf.math.log(smoothed), 1)[:, 0]
    logits = tf.keras.layers.Dense(CLASSES)(features)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(targets, logits)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=_train_op(loss, params))


def conditional_generator(features, labels, mode, params):
    """A conditional generator: noise joined with one_hot(labels), images of the class."""
    z = tf.random.normal([tf.shape(features)[0], LATENT])
    h = tf.keras.layers.Dense(HIDDEN, activation="relu")(tf.concat([z, tf.one_hot(labels, CLASSES)], 1))
    images = tf.keras.layers.Dense(PIXELS, activation="sigmoid")(h)
    loss = tf.compat.v1.losses.mean_squared_error(features, images)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=_train_op(loss, params))


def noisy_labels(features, labels, mode, params):
    """Label noise: random numbers added to the regression targets (the CS draws them)."""
    prediction = tf.keras.layers.Dense(PIXELS)(features)
    targets = labels + tf.random.normal(tf.shape(labels), stddev=0.1)
    loss = tf.compat.v1.losses.mean_squared_error(targets, prediction)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=_train_op(loss, params))


# ---- integers drawn per sample ----

def random_feature(features, labels, mode, params):
    """Random integers: a random feature index per sample, its value weighing the sample."""
    index = tf.random.uniform([params.get("batch_size", 8)], 0, PIXELS, dtype=tf.int32)
    picked = tf.gather(features, index, batch_dims=1)[:, None]
    return _classifier_spec(mode, labels, tf.keras.layers.Dense(CLASSES)(features * picked), params)


T_STEPS = 20
_ALPHA_BAR = np.cumprod(1.0 - np.linspace(1e-4, 0.1, T_STEPS)).astype(np.float32)


def _sinusoidal(t, dim=8):
    freqs = tf.constant(np.exp(-np.log(100.0) * np.arange(dim // 2) / (dim // 2)), tf.float32)
    angles = tf.cast(t, tf.float32)[:, None] * freqs[None]
    return tf.concat([tf.sin(angles), tf.cos(angles)], -1)


def ddpm(features, labels, mode, params):
    """A DDPM denoiser: each sample's timestep t ~ U{0..T-1} (tf.random.uniform, int32),
    x_t = sqrt(alpha_bar[t]) x0 + sqrt(1 - alpha_bar[t]) eps, a Dense network given a Dense
    layer of a sinusoidal embedding of t predicts eps; params "table": the embedding a
    tf.gather of a constant table by int64 timesteps, the denoiser a Conv2D over 4x4 images;
    "stateless": t from tf.random.stateless_uniform with a seed variable."""
    x0 = features * 2.0 - 1.0
    batch = tf.shape(x0)[0]
    dtype = tf.int64 if params.get("table") else tf.int32
    if params.get("stateless"):
        seed = tf.compat.v1.get_variable("seed", initializer=[5, 6], trainable=False)
        t = tf.random.stateless_uniform([batch], seed, 0, T_STEPS, dtype=dtype)
    else:
        t = tf.random.uniform([batch], 0, T_STEPS, dtype=dtype)
    noise = tf.random.normal(tf.shape(x0))
    ab = tf.gather(tf.constant(_ALPHA_BAR), t)[:, None]
    xt = tf.sqrt(ab) * x0 + tf.sqrt(1.0 - ab) * noise
    if params.get("table"):
        table = np.random.default_rng(3).normal(size=(T_STEPS, 8)).astype(np.float32)
        temb = tf.gather(tf.constant(table), t)
        image = tf.reshape(xt, [-1, 4, 4, 1])
        h = tf.keras.layers.Conv2D(4, 3, padding="same", activation="relu")(image)
        h = tf.keras.layers.Flatten()(h)
    else:
        temb, h = _sinusoidal(t), xt
    temb = tf.keras.layers.Dense(8, activation="swish")(temb)
    h = tf.keras.layers.Dense(HIDDEN, activation="swish")(tf.concat([h, temb], 1))
    eps = tf.keras.layers.Dense(PIXELS)(h)
    if mode == ModeKeys.PREDICT:
        x0_hat = (xt - tf.sqrt(1.0 - ab) * eps) / tf.sqrt(ab)
        return CSEstimatorSpec(mode=mode, predictions={"eps": eps, "x0_hat": x0_hat})
    loss = tf.compat.v1.losses.mean_squared_error(noise, eps)
    metrics = {"eps_mse": tf.compat.v1.metrics.mean_squared_error(noise, eps),
               "t_mean": tf.compat.v1.metrics.mean(tf.cast(t, tf.float32)),
               "pixel_mean": tf.compat.v1.metrics.mean(x0)}
    train_op = _train_op(loss, params) if mode == ModeKeys.TRAIN else None
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op, eval_metric_ops=metrics)


# ---- integers the CS refuses ----

def integer_bounds_computed(features, labels, mode, params):
    """Integers below a bound computed from the samples' values."""
    high = tf.cast(tf.reduce_max(features), tf.int32) + 2
    index = tf.random.uniform([tf.shape(features)[0]], 0, high, dtype=tf.int32)
    picked = tf.gather(features, index, batch_dims=1)[:, None]
    return _classifier_spec(mode, labels, tf.keras.layers.Dense(CLASSES)(features * picked), params)


def full_range_integers(features, labels, mode, params):
    """tf.random.stateless_uniform of integers without bounds (the dtype's full range)."""
    seed = tf.compat.v1.get_variable("seed", initializer=[3, 4], trainable=False)
    bits = tf.random.stateless_uniform([tf.shape(features)[0]], seed, dtype=tf.int32,
                                       minval=None, maxval=None)
    picked = tf.cast(bits % 7, tf.float32)[:, None]
    return _classifier_spec(mode, labels, tf.keras.layers.Dense(CLASSES)(features * picked), params)


# ---- classes drawn from logits every row of which is the same ----

CODE_PRIOR = np.array([0.1, 0.2, 0.3, 0.4], np.float32)


def infogan(features, labels, mode, params):
    """An InfoGAN-style generator: each sample's categorical code drawn uniformly,
    tf.random.categorical(tf.zeros([batch, CLASSES]), 1) (params "logits": "zeros_like",
    tf.zeros_like(features[:, :CLASSES]); "prior": a [CLASSES] log prior broadcast to the
    batch; "rows_differ": a constant [batch, CLASSES] of a different prior a row, refused),
    joined with noise into images; a Q head recovers the code (the mutual-information term)
    and a critic scores the real images."""
    batch = tf.shape(features)[0]
    kind = params.get("logits", "zeros")
    if kind == "zeros_like":
        logits = tf.zeros_like(features[:, :CLASSES])
    elif kind == "prior":
        logits = tf.broadcast_to(tf.math.log(tf.constant(CODE_PRIOR)), [batch, CLASSES])
    elif kind == "rows_differ":
        rows = np.random.default_rng(5).dirichlet(np.ones(CLASSES), params["batch_size"])
        logits = tf.math.log(tf.constant(rows, tf.float32))
    else:
        logits = tf.zeros([batch, CLASSES])
    code = tf.random.categorical(logits, 1)[:, 0]
    z = tf.random.normal([batch, LATENT])
    h = tf.keras.layers.Dense(HIDDEN, activation="relu")(tf.concat([z, tf.one_hot(code, CLASSES)], 1))
    images = tf.keras.layers.Dense(PIXELS, activation="sigmoid")(h)
    q_logits = tf.keras.layers.Dense(CLASSES, name="q")(images)
    real = tf.keras.layers.Dense(1, name="critic")(features)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode=mode, predictions={"images": images, "code": code})
    info = tf.compat.v1.losses.sparse_softmax_cross_entropy(code, q_logits)
    real_loss = tf.reduce_mean(tf.nn.softplus(-real))
    loss = tf.compat.v1.losses.mean_squared_error(features, images) + info + real_loss
    metrics = {"real_loss": tf.compat.v1.metrics.mean(tf.nn.softplus(-real)),
               "code_mean": tf.compat.v1.metrics.mean(tf.cast(code, tf.float32))}
    train_op = _train_op(loss, params) if mode == ModeKeys.TRAIN else None
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op, eval_metric_ops=metrics)


def infogan_rows_differ(features, labels, mode, params):
    """The InfoGAN's code drawn from a constant [batch, CLASSES] whose rows differ."""
    return infogan(features, labels, mode, {**params, "logits": "rows_differ"})
