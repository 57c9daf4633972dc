"""In-batch products that mix samples, written the ordinary way: a two-tower retrieval model
(Keras Dense towers, tf.math.l2_normalize, a temperature, in-batch negatives: logits =
tf.matmul(q, d, transpose_b=True), labels tf.range(batch)) and a SimCLR/CLIP-style symmetric
InfoNCE (both directions' cross entropy averaged, labels tf.eye(batch))."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec

BATCH, STEPS = 8, 4


def input_fn(params):
    rng = np.random.default_rng(11)
    n = params["batch_size"] * STEPS * 2
    queries = rng.normal(size=(n, 6)).astype(np.float32)
    documents = (queries @ rng.normal(size=(6, 5)) + 0.3 * rng.normal(size=(n, 5))).astype(np.float32)
    features = {"query": queries, "document": documents}
    classes = (queries[:, 0] > 0).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((features, classes)).batch(
        params["batch_size"], drop_remainder=True)


def _train(loss, params):
    optimizer = tf.compat.v1.train.AdamOptimizer(params.get("learning_rate", 0.01))
    return optimizer.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())


def two_tower_model_fn(features, labels, mode, params):
    q = tf.keras.layers.Dense(8, activation="relu")(features["query"])
    q = tf.keras.layers.Dense(4)(q)
    d = tf.keras.layers.Dense(4)(features["document"])
    q, d = tf.math.l2_normalize(q, axis=1), tf.math.l2_normalize(d, axis=1)
    logits = tf.matmul(q, d, transpose_b=True) / 0.1
    batch = tf.shape(logits)[0]
    targets = tf.range(batch)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(targets, logits)
    if mode == "eval":  # in-batch retrieval: is each query's own document its best match?
        metrics = {"recall_at_1": tf.compat.v1.metrics.accuracy(targets, tf.argmax(logits, axis=1)),
                   "mean_logit": tf.compat.v1.metrics.mean(logits)}
        return CSEstimatorSpec(mode=mode, loss=loss, eval_metric_ops=metrics)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=_train(loss, params))


def symmetric_model_fn(features, labels, mode, params):
    q = tf.keras.layers.Dense(4, use_bias=False)(features["query"])
    d = tf.keras.layers.Dense(4)(features["document"])
    q, d = tf.math.l2_normalize(q, axis=-1), tf.math.l2_normalize(d, axis=-1)
    logits = tf.matmul(q, d, transpose_b=True) * 5.0
    targets = tf.eye(params["batch_size"])
    loss_q = tf.compat.v1.losses.softmax_cross_entropy(targets, logits)
    loss_d = tf.compat.v1.losses.softmax_cross_entropy(targets, tf.transpose(logits))
    loss = (loss_q + loss_d) / 2
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=_train(loss, params))


def batch_attention_model_fn(features, labels, mode, params):
    """Each sample attends over the batch (a memory of the batch's documents), then a Keras
    classifier reads what it gathered: the mixing product feeds further per-sample layers."""
    q = tf.keras.layers.Dense(4)(features["query"])
    k = tf.keras.layers.Dense(4, use_bias=False)(features["document"])  # (a key bias cancels)
    v = tf.keras.layers.Dense(3, activation="tanh")(features["document"])
    weights = tf.nn.softmax(tf.matmul(q, k, transpose_b=True) / 2.0)
    mixed = tf.matmul(weights, v)
    logits = tf.keras.layers.Dense(2)(tf.concat([mixed, q], axis=1))
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=_train(loss, params))


def cross_correlation_model_fn(features, labels, mode, params):
    """Barlow Twins: the [n, n] cross-correlation of two views over the batch
    (tf.matmul(za, zb, transpose_a=True)): a product whose rows are no samples, in the loss."""
    za = tf.keras.layers.Dense(4)(features["query"])
    zb = tf.keras.layers.Dense(4)(features["document"])
    c = tf.matmul(za, zb, transpose_a=True) / params["batch_size"]
    loss = tf.reduce_sum(tf.square(c - tf.eye(4)))
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=_train(loss, params))


def column_softmax_model_fn(features, labels, mode, params):
    """The documents' side of InfoNCE written as a softmax over the batch axis (axis=0) and
    the positives taken with tf.linalg.diag_part; a learned temperature."""
    q = tf.math.l2_normalize(tf.keras.layers.Dense(4)(features["query"]), axis=1)
    d = tf.math.l2_normalize(tf.keras.layers.Dense(4)(features["document"]), axis=1)
    log_t = tf.compat.v1.get_variable("log_temperature", [], initializer=tf.constant_initializer(2.0))
    logits = tf.matmul(q, d, transpose_b=True) * tf.exp(log_t)
    loss = -tf.reduce_mean(tf.linalg.diag_part(tf.nn.log_softmax(logits, axis=0)))
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=_train(loss, params))


def minimize_with(optimizer: str, loss):
    """The train_op of a drawn model: "adam" (rate 0.01), "sgd" or "momentum" (0.1)."""
    rate = 0.01 if optimizer == "adam" else 0.1
    return {"adam": tf.compat.v1.train.AdamOptimizer(rate),
            "sgd": tf.compat.v1.train.GradientDescentOptimizer(rate),
            "momentum": tf.compat.v1.train.MomentumOptimizer(rate, 0.9)}[optimizer].minimize(
        loss, global_step=tf.compat.v1.train.get_or_create_global_step())


def random_model_fn(seed: int):
    """A two-tower contrastive model drawn from `seed`: tower widths and depth, Keras
    activations, l2-normalised or not, a fixed or learned temperature, labels tf.range /
    tf.eye / tf.one_hot(tf.range), one direction or both (tf.transpose or the second
    product), tf.compat.v1 losses or tf.nn, and the optimizer."""
    rng = np.random.default_rng(seed)
    widths = [int(w) for w in rng.integers(4, 9, size=int(rng.integers(1, 3)))]
    embedding = int(rng.integers(3, 7))
    # (not relu: a relu tower dead for a sample outputs its bias, zero at the start, and
    # l2-normalising a zero vector multiplies its gradient by 1 / sqrt(1e-12): TF's float32
    # gradients elsewhere are then rounding noise, which Adam's first step turns into +-lr)
    activation = str(rng.choice(["tanh", "elu", "softplus"]))
    normalise, learned = bool(rng.integers(2)), bool(rng.integers(2))
    labels_kind = str(rng.choice(["range", "eye", "one_hot"]))
    direction = str(rng.choice(["one", "transpose", "product"]))
    temperature = float(rng.uniform(0.1, 1.0))
    optimizer = str(rng.choice(["adam", "sgd", "momentum"]))

    def tower(x, name):
        with tf.compat.v1.variable_scope(name):
            for width in widths:
                x = tf.keras.layers.Dense(width, activation=activation)(x)
            x = tf.keras.layers.Dense(embedding)(x)
        return tf.math.l2_normalize(x, axis=1) if normalise else x

    def cross_entropy(logits, batch):
        if labels_kind == "range":
            return tf.compat.v1.losses.sparse_softmax_cross_entropy(tf.range(batch), logits)
        targets = tf.eye(batch) if labels_kind == "eye" else tf.one_hot(tf.range(batch), batch)
        return tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(labels=targets, logits=logits))

    def model_fn(features, labels, mode, params):
        q, d = tower(features["query"], "query"), tower(features["document"], "document")
        scale = 1.0 / temperature
        if learned:
            scale = tf.exp(tf.compat.v1.get_variable(
                "log_scale", [], initializer=tf.constant_initializer(np.log(scale))))
        logits = tf.matmul(q, d, transpose_b=True) * scale
        batch = params["batch_size"]
        loss = cross_entropy(logits, batch)
        if direction != "one":
            other = tf.transpose(logits) if direction == "transpose" else \
                tf.matmul(d, q, transpose_b=True) * scale
            loss = (loss + cross_entropy(other, batch)) / 2
        return CSEstimatorSpec(mode=mode, loss=loss, train_op=minimize_with(optimizer, loss))

    model_fn.__name__ = f"random_in_batch_{seed}"
    return model_fn
