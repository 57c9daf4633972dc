"""A small BERT masked-LM for CSEstimator, in the shape of the original modelzoo's
transformers/tf/bert (model_fn(features, labels, mode, params) returning CSEstimatorSpec):
token and position embeddings with layer normalization, `num_hidden_layers` Transformer
blocks (multi-head self-attention, a GELU feed-forward network, residual connections and
layer normalization), and a masked-LM head over the masked positions only, its output
projection tied to the token embeddings. Keras layers under a mixed_float16 policy when
`model.mixed_precision` is true; the loss is the masked positions' weighted cross-entropy
summed over the batch and divided by the batch size (the original's MLMLossLayer)."""
import math

import tensorflow as tf
from tensorflow.keras.layers import Dense, Dropout, Embedding, LayerNormalization

from examples.modelzoo_trainer import build_train_op
from launcher.estimator import CSEstimatorSpec, ModeKeys


def encoder_block(x, model_params, policy, training):
    """One Transformer block: self-attention, then the feed-forward network, each added to
    its input and layer-normalized."""
    length, hidden = int(x.shape[1]), model_params["hidden_size"]
    num_heads = model_params["num_heads"]
    depth = hidden // num_heads
    epsilon = float(model_params["layer_norm_epsilon"])
    rate = model_params.get("dropout_rate", 0.0)

    def split_heads(t):  # (batch, length, hidden) -> (batch, heads, length, depth)
        return tf.transpose(tf.reshape(t, [-1, length, num_heads, depth]), [0, 2, 1, 3])

    q, k, v = (split_heads(Dense(hidden, dtype=policy)(x)) for _ in range(3))
    scores = tf.matmul(q, k, transpose_b=True) * (1.0 / math.sqrt(depth))
    weights = tf.nn.softmax(scores, axis=-1)
    context = tf.reshape(tf.transpose(tf.matmul(weights, v), [0, 2, 1, 3]), [-1, length, hidden])
    attended = Dropout(rate, dtype=policy)(Dense(hidden, dtype=policy)(context), training=training)
    x = LayerNormalization(epsilon=epsilon, dtype=policy)(x + attended)
    ffn = Dense(model_params["filter_size"], activation=model_params["encoder_nonlinearity"],
                use_bias=model_params.get("use_ffn_bias", True), dtype=policy)(x)
    out = Dropout(rate, dtype=policy)(Dense(hidden, dtype=policy)(ffn), training=training)
    return LayerNormalization(epsilon=epsilon, dtype=policy)(x + out)


def build_model(features, labels, mode, model_params):
    """(loss, masked-LM logits [batch, predictions, vocab])."""
    policy = tf.keras.mixed_precision.Policy(
        "mixed_float16" if model_params["mixed_precision"] else "float32")
    training = mode == ModeKeys.TRAIN
    input_ids = features["input_ids"]
    length, hidden = int(input_ids.shape[1]), model_params["hidden_size"]
    epsilon = float(model_params["layer_norm_epsilon"])

    token_embedding = Embedding(model_params["vocab_size"], hidden, dtype=policy, name="word_embeddings")
    x = token_embedding(input_ids)
    if model_params.get("use_position_embedding", True):
        position_embedding = Embedding(model_params["max_position_embeddings"], hidden, dtype=policy,
                                       name="position_embeddings")
        x = x + position_embedding(tf.range(length))
    x = LayerNormalization(epsilon=epsilon, dtype=policy)(x)
    x = Dropout(model_params.get("dropout_rate", 0.0), dtype=policy)(x, training=training)
    for _ in range(model_params["num_hidden_layers"]):
        x = encoder_block(x, model_params, policy, training)

    # the masked-LM head reads the masked positions only
    masked = tf.gather(x, features["masked_lm_positions"], batch_dims=1)
    masked = Dense(hidden, activation=model_params["encoder_nonlinearity"], dtype=policy)(masked)
    masked = LayerNormalization(epsilon=epsilon, dtype=policy)(masked)
    if model_params.get("share_embedding_weights", True):
        table = tf.cast(token_embedding.embeddings, masked.dtype)
        logits = tf.matmul(masked, table, transpose_b=True)
        bias = tf.compat.v1.get_variable("mlm_output_bias", [model_params["vocab_size"]],
                                         initializer=tf.zeros_initializer())
        logits = tf.nn.bias_add(logits, tf.cast(bias, logits.dtype))
    else:
        logits = Dense(model_params["vocab_size"], dtype=policy)(masked)
    logits = tf.cast(logits, tf.float32)
    if mode == ModeKeys.PREDICT:
        return None, logits

    per_prediction = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    weighted = features["masked_lm_weights"] * per_prediction
    loss = tf.reduce_sum(weighted) / int(input_ids.shape[0])  # batches of a static size
    tf.compat.v1.summary.scalar("loss", loss)
    return loss, logits


def build_eval_metric_ops(logits, labels, weights):
    return {
        "masked_lm_accuracy": tf.compat.v1.metrics.accuracy(
            labels=labels, predictions=tf.argmax(logits, axis=-1, output_type=tf.int32),
            weights=weights),
    }


def model_fn(features, labels, mode, params):
    loss, logits = build_model(features, labels, mode, params["model"])
    train_op = host_call = predictions = None
    if mode == ModeKeys.TRAIN:
        train_op = build_train_op(loss, params["optimizer"])
    elif mode == ModeKeys.EVAL:
        host_call = (build_eval_metric_ops, [logits, labels, features["masked_lm_weights"]])
    else:
        predictions = {"masked_lm_predictions": tf.argmax(logits, axis=-1)}
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op, host_call=host_call,
                           predictions=predictions)
