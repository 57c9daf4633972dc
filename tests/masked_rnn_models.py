"""Keras recurrent layers reading a mask, as users write them for padded sequences: a
sentiment classifier over token ids padded with 0 (Embedding(mask_zero=True) into a GRU,
LSTM, SimpleRNN or Bidirectional layer, its last state into a Dense), a sequence tagger
returning sequences with a loss weighted by the padding mask, and Keras' Masking layer
before a recurrent layer over a padded series."""
import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

L = tf.keras.layers
v1 = tf.compat.v1
gs = v1.train.get_or_create_global_step
STEPS, VOCAB, UNITS, TAGS = 6, 30, 5, 3
RNNS = {"gru": L.GRU, "lstm": L.LSTM, "simple_rnn": L.SimpleRNN}


def _lengths(rng, n):
    """Sequence lengths 2..STEPS, the batch's first sample padded to 2 steps."""
    lengths = rng.integers(2, STEPS + 1, size=n)
    lengths[::8] = 2
    return lengths


def reviews_input_fn(params):
    """Reviews of up to 6 token ids, 0 padding their end; the label: a positive word (1..3)
    in the review."""
    rng = np.random.default_rng(params.get("data_seed", 5))
    ids = rng.integers(4, VOCAB, size=(32, STEPS))
    ids[np.arange(STEPS)[None, :] >= _lengths(rng, 32)[:, None]] = 0
    y = (rng.random(32) < 0.5).astype(np.int32)
    ids[y == 1, 0] = rng.integers(1, 4, size=int(y.sum()))
    return tf.data.Dataset.from_tensor_slices((ids.astype(np.int32), y)).batch(8, drop_remainder=True)


def _layer(params):
    """The recurrent layer params name (rnn: gru, lstm or simple_rnn; bidirectional: wrapped
    in Bidirectional; return_sequences)."""
    rnn = RNNS[params.get("rnn", "gru")](UNITS, return_sequences=bool(params.get("return_sequences")))
    return L.Bidirectional(rnn) if params.get("bidirectional") else rnn


def _spec(mode, loss, metrics, optimizer):
    """EVAL: the loss and metrics; TRAIN: optimizer minimizing the loss."""
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss, eval_metric_ops=metrics)
    return CSEstimatorSpec(mode, loss=loss, train_op=optimizer.minimize(loss, global_step=gs()))


def sentiment(features, labels, mode, params):
    """Embedding(mask_zero=True) into the recurrent layer, its last state into a Dense; Adam
    (params mask_argument: a plain Embedding, the mask passed as the layer's mask=)."""
    if params.get("mask_argument"):
        h = _layer(params)(L.Embedding(VOCAB, 4)(features), mask=tf.not_equal(features, 0))
    else:
        h = _layer(params)(L.Embedding(VOCAB, 4, mask_zero=True)(features))
    logits = L.Dense(2)(h)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"class": tf.argmax(logits, 1),
                                                  "probabilities": tf.nn.softmax(logits)})
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    return _spec(mode, loss, {"accuracy": v1.metrics.accuracy(labels, tf.argmax(logits, 1))},
                 v1.train.AdamOptimizer(1e-2))


def tagger(features, labels, mode, params):
    """A tag per token: Embedding(mask_zero=True), the recurrent layer returning sequences, a
    Dense per step; the cross-entropy weighted by the padding mask (SUM_BY_NONZERO_WEIGHTS)
    (params stacked: a GRU returning sequences first, the mask passed on by Keras)."""
    h = L.Embedding(VOCAB, 4, mask_zero=True)(features)
    if params.get("stacked"):
        h = L.GRU(UNITS, return_sequences=True)(h)
    h = _layer({**params, "return_sequences": True})(h)
    logits = L.Dense(TAGS)(h)
    tags = features % TAGS
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"tags": tf.argmax(logits, -1)})
    weights = tf.cast(tf.not_equal(features, 0), tf.float32)
    loss = v1.losses.sparse_softmax_cross_entropy(tags, logits, weights=weights)
    return _spec(mode, loss, {"accuracy": v1.metrics.accuracy(tags, tf.argmax(logits, -1),
                                                              weights=weights)},
                 v1.train.AdamOptimizer(1e-2))


def series_input_fn(params):
    """Series of up to 6 steps of 2 features, zeros padding their end; the label: whether the
    first feature's sum is positive."""
    rng = np.random.default_rng(params.get("data_seed", 6))
    x = rng.normal(size=(32, STEPS, 2)).astype(np.float32)
    x[np.arange(STEPS)[None, :] >= _lengths(rng, 32)[:, None]] = 0.0
    y = (x[:, :, 0].sum(axis=1) > 0).astype(np.float32)[:, None]
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(8, drop_remainder=True)


def masked_series(features, labels, mode, params):
    """Keras' Masking layer before the recurrent layer (pooled over the steps when it returns
    sequences), a Dense(1); sigmoid cross-entropy, SGD."""
    h = _layer(params)(L.Masking(mask_value=0.0)(features))
    if params.get("return_sequences"):
        h = tf.reduce_mean(h, axis=1)
    logits = L.Dense(1)(h)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"logits": logits})
    loss = v1.losses.sigmoid_cross_entropy(labels, logits)
    return _spec(mode, loss, {"accuracy": v1.metrics.accuracy(labels, tf.cast(logits > 0, tf.float32))},
                 v1.train.GradientDescentOptimizer(0.5))
