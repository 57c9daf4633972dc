"""Style transfer against a loss network, written the way users write Johnson et al.'s recipe:
a small trainable image transformation net, a feature extractor of Keras Conv2D layers and
MaxPooling2D applied to its output, to the content images and to a constant style image
(tf.constant), Gram matrices of the feature maps (tf.matmul(f, f, transpose_a=True)), a
content loss on one layer and a style loss against the style image's Grams on every layer,
Adam. The loss network is frozen (trainable=False, as VGG's pretrained weights are, and
left out of the optimizer's var_list), or
trained with the rest (its filters then reach the style image's features: their gradient
comes back through the convolutions on the constant too); a depthwise loss network stays
refused on weights, and so is the frozen network under mixed_float16 (params["policy"])."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

L = tf.keras.layers
SIZE = 16


def input_fn(params):
    """Smooth random colour images (the content), no labels."""
    batch = params.get("batch_size", 4)
    rng = np.random.default_rng(2)
    yy, xx = np.mgrid[0:SIZE, 0:SIZE] / SIZE
    images = np.zeros((4 * batch, SIZE, SIZE, 3), np.float32)
    for image in images:
        for c in range(3):
            f = rng.uniform(1, 3, 2)
            image[:, :, c] = 0.5 + 0.5 * np.sin(2 * np.pi * (f[0] * xx + f[1] * yy) + rng.uniform(0, 6))
    return tf.data.Dataset.from_tensor_slices((images, np.zeros(len(images), np.float32))).batch(
        batch, drop_remainder=True)


def style_image() -> np.ndarray:
    """A checkerboard with stripes, [1, SIZE, SIZE, 3]."""
    yy, xx = np.mgrid[0:SIZE, 0:SIZE] / SIZE
    s = np.stack([(np.floor(xx * 4) + np.floor(yy * 4)) % 2, np.sin(12 * xx * yy), yy], -1)
    return s[None].astype(np.float32)


def transform_net(x):
    h = L.Conv2D(8, 3, padding="same", activation="relu", name="t_c1")(x)
    h = L.Conv2D(8, 3, padding="same", activation="relu", name="t_c2")(h)
    return tf.sigmoid(L.Conv2D(3, 3, padding="same", name="t_out")(h))


class LossNetwork:
    """Three conv layers with pooling between them (VGG's relu1_2, relu2_2, relu3_3);
    `pooling` MaxPooling2D or AveragePooling2D."""

    def __init__(self, trainable: bool, pooling=L.MaxPooling2D):
        self.convs = [L.Conv2D(f, 3, padding="same", activation="relu", trainable=trainable,
                               name=f"vgg_c{k + 1}") for k, f in enumerate((8, 12, 16))]
        self.pool = pooling(2)

    def __call__(self, x):
        x = (x - 0.45) / 0.225
        features = [self.convs[0](x)]
        for conv in self.convs[1:]:
            features.append(conv(self.pool(features[-1])))
        return features


class DepthwiseLossNetwork:
    """A MobileNet-style frozen extractor: a depthwise convolution after the first conv."""

    def __init__(self):
        self.c1 = L.Conv2D(8, 3, padding="same", activation="relu", trainable=False, name="vgg_c1")
        self.dw = L.DepthwiseConv2D(3, padding="same", activation="relu", trainable=False, name="vgg_dw")

    def __call__(self, x):
        f1 = self.c1(x)
        return [f1, self.dw(f1)]


def gram(f):
    f = tf.cast(f, tf.float32)  # (the loss in float32 under mixed_float16)
    shape = tf.shape(f)
    hw = tf.cast(shape[1] * shape[2], tf.float32)
    c = f.shape[-1]
    flat = tf.reshape(f, [-1, shape[1] * shape[2], c])
    return tf.matmul(flat, flat, transpose_a=True) / (hw * tf.cast(c, tf.float32))


def _style_transfer(features, mode, params, loss_network, trains_network: bool = False):
    """The transformer trained against `loss_network()` (built under params["policy"])."""
    tf.keras.mixed_precision.set_global_policy(params.get("policy", "float32"))
    network = loss_network()
    y = transform_net(features)
    fy, fx = network(y), network(features)
    fs = network(tf.constant(style_image()))
    content = tf.reduce_mean(tf.square(tf.cast(fy[1] - fx[1], tf.float32)), [1, 2, 3])
    style = tf.add_n([tf.reduce_sum(tf.square(gram(a) - gram(s)), [1, 2]) for a, s in zip(fy, fs)])
    loss = tf.reduce_mean(content + params.get("style_weight", 5.0) * style)
    train_op = None
    if mode == ModeKeys.TRAIN:
        # (Keras 3 puts a trainable=False layer's variables in TRAINABLE_VARIABLES too)
        trained = [v for v in tf.compat.v1.trainable_variables()
                   if trains_network or not v.name.startswith("vgg")]
        train_op = tf.compat.v1.train.AdamOptimizer(params.get("learning_rate", 1e-2)).minimize(
            loss, var_list=trained, global_step=tf.compat.v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op,
                           predictions={"stylized": y, "style": style},
                           eval_metric_ops={"content": tf.compat.v1.metrics.mean(content),
                                            "style": tf.compat.v1.metrics.mean(style)})


def frozen_vgg_style(features, labels, mode, params):
    """The standard recipe: the loss network frozen (trainable=False), max pooling."""
    return _style_transfer(features, mode, params, lambda: LossNetwork(trainable=False))


def trained_loss_network_style(features, labels, mode, params):
    """The loss network trained with the transformer (average pooling): each filter's
    gradient sums its uses on the samples and on the constant style image."""
    return _style_transfer(features, mode, params,
                           lambda: LossNetwork(trainable=True, pooling=L.AveragePooling2D), True)


def depthwise_style(features, labels, mode, params):
    """A depthwise layer in the frozen loss network: no CS kernel on weights."""
    return _style_transfer(features, mode, params, DepthwiseLossNetwork)
