"""Losses that slice the batch, written the ordinary way: a prototypical network over one
episode per batch (its first half the support set, labels sliced the same way, prototypes by
a one_hot matmul, the queries' distances to them in a softmax cross entropy), SimCLR's
NT-Xent of two views concatenated in the batch (tf.split, or z[:B//2] and z[B//2:]), and a
temporal-consistency loss over a batch of consecutive frames (x[1:] - x[:-1] of the
predictions) with tf.roll(z, 1, axis=0) as a triplet's negatives. What the CS does not
carry out: a slice of the batch feeding per-sample layers or a prediction."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec

BATCH, STEPS, WAYS = 8, 4, 2


def input_fn(params):
    rng = np.random.default_rng(31)
    n = params["batch_size"] * STEPS * 2
    x = rng.normal(size=(n, 6)).astype(np.float32)
    view = (x + 0.3 * rng.normal(size=x.shape)).astype(np.float32)  # a second augmentation
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices(({"x": x, "view": view}, y)).batch(
        params["batch_size"], drop_remainder=True)


def _spec(mode, loss, params, metrics=None, predictions=None):
    if mode == "infer":
        return CSEstimatorSpec(mode=mode, predictions=predictions)
    if mode == "eval":
        return CSEstimatorSpec(mode=mode, loss=loss, eval_metric_ops=metrics or {})
    optimizer = tf.compat.v1.train.AdamOptimizer(params.get("learning_rate", 0.01))
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=optimizer.minimize(
        loss, global_step=tf.compat.v1.train.get_or_create_global_step()))


def _embed(features, width=4):
    hidden = tf.keras.layers.Dense(8, activation="relu")(features["x"])
    return tf.keras.layers.Dense(width)(hidden)


def prototypes_model_fn(features, labels, mode, params):
    """Support set emb[:n_s], queries emb[n_s:]; class prototypes the support's mean
    embedding per class (one_hot matmul), logits the negative squared distances."""
    z = _embed(features)
    if mode == "infer":
        return _spec(mode, None, params, predictions={"embedding": z})
    n_s = params["batch_size"] // 2
    support, queries = z[:n_s], z[n_s:]
    one_hot = tf.one_hot(labels[:n_s], WAYS)
    prototypes = tf.matmul(one_hot, support, transpose_a=True) / (
        tf.reduce_sum(one_hot, 0)[:, None] + 1.0)
    logits = -tf.reduce_sum(tf.square(queries[:, None, :] - prototypes[None]), -1)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels[n_s:], logits)
    metrics = {"accuracy": tf.compat.v1.metrics.accuracy(labels[n_s:], tf.argmax(logits, -1))}
    return _spec(mode, loss, params, metrics)


def penalised_prototypes_model_fn(features, labels, mode, params):
    """The prototypical network with Keras L2 penalties on its layers, added as users add
    them (model.losses): measured apart, carried by their weights' regions."""
    l2 = tf.keras.regularizers.L2(1e-3)
    layers = [tf.keras.layers.Dense(8, activation="relu", kernel_regularizer=l2),
              tf.keras.layers.Dense(4, kernel_regularizer=l2)]
    z = layers[1](layers[0](features["x"]))
    n_s = params["batch_size"] // 2
    one_hot = tf.one_hot(labels[:n_s], WAYS)
    prototypes = tf.matmul(one_hot, z[:n_s], transpose_a=True) / (
        tf.reduce_sum(one_hot, 0)[:, None] + 1.0)
    logits = -tf.reduce_sum(tf.square(z[n_s:, None, :] - prototypes[None]), -1)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels[n_s:], logits) + \
        tf.add_n([w for layer in layers for w in layer.losses])
    return _spec(mode, loss, params)


def segment_prototypes_model_fn(features, labels, mode, params):
    """Cosine prototypes: tf.math.unsorted_segment_mean of the l2-normalised support set by
    its labels. (Of raw embeddings, the last layer's bias would shift every distance's two
    sides alike when every class is in the support: its gradient 0 in exact arithmetic,
    rounding noise in TF's float32 and the CS's, which Adam makes visible.)"""
    z = tf.math.l2_normalize(_embed(features), axis=1)
    if mode == "infer":
        return _spec(mode, None, params, predictions={"embedding": z})
    n_s = params["batch_size"] // 2
    prototypes = tf.math.unsorted_segment_mean(z[:n_s], labels[:n_s], WAYS)
    logits = -tf.reduce_sum(tf.square(z[n_s:, None, :] - prototypes[None]), -1)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels[n_s:], logits)
    return _spec(mode, loss, params)


def nt_xent_model_fn(features, labels, mode, params):
    """SimCLR's NT-Xent: the batch holds two views (its halves), z1, z2 = tf.split(z, 2, 0);
    each view's positive the other's same sample, the rest of the 2N the negatives."""
    z = tf.math.l2_normalize(_embed(features), axis=1)
    if mode == "infer":
        return _spec(mode, None, params, predictions={"z": z})
    z1, z2 = tf.split(z, 2, 0)
    n = params["batch_size"] // 2
    both = tf.concat([z1, z2], 0)
    similarity = tf.matmul(both, both, transpose_b=True) / 0.5 - 1e9 * tf.eye(2 * n)
    targets = tf.concat([tf.range(n, 2 * n), tf.range(0, n)], 0)
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=targets, logits=similarity))
    return _spec(mode, loss, params, {"similarity": tf.compat.v1.metrics.mean(
        tf.reduce_sum(z1 * z2, -1))})


def two_views_model_fn(features, labels, mode, params):
    """NT-Xent of two augmentations input_fn yields per sample, their embeddings (one shared
    tower) concatenated along the batch, tf.concat([z1, z2], 0), the positives tf.roll of the
    2N rows by N."""
    tower = [tf.keras.layers.Dense(8, activation="relu"), tf.keras.layers.Dense(4)]
    z1, z2 = (tf.math.l2_normalize(tower[1](tower[0](features[k])), axis=1)
              for k in ("x", "view"))
    if mode == "infer":
        return _spec(mode, None, params, predictions={"z": z1})
    z = tf.concat([z1, z2], 0)
    n = params["batch_size"]
    similarity = tf.matmul(z, z, transpose_b=True) / 0.5 - 1e9 * tf.eye(2 * n)
    positives = tf.one_hot(tf.roll(tf.range(2 * n), n, 0), 2 * n)
    loss = tf.compat.v1.losses.softmax_cross_entropy(positives, similarity)
    return _spec(mode, loss, params)


def temporal_model_fn(features, labels, mode, params):
    """Consecutive frames: a classifier's cross entropy plus a smoothness term of
    neighbouring predictions (p[1:] - p[:-1]) and a triplet hinge with tf.roll(z, 1, 0) as
    each frame's negative."""
    z = _embed(features, 3)
    logits = tf.keras.layers.Dense(2)(z)
    if mode == "infer":
        return _spec(mode, None, params, predictions={"classes": tf.argmax(logits, -1)})
    p = tf.nn.softmax(logits)
    smooth = tf.reduce_mean(tf.square(p[1:] - p[:-1]))
    negatives = tf.roll(z, 1, axis=0)
    triplet = tf.reduce_mean(tf.nn.relu(
        tf.reduce_sum(tf.square(z[:-1] - z[1:]), -1)
        - tf.reduce_sum(tf.square(z - negatives), -1)[1:] + 1.0))
    ce = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    loss = ce + 0.5 * smooth + 0.1 * triplet
    return _spec(mode, loss, params, {"smooth": tf.compat.v1.metrics.mean(smooth)})


def sliced_layer_model_fn(features, labels, mode, params):
    """The queries' differences to the first sample fed to a Dense layer: a slice of the
    batch feeding per-sample layers (refused)."""
    z = _embed(features)
    relative = tf.keras.layers.Dense(2)(z[1:] - z[:1])
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels[1:], relative)
    return _spec(mode, loss, params)


def split_layer_model_fn(features, labels, mode, params):
    """The second view's half of the batch, tf.split(z, 2, 0), through a Dense layer
    (refused)."""
    z1, z2 = tf.split(_embed(features), 2, 0)
    logits = tf.keras.layers.Dense(2)(z2)
    loss = tf.reduce_mean(tf.square(z1)) + tf.compat.v1.losses.sparse_softmax_cross_entropy(
        labels[params["batch_size"] // 2:], logits)
    return _spec(mode, loss, params)


def per_example_kernels_model_fn(features, labels, mode, params, shift=0):
    """CondConv's routing: each example's kernel a mix of expert kernels by its own routing
    weights, the batch split into examples to apply each its own (per_sample_pieces: trains
    as TF does)."""
    x = features["x"]
    routing = tf.keras.layers.Dense(3, activation="sigmoid", name="routing")(x)
    experts = tf.compat.v1.get_variable("experts", [3, 6, 2])
    routes = tf.split(routing, params["batch_size"], 0)
    routes = routes[shift:] + routes[:shift]
    hidden = tf.concat([tf.matmul(x_b, tf.tensordot(r_b[0], experts, 1)) for x_b, r_b in zip(
        tf.split(x, params["batch_size"], 0), routes)], 0)
    logits = tf.keras.layers.Dense(2, name="head")(tf.nn.relu(hidden))
    return _spec(mode, tf.compat.v1.losses.softmax_cross_entropy(
        tf.one_hot(labels, 2), logits, label_smoothing=0.1) + 1e-4 * tf.nn.l2_loss(experts), params)


def shifted_example_kernels_model_fn(features, labels, mode, params):
    """Each example by the next example's kernel (refused: the splits of the batch; the cross
    entropy after them only their consequence)."""
    return per_example_kernels_model_fn(features, labels, mode, params, shift=1)


def sliced_prediction_model_fn(features, labels, mode, params):
    """A prediction of each frame's change from the one before, x[1:] - x[:-1]: a slice of
    the batch the host reads (refused)."""
    z = _embed(features)
    if mode == "infer":
        return _spec(mode, None, params, predictions={"change": z[1:] - z[:-1]})
    return _spec(mode, tf.reduce_mean(tf.square(z[1:] - z[:-1])), params)


def random_model_fn(seed: int):
    """A loss slicing the batch drawn from `seed`: embedding widths and activation, the
    slicing (a support set emb[:k] against the queries emb[k:], the halves of tf.split,
    neighbours x[1:] - x[:-1], x[::-1], tf.roll by a shift, the first sample x[0] as an
    anchor), the loss on it (softmax cross entropy of negative distances with the sliced
    labels, a mean of squares, a logsumexp of similarities), a per-sample cross entropy
    added or not, and the optimizer."""
    rng = np.random.default_rng(seed)
    width, embedding = int(rng.integers(4, 9)), int(rng.integers(2, 6))
    activation = str(rng.choice(["tanh", "elu", "softplus"]))
    form = str(rng.choice(["support", "split", "neighbours", "reversed", "roll", "anchor"]))
    loss_kind = str(rng.choice(["cross_entropy", "squares", "logsumexp"]))
    shift, per_sample = int(rng.integers(1, 4)), bool(rng.integers(2))
    optimizer = str(rng.choice(["adam", "sgd", "momentum"]))

    def model_fn(features, labels, mode, params):
        hidden = tf.keras.layers.Dense(width, activation=activation)(features["x"])
        z = tf.keras.layers.Dense(embedding, activation="tanh")(hidden)
        batch = params["batch_size"]
        k = batch // 2 if form in ("support", "split") else batch - 1
        if form == "support":
            a, b, la, lb = z[:k], z[k:], labels[:k], labels[k:]
        elif form == "split":
            a, b = tf.split(z, 2, 0)
            la, lb = tf.split(labels, 2, 0)
        elif form == "neighbours":
            a, b, la, lb = z[1:], z[:-1], labels[1:], labels[:-1]
        elif form == "reversed":
            a, b, la, lb = z, z[::-1], labels, labels[::-1]
        elif form == "roll":
            a, b = z, tf.roll(z, shift, axis=0)
            la, lb = labels, tf.roll(labels, shift, axis=0)
        else:
            a, b, la, lb = z[1:], z[0][None, :] + 0 * z[1:], labels[1:], labels[1:]
        if loss_kind == "cross_entropy":
            hot = tf.one_hot(la, WAYS)
            prototypes = tf.matmul(hot, a, transpose_a=True) / (tf.reduce_sum(hot, 0)[:, None] + 1.0)
            logits = -tf.reduce_sum(tf.square(b[:, None, :] - prototypes[None]), -1)
            loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(lb, logits)
        elif loss_kind == "squares":
            loss = tf.reduce_mean(tf.square(a - b)) * tf.reduce_mean(tf.cast(la, tf.float32) + 1.0)
        else:
            loss = tf.reduce_mean(tf.reduce_logsumexp(tf.matmul(a, b, transpose_b=True), -1))
        if per_sample:
            loss += tf.compat.v1.losses.sparse_softmax_cross_entropy(
                labels, tf.keras.layers.Dense(WAYS)(z))
        train = {"adam": tf.compat.v1.train.AdamOptimizer(0.01),
                 "sgd": tf.compat.v1.train.GradientDescentOptimizer(0.1),
                 "momentum": tf.compat.v1.train.MomentumOptimizer(0.1, 0.9)}[optimizer]
        return CSEstimatorSpec(mode=mode, loss=loss, train_op=train.minimize(
            loss, global_step=tf.compat.v1.train.get_or_create_global_step()))

    model_fn.__name__ = f"random_batch_slice_{seed}"
    return model_fn
