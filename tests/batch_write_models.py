"""Non-trainable state written from the whole batch, the way users write it: a REINFORCE
reward baseline (`baseline.assign(0.9 * baseline + 0.1 * tf.reduce_mean(reward))`), a
running mean of the features kept in a variable and read the next step, center loss
(Wen et al.: `centers` gathered by label in the loss, moved by
`tf.compat.v1.scatter_sub(centers, labels, alpha * diff / (1 + count))` with
tf.unique_with_counts, or toward the class means of tf.math.unsorted_segment_mean or _sum),
MoCo's key queue (`queue.assign(tf.concat([keys, queue[:-B]],
0))`, or at a ring pointer `ptr + tf.range(B)` by scatter_update or
tf.tensor_scatter_nd_update, then `ptr.assign((ptr + B) % K)`), a running mean of the
per-sample losses weighting the next step's; and what stays refused (a write racing the
forward pass's read, a pointer moved with no order to the write reading it, ...)."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

v1 = tf.compat.v1
FEATURES, CLASSES, EMBED, QUEUE = 6, 4, 5, 16


def labelled_input_fn(params):
    """Vectors of 6 values, integer labels of 4 classes (repeated in every batch)."""
    batch = params.get("batch_size", 8)
    rng = np.random.default_rng(31)
    n = 8 * batch
    y = rng.integers(0, CLASSES, size=n).astype(np.int32)
    x = (rng.normal(size=(n, FEATURES)) + y[:, None] * 0.5).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)


def _state(name, shape, value=0.0, dtype=tf.float32):
    return v1.get_variable(name, shape, dtype, initializer=v1.constant_initializer(value),
                           trainable=False)


def reinforce_baseline(features, labels, mode, params):
    """A policy over 4 actions rewarded by the label and the probability of its action; the
    advantage subtracts a moving baseline of the batch's mean reward, moved after the
    optimizer's update (params["after"] False: with no order to the advantage's read)."""
    logits = tf.keras.layers.Dense(CLASSES, name="policy")(
        tf.keras.layers.Dense(8, activation="tanh", name="body")(features))
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"logits": logits})
    baseline = _state("baseline", [], 0.1)
    log_p = tf.nn.log_softmax(logits)
    taken = tf.reduce_sum(log_p * tf.one_hot(labels, CLASSES), 1)
    reward = tf.cast(labels, tf.float32) * 0.25 + tf.stop_gradient(tf.exp(taken))
    advantage = tf.stop_gradient(reward - baseline)
    loss = -tf.reduce_mean(advantage * taken)
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss, eval_metric_ops={
            "reward": v1.metrics.mean(reward)})
    train = v1.train.AdamOptimizer(1e-2).minimize(
        loss, global_step=v1.train.get_or_create_global_step())
    with tf.control_dependencies([train] if params.get("after", True) else []):
        mean = tf.reduce_mean(reward)
        if params.get("scaled"):  # (by another state variable)
            mean = mean * _state("reward_scale", [], 1.0)
        moved = baseline.assign(0.9 * baseline + 0.1 * mean)
    return CSEstimatorSpec(mode, loss=loss, train_op=tf.group(train, moved))


def running_feature_mean(features, labels, mode, params):
    """Features centred by a running mean of the batch's hidden features (kept in a
    variable, read the next step)."""
    hidden = tf.keras.layers.Dense(EMBED, activation="tanh", name="body")(features)
    mean = _state("feature_mean", [EMBED])
    logits = tf.keras.layers.Dense(CLASSES, name="head")(hidden - mean)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"logits": logits})
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss)
    train = v1.train.AdamOptimizer(1e-2).minimize(
        loss, global_step=v1.train.get_or_create_global_step())
    with tf.control_dependencies([train]):
        moved = mean.assign_sub(0.2 * (mean - tf.reduce_mean(hidden, 0)))
        if params.get("twice"):  # and again, from the batch's maximum
            with tf.control_dependencies([moved]):
                moved = mean.assign(tf.maximum(mean, tf.reduce_max(hidden, 0)))
    return CSEstimatorSpec(mode, loss=loss, train_op=moved)


def center_loss(features, labels, mode, params):
    """Softmax plus Wen et al.'s center loss, the classic code: the centers gathered by
    label, moved by scatter_sub of alpha * diff / (1 + the label's count in the batch)."""
    embedding = tf.keras.layers.Dense(EMBED, activation="tanh", name="embed")(features)
    logits = tf.keras.layers.Dense(CLASSES, name="head")(embedding)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"logits": logits})
    centers = _state("centers", [CLASSES, EMBED])
    centers_batch = tf.gather(centers, labels)
    diff = centers_batch - embedding
    _, index, count = tf.unique_with_counts(labels)
    appear = tf.reshape(tf.gather(count, index), [-1, 1])
    diff = 0.5 * (diff / tf.cast(1 + appear, tf.float32))
    update = v1.scatter_sub(centers, labels, diff)
    with tf.control_dependencies([update] if params.get("facenet") else []):  # (its loss waits)
        center = tf.reduce_mean(tf.reduce_sum(tf.square(embedding - centers_batch), 1))
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits) + 0.1 * center
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss)
    optimizer = v1.train.AdamOptimizer(1e-2)
    step = v1.train.get_or_create_global_step()
    if params.get("beside"):  # grouped with the optimizer's op
        return CSEstimatorSpec(mode, loss=loss, train_op=tf.group(
            optimizer.minimize(loss, global_step=step), update))
    with tf.control_dependencies([update]):  # (the classic code: before the optimizer's)
        return CSEstimatorSpec(mode, loss=loss, train_op=optimizer.minimize(loss, global_step=step))


def center_loss_class_means(features, labels, mode, params):
    """Center loss moving each present class's center toward its mean in the batch:
    tf.math.unsorted_segment_mean (params["segment_sum"]: the sums and counts by
    unsorted_segment_sum), classes absent from the batch left where they are."""
    embedding = tf.keras.layers.Dense(EMBED, activation="tanh", name="embed")(features)
    logits = tf.keras.layers.Dense(CLASSES, name="head")(embedding)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"logits": logits})
    centers = _state("centers", [CLASSES, EMBED])
    center = tf.reduce_mean(tf.reduce_sum(tf.square(embedding - tf.gather(centers, labels)), 1))
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits) + 0.1 * center
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss)
    train = v1.train.AdamOptimizer(1e-2).minimize(
        loss, global_step=v1.train.get_or_create_global_step())
    count = tf.math.unsorted_segment_sum(tf.ones_like(labels, tf.float32), labels, CLASSES)
    if params.get("segment_sum"):
        means = tf.math.unsorted_segment_sum(embedding, labels, CLASSES) / tf.maximum(
            count, 1.0)[:, None]
    else:
        means = tf.math.unsorted_segment_mean(embedding, labels, CLASSES)
    moved = tf.where((count > 0)[:, None], centers - 0.5 * (centers - means), centers)
    with tf.control_dependencies([train]):
        return CSEstimatorSpec(mode, loss=loss, train_op=centers.assign(moved))


def moco_queue(features, labels, mode, params):
    """MoCo's contrastive loss against a queue of earlier keys: logits of the queries
    against the positive key and the queue; after the step the batch's keys enter the
    queue's front and its oldest leave."""
    batch = params.get("batch_size", 8)
    query = tf.nn.l2_normalize(tf.keras.layers.Dense(EMBED, name="query")(features), axis=1)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"query": query})
    keys = tf.stop_gradient(tf.nn.l2_normalize(
        tf.keras.layers.Dense(EMBED, name="key")(features * 0.9), axis=1))
    queue = v1.get_variable("queue", [QUEUE, EMBED], trainable=False,
                            initializer=v1.random_normal_initializer(seed=3))
    positive = tf.reduce_sum(query * keys, 1, keepdims=True)
    negative = tf.matmul(query, queue, transpose_b=True)
    logits = tf.concat([positive, negative], 1) / 0.2
    loss = -tf.reduce_mean(tf.nn.log_softmax(logits)[:, 0])  # (the positive is class 0)
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss)
    train = v1.train.AdamOptimizer(1e-2).minimize(
        loss, global_step=v1.train.get_or_create_global_step())
    with tf.control_dependencies([train]):
        if params.get("ring"):  # a ring pointer: the keys written at ptr + tf.range(B)
            ptr = _state("ptr", [], 0, tf.int32)
            rows = ptr + tf.range(batch)
            enqueued = queue.assign(tf.tensor_scatter_nd_update(queue, rows[:, None], keys)) \
                if params["ring"] == "nd" else v1.scatter_update(queue, rows, keys)
            with tf.control_dependencies([] if params["ring"] == "unordered" else [enqueued]):
                moved = ptr.assign((ptr + batch) % QUEUE)
            enqueued = tf.group(enqueued, moved)
        else:
            enqueued = queue.assign(tf.concat([keys, queue[:-batch]], 0))
    return CSEstimatorSpec(mode, loss=loss, train_op=enqueued)


def running_loss(features, labels, mode, params):
    """Each sample's loss weighted by a running mean of the batch losses (kept in a
    variable, read the next step)."""
    logits = tf.keras.layers.Dense(CLASSES, name="head")(features)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"logits": logits})
    running = _state("running_loss", [], 1.0)
    per_sample = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    loss = tf.reduce_mean(per_sample) * (2.0 - running) if params.get("outside") else \
        tf.reduce_mean(per_sample * (2.0 - running))
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss)
    train = v1.train.AdamOptimizer(1e-2).minimize(
        loss, global_step=v1.train.get_or_create_global_step())
    with tf.control_dependencies([train]):
        moved = running.assign(0.9 * running + 0.1 * tf.reduce_mean(per_sample))
    return CSEstimatorSpec(mode, loss=loss, train_op=moved)


def deep_svdd(features, labels, mode, params):
    """Deep SVDD (Ruff et al.): the hypersphere's center is the mean of the network's
    outputs on one batch, then kept fixed; the loss is each output's squared distance to it.
    The center is set under a tf.cond on the global step after the step (`at`: the step
    whose end sets it) or, the original code, at step 0 before the loss reads it
    (`before`); `sorted` sets it to a value the CS does not compute."""
    hidden = tf.keras.layers.Dense(EMBED, use_bias=False, activation="leaky_relu",
                                   name="fc1")(features)
    z = tf.keras.layers.Dense(3, use_bias=False, name="fc2")(hidden)
    center = _state("center", [3])
    step = v1.train.get_or_create_global_step()
    if params.get("before"):
        set_center = tf.cond(tf.equal(step, 0), lambda: center.assign(tf.reduce_mean(z, 0)),
                             lambda: tf.identity(center))
        with tf.control_dependencies([set_center]):
            score = tf.reduce_sum(tf.square(z - tf.stop_gradient(set_center)), 1)
    else:
        score = tf.reduce_sum(tf.square(z - center), 1)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"score": score})
    loss = tf.reduce_mean(score)
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss, eval_metric_ops={
            "mean_score": v1.metrics.mean(score)})
    train = v1.train.AdamOptimizer(1e-2).minimize(loss, global_step=step)
    if params.get("before"):
        return CSEstimatorSpec(mode, loss=loss, train_op=train)
    mean = tf.reduce_mean(z, 0)
    with tf.control_dependencies([train]):
        set_center = tf.cond(tf.equal(step, params.get("at", 2)),
                             lambda: center.assign(tf.sort(mean) if params.get("sorted") else mean),
                             lambda: tf.identity(center))
    return CSEstimatorSpec(mode, loss=loss, train_op=tf.group(train, set_center))
