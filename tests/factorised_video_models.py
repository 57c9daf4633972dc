"""An R(2+1)D video classifier under Keras mixed_float16 (after unseen30's r2plus1d_video):
each 3-D convolution factorised into a spatial (1, 3, 3) and a temporal (3, 1, 1) Conv3D,
BatchNormalization in training on the 5-D activations (params["batch_norm"]: else a bias
and ReLU, unseen30's), residual adds (a strided 1x1x1
projection), GlobalAveragePooling3D, a float32 softmax head; Adam with a linear warm-up then
cosine decay, params["loss_scale"] "dynamic" or a number."""
import math

import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

L = tf.keras.layers
params = {"batch_size": 4, "frames": 4, "size": 8, "num_classes": 4, "learning_rate": 1e-3,
          "policy": "mixed_float16", "loss_scale": "dynamic", "batch_norm": True}


def input_fn(params):
    """Noise clips with a bright blob moving in one of 4 directions (the class)."""
    rng = np.random.RandomState(3)
    n, frames, size = params["batch_size"] * 8, params["frames"], params["size"]
    y = rng.randint(0, params["num_classes"], n)
    clips = 0.3 * rng.randn(n, frames, size, size, 3).astype(np.float32)
    for i in range(n):
        dx, dy = [(1, 0), (-1, 0), (0, 1), (0, -1)][y[i]]
        for t in range(frames):
            x0, y0 = (size // 2 + dx * t) % size, (size // 2 + dy * t) % size
            clips[i, t, max(0, y0 - 1):y0 + 1, max(0, x0 - 1):x0 + 1, :] += 1.0
    return tf.data.Dataset.from_tensor_slices((clips, y.astype(np.int32))).batch(
        params["batch_size"], drop_remainder=True)


def conv2plus1d(x, filters, name, training, strides=(1, 1, 1)):
    """The spatial (1, 3, 3) Conv3D, BatchNormalization (training: None, no normalization)
    and ReLU, then the temporal (3, 1, 1)."""
    x = L.Conv3D(filters, (1, 3, 3), strides=(1, *strides[1:]), padding="same",
                 use_bias=training is None, name=name + "_s")(x)
    if training is not None:
        x = L.BatchNormalization(name=name + "_bn")(x, training=training)
    x = tf.nn.relu(x)
    return L.Conv3D(filters, (3, 1, 1), strides=(strides[0], 1, 1), padding="same",
                    name=name + "_t")(x)


def model_fn(features, labels, mode, params):
    tf.keras.mixed_precision.set_global_policy(params.get("policy", "mixed_float16"))
    training = mode == ModeKeys.TRAIN
    normalized = training if params.get("batch_norm", True) else None
    try:
        h = tf.nn.relu(conv2plus1d(features, 8, "stem", normalized))
        r = conv2plus1d(tf.nn.relu(conv2plus1d(h, 8, "b1a", normalized)), 8, "b1b", normalized)
        h = tf.nn.relu(h + r)
        s = L.Conv3D(16, 1, strides=2, name="b2_proj")(h)
        r = conv2plus1d(h, 16, "b2a", normalized, strides=(2, 2, 2))
        h = tf.nn.relu(s + r)
        logits = L.Dense(params["num_classes"], dtype="float32", name="logits")(
            L.GlobalAveragePooling3D()(h))
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")
    classes = tf.argmax(logits, -1, output_type=tf.int32)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode=mode, predictions={"class": classes,
                                                       "probs": tf.nn.softmax(logits)})
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    train_op = None
    if training:
        step = tf.compat.v1.train.get_or_create_global_step()
        t, warm, total = tf.cast(step, tf.float32), 2.0, 20.0
        lr = tf.where(t < warm, params["learning_rate"] * (t + 1) / warm,
                      0.5 * params["learning_rate"] * (1 + tf.cos(math.pi * (t - warm) / (total - warm))))
        opt = tf.compat.v1.train.AdamOptimizer(lr)
        if params.get("policy", "mixed_float16") == "mixed_float16":
            opt = tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer(
                opt, params.get("loss_scale", "dynamic"))
        train_op = opt.minimize(loss, global_step=step)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op, eval_metric_ops={
        "accuracy": tf.compat.v1.metrics.accuracy(labels, classes)})
