"""Convolutions of per-sample values by a constant filter, as users write them (unseen16):
tf.image.ssim as a loss and an eval metric (its Gaussian window applied by
depthwise_conv2d), tf.image.sobel_edges in an edge loss, a hand-written Gaussian blur by
tf.nn.conv2d with a tf.constant kernel and box filters by tf.nn.conv1d and conv3d; a blur-pool
CNN under mixed_float16 (float16 constant filters); and a filter the CS cannot hold (random
numbers)."""
import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

L, v1 = tf.keras.layers, tf.compat.v1


def images_input_fn(params):
    rng = np.random.default_rng(params.get("data_seed", 0))
    yy, xx = np.mgrid[0:8, 0:8] / 8.0
    phase = rng.uniform(0, 6, size=(32, 1, 1, 1))
    x = 0.5 + 0.4 * np.sin(4 * (yy + xx)[None, ..., None] + phase) + 0.05 * rng.normal(size=(32, 8, 8, 1))
    return tf.data.Dataset.from_tensor_slices((x.astype(np.float32), rng.integers(0, 3, 32).astype(np.int32))
                                              ).batch(8, drop_remainder=True)


def _train(mode, loss, metrics=None):
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss, eval_metric_ops=metrics)
    return CSEstimatorSpec(mode, loss=loss, train_op=v1.train.AdamOptimizer(3e-3).minimize(
        loss, global_step=v1.train.get_or_create_global_step()))


def _autoencoder(features):
    h = L.Conv2D(4, 3, strides=2, padding="same", activation="relu", name="enc")(features)
    h = L.Conv2DTranspose(4, 3, strides=2, padding="same", activation="relu", name="dec")(h)
    return L.Conv2D(1, 3, padding="same", activation="sigmoid", name="out")(h)


def ssim_autoencoder(features, labels, mode, params):
    """1 - SSIM (and the mean squared error) as the loss; SSIM's mean as an eval metric."""
    recon = _autoencoder(features)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"recon": recon})
    ssim = tf.image.ssim(recon, features, max_val=1.0, filter_size=3, filter_sigma=1.0)
    loss = tf.reduce_mean(1.0 - ssim) + v1.losses.mean_squared_error(features, recon)
    return _train(mode, loss, {"ssim": v1.metrics.mean(ssim),
                               "mse": v1.metrics.mean_squared_error(features, recon)})


def sobel_edge_loss(features, labels, mode, params):
    """The reconstruction's Sobel edges against the input's (an L1 edge loss)."""
    recon = _autoencoder(features)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"edges": tf.image.sobel_edges(recon)})
    loss = tf.reduce_mean(tf.abs(tf.image.sobel_edges(recon) - tf.image.sobel_edges(features))) + \
        v1.losses.mean_squared_error(features, recon)
    return _train(mode, loss, {"mse": v1.metrics.mean_squared_error(features, recon)})


def _gaussian(size, sigma, channels):
    g = np.exp(-0.5 * ((np.arange(size) - (size - 1) / 2) / sigma) ** 2)
    g = np.outer(g, g) / np.outer(g, g).sum()
    return tf.constant(np.einsum("hw,cd->hwcd", g, np.eye(channels)).astype(np.float32))


def blurred_classifier(features, labels, mode, params):
    """Feature maps blurred by a constant Gaussian (tf.nn.conv2d) and smoothed along each row
    by a box filter (tf.nn.conv1d of a tf.constant), the image as a volume box-filtered by
    tf.nn.conv3d, then a classifier."""
    h = L.Conv2D(4, 3, padding="same", activation="relu", name="conv")(features)
    h = tf.nn.conv2d(h, _gaussian(3, 1.0, 4), strides=1, padding="SAME")
    rows = tf.reshape(h, [-1, 8, 8 * 4])
    rows = tf.nn.conv1d(rows, tf.ones([3, 32, 8]) / 96.0, stride=1, padding="VALID")
    volume = tf.nn.conv3d(tf.reshape(features, [-1, 2, 4, 8, 1]), tf.ones([2, 3, 3, 1, 2]) / 18.0,
                          strides=[1] * 5, padding="SAME")
    logits = L.Dense(3, name="logits")(tf.concat([L.Flatten()(rows), L.Flatten()(volume)], -1))
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"classes": tf.argmax(logits, -1)})
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    return _train(mode, loss, {"accuracy": v1.metrics.accuracy(labels, tf.argmax(logits, -1))})


def random_filter(features, labels, mode, params):
    """A convolution by a filter drawn anew each step: no weight, no constant."""
    h = L.Conv2D(4, 3, padding="same", name="conv")(features)
    h = tf.nn.conv2d(h, tf.random.normal([3, 3, 4, 4]), strides=1, padding="SAME")
    loss = v1.losses.sparse_softmax_cross_entropy(labels, L.Dense(3)(L.Flatten()(h)))
    return _train(mode, loss)


def _blurpool(x):
    """BlurPool (anti-aliased downsampling): a fixed binomial filter per channel, stride 2,
    in the feature map's dtype."""
    k = np.outer([1, 2, 1], [1, 2, 1]).astype(np.float32) / 16.0
    kern = tf.constant(np.tile(k[:, :, None, None], [1, 1, x.shape[-1], 1]), dtype=x.dtype)
    return tf.nn.depthwise_conv2d(x, kern, [1, 2, 2, 1], "SAME")


def blurpool_mixed(features, labels, mode, params):
    """An anti-aliased CNN under mixed_float16 (params["policy"]: the float32 twin): a
    constant blur-pool (depthwise_conv2d), a fixed Gaussian smoothing (tf.nn.conv2d of the
    float32 window cast to float16), a float32 head; Adam with a dynamic loss scale."""
    tf.keras.mixed_precision.set_global_policy(params.get("policy", "mixed_float16"))
    try:
        h = _blurpool(L.Conv2D(4, 3, padding="same", activation="relu", name="conv1")(features))
        h = L.Conv2D(4, 3, padding="same", activation="relu", name="conv2")(h)
        h = tf.nn.conv2d(h, tf.cast(_gaussian(3, 1.0, 4), h.dtype), strides=1, padding="SAME")
        logits = L.Dense(3, dtype="float32", name="head")(L.Flatten()(_blurpool(h)))
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"logits": logits})
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss, eval_metric_ops={
            "accuracy": v1.metrics.accuracy(labels, tf.argmax(logits, -1))})
    opt = v1.train.experimental.MixedPrecisionLossScaleOptimizer(v1.train.AdamOptimizer(3e-3), "dynamic")
    return CSEstimatorSpec(mode, loss=loss, train_op=opt.minimize(
        loss, global_step=v1.train.get_or_create_global_step()))
