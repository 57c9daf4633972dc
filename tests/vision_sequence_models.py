"""Small vision and sequence models written the way users write them, one construct each
that unseen models needed (issue 21): Keras Conv2D(groups=) as in ResNeXt, tf.pad's REFLECT
and SYMMETRIC modes, Bidirectional recurrent layers returning sequences with a
TimeDistributed head, Keras' Masking layer and Embedding(mask_zero=True) before a
recurrent layer, a token tagger's label-smoothed one-hot cross-entropy per token, and
tf.einsum of one operand."""
import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

L = tf.keras.layers
gs = tf.compat.v1.train.get_or_create_global_step


def image_input_fn(params):
    rng = np.random.default_rng(params.get("data_seed", 0))
    x = rng.uniform(size=(24, 8, 8, 4)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((x, rng.integers(0, 3, 24).astype(np.int32))).batch(
        8, drop_remainder=True)


def sequence_input_fn(params):
    """Sequences of 5 steps; the last steps of some are zeros (padding for Masking)."""
    rng = np.random.default_rng(params.get("data_seed", 1))
    x = rng.normal(size=(24, 5, 3)).astype(np.float32)
    x[np.arange(5)[None, :] >= rng.integers(2, 6, 24)[:, None]] = 0.0
    y = (x[:, :, :1] > 0).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(8, drop_remainder=True)


def token_input_fn(params):
    """Token ids, 0 padding the end of each sequence (Embedding's mask_zero)."""
    rng = np.random.default_rng(params.get("data_seed", 2))
    ids = rng.integers(1, 20, size=(24, 6))
    ids[np.arange(6)[None, :] >= rng.integers(2, 7, 24)[:, None]] = 0
    y = (ids % 3 == 0).any(axis=1).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((ids.astype(np.int32), y)).batch(8, drop_remainder=True)


def _spec(mode, loss, metrics):
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode=mode, loss=loss, eval_metric_ops=metrics)
    opt = tf.compat.v1.train.AdamOptimizer(1e-2)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=opt.minimize(loss, global_step=gs()))


def _classify(labels, logits):
    return {"accuracy": tf.compat.v1.metrics.accuracy(labels, tf.argmax(logits, -1))}


def grouped_conv(features, labels, mode, params):
    """ResNeXt-style grouped convolutions: Keras Conv2D(groups=), strided without a bias,
    then with a bias and ReLU, beside an ordinary 1x1 projection."""
    h = L.Conv2D(8, 3, strides=2, padding="same", groups=2, use_bias=False)(features)
    y = L.Conv2D(8, 3, padding="same", groups=4, activation="relu")(h)
    h = tf.nn.relu(y + L.Conv2D(8, 1)(h))
    logits = L.Dense(3)(L.GlobalAveragePooling2D()(h))
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    return _spec(mode, loss, _classify(labels, logits))


def mirror_padding(features, labels, mode, params):
    """Convolutions over reflect- and symmetric-padded images (tf.pad's mirror modes)."""
    h = tf.pad(features, [[0, 0], [1, 1], [2, 1], [0, 0]], mode="REFLECT")
    h = L.Conv2D(4, 3, activation="relu")(h)
    h = tf.pad(h, [[0, 0], [2, 0], [1, 1], [0, 0]], mode="SYMMETRIC")
    h = L.Conv2D(4, 3, activation="tanh")(h)
    logits = L.Dense(3)(L.Flatten()(h))
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    return _spec(mode, loss, _classify(labels, logits))


def bidirectional_tagger(features, labels, mode, params):
    """A sequence tagger: Bidirectional SimpleRNN returning sequences (its backward half
    reversed back in time), then TimeDistributed(Dense) per step."""
    h = L.Bidirectional(L.SimpleRNN(4, return_sequences=True))(features)
    logits = L.TimeDistributed(L.Dense(1))(h)
    loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits)
    return _spec(mode, loss, {"accuracy": tf.compat.v1.metrics.accuracy(
        labels, tf.cast(logits > 0, tf.float32))})


def smoothed_tagger(features, labels, mode, params):
    """A tag per token: tf.compat.v1.losses.softmax_cross_entropy of one-hot tags with label
    smoothing on logits (batch, steps, tags), which TF flattens across the batch."""
    h = L.Conv1D(8, 3, padding="same", activation="relu")(L.Embedding(20, 6)(features))
    logits = L.Dense(3)(h)
    tags = features % 3
    loss = tf.compat.v1.losses.softmax_cross_entropy(tf.one_hot(tags, 3), logits, label_smoothing=0.1)
    return _spec(mode, loss, {"accuracy": tf.compat.v1.metrics.accuracy(tags, tf.argmax(logits, -1))})


def einsum_pooling(features, labels, mode, params):
    """tf.einsum of one operand: a sum over the steps ('btd->bd') and a transpose ('btd->bdt')."""
    h = L.Embedding(20, 4)(features)
    pooled = tf.einsum("btd->bd", h) / 6.0
    peak = tf.reduce_max(tf.einsum("btd->bdt", L.Dense(4, activation="tanh")(h)), axis=-1)
    logits = L.Dense(2)(tf.concat([pooled, peak], -1))
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    return _spec(mode, loss, _classify(labels, logits))


def masked_rnn(features, labels, mode, params):
    """Keras' Masking layer before a SimpleRNN: padded steps keep the previous state."""
    h = L.SimpleRNN(4)(L.Masking(mask_value=0.0)(features))
    logits = L.Dense(1)(h)
    target = labels[:, 0]
    loss = tf.compat.v1.losses.sigmoid_cross_entropy(target, logits)
    return _spec(mode, loss, {"accuracy": tf.compat.v1.metrics.accuracy(
        target, tf.cast(logits > 0, tf.float32))})


def masked_embedding_rnn(features, labels, mode, params):
    """Embedding(mask_zero=True) before a SimpleRNN: its mask skips the padding ids."""
    h = L.SimpleRNN(4)(L.Embedding(20, 4, mask_zero=True)(features))
    logits = L.Dense(2)(h)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    return _spec(mode, loss, _classify(labels, logits))
