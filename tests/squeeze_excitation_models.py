"""Squeeze-and-Excitation CNN under Keras mixed_float16 (unseen26's se_net.py, imports
adapted): conv blocks each re-weighted by an SE gate (global average pool -> bottleneck ->
sigmoid, Multiply()([x, s]) with s [B, 1, 1, c]), Adam with staircase exponential decay and
a loss scale: params["loss_scale"] "dynamic" (the tester's) or a static number."""
import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

params = {"batch_size": 16, "num_classes": 5, "learning_rate": 1e-3, "decay_steps": 50,
          "decay_rate": 0.9, "se_ratio": 4, "policy": "mixed_float16", "loss_scale": "dynamic"}


def input_fn(params):
    rng = np.random.RandomState(7)
    n = params["batch_size"] * 8
    y = rng.randint(0, params["num_classes"], size=n).astype(np.int32)
    x = rng.uniform(0, 1, size=(n, 24, 24, 3)).astype(np.float32)
    for i in range(n):  # a bright square whose position depends on the class
        r = 4 * y[i]
        x[i, r:r + 4, r:r + 4, :] += 1.0
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(params["batch_size"], drop_remainder=True)


def se_block(x, ratio):
    c = x.shape[-1]
    s = tf.keras.layers.GlobalAveragePooling2D()(x)
    s = tf.keras.layers.Dense(c // ratio, activation="relu")(s)
    s = tf.keras.layers.Dense(c, activation="sigmoid")(s)
    s = tf.keras.layers.Reshape((1, 1, c))(s)
    return tf.keras.layers.Multiply()([x, s])


def model_fn(features, labels, mode, params):
    tf.keras.mixed_precision.set_global_policy(params.get("policy", "mixed_float16"))
    h = features
    for filters in (32, 64, 64):
        h = tf.keras.layers.Conv2D(filters, 3, padding="same", activation="relu")(h)
        h = se_block(h, params["se_ratio"])
        h = tf.keras.layers.MaxPooling2D(2)(h)
    h = tf.keras.layers.Flatten()(h)
    h = tf.keras.layers.Dense(64, activation="relu")(h)
    logits = tf.keras.layers.Dense(params["num_classes"], dtype="float32")(h)
    classes = tf.argmax(logits, axis=1)
    predictions = {"classes": classes, "probabilities": tf.nn.softmax(logits)}
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode=mode, predictions=predictions)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    train_op = None
    if mode == ModeKeys.TRAIN:
        global_step = tf.compat.v1.train.get_or_create_global_step()
        lr = tf.compat.v1.train.exponential_decay(params["learning_rate"], global_step,
                                                  params["decay_steps"], params["decay_rate"],
                                                  staircase=True)
        opt = tf.compat.v1.train.AdamOptimizer(lr)
        if params.get("policy", "mixed_float16") == "mixed_float16":
            opt = tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer(
                opt, params.get("loss_scale", "dynamic"))
        train_op = opt.minimize(loss, global_step=global_step)
    metrics = {"accuracy": tf.compat.v1.metrics.accuracy(labels, classes)}
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op, predictions=predictions,
                           eval_metric_ops=metrics)
