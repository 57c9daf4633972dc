"""Models that read one weight in several places, written the way users write them: tied
input/output embeddings (BERT's output projection), a Keras layer called twice, a learned
position table sliced to the sequence (`pos_table[:length]`), a small Transformer with both,
and Keras recurrent layers over fixed-length sequences."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

VOCAB, LENGTH, MAXLEN, DIM = 40, 6, 10, 8


def token_input_fn(params):
    """Token sequences and their next tokens (a language model's labels)."""
    batch = params.get("batch_size", 8)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, VOCAB, size=(4 * batch, LENGTH)).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((tokens, np.roll(tokens, -1, axis=1))).batch(
        batch, drop_remainder=True)


def sequence_input_fn(params):
    """Sequences of LENGTH steps of 3 features, a class each."""
    batch = params.get("batch_size", 8)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(4 * batch, LENGTH, 3)).astype(np.float32)
    y = (np.arange(4 * batch) % 4).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)


def vector_input_fn(params):
    batch = params.get("batch_size", 8)
    rng = np.random.default_rng(2)
    x = rng.normal(size=(4 * batch, 12)).astype(np.float32)
    y = (np.arange(4 * batch) % 4).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)


def _optimizer(params):
    lr = params.get("learning_rate", 0.05)
    if params.get("optimizer") == "adam":
        return tf.compat.v1.train.AdamOptimizer(lr)
    if params.get("optimizer") == "momentum":
        return tf.compat.v1.train.MomentumOptimizer(lr, 0.9)
    return tf.compat.v1.train.GradientDescentOptimizer(lr)


def _spec(mode, labels, logits, params):
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode=mode, predictions={"logits": logits})
    if len(logits.shape) == 3:  # a token's loss at every position
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
    else:
        loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    train_op = None
    if mode == ModeKeys.TRAIN:
        train_op = _optimizer(params).minimize(
            loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op)


def tied_embeddings(features, labels, mode, params):
    """A language model whose output projection is the token embedding, transposed."""
    embedding = tf.keras.layers.Embedding(VOCAB, DIM)
    h = tf.keras.layers.Dense(DIM, activation="tanh")(embedding(features))
    logits = tf.matmul(h, embedding.embeddings, transpose_b=True)
    return _spec(mode, labels, logits, params)


# The output vocabulary in another order than the input's.
OUTPUT_ORDER = np.random.default_rng(5).permutation(VOCAB)


def gathered_rows(features, labels, mode, params):
    """Tied embeddings whose output projection gathers the table's rows in another order
    (TF updates the table as an embedding table: sparse)."""
    embedding = tf.keras.layers.Embedding(VOCAB, DIM)
    h = tf.keras.layers.Dense(DIM, activation="tanh")(embedding(features))
    logits = tf.matmul(h, tf.gather(embedding.embeddings, OUTPUT_ORDER), transpose_b=True)
    return _spec(mode, labels, logits, params)


def embedding_called_twice(features, labels, mode, params):
    """One Embedding layer looking up two halves of each sequence (a siamese pair): TF
    updates its table from both lookups' IndexedSlices."""
    embedding = tf.keras.layers.Embedding(VOCAB, DIM)
    half = LENGTH // 2
    pair = tf.concat([tf.reduce_mean(embedding(features[:, :half]), axis=1),
                      tf.reduce_mean(embedding(features[:, half:]), axis=1)], axis=-1)
    return _spec(mode, labels[:, 0], tf.keras.layers.Dense(VOCAB)(pair), params)


def dense_called_twice(features, labels, mode, params):
    """One Dense layer applied twice (a weight-tied residual block)."""
    shared = tf.keras.layers.Dense(12, activation="tanh")
    h = shared(features)
    h = shared(h) + h
    return _spec(mode, labels, tf.keras.layers.Dense(4)(h), params)


def nearest_code(features, labels, mode, params):
    """A vector-quantised classifier (VQ-VAE's codebook): the codebook is read twice, once in
    the distances whose argmin picks each sample's code (no gradient reaches that read, as in
    TF) and once as tf.one_hot(code) @ codebook, which the loss trains."""
    z = tf.keras.layers.Dense(6)(features)
    codebook = tf.compat.v1.get_variable("codebook", [5, 6], initializer=tf.random_uniform_initializer(-1.0, 1.0))
    distances = tf.reduce_sum(tf.square(z), 1, keepdims=True) - 2.0 * tf.matmul(z, codebook, transpose_b=True) \
        + tf.reduce_sum(tf.square(codebook), 1)[None, :]
    codes = tf.argmin(distances, axis=1)
    if params.get("pick") == "gather":  # the rows looked up: TF's update of the codebook is sparse
        quantised = tf.gather(codebook, codes)
    else:
        quantised = tf.matmul(tf.one_hot(codes, 5), codebook)
    logits = tf.keras.layers.Dense(4)(z + quantised)
    return _spec(mode, labels, logits, params)


class PositionTable(tf.keras.layers.Layer):
    """Learned positions for up to MAXLEN tokens, sliced to the sequence's length."""

    def build(self, input_shape):
        self.table = self.add_weight(name="table", shape=(MAXLEN, int(input_shape[-1])),
                                     initializer="random_normal")

    def call(self, x):
        return x + self.table[:LENGTH]


def sliced_positions(features, labels, mode, params):
    """Token embeddings plus a sliced position table, then the next token's logits."""
    x = PositionTable()(tf.keras.layers.Embedding(VOCAB, DIM)(features))
    return _spec(mode, labels, tf.keras.layers.Dense(VOCAB)(x), params)


def small_transformer(features, labels, mode, params):
    """One Transformer block with a sliced position table and tied input/output embeddings."""
    embedding = tf.keras.layers.Embedding(VOCAB, DIM)
    x = PositionTable()(embedding(features))
    attention = tf.keras.layers.MultiHeadAttention(num_heads=2, key_dim=DIM // 2)
    x = tf.keras.layers.LayerNormalization()(x + attention(x, x))
    x = tf.keras.layers.LayerNormalization()(x + tf.keras.layers.Dense(DIM)(
        tf.keras.layers.Dense(2 * DIM, activation="relu")(x)))
    logits = tf.matmul(x, embedding.embeddings, transpose_b=True)
    return _spec(mode, labels, logits, params)


def recurrent(features, labels, mode, params):
    """A Keras recurrent layer (params['cell']: LSTM, GRU, SimpleRNN) over the sequence."""
    cell = getattr(tf.keras.layers, params.get("cell", "LSTM"))
    h = cell(8, return_sequences=params.get("return_sequences", False),
             unroll=params.get("unroll", False))(features)
    if params.get("return_sequences", False):
        h = tf.reduce_mean(h, axis=1)
    return _spec(mode, labels, tf.keras.layers.Dense(4)(h), params)
