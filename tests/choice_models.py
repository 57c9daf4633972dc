"""Models that choose classes, written the way users write them: a classifier predicting
tf.argmax classes with an accuracy(argmax) metric, Gumbel-max action choice feeding
tf.one_hot and tf.gather(batch_dims=1) in the loss (tf.argmin of a rank-3 value along axis
1 too), the same choice in float16 (mixed_float16 layers), a REINFORCE policy gradient with
tf.random.categorical actions, and an argmax over the batch axis (refused)."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

L = tf.keras.layers
FEATURES, CLASSES = 6, 4


def input_fn(params):
    rng = np.random.default_rng(params.get("data_seed", 5))
    x = rng.normal(size=(64, FEATURES)).astype(np.float32)
    y = np.argmax(x[:, :CLASSES] + 0.5 * x[:, CLASSES:].sum(1, keepdims=True), 1).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(params.get("batch_size", 8),
                                                            drop_remainder=True)


def _spec(mode, loss, metrics=None):
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode=mode, loss=loss, eval_metric_ops=metrics or {})
    optimizer = tf.compat.v1.train.AdamOptimizer(0.01)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=optimizer.minimize(
        loss, global_step=tf.compat.v1.train.get_or_create_global_step()))


def classifier(features, labels, mode, params):
    """A classifier weighing its misclassified samples up (the predicted class, tf.argmax,
    against the label); argmax classes predicted, accuracy(argmax) evaluated."""
    logits = L.Dense(CLASSES)(L.Dense(16, activation="relu")(features))
    predicted = tf.argmax(logits, 1)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode=mode, predictions={
            "classes": predicted, "probabilities": tf.nn.softmax(logits)})
    per_sample = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    wrong = tf.cast(tf.not_equal(predicted, tf.cast(labels, tf.int64)), tf.float32)
    loss = tf.reduce_mean(per_sample * (1.0 + 0.5 * wrong))
    return _spec(mode, loss, {"accuracy": tf.compat.v1.metrics.accuracy(labels, predicted)})


def gumbel_choice(features, labels, mode, params):
    """An action chosen by Gumbel-max on the policy's logits, its value learned by a Q head
    (tf.gather of the chosen action, batch_dims=1) with the reward of that action; the
    smallest activation along axis 1 of a rank-3 value (tf.argmin) and the largest along its
    last axis (tf.argmax) mask terms."""
    h = L.Dense(16, activation="tanh")(features)
    logits, q = L.Dense(CLASSES)(h), L.Dense(CLASSES)(h)
    u = tf.random.uniform(tf.shape(logits), minval=1e-6, maxval=1.0)
    action = tf.argmax(logits - tf.math.log(-tf.math.log(u)), axis=-1, output_type=tf.int32)
    reward = tf.reduce_sum(tf.one_hot(action, CLASSES) * features[:, :CLASSES], axis=1)
    q_taken = tf.gather(q, action, batch_dims=1)
    grid = tf.reshape(L.Dense(12)(h), [-1, 3, 4])
    lowest = tf.transpose(tf.one_hot(tf.argmin(grid, axis=1), 3), [0, 2, 1])  # [batch, 3, 4]
    largest = tf.one_hot(tf.argmax(grid, axis=-1), 4)  # [batch, 3, 4]
    loss = (tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
            + tf.reduce_mean(tf.square(q_taken - reward))
            + 0.1 * tf.reduce_mean(tf.reduce_sum((lowest - largest) * tf.square(grid), [1, 2])))
    return _spec(mode, loss)


def half_choice(features, labels, mode, params):
    """mixed_float16 layers: the argmax of float16 logits picks the value a loss term reads."""
    h = L.Dense(16, activation="relu", dtype="mixed_float16")(features)
    logits = L.Dense(CLASSES, dtype="mixed_float16")(h)
    best = tf.argmax(logits, axis=-1)
    picked = tf.gather(tf.cast(logits, tf.float32), best, batch_dims=1)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, tf.cast(logits, tf.float32)) \
        + 0.1 * tf.reduce_mean(tf.square(picked))
    return _spec(mode, loss)


def reinforce(features, labels, mode, params):
    """REINFORCE: actions drawn from the policy (tf.random.categorical; params samples > 1
    draws several per sample, params int32 as int32, params half from float16 logits of
    mixed_float16 layers), reward 1 for the labelled class, a learned baseline; loss
    -log pi(a) * advantage plus the baseline's squared error."""
    policy = "mixed_float16" if params.get("half") else None
    h = L.Dense(16, activation="relu", dtype=policy)(features)
    logits, value = L.Dense(CLASSES, dtype=policy)(h), L.Dense(1)(tf.cast(h, tf.float32))[:, 0]
    count = params.get("samples", 1)
    dtype = tf.int32 if params.get("int32") else None
    if params.get("v1"):
        actions = tf.compat.v1.multinomial(logits, count, output_dtype=dtype)
    else:
        actions = tf.random.categorical(logits, count, dtype=dtype)
    chosen = tf.one_hot(actions, CLASSES)  # [batch, count, classes]
    reward = tf.reduce_mean(tf.cast(tf.equal(actions, tf.cast(labels[:, None], actions.dtype)),
                                    tf.float32), axis=1)
    advantage = tf.stop_gradient(reward - value)
    log_prob = tf.reduce_sum(chosen * tf.nn.log_softmax(tf.cast(logits, tf.float32))[:, None, :],
                             axis=[1, 2])
    loss = -tf.reduce_mean(log_prob * advantage) + tf.reduce_mean(tf.square(reward - value))
    return _spec(mode, loss)


def best_sample(features, labels, mode, params):
    """The batch's most confident sample per class (tf.argmax over axis 0) weighs the loss."""
    logits = L.Dense(CLASSES)(features)
    per_sample = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    most_confident = tf.argmax(logits, axis=0)  # the batch axis
    weight = tf.reduce_sum(tf.one_hot(most_confident, params.get("batch_size", 8)), 0)
    return _spec(mode, tf.reduce_mean(per_sample * (1.0 + weight)))
