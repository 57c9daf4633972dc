"""Models that run an Embedding and Keras recurrent layers on rows folded into the batch, as
users write them: a hierarchical attention network (Yang et al.: a document's sentences folded
into the batch, [B, S, W] -> [B*S, W], an Embedding and a bidirectional word GRU per sentence,
attention pooling, back to [B, S, H], a sentence GRU, attention, Dense), an LSTM over each
of a sample's windows (TimeDistributed by hand or Keras'), a word encoder masked on padded
sentences (Embedding(mask_zero=True)); and a prediction of a recurrent layer's folded states
(refused)."""
import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

L = tf.keras.layers
v1 = tf.compat.v1
gs = v1.train.get_or_create_global_step
SENTENCES, WORDS, VOCAB, UNITS = 4, 6, 50, 8


def documents_input_fn(params):
    """Documents of 4 sentences of 6 word ids; the class's keyword planted in one sentence
    (params padded: each sentence 2 to 6 words, 0 padding its end)."""
    rng = np.random.default_rng(17)
    docs = rng.integers(4, VOCAB, size=(64, SENTENCES, WORDS))
    y = rng.integers(0, 3, size=64)
    for k in range(64):
        docs[k, rng.integers(0, SENTENCES), rng.integers(0, WORDS)] = 1 + y[k]
    if params.get("padded"):
        docs[np.arange(WORDS) >= rng.integers(2, WORDS + 1, size=(64, SENTENCES, 1))] = 0
    return tf.data.Dataset.from_tensor_slices((docs.astype(np.int32), y.astype(np.int32))) \
        .batch(8, drop_remainder=True)


def _attention_pool(h, name):
    """Attention pooling over the steps (axis -2) of h: the weighted sum and the weights."""
    u = L.Dense(UNITS, activation="tanh", name=f"{name}_proj")(h)
    w = tf.nn.softmax(L.Dense(1, use_bias=False, name=f"{name}_context")(u), axis=-2)
    return tf.reduce_sum(w * h, axis=-2), tf.squeeze(w, -1)


def han(features, labels, mode, params):
    """The word encoder on the sentences folded into the batch; Adam (params word_rnn: the
    word encoder's layer, gru, lstm or simple_rnn; embed_first: look the words up on the
    [B, S, W] ids, then fold; predict_words: predict the word encoder's folded states;
    mask_zero: the Embedding's mask on the word encoder's steps)."""
    rnn = {"gru": L.GRU, "lstm": L.LSTM, "simple_rnn": L.SimpleRNN}[params.get("word_rnn", "gru")]
    embed = L.Embedding(VOCAB, 16, mask_zero=bool(params.get("mask_zero")), name="embed")
    if params.get("embed_first"):
        words = tf.reshape(embed(features), [-1, WORDS, 16])
    else:
        words = embed(tf.reshape(features, [-1, WORDS]))                   # [B*S, W, 16]
    hw = L.Bidirectional(rnn(UNITS, return_sequences=True), name="word_rnn")(words)
    sentences, _ = _attention_pool(hw, "word_att")                          # [B*S, 16]
    sentences = tf.reshape(sentences, [-1, SENTENCES, 2 * UNITS])
    hs = L.GRU(UNITS, return_sequences=True, name="sent_gru")(sentences)
    doc, sent_att = _attention_pool(hs, "sent_att")
    logits = L.Dense(3, name="logits")(doc)
    if mode == ModeKeys.PREDICT:
        extra = {"words": hw} if params.get("predict_words") else {}
        return CSEstimatorSpec(mode, predictions={"class": tf.argmax(logits, 1),
                                                  "sentence_attention": sent_att, **extra})
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss, eval_metric_ops={
            "accuracy": v1.metrics.accuracy(labels, tf.argmax(logits, 1))})
    return CSEstimatorSpec(mode, loss=loss,
                           train_op=v1.train.AdamOptimizer(1e-3).minimize(loss, global_step=gs()))


def windows_input_fn(params):
    """Series of 3 windows of 5 steps of 2 features; the label: is the last window rising."""
    rng = np.random.default_rng(18)
    x = rng.normal(size=(64, 3, 5, 2)).astype(np.float32)
    y = (x[:, -1, -1, 0] > x[:, -1, 0, 0]).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(8, drop_remainder=True)


def window_lstm(features, labels, mode, params):
    """An LSTM's last state per window, TimeDistributed by hand ([B, 3, 5, 2] -> [B*3, 5, 2]
    -> [B, 3, 6]) or by Keras' TimeDistributed (params keras), flattened into a Dense; SGD."""
    windows, steps, width = features.shape[1:]
    lstm = L.LSTM(6, name="window_lstm")
    if params.get("keras"):
        h = L.TimeDistributed(lstm)(features)
    else:
        h = lstm(tf.reshape(features, [-1, steps, width]))
    logits = L.Dense(2)(tf.reshape(h, [-1, windows * 6]))
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"logits": logits})
    return CSEstimatorSpec(mode, loss=loss, train_op=v1.train.GradientDescentOptimizer(0.1)
                           .minimize(loss, global_step=gs()))
