"""Sampled losses for large vocabularies, written the way users write them: a skip-gram
word2vec with tf.nn.nce_loss (an Embedding of the center word, an output table and biases
of get_variable), and a classifier with tf.nn.sampled_softmax_loss in training and the full
softmax otherwise (the TF tutorial's pattern); and the candidate samplers the CS refuses."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

VOCAB, EMBED, FEATURES, HIDDEN, SAMPLED = 40, 8, 12, 10, 6


def skipgram_input_fn(params):
    """(center word, context words) of a Zipf-like corpus: params' window (1) neighbour ids,
    none of the first params' reserved (0) ids (padding, never a word)."""
    batch, window, reserved = (params.get(k, d) for k, d in
                               (("batch_size", 8), ("window", 1), ("reserved", 0)))
    rng = np.random.default_rng(3)
    centers = np.minimum(rng.zipf(1.3, 8 * batch) - 1, VOCAB - 1).astype(np.int32)
    near = centers[:, None] + rng.integers(1, 3, (len(centers), window))
    contexts = reserved + near % (VOCAB - reserved)
    return tf.data.Dataset.from_tensor_slices(
        (centers, contexts.astype(params.get("label_dtype", "int64")))).batch(
            batch, drop_remainder=True)


def _output_table(rows: int, dim: int):
    weights = tf.compat.v1.get_variable(
        "nce_weights", [rows, dim],
        initializer=tf.compat.v1.truncated_normal_initializer(stddev=1.0 / np.sqrt(dim)))
    biases = tf.compat.v1.get_variable("nce_biases", [rows], initializer=tf.zeros_initializer())
    return weights, biases


def _train_op(loss, params):
    if params.get("optimizer") == "sgd":
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(params.get("learning_rate", 0.5))
    elif params.get("optimizer") == "momentum":  # (sparse: only the looked-up rows' slots move)
        optimizer = tf.compat.v1.train.MomentumOptimizer(params.get("learning_rate", 0.5), 0.9)
    else:
        optimizer = tf.compat.v1.train.AdamOptimizer(params.get("learning_rate", 0.05))
    return optimizer.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())


def skipgram_nce(features, labels, mode, params):
    """word2vec: the center word's embedding scored against its context words by NCE (and
    params' remove_accidental_hits)."""
    embedded = tf.keras.layers.Embedding(VOCAB, EMBED)(features)
    weights, biases = _output_table(VOCAB, EMBED)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode=mode, predictions={"embedding": embedded})
    loss = tf.reduce_mean(tf.nn.nce_loss(weights=weights, biases=biases, labels=labels,
                                         inputs=embedded, num_sampled=SAMPLED,
                                         num_classes=VOCAB, num_true=params.get("window", 1),
                                         remove_accidental_hits=params.get("hits", False)))
    train_op = _train_op(loss, params) if mode == ModeKeys.TRAIN else None
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op)


def tied_skipgram(features, labels, mode, params):
    """word2vec with one table: the center word's embedding looked up in the NCE table."""
    weights, biases = _output_table(VOCAB, EMBED)
    embedded = tf.nn.embedding_lookup(weights, features)
    loss = tf.reduce_mean(tf.nn.nce_loss(weights=weights, biases=biases, labels=labels,
                                         inputs=embedded, num_sampled=SAMPLED,
                                         num_classes=VOCAB))
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=_train_op(loss, params))


def repeated_draws_softmax(features, labels, mode, params):
    """Skip-gram by sampled softmax with draws that may repeat (unique=False): accidental
    hits of a class drawn twice (frequent words: Zipf contexts, log-uniform draws)."""
    embedded = tf.keras.layers.Embedding(VOCAB, EMBED)(features)
    weights, biases = _output_table(VOCAB, EMBED)
    sampled = tf.random.log_uniform_candidate_sampler(labels, 1, SAMPLED, False, VOCAB)
    loss = tf.reduce_mean(tf.nn.sampled_softmax_loss(
        weights=weights, biases=biases, labels=labels, inputs=embedded, num_sampled=SAMPLED,
        num_classes=VOCAB, sampled_values=sampled))
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=_train_op(loss, params))


def classifier_input_fn(params):
    batch = params.get("batch_size", 8)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((8 * batch, FEATURES)).astype(np.float32)
    y = (np.abs(x[:, :4]).sum(1) * 7).astype(np.int64) % VOCAB
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)


def sampled_softmax_classifier(features, labels, mode, params):
    """A classifier over VOCAB classes: sampled softmax in training, the full softmax in
    evaluation and prediction."""
    h = tf.keras.layers.Dense(HIDDEN, activation="tanh")(features)
    weights, biases = _output_table(VOCAB, HIDDEN)
    logits = tf.matmul(h, weights, transpose_b=True) + biases
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode=mode, predictions={"classes": tf.argmax(logits, 1),
                                                       "logits": logits})
    if mode == ModeKeys.TRAIN:
        loss = tf.reduce_mean(tf.nn.sampled_softmax_loss(
            weights=weights, biases=biases, labels=labels[:, None], inputs=h,
            num_sampled=SAMPLED, num_classes=VOCAB))
        return CSEstimatorSpec(mode=mode, loss=loss, train_op=_train_op(loss, params))
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    metrics = {"accuracy": tf.compat.v1.metrics.accuracy(labels, tf.argmax(logits, 1))}
    return CSEstimatorSpec(mode=mode, loss=loss, eval_metric_ops=metrics)


def sampled_softmax_eval(features, labels, mode, params):
    """The sampled loss in every mode (evaluation draws its own classes, as TF's graph)."""
    h = tf.keras.layers.Dense(HIDDEN, activation="tanh")(features)
    weights, biases = _output_table(VOCAB, HIDDEN)
    loss = tf.reduce_mean(tf.nn.sampled_softmax_loss(
        weights=weights, biases=biases, labels=labels[:, None], inputs=h,
        num_sampled=SAMPLED, num_classes=VOCAB))
    train_op = _train_op(loss, params) if mode == ModeKeys.TRAIN else None
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op)


def uniform_sampled_softmax(features, labels, mode, params):
    """sampled_softmax_loss with a uniform sampler of its own (sampled_values)."""
    h = tf.keras.layers.Dense(HIDDEN, activation="tanh")(features)
    weights, biases = _output_table(VOCAB, HIDDEN)
    true_classes = labels[:, None]
    sampled = tf.random.uniform_candidate_sampler(true_classes, 1, SAMPLED, True, VOCAB)
    loss = tf.reduce_mean(tf.nn.sampled_softmax_loss(
        weights=weights, biases=biases, labels=true_classes, inputs=h,
        num_sampled=SAMPLED, num_classes=VOCAB, sampled_values=sampled))
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=_train_op(loss, params))


# word counts of the classes (Zipf-like), as word2vec's unigram table
COUNTS = [float(1000 // (k + 1) + 1) for k in range(VOCAB)]


def unigram_nce(features, labels, mode, params):
    """word2vec's negatives: NCE with a fixed unigram sampler of the word counts to the 3/4
    (params' vocab_file instead: refused in one line)."""
    embedded = tf.keras.layers.Embedding(VOCAB, EMBED)(features)
    weights, biases = _output_table(VOCAB, EMBED)
    reserved = params.get("reserved", 0)
    source = {"vocab_file": params["vocab_file"]} if "vocab_file" in params else \
        {"unigrams": COUNTS[reserved:]}
    sampled = tf.random.fixed_unigram_candidate_sampler(
        labels, 1, SAMPLED, True, VOCAB, distortion=0.75, num_reserved_ids=reserved, **source)
    loss = tf.reduce_mean(tf.nn.nce_loss(weights=weights, biases=biases, labels=labels,
                                         inputs=embedded, num_sampled=SAMPLED,
                                         num_classes=VOCAB, sampled_values=sampled))
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=_train_op(loss, params))


def learned_unigram_softmax(features, labels, mode, params):
    """A learned unigram sampler (counts of the labels seen so far): refused in one line."""
    h = tf.keras.layers.Dense(HIDDEN, activation="tanh")(features)
    weights, biases = _output_table(VOCAB, HIDDEN)
    true_classes = labels[:, None]
    sampled = tf.random.learned_unigram_candidate_sampler(true_classes, 1, SAMPLED, True, VOCAB)
    loss = tf.reduce_mean(tf.nn.sampled_softmax_loss(
        weights=weights, biases=biases, labels=true_classes, inputs=h,
        num_sampled=SAMPLED, num_classes=VOCAB, sampled_values=sampled))
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=_train_op(loss, params))


def sharded_nce(features, labels, mode, params):
    """nce_loss of a weight table in two shards: refused in one line."""
    embedded = tf.keras.layers.Embedding(VOCAB, EMBED)(features)
    halves = [tf.compat.v1.get_variable(f"shard_{i}", [VOCAB // 2, EMBED]) for i in range(2)]
    biases = tf.compat.v1.get_variable("nce_biases", [VOCAB])
    loss = tf.reduce_mean(tf.nn.nce_loss(weights=halves, biases=biases, labels=labels,
                                         inputs=embedded, num_sampled=SAMPLED,
                                         num_classes=VOCAB))
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=_train_op(loss, params))


def draws_in_a_metric(features, labels, mode, params):
    """The sampler's expected counts read by an eval metric on the host: refused in one
    line."""
    h = tf.keras.layers.Dense(HIDDEN, activation="tanh")(features)
    weights, biases = _output_table(VOCAB, HIDDEN)
    true_classes = labels[:, None]
    sampled = tf.random.log_uniform_candidate_sampler(true_classes, 1, SAMPLED, True, VOCAB)
    loss = tf.reduce_mean(tf.nn.sampled_softmax_loss(
        weights=weights, biases=biases, labels=true_classes, inputs=h,
        num_sampled=SAMPLED, num_classes=VOCAB, sampled_values=sampled))
    train_op = _train_op(loss, params) if mode == ModeKeys.TRAIN else None
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op, eval_metric_ops={
        "expected_count": tf.compat.v1.metrics.mean(sampled[2])})


def tempered_sampled_softmax(features, labels, mode, params):
    """A sampled softmax written by hand as TF writes it, the sampled logits times params'
    temperature: at 1 TF's function; at 0.5 (the default) its ops are _compute_sampled_logits'
    kinds, its values not (the probe refuses it in one line)."""
    batch = params.get("batch_size", 8)
    h = tf.keras.layers.Dense(HIDDEN, activation="tanh")(features)
    weights, biases = _output_table(VOCAB, HIDDEN)
    true_classes = labels[:, None]
    drawn = tf.random.log_uniform_candidate_sampler(true_classes, 1, SAMPLED, True, VOCAB)
    sampled, true_count, sampled_count = (tf.stop_gradient(t) for t in drawn)
    ids = tf.concat([tf.reshape(true_classes, [-1]), sampled], 0)
    rows, bias_rows = tf.gather(weights, ids), tf.gather(biases, ids)
    true_logits = tf.matmul(h * rows[:batch], tf.ones([HIDDEN, 1])) + \
        tf.reshape(bias_rows[:batch], [batch, 1])
    sampled_logits = (tf.matmul(h, rows[batch:], transpose_b=True) + bias_rows[batch:]) * \
        params.get("temperature", 0.5)
    logits = tf.concat([true_logits - tf.math.log(true_count),
                        sampled_logits - tf.math.log(sampled_count)], 1)
    targets = tf.concat([tf.ones([batch, 1]), tf.zeros([batch, SAMPLED])], 1)
    loss = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(labels=targets, logits=logits))
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=_train_op(loss, params))
