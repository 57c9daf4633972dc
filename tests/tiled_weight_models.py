"""Models that give every sample the same learned weight, written the way users write them: a
tiny ViT (patches by a strided Conv2D, a class token tf.tile'd over the batch and
concatenated in front, a learned position embedding, one Transformer block with Keras
MultiHeadAttention), a Set Transformer's pooling by multihead attention (learned seed
queries tiled over the batch), Perceiver-style latents by tf.broadcast_to, DETR-style object
queries by tf.repeat, a token by tf.ones_like(x[:, :1]) * w, and a tiling by the static
batch size."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

SIDE, PATCH, CHANNELS, WIDTH, CLASSES = 8, 4, 3, 16, 4
ELEMENTS, FEATURES = 6, 5  # a set's elements, each of FEATURES values


def image_input_fn(params):
    """SIDE x SIDE images of CHANNELS channels, a class each."""
    batch = params.get("batch_size", 8)
    rng = np.random.default_rng(11)
    x = rng.normal(size=(4 * batch, SIDE, SIDE, CHANNELS)).astype(np.float32)
    y = (np.arange(4 * batch) % CLASSES).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)


def set_input_fn(params):
    """Sets of ELEMENTS vectors, a class each."""
    batch = params.get("batch_size", 8)
    rng = np.random.default_rng(12)
    x = rng.normal(size=(4 * batch, ELEMENTS, FEATURES)).astype(np.float32)
    y = (np.arange(4 * batch) % CLASSES).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)


def _spec(mode, labels, logits, params):
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode=mode, predictions={"classes": tf.argmax(logits, -1)})
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    train_op = None
    if mode == ModeKeys.TRAIN:
        optimizer = tf.compat.v1.train.AdamOptimizer(params.get("learning_rate", 0.01))
        train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    metrics = {"accuracy": tf.compat.v1.metrics.accuracy(labels, tf.argmax(logits, -1))}
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op, eval_metric_ops=metrics)


class ClassToken(tf.keras.layers.Layer):
    """ViT's class token in front of the patches, then a learned position embedding."""

    def build(self, input_shape):
        self.cls_token = self.add_weight(name="cls_token", shape=(1, 1, input_shape[-1]),
                                         initializer="random_normal")
        self.position = self.add_weight(name="position", shape=(1, input_shape[1] + 1, input_shape[-1]),
                                        initializer="random_normal")

    def call(self, x):
        cls = tf.tile(self.cls_token, [tf.shape(x)[0], 1, 1])
        return tf.concat([cls, x], 1) + self.position


def _transformer_block(x, heads=2):
    h = tf.keras.layers.LayerNormalization()(x)
    x = x + tf.keras.layers.MultiHeadAttention(heads, WIDTH // heads)(h, h)
    h = tf.keras.layers.LayerNormalization()(x)
    h = tf.keras.layers.Dense(2 * WIDTH, activation="gelu")(h)
    return x + tf.keras.layers.Dense(WIDTH)(h)


def vit(features, labels, mode, params):
    """Patches, a class token, one Transformer block; the class token's output classifies."""
    patches = tf.keras.layers.Conv2D(WIDTH, PATCH, strides=PATCH)(features)
    x = tf.reshape(patches, [-1, (SIDE // PATCH) ** 2, WIDTH])
    x = _transformer_block(ClassToken()(x))
    logits = tf.keras.layers.Dense(CLASSES)(tf.keras.layers.LayerNormalization()(x)[:, 0])
    return _spec(mode, labels, logits, params)


class PoolingByAttention(tf.keras.layers.Layer):
    """The Set Transformer's PMA: learned seed vectors attend over the set."""

    def __init__(self, seeds, heads, **kwargs):
        super().__init__(**kwargs)
        self.seeds, self.attention = seeds, tf.keras.layers.MultiHeadAttention(heads, WIDTH // heads)

    def build(self, input_shape):
        self.seed = self.add_weight(name="seed", shape=(1, self.seeds, WIDTH), initializer="glorot_uniform")

    def call(self, x):
        query = tf.tile(self.seed, [tf.shape(x)[0], 1, 1])
        return query + self.attention(query, x)


def set_transformer_pma(features, labels, mode, params):
    """Elements embedded, pooled into 2 seeds by attention, flattened, classified."""
    x = tf.keras.layers.Dense(WIDTH, activation="relu")(features)
    pooled = PoolingByAttention(2, 2)(x)
    logits = tf.keras.layers.Dense(CLASSES)(tf.keras.layers.Flatten()(pooled))
    return _spec(mode, labels, logits, params)


def perceiver_latents(features, labels, mode, params):
    """Latents by tf.broadcast_to, a get_variable, cross-attending to the elements."""
    x = tf.keras.layers.Dense(WIDTH)(features)
    latents = tf.compat.v1.get_variable("latents", [3, WIDTH])
    query = tf.broadcast_to(latents, [tf.shape(x)[0], 3, WIDTH])
    scores = tf.nn.softmax(tf.matmul(query, x, transpose_b=True) / WIDTH ** 0.5)
    logits = tf.keras.layers.Dense(CLASSES)(tf.reshape(tf.matmul(scores, x), [-1, 3 * WIDTH]))
    return _spec(mode, labels, logits, params)


def object_queries(features, labels, mode, params):
    """DETR-style queries by tf.repeat(w[None], batch, 0), added to the elements' pooling."""
    x = tf.keras.layers.Dense(WIDTH, activation="tanh")(features)
    queries = tf.compat.v1.get_variable("queries", [ELEMENTS, WIDTH])
    x = x + tf.repeat(queries[None], tf.shape(x)[0], axis=0)
    logits = tf.keras.layers.Dense(CLASSES)(tf.reduce_mean(x, 1))
    return _spec(mode, labels, logits, params)


def ones_like_token(features, labels, mode, params):
    """A token made as tf.ones_like(x[:, :1]) * w, concatenated in front of the elements."""
    x = tf.keras.layers.Dense(WIDTH, activation="relu")(features)
    token = tf.compat.v1.get_variable("token", [WIDTH])
    x = tf.concat([tf.ones_like(x[:, :1]) * token, x], 1)
    logits = tf.keras.layers.Dense(CLASSES)(tf.keras.layers.Flatten()(x))
    return _spec(mode, labels, logits, params)


def static_batch_tile(features, labels, mode, params):
    """A class token tiled by the params' batch size, a Python int."""
    x = tf.keras.layers.Dense(WIDTH, activation="relu")(features)
    token = tf.compat.v1.get_variable("token", [1, 1, WIDTH])
    x = tf.concat([tf.tile(token, [params["batch_size"], 1, 1]), x], 1)
    logits = tf.keras.layers.Dense(CLASSES)(tf.reduce_max(x, 1))
    return _spec(mode, labels, logits, params)


def sorted_token(features, labels, mode, params):
    """A token the CS cannot compute (tf.sort of a weight), tiled over the batch."""
    x = tf.keras.layers.Dense(WIDTH, activation="relu")(features)
    token = tf.sort(tf.compat.v1.get_variable("token", [1, 1, WIDTH]), axis=-1)
    x = tf.concat([tf.tile(token, [tf.shape(x)[0], 1, 1]), x], 1)
    logits = tf.keras.layers.Dense(CLASSES)(tf.reduce_max(x, 1))
    return _spec(mode, labels, logits, params)


def scaled_token(features, labels, mode, params):
    """A token computed from weights (2 * w, the weight program's) tiled over the batch."""
    x = tf.keras.layers.Dense(WIDTH, activation="relu")(features)
    token = 2.0 * tf.compat.v1.get_variable("token", [1, 1, WIDTH])
    x = tf.concat([tf.tile(token, [tf.shape(x)[0], 1, 1]), x], 1)
    logits = tf.keras.layers.Dense(CLASSES)(tf.reduce_max(x, 1))
    return _spec(mode, labels, logits, params)


def tiled_along_a_token_axis(features, labels, mode, params):
    """Tokens tiled over the batch and repeated twice along their own axis."""
    x = tf.keras.layers.Dense(WIDTH, activation="relu")(features)
    tokens = tf.compat.v1.get_variable("tokens", [1, 2, WIDTH])
    x = tf.concat([tf.tile(tokens, [tf.shape(x)[0], 2, 1]), x], 1)
    logits = tf.keras.layers.Dense(CLASSES)(tf.reduce_max(x, 1))
    return _spec(mode, labels, logits, params)


def mixed_class_token(features, labels, mode, params):
    """The class token and position embedding under the mixed_float16 policy (float32
    weights read as float16 copies), in front of float16 elements."""
    x = tf.keras.layers.Dense(WIDTH, activation="relu", dtype="mixed_float16")(features)
    x = ClassToken(dtype="mixed_float16")(x)
    logits = tf.keras.layers.Dense(CLASSES)(tf.keras.layers.Flatten()(x))
    return _spec(mode, labels, logits, params)
