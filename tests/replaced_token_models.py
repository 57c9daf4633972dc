"""A blind tester's ELECTRA (unseen27's electra_rtd.py, as written): the generator's replacement
tokens drawn by tf.random.categorical of its logits folded to [batch * T, V], reshaped back to
[batch, T]; the discriminator sharing the token and position embeddings (each read twice)."""
import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

params = {"batch_size": 8, "vocab_size": 64, "seq_len": 16, "d_model": 32, "gen_d": 16,
          "heads": 2, "mask_prob": 0.15, "dropout": 0.1, "disc_weight": 50.0,
          "learning_rate": 5e-4, "warmup_steps": 2, "total_steps": 100}
MASK_ID = 1


def input_fn(params):
    rng = np.random.RandomState(131)
    n, T, V = params["batch_size"] * 6, params["seq_len"], params["vocab_size"]
    start = rng.randint(2, V, size=(n, 1))
    tokens = (2 + (start + np.arange(T)[None] * rng.randint(1, 3, size=(n, 1))) % (V - 2)).astype(np.int32)
    masked = rng.uniform(size=(n, T)) < params["mask_prob"]
    masked[:, 0] = True                                    # at least one position a sequence
    inputs = np.where(masked, MASK_ID, tokens).astype(np.int32)
    feats = {"input_ids": inputs, "masked": masked.astype(np.float32)}
    return tf.data.Dataset.from_tensor_slices((feats, tokens)).batch(params["batch_size"],
                                                                     drop_remainder=True)


def encoder_block(x, heads, training, rate):
    d = int(x.shape[-1])
    a = tf.keras.layers.MultiHeadAttention(heads, d // heads, dropout=rate)(x, x, training=training)
    x = tf.keras.layers.LayerNormalization(epsilon=1e-12)(x + tf.keras.layers.Dropout(rate)(a, training=training))
    f = tf.keras.layers.Dense(d)(tf.keras.layers.Dense(4 * d, activation="gelu")(x))
    return tf.keras.layers.LayerNormalization(epsilon=1e-12)(x + tf.keras.layers.Dropout(rate)(f, training=training))


def model_fn(features, labels, mode, params):
    training = mode == ModeKeys.TRAIN
    T, V, d, rate = params["seq_len"], params["vocab_size"], params["d_model"], params["dropout"]
    tok_emb = tf.keras.layers.Embedding(V, d, name="shared_tokens")
    pos_emb = tf.keras.layers.Embedding(T, d, name="shared_positions")
    def embed(ids):
        return tok_emb(ids) + pos_emb(tf.range(T))[None]
    # generator
    g = tf.keras.layers.Dense(params["gen_d"])(embed(features["input_ids"]))
    g = encoder_block(g, params["heads"], training, rate)
    gen_logits = tf.matmul(tf.keras.layers.Dense(d)(g), tok_emb.embeddings, transpose_b=True)  # [B,T,V]
    masked = features["masked"]
    mlm_xent = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=gen_logits)
    mlm_loss = tf.reduce_sum(mlm_xent * masked) / tf.reduce_sum(masked)
    sampled = tf.random.categorical(tf.reshape(tf.stop_gradient(gen_logits), [-1, V]), 1,
                                    dtype=tf.int32)
    sampled = tf.reshape(sampled, [-1, T])
    corrupted = tf.where(masked > 0, sampled, labels)
    is_replaced = tf.cast(tf.not_equal(corrupted, labels), tf.float32)
    # discriminator
    h = embed(corrupted)
    for _ in range(2):
        h = encoder_block(h, params["heads"], training, rate)
    disc_logits = tf.squeeze(tf.keras.layers.Dense(1)(h), -1)
    disc_pred = tf.cast(disc_logits > 0, tf.float32)
    predictions = {"replaced_logits": disc_logits, "generator_tokens": tf.argmax(gen_logits, -1)}
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode=mode, predictions=predictions)
    rtd_loss = tf.compat.v1.losses.sigmoid_cross_entropy(is_replaced, disc_logits)
    loss = mlm_loss + params["disc_weight"] * rtd_loss
    train_op = None
    if training:
        gs = tf.compat.v1.train.get_or_create_global_step()
        step = tf.cast(gs, tf.float32)
        decay = tf.compat.v1.train.polynomial_decay(params["learning_rate"], gs, params["total_steps"], 0.0)
        lr = tf.where(step < params["warmup_steps"],
                      params["learning_rate"] * (step + 1) / params["warmup_steps"], decay)
        train_op = tf.compat.v1.train.AdamOptimizer(lr, epsilon=1e-6).minimize(loss, global_step=gs)
    metrics = {"rtd_accuracy": tf.compat.v1.metrics.accuracy(is_replaced, disc_pred),
               "mlm_accuracy": tf.compat.v1.metrics.accuracy(
                   labels, tf.argmax(gen_logits, -1, output_type=tf.int32), weights=masked)}
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op, predictions=predictions,
                           eval_metric_ops=metrics)
