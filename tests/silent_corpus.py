"""The fixed corpus of issue 10: models, written the ordinary way, that once validated and
then trained differently on the CS ("silent"), and ordinary code the compiler refused.

Each must be refused with one line naming the op and its line here, or train on the CS
exactly as TensorFlow trains it (tests/coordinator/test_silent_corpus.py says how each is checked).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec

BATCH = 16
FEATURES = 10
CLASSES = 4
VOCAB = 20
TOKENS = 6
DROPOUT_RATE = 0.4


# ---- inputs (deterministic, no downloads) ----
def _dataset(x, y, params):
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(params["batch_size"], drop_remainder=True)


def vector_input_fn(params):
    """Features in [0.5, 1.5] (never 0: a dropped entry shows as 0), labels in [0, 4)."""
    rng = np.random.default_rng(3)
    x = rng.uniform(0.5, 1.5, size=(BATCH * 12, FEATURES)).astype(np.float32)
    y = (x[:, :CLASSES].argmax(1)).astype(np.int32)
    return _dataset(x, y, params)


def int_input_fn(params):
    rng = np.random.default_rng(4)
    x = rng.integers(0, 8, size=(BATCH * 12, FEATURES)).astype(np.int32)
    return _dataset(x, (x[:, 0] % CLASSES).astype(np.int32), params)


def regression_input_fn(params):
    """Labels shaped (batch,), as tabular data usually comes."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(BATCH * 12, FEATURES)).astype(np.float32)
    y = (x @ np.linspace(-1, 1, FEATURES) + 0.1).astype(np.float32)
    return _dataset(x, y, params)


def binary_input_fn(params):
    """Int labels shaped (batch, 1) in {0, 1}."""
    rng = np.random.default_rng(6)
    x = rng.normal(size=(BATCH * 12, FEATURES)).astype(np.float32)
    return _dataset(x, (x[:, :1] > 0).astype(np.int32), params)


def image_input_fn(params):
    rng = np.random.default_rng(7)
    x = rng.uniform(0.5, 1.5, size=(BATCH * 12, 6, 6, 3)).astype(np.float32)
    return _dataset(x, (np.arange(BATCH * 12) % CLASSES).astype(np.int32), params)


def token_input_fn(params):
    rng = np.random.default_rng(8)
    x = rng.integers(0, VOCAB, size=(BATCH * 12, TOKENS)).astype(np.int32)
    return _dataset(x, (x[:, 0] % CLASSES).astype(np.int32), params)


# ---- shared tails ----
def global_step():
    return tf.compat.v1.train.get_or_create_global_step()


def spec(mode, loss, train_op, host=None):
    host_call = None if host is None else (lambda *t: {}, list(host))
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op, host_call=host_call)


def sgd_spec(mode, loss, learning_rate=0.1, host=None):
    opt = tf.compat.v1.train.GradientDescentOptimizer(learning_rate)
    return spec(mode, loss, opt.minimize(loss, global_step=global_step()), host)


def mlp_logits(x):
    h = tf.keras.layers.Dense(16, activation="relu")(x)
    return tf.keras.layers.Dense(CLASSES)(h)


def xent(labels, logits):
    return tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)


# ---- the silent cases ----
def clipped_by_value(features, labels, mode, params):
    loss = xent(labels, mlp_logits(features))
    opt = tf.compat.v1.train.GradientDescentOptimizer(0.5)
    grads_and_vars = opt.compute_gradients(loss)
    clipped = [(tf.clip_by_value(g, -1e-3, 1e-3), v) for g, v in grads_and_vars]
    return spec(mode, loss, opt.apply_gradients(clipped, global_step=global_step()))


def clipped_by_global_norm(features, labels, mode, params):
    loss = xent(labels, mlp_logits(features))
    opt = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9)
    grads, variables = zip(*opt.compute_gradients(loss))
    grads, _ = tf.clip_by_global_norm(grads, 0.05)
    return spec(mode, loss, opt.apply_gradients(zip(grads, variables), global_step=global_step()))


def scaled_gradients(features, labels, mode, params):
    loss = xent(labels, mlp_logits(features))
    opt = tf.compat.v1.train.GradientDescentOptimizer(0.5)
    scaled = [(g * 0.01, v) for g, v in opt.compute_gradients(loss)]
    return spec(mode, loss, opt.apply_gradients(scaled, global_step=global_step()))


def var_list_subset(features, labels, mode, params):
    h = tf.keras.layers.Dense(16, activation="relu")(features)
    frozen = {v.name for v in tf.compat.v1.trainable_variables()}
    loss = xent(labels, tf.keras.layers.Dense(CLASSES)(h))
    head = [v for v in tf.compat.v1.trainable_variables() if v.name not in frozen]
    opt = tf.compat.v1.train.GradientDescentOptimizer(0.5)
    return spec(mode, loss, opt.minimize(loss, var_list=head, global_step=global_step()))


def stop_gradient(features, labels, mode, params):
    h = tf.keras.layers.Dense(16, activation="relu")(features)
    logits = tf.keras.layers.Dense(CLASSES)(tf.stop_gradient(h))
    return sgd_spec(mode, xent(labels, logits), 0.5)


def dropout_noise_shape(features, labels, mode, params):
    dropped = tf.keras.layers.Dropout(DROPOUT_RATE, noise_shape=(BATCH, 1))(features, training=True)
    return sgd_spec(mode, xent(labels, mlp_logits(dropped)), host=[dropped])


def spatial_dropout(features, labels, mode, params):
    dropped = tf.keras.layers.SpatialDropout2D(DROPOUT_RATE)(features, training=True)
    h = tf.keras.layers.Conv2D(4, 3, activation="relu")(dropped)
    logits = tf.keras.layers.Dense(CLASSES)(tf.keras.layers.Flatten()(h))
    return sgd_spec(mode, xent(labels, logits), host=[dropped])


def fixed_mask(features, labels, mode, params):
    """Every other feature kept and doubled: no randomness at all."""
    mask = tf.constant(np.arange(FEATURES) % 2, tf.float32)
    kept = tf.where(mask >= 0.5, features * 2.0, 0.0)
    return sgd_spec(mode, xent(labels, mlp_logits(kept)))


def int_features_cast(features, labels, mode, params):
    x = tf.cast(features, tf.float32) / 7.0
    return sgd_spec(mode, xent(labels, mlp_logits(x)))


def float16_model(features, labels, mode, params):
    h = tf.keras.layers.Dense(16, activation="relu", dtype="float16")(tf.cast(features, tf.float16))
    logits = tf.cast(tf.keras.layers.Dense(CLASSES, dtype="float16")(h), tf.float32)
    return sgd_spec(mode, xent(labels, logits))


def wide_logits(features):
    h = tf.keras.layers.Dense(256, activation="relu")(features)
    h = tf.keras.layers.Dense(256, activation="relu")(h)
    return tf.keras.layers.Dense(CLASSES)(h)


def nesterov(features, labels, mode, params):
    loss = xent(labels, wide_logits(features))
    opt = tf.compat.v1.train.MomentumOptimizer(0.05, 0.9, use_nesterov=True)
    return spec(mode, loss, opt.minimize(loss, global_step=global_step()))


def adam(features, labels, mode, params):
    loss = xent(labels, wide_logits(features))
    opt = tf.compat.v1.train.AdamOptimizer(1e-3)
    return spec(mode, loss, opt.minimize(loss, global_step=global_step()))


def keras_dropout(features, labels, mode, params):
    """Keras Dropout on the inputs (what the resume and checkpoint cases train)."""
    dropped = tf.keras.layers.Dropout(DROPOUT_RATE)(features, training=mode == "train")
    return sgd_spec(mode, xent(labels, mlp_logits(dropped)), host=[dropped])


def without_dropout(features, labels, mode, params):
    """keras_dropout's model without its dropout: fed the CS's dropped features, it is the
    TensorFlow reference for what the CS did with its masks (same variable names)."""
    return sgd_spec(mode, xent(labels, mlp_logits(features)))


def spatial_without_dropout(features, labels, mode, params):
    h = tf.keras.layers.Conv2D(4, 3, activation="relu")(features)
    logits = tf.keras.layers.Dense(CLASSES)(tf.keras.layers.Flatten()(h))
    return sgd_spec(mode, xent(labels, logits))


# ---- ordinary code that was refused ----
def hand_mse_reshaped_labels(features, labels, mode, params):
    pred = tf.keras.layers.Dense(1)(tf.keras.layers.Dense(16, activation="relu")(features))
    loss = tf.reduce_mean(tf.square(pred - tf.reshape(labels, [-1, 1])))
    return sgd_spec(mode, loss, 0.01)


def losses_mse_reshaped_labels(features, labels, mode, params):
    pred = tf.keras.layers.Dense(1)(tf.keras.layers.Dense(16, activation="relu")(features))
    loss = tf.compat.v1.losses.mean_squared_error(tf.reshape(labels, [-1, 1]), pred)
    return sgd_spec(mode, loss, 0.01)


def labels_cast(features, labels, mode, params):
    logits = tf.keras.layers.Dense(1)(tf.keras.layers.Dense(16, activation="relu")(features))
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
        labels=tf.cast(labels, tf.float32), logits=logits))
    return sgd_spec(mode, loss)


def losses_sigmoid_cross_entropy(features, labels, mode, params):
    logits = tf.keras.layers.Dense(1)(tf.keras.layers.Dense(16, activation="relu")(features))
    loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits)
    return sgd_spec(mode, loss)


def embedding(features, labels, mode, params):
    x = tf.keras.layers.Embedding(VOCAB, 8)(features)
    logits = tf.keras.layers.Dense(CLASSES)(tf.keras.layers.Flatten()(x))
    return sgd_spec(mode, xent(labels, logits))


def layer_norm(features, labels, mode, params):
    h = tf.keras.layers.Dense(16)(features)
    h = tf.keras.layers.LayerNormalization()(h)
    return sgd_spec(mode, xent(labels, tf.keras.layers.Dense(CLASSES)(tf.nn.relu(h))))


def gelu(features, labels, mode, params):
    h = tf.keras.layers.Dense(16, activation="gelu")(features)
    h = tf.nn.gelu(tf.keras.layers.Dense(16)(h), approximate=True)
    return sgd_spec(mode, xent(labels, tf.keras.layers.Dense(CLASSES)(h)))


def attention(features, labels, mode, params):
    x = tf.keras.layers.Embedding(VOCAB, 8)(features)
    q, k, v = (tf.keras.layers.Dense(8)(x) for _ in range(3))
    weights = tf.nn.softmax(tf.matmul(q, k, transpose_b=True) / math.sqrt(8.0), axis=-1)
    h = tf.reduce_mean(tf.matmul(weights, v), axis=1)
    return sgd_spec(mode, xent(labels, tf.keras.layers.Dense(CLASSES)(h)))


def non_batch_reductions(features, labels, mode, params):
    h = tf.keras.layers.Conv2D(8, 3, activation="relu")(features)
    pooled = tf.concat([tf.reduce_max(h, axis=[1, 2]), tf.reduce_mean(h, axis=[1, 2])], axis=-1)
    return sgd_spec(mode, xent(labels, tf.keras.layers.Dense(CLASSES)(pooled)))


def l2_loss_term(features, labels, mode, params):
    loss = xent(labels, mlp_logits(features))
    kernels = [v for v in tf.compat.v1.trainable_variables() if "kernel" in v.name]
    loss += 1e-2 * tf.add_n([tf.nn.l2_loss(v) for v in kernels])
    return sgd_spec(mode, loss)


def kernel_regularizer(features, labels, mode, params):
    hidden = tf.keras.layers.Dense(16, activation="relu",
                                   kernel_regularizer=tf.keras.regularizers.l2(1e-2))
    head = tf.keras.layers.Dense(CLASSES, kernel_regularizer=tf.keras.regularizers.l1(1e-3))
    logits = head(hidden(features))
    loss = xent(labels, logits) + tf.add_n(hidden.losses + head.losses)
    return sgd_spec(mode, loss)


def weighted_loss(features, labels, mode, params):
    class_weights = tf.gather(tf.constant([1.0, 2.0, 0.5, 1.0]), labels)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, mlp_logits(features),
                                                            weights=class_weights)
    return sgd_spec(mode, loss)


def label_smoothing(features, labels, mode, params):
    loss = tf.compat.v1.losses.softmax_cross_entropy(tf.one_hot(labels, CLASSES),
                                                     mlp_logits(features), label_smoothing=0.1)
    return sgd_spec(mode, loss)


def batch_norm_training(features, labels, mode, params):
    h = tf.keras.layers.Dense(16)(features)
    h = tf.keras.layers.BatchNormalization()(h, training=True)
    return sgd_spec(mode, xent(labels, tf.keras.layers.Dense(CLASSES)(tf.nn.relu(h))))


def batch_norm_inference(features, labels, mode, params):
    h = tf.keras.layers.Dense(16)(features)
    h = tf.keras.layers.BatchNormalization()(h, training=False)
    return sgd_spec(mode, xent(labels, tf.keras.layers.Dense(CLASSES)(tf.nn.relu(h))))


def lstm(features, labels, mode, params):
    x = tf.keras.layers.Embedding(VOCAB, 8)(features)
    h = tf.keras.layers.LSTM(8)(x)
    return sgd_spec(mode, xent(labels, tf.keras.layers.Dense(CLASSES)(h)))


@dataclass(frozen=True)
class Case:
    model_fn: Callable
    input_fn: Callable
    check: str = "exact"  # exact, dropout, resume, checkpoint, recurrent
    reference: Callable | None = None  # dropout: the model without its dropout
    shared_axes: tuple[int, ...] = ()  # dropout: axes one mask entry covers (noise_shape 1s)


CASES: dict[str, Case] = {
    "clip_by_value": Case(clipped_by_value, vector_input_fn),
    "clip_by_global_norm": Case(clipped_by_global_norm, vector_input_fn),
    "scaled_gradients": Case(scaled_gradients, vector_input_fn),
    "minimize_var_list": Case(var_list_subset, vector_input_fn),
    "stop_gradient": Case(stop_gradient, vector_input_fn),
    "dropout_noise_shape": Case(dropout_noise_shape, vector_input_fn, "dropout", without_dropout,
                                (1,)),
    "spatial_dropout": Case(spatial_dropout, image_input_fn, "dropout", spatial_without_dropout,
                            (1, 2)),
    "fixed_mask": Case(fixed_mask, vector_input_fn),
    "int_features_cast": Case(int_features_cast, int_input_fn),
    "float16": Case(float16_model, vector_input_fn),
    "nesterov": Case(nesterov, vector_input_fn),
    "adam": Case(adam, vector_input_fn),
    "dropout_resume": Case(keras_dropout, vector_input_fn, "resume"),
    "dropout_checkpoint_on_cpu": Case(keras_dropout, vector_input_fn, "checkpoint"),
    "dropout_masks": Case(keras_dropout, vector_input_fn, "dropout", without_dropout),
    "hand_mse_reshaped_labels": Case(hand_mse_reshaped_labels, regression_input_fn),
    "losses_mse_reshaped_labels": Case(losses_mse_reshaped_labels, regression_input_fn),
    "labels_cast": Case(labels_cast, binary_input_fn),
    "losses_sigmoid_cross_entropy": Case(losses_sigmoid_cross_entropy, binary_input_fn),
    "embedding": Case(embedding, token_input_fn),
    "layer_norm": Case(layer_norm, vector_input_fn),
    "gelu": Case(gelu, vector_input_fn),
    "attention": Case(attention, token_input_fn),
    "non_batch_reductions": Case(non_batch_reductions, image_input_fn),
    "l2_loss": Case(l2_loss_term, vector_input_fn),
    "kernel_regularizer": Case(kernel_regularizer, vector_input_fn),
    "weighted_loss": Case(weighted_loss, vector_input_fn),
    "label_smoothing": Case(label_smoothing, vector_input_fn),
    "batch_norm_training": Case(batch_norm_training, vector_input_fn),
    "batch_norm_inference": Case(batch_norm_inference, vector_input_fn),
    "lstm": Case(lstm, token_input_fn, "recurrent"),
}


def params_for(name: str) -> dict:
    return {"batch_size": BATCH, "runconfig": {"tf_random_seed": 7}, "case": name}
