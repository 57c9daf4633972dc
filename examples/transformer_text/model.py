"""model_fn of a small transformer text classifier (Keras' "text classification with
transformer" example, written for tf.compat.v1 graphs): token and position embeddings, one
block of multi-head self-attention (tf ops) and a GELU feed-forward network, each with a
residual connection and layer normalization, mean pooling over the sequence, and logits."""
from __future__ import annotations

import math

import tensorflow as tf

from examples.classifier import classifier_spec
from examples.optimizer import OPTIMIZER_SPEC
from examples.transformer_text.data import INPUT_SPEC
from launcher.estimator import ModeKeys
from launcher.params_spec import Key

# Every params key the model and its input read, checked before any work (run.py).
PARAMS_SPEC = {**INPUT_SPEC, **OPTIMIZER_SPEC, "model": {
    "vocab_size": Key("int", minimum=1), "num_classes": Key("int", minimum=2),
    "embed_dim": Key("int", minimum=1), "num_heads": Key("int", minimum=1),
    "ff_dim": Key("int", minimum=1), "dropout": Key("number", minimum=0, below=1, required=False)}}


def token_and_position_embedding(tokens: tf.Tensor, config: dict) -> tf.Tensor:
    length, dim = int(tokens.shape[1]), config["embed_dim"]
    positions = tf.keras.layers.Embedding(length, dim)(tf.range(start=0, limit=length, delta=1))
    return tf.keras.layers.Embedding(config["vocab_size"], dim)(tokens) + positions


def self_attention(x: tf.Tensor, num_heads: int) -> tf.Tensor:
    length, dim = int(x.shape[1]), int(x.shape[2])
    depth = dim // num_heads

    def heads(t):  # (batch, length, dim) -> (batch, heads, length, depth)
        return tf.transpose(tf.reshape(t, [-1, length, num_heads, depth]), [0, 2, 1, 3])

    q, k, v = (heads(tf.keras.layers.Dense(dim)(x)) for _ in range(3))
    weights = tf.nn.softmax(tf.matmul(q, k, transpose_b=True) / math.sqrt(depth), axis=-1)
    context = tf.reshape(tf.transpose(tf.matmul(weights, v), [0, 2, 1, 3]), [-1, length, dim])
    return tf.keras.layers.Dense(dim)(context)


def transformer_block(x: tf.Tensor, config: dict, training: bool) -> tf.Tensor:
    rate = config.get("dropout", 0.0)
    attended = self_attention(x, config["num_heads"])
    if rate > 0:
        attended = tf.keras.layers.Dropout(rate)(attended, training=training)
    x = tf.keras.layers.LayerNormalization(epsilon=1e-6)(x + attended)
    hidden = tf.keras.layers.Dense(config["ff_dim"], activation="gelu")(x)
    out = tf.keras.layers.Dense(int(x.shape[-1]))(hidden)
    if rate > 0:
        out = tf.keras.layers.Dropout(rate)(out, training=training)
    return tf.keras.layers.LayerNormalization(epsilon=1e-6)(x + out)


def build_logits(tokens: tf.Tensor, config: dict, training: bool) -> tf.Tensor:
    x = token_and_position_embedding(tokens, config)
    x = transformer_block(x, config, training)
    pooled = tf.reduce_mean(x, axis=1)
    return tf.keras.layers.Dense(config["num_classes"])(pooled)


def model_fn(features, labels, mode, params):
    logits = build_logits(features, params["model"], training=mode == ModeKeys.TRAIN)
    return classifier_spec(logits, labels, mode, params)
