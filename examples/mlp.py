"""FC-MNIST (784-500-300-10) with Keras layers on random samples: the model the compiler's
tests (tests/compiler_models.py builds the others on its `spec_for`) and the simulator's
benchmarks (bench/) train."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys


def input_fn(params):
    """Random samples of params['shape'] with integer labels in [0, 10)."""
    batch = params.get("batch_size", 32)
    shape = tuple(params.get("shape", (784,)))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2 * batch, *shape)).astype(np.float32)
    y = (np.arange(2 * batch) % 10).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)


def optimizer(params):
    name = params.get("optimizer", "sgd")
    lr = params.get("learning_rate", 0.01)
    if name == "momentum":
        return tf.compat.v1.train.MomentumOptimizer(lr, params.get("momentum", 0.9),
                                                    use_nesterov=params.get("nesterov", False))
    if name == "adam":
        return tf.compat.v1.train.AdamOptimizer(lr, beta1=0.8, beta2=0.99, epsilon=1e-7)
    return tf.compat.v1.train.GradientDescentOptimizer(lr)


def spec_for(mode, loss, logits, labels, params):
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode=mode, predictions={"probabilities": tf.nn.softmax(logits),
                                                       "classes": tf.argmax(logits, axis=1)})
    train_op = None
    if mode == ModeKeys.TRAIN:
        train_op = optimizer(params).minimize(
            loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    tf.compat.v1.summary.scalar("loss", loss)

    def metrics(logits, labels):
        return {"accuracy": tf.compat.v1.metrics.accuracy(labels, tf.argmax(logits, axis=1))}

    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op,
                           host_call=(metrics, [logits, labels]))


def mixed_float16(model_fn):
    """`model_fn` built under Keras' mixed_float16 policy (float16 layers, float32 weights);
    the float32 policy is back once it returns."""
    def mixed(features, labels, mode, params):
        tf.keras.mixed_precision.set_global_policy("mixed_float16")
        try:
            return model_fn(features, labels, mode, params)
        finally:
            tf.keras.mixed_precision.set_global_policy("float32")

    return mixed


def keras_mlp(features, labels, mode, params):
    """FC-MNIST: 784-500-300-10 with Keras layers."""
    h = features
    for units in params.get("hidden", [500, 300]):
        h = tf.keras.layers.Dense(units, activation="relu")(h)
    if params.get("dropout"):
        h = tf.keras.layers.Dropout(params["dropout"])(h, training=mode == ModeKeys.TRAIN)
    logits = tf.keras.layers.Dense(10)(h)
    loss = (tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
            if mode != ModeKeys.PREDICT else None)
    return spec_for(mode, loss, logits, labels, params)
