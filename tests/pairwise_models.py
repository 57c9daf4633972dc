"""Losses over every pair of the batch's samples, written the ordinary way: batch-hard
triplet loss (FaceNet; Hermans et al., "In Defense of the Triplet Loss": pairwise squared
distances sq[:, None] - 2 e e^T + sq[None, :], a same-label mask, the hardest positive and
negative of each row, relu(hp - hn + margin)), supervised contrastive (SupCon: the
label-equality mask times the log-softmax of e e^T / T), a contrastive pair loss with a
margin (Hadsell et al.) and an N-pair loss. Labels are integer classes, four a batch."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec

BATCH, STEPS, CLASSES, FEATURES = 16, 4, 4, 10


def input_fn(params):
    """Gaussian classes, each batch holding every class (several samples of each)."""
    rng = np.random.default_rng(5)
    n = params["batch_size"] * STEPS * 2
    centres = rng.normal(scale=1.5, size=(CLASSES, FEATURES))
    classes = np.concatenate([rng.permutation(np.arange(params["batch_size"]) % CLASSES)
                              for _ in range(n // params["batch_size"])]).astype(np.int32)
    x = (centres[classes] + rng.normal(size=(n, FEATURES))).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((x, classes)).batch(
        params["batch_size"], drop_remainder=True)


def _train(loss, params):
    optimizer = tf.compat.v1.train.AdamOptimizer(params.get("learning_rate", 0.01))
    return optimizer.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())


def _embed(features, width=6):
    h = tf.keras.layers.Dense(16, activation="relu")(features)
    return tf.math.l2_normalize(tf.keras.layers.Dense(width)(h), axis=1)


def pairwise_distances(e):
    """Squared Euclidean distances between every pair of rows of e."""
    dot = tf.matmul(e, e, transpose_b=True)
    sq = tf.reduce_sum(tf.square(e), axis=1)
    return tf.maximum(sq[:, None] - 2.0 * dot + sq[None, :], 0.0)


def batch_hard_triplet_model_fn(features, labels, mode, params):
    e = _embed(features)
    distances = pairwise_distances(e)
    same = tf.cast(tf.equal(labels[:, None], labels[None, :]), tf.float32)
    positives = same * (1.0 - tf.eye(params["batch_size"]))
    hardest_positive = tf.reduce_max(distances * positives, axis=1)
    largest = tf.reduce_max(distances, axis=1, keepdims=True)
    hardest_negative = tf.reduce_min(distances + largest * same, axis=1)
    loss = tf.reduce_mean(tf.nn.relu(hardest_positive - hardest_negative + 0.5))
    if mode == "eval":
        metrics = {"hardest_positive": tf.compat.v1.metrics.mean(hardest_positive),
                   "hardest_negative": tf.compat.v1.metrics.mean(hardest_negative)}
        return CSEstimatorSpec(mode=mode, loss=loss, eval_metric_ops=metrics)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=_train(loss, params))


def triplet_expand_dims_model_fn(features, labels, mode, params):
    """The same loss the other common way: tf.expand_dims, tf.reshape and tf.transpose
    rows, tf.not_equal for the negatives, a Keras Dense embedding without normalising."""
    hidden = tf.keras.layers.Dense(12, activation="tanh")(features)
    e = tf.keras.layers.Dense(5, use_bias=False)(hidden)  # (a bias cancels in e_i - e_j)
    dot = tf.matmul(e, e, transpose_b=True)
    sq = tf.reduce_sum(tf.square(e), 1, keepdims=True)  # [batch, 1]
    distances = tf.maximum(sq - 2.0 * dot + tf.transpose(sq), 0.0)
    column = tf.reshape(labels, [-1, 1])
    same = tf.cast(tf.equal(column, tf.reshape(labels, [1, -1])), tf.float32)
    different = tf.cast(tf.not_equal(tf.expand_dims(labels, 1), tf.expand_dims(labels, 0)),
                        tf.float32)
    hardest_positive = tf.reduce_max(distances * same, axis=1)
    hardest_negative = tf.reduce_min(distances + 1e3 * (1.0 - different), axis=1)
    loss = tf.reduce_mean(tf.maximum(hardest_positive - hardest_negative + 1.0, 0.0))
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=_train(loss, params))


def supcon_model_fn(features, labels, mode, params):
    """Khosla et al.'s loss as their reference code computes it."""
    z = _embed(features, 8)
    logits = tf.matmul(z, z, transpose_b=True) / 0.5
    logits = logits - tf.stop_gradient(tf.reduce_max(logits, axis=1, keepdims=True))
    column = tf.reshape(labels, [-1, 1])
    mask = tf.cast(tf.equal(column, tf.transpose(column)), tf.float32)
    not_self = 1.0 - tf.eye(params["batch_size"])
    mask = mask * not_self
    exp_logits = tf.exp(logits) * not_self
    log_prob = logits - tf.math.log(tf.reduce_sum(exp_logits, 1, keepdims=True))
    mean_log_prob_pos = tf.reduce_sum(mask * log_prob, 1) / tf.reduce_sum(mask, 1)
    loss = -tf.reduce_mean(mean_log_prob_pos)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=_train(loss, params))


def supcon_logsumexp_model_fn(features, labels, mode, params):
    """SupCon the short way: self-similarities masked by - 1e9 * tf.eye, the log-softmax by
    tf.reduce_logsumexp, the positives' mask labels[:, None] == labels[None, :] minus the eye."""
    z = _embed(features, 8)
    eye = tf.eye(params["batch_size"])
    logits = tf.matmul(z, z, transpose_b=True) / 0.1 - 1e9 * eye
    positives = tf.cast(tf.equal(labels[:, None], labels[None, :]), tf.float32) - eye
    log_prob = logits - tf.reduce_logsumexp(logits, axis=1, keepdims=True)
    loss = -tf.reduce_mean(tf.reduce_sum(positives * log_prob, 1) / tf.reduce_sum(positives, 1))
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=_train(loss, params))


def contrastive_pair_model_fn(features, labels, mode, params):
    """Every pair: similar pairs pulled together, dissimilar ones pushed past a margin; the
    distances by broadcasting the embeddings (e[:, None, :] - e[None, :, :])."""
    e = tf.keras.layers.Dense(4)(tf.keras.layers.Dense(12, activation="elu")(features))
    squared = tf.reduce_sum(tf.square(e[:, None, :] - e[None, :, :]), axis=-1)
    distance = tf.sqrt(squared + 1e-6)
    similar = tf.cast(tf.equal(labels[:, None], labels[None, :]), tf.float32)
    pushed = tf.square(tf.nn.relu(1.0 - distance))
    loss = tf.reduce_mean(similar * squared + (1.0 - similar) * pushed)
    optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op)


def batch_sum_of_row_model_fn(features, labels, mode, params):
    """sq[None, :] summed over its own leading axis: not broadcast against the samples."""
    e = tf.keras.layers.Dense(4)(features)
    sq = tf.reduce_sum(tf.square(e), axis=1)
    spread = tf.reduce_sum(sq[None, :], axis=0)
    loss = tf.reduce_mean(spread * tf.reduce_sum(e, axis=1))
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=_train(loss, params))


def positive_pairs_mean_model_fn(features, labels, mode, params):
    """A pull-together loss averaged over the batch's same-label pairs (a divisor of labels)."""
    e = _embed(features, 4)
    similar = tf.cast(tf.equal(labels[:, None], labels[None, :]), tf.float32)
    loss = tf.reduce_sum(similar * pairwise_distances(e)) / tf.reduce_sum(similar)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=_train(loss, params))


def _pairwise_distances(embeddings, squared=False):
    """Olivier Moindrot's widely copied batch-hard triplet code (tensorflow-triplet-loss)."""
    dot_product = tf.matmul(embeddings, tf.transpose(embeddings))
    square_norm = tf.linalg.diag_part(dot_product)
    distances = tf.expand_dims(square_norm, 0) - 2.0 * dot_product + tf.expand_dims(square_norm, 1)
    distances = tf.maximum(distances, 0.0)
    if not squared:
        mask = tf.cast(tf.equal(distances, 0.0), tf.float32)
        distances = distances + mask * 1e-16
        distances = tf.sqrt(distances)
        distances = distances * (1.0 - mask)
    return distances


def _anchor_positive_mask(labels):
    indices_equal = tf.cast(tf.eye(tf.shape(labels)[0]), tf.bool)
    indices_not_equal = tf.logical_not(indices_equal)
    labels_equal = tf.equal(tf.expand_dims(labels, 0), tf.expand_dims(labels, 1))
    return tf.logical_and(indices_not_equal, labels_equal)


def _anchor_negative_mask(labels):
    labels_equal = tf.equal(tf.expand_dims(labels, 0), tf.expand_dims(labels, 1))
    return tf.logical_not(labels_equal)


def moindrot_batch_hard_model_fn(features, labels, mode, params):
    embeddings = _embed(features)
    pairwise_dist = _pairwise_distances(embeddings, squared=params.get("squared", False))
    mask_anchor_positive = tf.cast(_anchor_positive_mask(labels), tf.float32)
    anchor_positive_dist = tf.multiply(mask_anchor_positive, pairwise_dist)
    hardest_positive_dist = tf.reduce_max(anchor_positive_dist, axis=1, keepdims=True)
    mask_anchor_negative = tf.cast(_anchor_negative_mask(labels), tf.float32)
    max_anchor_negative_dist = tf.reduce_max(pairwise_dist, axis=1, keepdims=True)
    anchor_negative_dist = pairwise_dist + max_anchor_negative_dist * (1.0 - mask_anchor_negative)
    hardest_negative_dist = tf.reduce_min(anchor_negative_dist, axis=1, keepdims=True)
    triplet_loss = tf.maximum(hardest_positive_dist - hardest_negative_dist + 0.5, 0.0)
    loss = tf.reduce_mean(triplet_loss)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=_train(loss, params))


def npairs_model_fn(features, labels, mode, params):
    """TF Addons' npairs_loss as written there: a same-label mask normalised per row as the
    soft targets of the anchors' similarities to the positives, plus an L2 penalty."""
    h = tf.keras.layers.Dense(12, activation="relu")(features)
    anchor = tf.keras.layers.Dense(6)(h)
    positive = tf.keras.layers.Dense(6)(h)
    column = tf.reshape(labels, [-1, 1])
    targets = tf.cast(tf.equal(column, tf.transpose(column)), tf.float32)
    targets = targets / tf.reduce_sum(targets, 1, keepdims=True)
    similarity = tf.matmul(anchor, positive, transpose_a=False, transpose_b=True)
    xent = tf.nn.softmax_cross_entropy_with_logits(logits=similarity, labels=targets)
    l2 = tf.reduce_mean(tf.reduce_sum(tf.square(anchor), 1)) + \
        tf.reduce_mean(tf.reduce_sum(tf.square(positive), 1))
    loss = tf.reduce_mean(xent) + 0.002 * 0.25 * l2
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=_train(loss, params))


def multiclass_npair_model_fn(features, labels, mode, params):
    """Sohn's multi-class N-pair loss: log(1 + sum over j != i of exp(f_i.p_j - f_i.p_i)),
    the positives' logits by tf.linalg.tensor_diag_part."""
    f = _embed(features)
    p = _embed(features * 0.5 + 0.1)
    logits = tf.matmul(f, p, transpose_b=True) * 4.0
    own = tf.linalg.tensor_diag_part(logits)
    others = tf.exp(logits - own[:, None]) * (1.0 - tf.eye(params["batch_size"]))
    loss = tf.reduce_mean(tf.math.log1p(tf.reduce_sum(others, axis=1)))
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=_train(loss, params))


def row_metric_model_fn(features, labels, mode, params):
    """Trains; its evaluation reports the mean of the row sq[None, :] itself."""
    e = tf.keras.layers.Dense(4)(features)
    sq = tf.reduce_sum(tf.square(e), 1)
    row = sq[None, :]
    loss = tf.reduce_mean(tf.nn.relu(1.0 - (sq[:, None] + row)))
    if mode == "eval":
        metrics = {"squared_norm": tf.compat.v1.metrics.mean(row)}
        return CSEstimatorSpec(mode=mode, loss=loss, eval_metric_ops=metrics)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=_train(loss, params))


def one_step_sequence_model_fn(features, labels, mode, params):
    """Not a row: a time-major transpose of a one-step sequence ([1, batch, n]) taken apart
    step by step, as unrolled recurrent layers do."""
    sequence = tf.reshape(features, [-1, 1, FEATURES])
    steps = tf.unstack(tf.transpose(sequence, [1, 0, 2]))
    logits = tf.keras.layers.Dense(CLASSES)(tf.keras.layers.Dense(8, activation="tanh")(steps[0]))
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=_train(loss, params))
