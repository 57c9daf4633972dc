"""Losses with per-sample weights, written the ordinary Estimator way (issue 21's fraud
classifier and NER tagger): tf.compat.v1.losses.* with `weights=` of shape [batch] (class
weights gathered by label) or [batch, T] (a padding mask from labels != pad) under each
Reduction, the default SUM_BY_NONZERO_WEIGHTS (sum(w * l) / count_nonzero(w), DivNoNan)
first; a hand-written masked mean sum(l * mask) / sum(mask) and the everyday variants of its
divisor (tf.maximum(., 1), + 1e-8, count_nonzero, clip_by_value, two-level means); a Keras loss with
sample_weight; and a denominator computed from the model's outputs."""
import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

L = tf.keras.layers
v1 = tf.compat.v1
R = v1.losses.Reduction
BATCH, FEATURES, CLASSES, STEPS_T, VOCAB, PAD = 8, 6, 3, 5, 12, 0


def tabular_input_fn(params):
    """Rows of features, an integer class (0 is rare) and a float target; with
    `zero_batch`, batch 1 holds only class 0 (its class weight 0: every weight 0)."""
    rng = np.random.default_rng(params.get("data_seed", 7))
    x = rng.normal(size=(4 * BATCH, FEATURES)).astype(np.float32)
    y = np.digitize(x[:, 0] + 0.5 * x[:, 1], [-0.8, 0.6]).astype(np.int32)
    if params.get("zero_batch"):
        y[BATCH:2 * BATCH] = 0
    target = (np.sin(x[:, :1]) + 0.3 * x[:, 1:2]).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices(({"x": x, "target": target}, y)).batch(
        BATCH, drop_remainder=True)


def tagging_input_fn(params):
    """Token ids padded with PAD at the end of each sequence, a tag per token (PAD for padding)."""
    rng = np.random.default_rng(params.get("data_seed", 8))
    ids = rng.integers(1, VOCAB, size=(4 * BATCH, STEPS_T)).astype(np.int32)
    lengths = rng.integers(1, STEPS_T + 1, size=4 * BATCH)
    if params.get("zero_batch"):
        lengths[BATCH:2 * BATCH] = 0
    ids[np.arange(STEPS_T)[None] >= lengths[:, None]] = PAD
    tags = np.where(ids == PAD, PAD, 1 + ids % (CLASSES - 1)).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((ids, tags)).batch(BATCH, drop_remainder=True)


def _spec(mode, loss, params, metrics):
    if mode != ModeKeys.TRAIN:
        return CSEstimatorSpec(mode=mode, loss=loss, eval_metric_ops=metrics)
    optimizer = {"adam": lambda: v1.train.AdamOptimizer(0.01),
                 "sgd": lambda: v1.train.GradientDescentOptimizer(0.1)}[params.get("optimizer", "adam")]()
    train = optimizer.minimize(loss, global_step=v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train)


def _loss_of(kind, labels, logits, target, weights, reduction):
    """tf.compat.v1.losses' `kind` on a classifier's logits (or its first column)."""
    probability = tf.sigmoid(logits[:, :1])
    binary = tf.cast(tf.expand_dims(labels, 1) > 0, tf.float32)
    w = weights if kind in ("sparse_softmax_cross_entropy", "softmax_cross_entropy") \
        else tf.expand_dims(weights, 1)
    losses = {
        "sparse_softmax_cross_entropy": lambda: v1.losses.sparse_softmax_cross_entropy(
            labels, logits, weights=w, reduction=reduction),
        "softmax_cross_entropy": lambda: v1.losses.softmax_cross_entropy(
            tf.one_hot(labels, CLASSES), logits, weights=w, reduction=reduction),
        "sigmoid_cross_entropy": lambda: v1.losses.sigmoid_cross_entropy(
            binary, logits[:, :1], weights=w, reduction=reduction),
        "mean_squared_error": lambda: v1.losses.mean_squared_error(
            target, logits[:, :1], weights=w, reduction=reduction),
        "absolute_difference": lambda: v1.losses.absolute_difference(
            target, logits[:, :1], weights=w, reduction=reduction),
        "huber_loss": lambda: v1.losses.huber_loss(
            target, logits[:, :1], weights=w, reduction=reduction, delta=0.5),
        "log_loss": lambda: v1.losses.log_loss(binary, probability, weights=w,
                                               reduction=reduction),
    }
    return losses[kind]()


def fraud_classifier(features, labels, mode, params):
    """An MLP whose loss weighs each sample by its class (tf.gather of a constant by label:
    the rare class 0 weighs 0 by default), params["loss"] of tf.compat.v1.losses under
    params["reduction"] (default: TF's, SUM_BY_NONZERO_WEIGHTS), plus an L2 penalty
    (params["l2"]); with params["two_tasks"], plus a regression loss weighted by another
    mask (two denominators); params["mixed"]: the hidden layer under mixed_float16."""
    l2 = params.get("l2", 1e-3)
    policy = "mixed_float16" if params.get("mixed") else None  # (the output layer float32)
    hidden = L.Dense(16, activation="relu", dtype=policy,
                     kernel_regularizer=tf.keras.regularizers.l2(l2) if l2 else None)(features["x"])
    logits = L.Dense(CLASSES)(hidden)
    class_weights = tf.gather(tf.constant(params.get("class_weights", [0.0, 1.0, 2.5])), labels)
    reduction = params.get("reduction", R.SUM_BY_NONZERO_WEIGHTS)
    data_loss = _loss_of(params.get("loss", "sparse_softmax_cross_entropy"), labels, logits,
                         features["target"], class_weights, reduction)
    if params.get("two_tasks"):  # a second weighted loss: its own count of nonzero weights
        data_loss += 0.5 * v1.losses.mean_squared_error(
            features["target"], logits[:, 1:2], weights=tf.cast(labels[:, None] > 1, tf.float32))
    loss = data_loss + tf.add_n(v1.get_collection(v1.GraphKeys.REGULARIZATION_LOSSES) or
                                [tf.constant(0.0)])
    return _spec(mode, loss, params, {
        "accuracy": v1.metrics.accuracy(labels, tf.argmax(logits, 1), weights=class_weights),
        "weighted_loss": v1.metrics.mean(data_loss)})


def ner_tagger(features, labels, mode, params):
    """Embedding, a Dense per token, sparse softmax cross-entropy per token weighted by the
    padding mask labels != PAD ([batch, T]) under params["reduction"]; or, with
    params["hand_written"], tf.reduce_sum(losses * mask) / tf.reduce_sum(mask) (or, with
    "count_nonzero", / tf.math.count_nonzero(labels))."""
    hidden = L.Dense(16, activation="tanh")(L.Embedding(VOCAB, 8)(features))
    logits = L.Dense(CLASSES)(hidden)
    mask = tf.cast(tf.not_equal(labels, PAD), tf.float32)
    if params.get("hand_written"):
        losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
        count = tf.reduce_sum(mask) if params["hand_written"] != "count_nonzero" else \
            tf.cast(tf.math.count_nonzero(labels), tf.float32)
        loss = tf.reduce_sum(losses * mask) / count
    else:
        loss = v1.losses.sparse_softmax_cross_entropy(
            labels, logits, weights=mask, reduction=params.get("reduction", R.SUM_BY_NONZERO_WEIGHTS))
    return _spec(mode, loss, params, {
        "token_accuracy": v1.metrics.accuracy(labels, tf.argmax(logits, -1), weights=mask)})


DIVISORS = {  # params["divisor"] of masked_tagger -> the divisor of sum(losses * mask)
    "maximum": lambda mask: tf.maximum(tf.reduce_sum(mask), 1.0),
    "epsilon": lambda mask: tf.reduce_sum(mask) + 1e-8,
    "count_nonzero": lambda mask: tf.maximum(tf.cast(tf.math.count_nonzero(mask), tf.float32), 1.0),
    "clip": lambda mask: tf.clip_by_value(tf.reduce_sum(mask), 1.0, np.inf),
    "sqrt": lambda mask: tf.sqrt(tf.maximum(tf.reduce_sum(mask), 1.0)),
    "where": lambda mask: tf.where(tf.reduce_sum(mask) > 0, tf.reduce_sum(mask), 1.0),
    "per_sequence": lambda mask: tf.maximum(tf.reduce_sum(mask) / BATCH, 1.0),  # (x * 1/8)
    "longest": lambda mask: tf.reduce_max(tf.reduce_sum(mask, 1)),  # (refused: Max)
}


def masked_tagger(features, labels, mode, params):
    """The NER tagger's loss as masked-loss code is written by hand: the token-level mean
    over the batch, sum(losses * mask) / DIVISORS[params["divisor"]](mask); "divide_no_nan":
    tf.math.divide_no_nan(sum(losses * mask), sum(mask)); "mean_ratio": mean(losses * mask) /
    tf.maximum(mean(mask), 1e-6); "two_level": each sequence's mean over its tokens
    (/ tf.maximum(its count, 1)), then the mean over the batch."""
    hidden = L.Dense(16, activation="tanh")(L.Embedding(VOCAB, 8)(features))
    logits = L.Dense(CLASSES)(hidden)
    mask = tf.cast(tf.not_equal(labels, PAD), tf.float32)
    losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    divisor = params["divisor"]
    if divisor == "divide_no_nan":
        loss = tf.math.divide_no_nan(tf.reduce_sum(losses * mask), tf.reduce_sum(mask))
    elif divisor == "mean_ratio":
        loss = tf.reduce_mean(losses * mask) / tf.maximum(tf.reduce_mean(mask), 1e-6)
    elif divisor == "two_level":
        per_sequence = tf.reduce_sum(losses * mask, axis=1) / tf.maximum(
            tf.reduce_sum(mask, axis=1), 1.0)
        loss = tf.reduce_mean(per_sequence)
    else:
        loss = tf.reduce_sum(losses * mask) / DIVISORS[divisor](mask)
    return _spec(mode, loss, params, {
        "token_accuracy": v1.metrics.accuracy(labels, tf.argmax(logits, -1), weights=mask)})


def keras_sample_weight(features, labels, mode, params):
    """A Keras loss object called with sample_weight (its 'sum_over_batch_size' divides by
    the count of elements, not of weights)."""
    logits = L.Dense(CLASSES)(L.Dense(16, activation="relu")(features["x"]))
    weights = tf.gather(tf.constant([0.0, 1.0, 2.5]), labels)
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)(
        labels, logits, sample_weight=weights)
    return _spec(mode, loss, params, {"accuracy": v1.metrics.accuracy(labels, tf.argmax(logits, 1))})


def divided_by_outputs(features, labels, mode, params):
    """A loss divided by the sum of the model's own confidences: its denominator is not
    known before the model ran (a loss of the whole batch)."""
    logits = L.Dense(CLASSES)(L.Dense(16, activation="relu")(features["x"]))
    losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    confidence = tf.reduce_max(tf.nn.softmax(logits), axis=1)
    loss = tf.math.divide_no_nan(tf.reduce_sum(losses * confidence), tf.reduce_sum(confidence))
    return _spec(mode, loss, params, {})
