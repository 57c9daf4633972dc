"""Small Estimator-style models for the compiler tests (Keras layers and raw tf.nn code)."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from examples.mlp import input_fn, keras_mlp, optimizer, spec_for  # noqa: F401  (m.input_fn, m.keras_mlp)
from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys  # noqa: F401  (m.ModeKeys)


def regression_input_fn(params):
    batch = params.get("batch_size", 32)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2 * batch, 20)).astype(np.float32)
    y = rng.normal(size=(2 * batch, 3)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)


def raw_mlp(features, labels, mode, params):
    """The same MLP with tf.compat.v1.get_variable, tf.matmul and tf.nn."""
    h = features
    sizes = [int(features.shape[1]), *params.get("hidden", [500, 300]), 10]
    for i, (n, m) in enumerate(zip(sizes, sizes[1:])):
        w = tf.compat.v1.get_variable(f"w{i}", [n, m])
        b = tf.compat.v1.get_variable(f"b{i}", [m], initializer=tf.zeros_initializer())
        h = tf.matmul(h, w) + b
        if i < len(sizes) - 2:
            h = tf.nn.tanh(h)
            h = tf.nn.dropout(h, rate=0.25)
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=h))
    return spec_for(mode, loss, h, labels, params)


def keras_cnn(features, labels, mode, params):
    h = tf.keras.layers.Conv2D(8, 3, padding="same", activation="relu")(features)
    h = tf.keras.layers.MaxPooling2D(2)(h)
    h = tf.keras.layers.Conv2D(16, 3, strides=1, padding="valid", activation="relu")(h)
    h = tf.keras.layers.Flatten()(h)
    h = tf.keras.layers.Dense(32, activation="relu")(h)
    logits = tf.keras.layers.Dense(10)(h)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    return spec_for(mode, loss, logits, labels, params)


def raw_cnn(features, labels, mode, params):
    k = tf.compat.v1.get_variable("k", [3, 3, 1, 4])
    c = tf.compat.v1.get_variable("c", [4], initializer=tf.zeros_initializer())
    h = tf.nn.relu6(tf.nn.bias_add(tf.nn.conv2d(features, k, strides=2, padding="SAME"), c))
    h = tf.nn.avg_pool2d(h, ksize=2, strides=2, padding="VALID")
    h = tf.reshape(h, [features.shape[0], -1])
    w = tf.compat.v1.get_variable("w", [int(h.shape[1]), 10])
    logits = tf.matmul(h, w)
    loss = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels,
                                                                        logits=logits))
    return spec_for(mode, loss, logits, labels, params)


def residual(features, labels, mode, params):
    a = tf.keras.layers.Dense(16)(features)
    b = tf.nn.leaky_relu(a, alpha=0.1)
    c = tf.keras.layers.Dense(16, activation="elu")(b)
    s = a + c
    h = tf.concat([s, b], axis=-1)
    logits = tf.keras.layers.Dense(10, activation="sigmoid")(h)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    return spec_for(mode, loss, logits, labels, params)


def regression(features, labels, mode, params):
    h = tf.keras.layers.Dense(8, activation="softplus")(features)
    out = tf.keras.layers.Dense(3)(h)
    if params.get("loss") == "sigmoid":
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=out))
    elif params.get("loss") == "softmax":
        loss = tf.compat.v1.losses.softmax_cross_entropy(labels, out)
    else:
        loss = tf.compat.v1.losses.mean_squared_error(labels, out)
    return spec_for(mode, loss, out, labels, params)


def one_hot_softmax(features, labels, mode, params):
    logits = tf.keras.layers.Dense(10)(features)
    loss = tf.compat.v1.losses.softmax_cross_entropy(tf.one_hot(labels, 10), logits)
    return spec_for(mode, loss, logits, labels, params)


def unsupported(features, labels, mode, params):
    h = tf.keras.layers.Dense(36)(features)
    s = tf.linalg.eigvalsh(tf.reshape(h, [-1, 6, 6]))  # line of the eigvalsh op
    u = tf.linalg.svd(tf.reshape(h, [-1, 6, 6]), compute_uv=False)  # line of the svd op
    logits = tf.keras.layers.Dense(10)(tf.concat([s, u], axis=1))
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    return spec_for(mode, loss, logits, labels, params)


def fixed_input(features, labels, mode, params):
    """Expects 784 features per sample (a fixed weight shape)."""
    w = tf.compat.v1.get_variable("w", [784, 10])
    logits = tf.matmul(features, w)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    return spec_for(mode, loss, logits, labels, params)


def decayed_lr(features, labels, mode, params):
    logits = tf.keras.layers.Dense(10)(features)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    step = tf.compat.v1.train.get_or_create_global_step()
    lr = tf.compat.v1.train.exponential_decay(0.1, step, 100, 0.5)
    train_op = tf.compat.v1.train.GradientDescentOptimizer(lr).minimize(loss, global_step=step)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op)


def mlp_stack(features, labels, mode, params):
    """A deep MLP: params['hidden'] units per layer."""
    h = features
    for units in params["hidden"]:
        h = tf.keras.layers.Dense(units, activation="relu")(h)
    logits = tf.keras.layers.Dense(10)(h)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    return spec_for(mode, loss, logits, labels, params)


def dict_input_fn(params):
    rng = np.random.default_rng(2)
    x = {"image": rng.normal(size=(64, 12)).astype(np.float32),
         "extra": rng.normal(size=(64, 4)).astype(np.float32)}
    y = (np.arange(64) % 10).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(32, drop_remainder=True)


def two_inputs(features, labels, mode, params):
    h = tf.keras.layers.Dense(8, activation="relu")(features["image"])
    logits = tf.keras.layers.Dense(10)(tf.concat([h, features["extra"]], axis=1))
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    return spec_for(mode, loss, logits, labels, params)
