"""Models that fold a per-sample axis into the batch and unfold it again, as users write them:
attention-based multiple-instance learning over bags of instances (Ilse et al.: a Dense per
instance on tf.reshape(bags, [-1, d]), attention pooling over the bag), a TimeDistributed by
hand over a sequence's steps, a Conv2D over a clip's frames; and ones that mix the folded rows
of different samples (refused)."""
import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

L = tf.keras.layers
v1 = tf.compat.v1
gs = v1.train.get_or_create_global_step
INSTANCES, FEATURES = 8, 12


def bags_input_fn(params):
    """Bags of 8 instances of 12 features; a bag is positive if any instance's first feature
    is large."""
    rng = np.random.default_rng(20)
    bags = rng.normal(size=(64, INSTANCES, FEATURES)).astype(np.float32)
    label = (bags[:, :, 0] > 1.5).any(1).astype(np.float32)[:, None]
    return tf.data.Dataset.from_tensor_slices((bags, label)).batch(8, drop_remainder=True)


def _instances(features, params, training):
    """A Dense and Dropout per instance, the bag's instances folded into the batch."""
    fold = params.get("fold", "minus_one")
    if fold == "minus_one":
        flat = tf.reshape(features, [-1, FEATURES])
    else:  # tf.shape(x)[0] * k
        flat = tf.reshape(features, [tf.shape(features)[0] * INSTANCES, FEATURES])
    h = L.Dense(16, activation="relu")(flat)
    if params.get("layer_norm"):
        h = L.LayerNormalization()(h)
    h = L.Dropout(params.get("dropout", 0.0))(h, training=training)
    if params.get("noise"):
        h = L.GaussianNoise(params["noise"])(h, training=training)
    return tf.reshape(h, [-1, INSTANCES, 16])


def mil_attention(features, labels, mode, params):
    """Attention-based MIL pooling (gated), sigmoid cross-entropy, Adam."""
    h = _instances(features, params, mode == ModeKeys.TRAIN)
    V = L.Dense(8, activation="tanh")(h)
    U = L.Dense(8, activation="sigmoid")(h)
    a = tf.nn.softmax(tf.squeeze(L.Dense(1)(V * U), -1), axis=1)
    z = tf.reduce_sum(a[:, :, None] * h, 1)
    logit = L.Dense(1)(z)
    loss = v1.losses.sigmoid_cross_entropy(labels, logit)
    prob = tf.sigmoid(logit)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"prob": prob, "attention": a})
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss, eval_metric_ops={
            "accuracy": v1.metrics.accuracy(labels, tf.cast(prob > 0.5, tf.float32))})
    return CSEstimatorSpec(mode, loss=loss,
                           train_op=v1.train.AdamOptimizer(3e-3).minimize(loss, global_step=gs()))


def seq_input_fn(params):
    rng = np.random.default_rng(5)
    x = rng.normal(size=(64, 6, 5)).astype(np.float32)
    y = (x[:, :, 1].mean(1) > 0).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(8, drop_remainder=True)


def time_distributed(features, labels, mode, params):
    """A Dense applied to every step by hand ([B, T, F] -> [B*T, F] -> [B, T, H]), a mean over
    the steps, softmax cross-entropy, SGD."""
    steps, width = features.shape[1], features.shape[2]
    h = L.Dense(10, activation="tanh")(tf.reshape(features, [-1, width]))
    h = tf.reshape(h, [-1, steps, 10])
    logits = L.Dense(2)(tf.reduce_mean(h, axis=1))
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"logits": logits})
    return CSEstimatorSpec(mode, loss=loss, train_op=v1.train.GradientDescentOptimizer(0.1)
                           .minimize(loss, global_step=gs()))


def clips_input_fn(params):
    rng = np.random.default_rng(6)
    x = rng.normal(size=(32, 3, 6, 6, 2)).astype(np.float32)
    y = (x[:, :, 2:4, 2:4, 0].mean((1, 2, 3)) > 0).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(4, drop_remainder=True)


def frame_conv(features, labels, mode, params):
    """A Conv2D over every frame of a clip ([B, T, H, W, C] -> [B*T, H, W, C] -> back), a mean
    over the frames, softmax cross-entropy, Adam (params pool: a MaxPooling2D of the frames
    while folded, each frame pooled on its own)."""
    t, hgt, wid, ch = features.shape[1:]
    h = L.Conv2D(4, 3, padding="same", activation="relu")(tf.reshape(features, [-1, hgt, wid, ch]))
    if params.get("pool"):
        h = L.MaxPooling2D(2)(h)
    h = tf.reshape(h, [-1, t, *h.shape[1:]])
    logits = L.Dense(2)(L.Flatten()(tf.reduce_mean(h, axis=1)))
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"logits": logits})
    return CSEstimatorSpec(mode, loss=loss,
                           train_op=v1.train.AdamOptimizer(1e-2).minimize(loss, global_step=gs()))


def _mixing_head(features, labels, mode, mix):
    flat = tf.reshape(features, [-1, FEATURES])
    h = L.Dense(16, activation="relu")(flat)
    if mix == "batch_mean":  # a statistic over every instance of every bag
        h = h - tf.reduce_mean(h, axis=0)
    elif mix == "batch_norm":
        h = L.BatchNormalization()(h, training=True)
    elif mix == "gram":  # every instance against every other bag's
        h = tf.matmul(h, h, transpose_b=True)[:, :16]
    elif mix == "rotate":  # every instance moved to the row before: the next bag's first
        h = tf.concat([h[1:], h[:1]], 0)
    elif mix == "softmax":  # attention weights over the instances of every bag together
        h = h * tf.nn.softmax(tf.squeeze(L.Dense(1)(h), -1))[:, None]
    h = tf.reshape(h, [-1, INSTANCES, 16])
    logit = L.Dense(1)(tf.reduce_max(h, 1))
    loss = v1.losses.sigmoid_cross_entropy(labels, logit)
    return CSEstimatorSpec(mode, loss=loss,
                           train_op=v1.train.AdamOptimizer(1e-3).minimize(loss, global_step=gs()))


def folded_batch_mean(features, labels, mode, params):
    return _mixing_head(features, labels, mode, "batch_mean")


def folded_batch_norm(features, labels, mode, params):
    return _mixing_head(features, labels, mode, "batch_norm")


def folded_gram(features, labels, mode, params):
    return _mixing_head(features, labels, mode, "gram")


def misfolded(features, labels, mode, params):
    """Steps of 5 features reshaped to rows of 16 (6 * 5 = 30 values a sample: rows straddle
    samples), then a Dense and a Dropout on those rows."""
    h = L.Dense(8, activation="relu")(tf.reshape(features, [-1, 16]))
    h = L.Dropout(0.25)(h, training=mode == ModeKeys.TRAIN)
    logits = L.Dense(2)(tf.reshape(h, [8, -1]))
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    return CSEstimatorSpec(mode, loss=loss, train_op=v1.train.GradientDescentOptimizer(0.1)
                           .minimize(loss, global_step=gs()))


def folded_rotate(features, labels, mode, params):
    return _mixing_head(features, labels, mode, "rotate")


def folded_softmax(features, labels, mode, params):
    return _mixing_head(features, labels, mode, "softmax")


def folded_metric(features, labels, mode, params):
    """An eval metric of the instances' activations while folded ([B*8, 16])."""
    h = L.Dense(16, activation="relu")(tf.reshape(features, [-1, FEATURES]))
    logit = L.Dense(1)(tf.reduce_max(tf.reshape(h, [-1, INSTANCES, 16]), 1))
    loss = v1.losses.sigmoid_cross_entropy(labels, logit)
    return CSEstimatorSpec(mode, loss=loss, eval_metric_ops={"activation": v1.metrics.mean(h)})
