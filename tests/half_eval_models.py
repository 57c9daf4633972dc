"""Mixed_float16 models whose evaluation and prediction the blind testers compared with the
CPU path (copied as written; only the names of their params, input_fn and model_fn differ):
unseen26's fcn_segmentation (an FCN-8s-style segmenter: VGG-ish encoder, 1x1 score layers
fused by 2x Conv2DTranspose upsampling, per-pixel softmax cross-entropy, mean IoU; momentum
SGD with a poly schedule and a static loss scale) and unseen25's transformer_seq2seq (an
encoder-decoder Transformer with Keras MultiHeadAttention, label smoothing 0.1, tied output
embeddings, Adam with the Noam schedule, a static loss scale written by hand)."""
# ruff: noqa: E702, E731, E741  (the models as their authors wrote them)
import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

# unseen26's fcn_segmentation

fcn_params = {"batch_size": 8, "num_classes": 4, "learning_rate": 0.01, "momentum": 0.9,
          "total_steps": 100, "loss_scale": 128.0, "policy": "mixed_float16"}


def fcn_input_fn(params):
    rng = np.random.RandomState(3)
    n = params["batch_size"] * 8
    x = rng.normal(scale=0.3, size=(n, 32, 32, 3)).astype(np.float32)
    y = np.zeros((n, 32, 32), np.int32)
    for i in range(n):  # random rectangles of classes 1..3 on background 0
        for c in range(1, params["num_classes"]):
            r, s = rng.randint(0, 24, size=2)
            h, w = rng.randint(4, 9, size=2)
            y[i, r:r + h, s:s + w] = c
            x[i, r:r + h, s:s + w, c - 1] += 1.0
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(params["batch_size"], drop_remainder=True)


def conv(x, f):
    return tf.keras.layers.Conv2D(f, 3, padding="same", activation="relu")(x)


def fcn_segmentation(features, labels, mode, params):
    tf.keras.mixed_precision.set_global_policy(params.get("policy", "mixed_float16"))
    k = params["num_classes"]
    c1 = conv(conv(features, 16), 16)
    p1 = tf.keras.layers.MaxPooling2D(2)(c1)          # 16x16
    c2 = conv(conv(p1, 32), 32)
    p2 = tf.keras.layers.MaxPooling2D(2)(c2)          # 8x8
    c3 = conv(conv(p2, 64), 64)
    p3 = tf.keras.layers.MaxPooling2D(2)(c3)          # 4x4
    c4 = conv(p3, 128)
    score4 = tf.keras.layers.Conv2D(k, 1)(c4)
    score3 = tf.keras.layers.Conv2D(k, 1)(p2)
    score2 = tf.keras.layers.Conv2D(k, 1)(p1)
    up = tf.keras.layers.Conv2DTranspose(k, 4, strides=2, padding="same")(score4) + score3
    up = tf.keras.layers.Conv2DTranspose(k, 4, strides=2, padding="same")(up) + score2
    up = tf.keras.layers.Conv2DTranspose(k, 4, strides=2, padding="same")(up)   # 32x32
    logits = tf.keras.layers.Activation("linear", dtype="float32")(up)
    classes = tf.argmax(logits, axis=-1, output_type=tf.int32)
    predictions = {"classes": classes, "probabilities": tf.nn.softmax(logits)}
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode=mode, predictions=predictions)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    train_op = None
    if mode == ModeKeys.TRAIN:
        global_step = tf.compat.v1.train.get_or_create_global_step()
        lr = tf.compat.v1.train.polynomial_decay(params["learning_rate"], global_step,
                                                 params["total_steps"], end_learning_rate=0.0,
                                                 power=0.9)
        opt = tf.compat.v1.train.MomentumOptimizer(lr, params["momentum"])
        if params.get("policy", "mixed_float16") == "mixed_float16":
            opt = tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer(
                opt, params["loss_scale"])
        train_op = opt.minimize(loss, global_step=global_step)
    metrics = {"mean_iou": tf.compat.v1.metrics.mean_iou(labels, classes, k),
               "pixel_accuracy": tf.compat.v1.metrics.accuracy(labels, classes)}
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op, predictions=predictions,
                           eval_metric_ops=metrics)


# unseen25's transformer_seq2seq

seq2seq_params = {"batch_size": 16, "vocab": 64, "src_len": 12, "tgt_len": 13, "d_model": 64,
          "heads": 4, "ff": 128, "layers": 1, "dropout": 0.1, "warmup_steps": 400,
          "label_smoothing": 0.1, "loss_scale": 128.0, "policy": "mixed_float16"}
BOS, EOS = 1, 2


def seq2seq_input_fn(params):
    rng = np.random.RandomState(19)
    n, S, T, V = 512, params["src_len"], params["tgt_len"], params["vocab"]
    src = np.zeros((n, S), np.int32); tin = np.zeros((n, T), np.int32); tout = np.zeros((n, T), np.int32)
    for i in range(n):
        k = rng.randint(4, S + 1)
        s = rng.randint(3, V, size=k)
        t = (s[::-1] - 3 + 5) % (V - 3) + 3
        src[i, :k] = s
        tin[i, 0] = BOS; tin[i, 1:k + 1] = t
        tout[i, :k] = t; tout[i, k] = EOS
    ds = tf.data.Dataset.from_tensor_slices(({"source": src, "target_in": tin}, tout))
    return ds.repeat().batch(params["batch_size"], drop_remainder=True)


def positional(length, d):
    pos = np.arange(length)[:, None]; i = np.arange(d)[None, :]
    angle = pos / np.power(10000.0, (2 * (i // 2)) / d)
    return np.where(i % 2 == 0, np.sin(angle), np.cos(angle)).astype(np.float32)


def transformer_seq2seq(features, labels, mode, params):
    tf.keras.mixed_precision.set_global_policy(params.get("policy", "mixed_float16"))
    training = mode == ModeKeys.TRAIN
    d, h, rate = params["d_model"], params["heads"], params["dropout"]
    src, tgt = features["source"], features["target_in"]
    S, T = params["src_len"], params["tgt_len"]
    embed = tf.keras.layers.Embedding(params["vocab"], d, name="shared_embedding")
    drop = lambda t: tf.keras.layers.Dropout(rate)(t, training=training)

    def embed_seq(ids, L):
        e = embed(ids) * (d ** 0.5)
        return drop(e + tf.cast(positional(L, d), e.dtype))

    src_keep = tf.not_equal(src, 0)
    enc_mask = src_keep[:, None, :] & tf.ones([1, S, 1], tf.bool)
    x = embed_seq(src, S)
    for l in range(params["layers"]):
        a = tf.keras.layers.MultiHeadAttention(h, d // h, dropout=rate, name=f"enc{l}_att")(
            x, x, attention_mask=enc_mask, training=training)
        x = tf.keras.layers.LayerNormalization(name=f"enc{l}_ln1")(x + drop(a))
        f = tf.keras.layers.Dense(params["ff"], activation="relu", name=f"enc{l}_ff1")(x)
        x = tf.keras.layers.LayerNormalization(name=f"enc{l}_ln2")(
            x + drop(tf.keras.layers.Dense(d, name=f"enc{l}_ff2")(f)))

    cross_mask = src_keep[:, None, :] & tf.ones([1, T, 1], tf.bool)
    y = embed_seq(tgt, T)
    for l in range(params["layers"]):
        a = tf.keras.layers.MultiHeadAttention(h, d // h, dropout=rate, name=f"dec{l}_self")(
            y, y, use_causal_mask=True, training=training)
        y = tf.keras.layers.LayerNormalization(name=f"dec{l}_ln1")(y + drop(a))
        a = tf.keras.layers.MultiHeadAttention(h, d // h, dropout=rate, name=f"dec{l}_cross")(
            y, x, attention_mask=cross_mask, training=training)
        y = tf.keras.layers.LayerNormalization(name=f"dec{l}_ln2")(y + drop(a))
        f = tf.keras.layers.Dense(params["ff"], activation="relu", name=f"dec{l}_ff1")(y)
        y = tf.keras.layers.LayerNormalization(name=f"dec{l}_ln3")(
            y + drop(tf.keras.layers.Dense(d, name=f"dec{l}_ff2")(f)))
    logits = tf.cast(tf.matmul(y, tf.cast(embed.embeddings, y.dtype), transpose_b=True), tf.float32)

    predictions = {"tokens": tf.argmax(logits, -1, output_type=tf.int32)}
    loss = train_op = eval_metric_ops = None
    if mode != ModeKeys.PREDICT:
        weights = tf.cast(tf.not_equal(labels, 0), tf.float32)
        loss = tf.compat.v1.losses.softmax_cross_entropy(
            tf.one_hot(labels, params["vocab"]), logits, weights=weights,
            label_smoothing=params["label_smoothing"])
        eval_metric_ops = {"token_accuracy": tf.compat.v1.metrics.accuracy(
            labels, predictions["tokens"], weights=weights)}
        if training:
            gs = tf.compat.v1.train.get_or_create_global_step()
            step = tf.cast(gs, tf.float32) + 1.0
            lr = d ** -0.5 * tf.minimum(tf.math.rsqrt(step), step * params["warmup_steps"] ** -1.5)
            opt = tf.compat.v1.train.AdamOptimizer(lr, beta1=0.9, beta2=0.98, epsilon=1e-9)
            scale = params["loss_scale"]
            grads_and_vars = opt.compute_gradients(loss * scale)
            grads_and_vars = [(g / scale, v) for g, v in grads_and_vars if g is not None]
            train_op = opt.apply_gradients(grads_and_vars, global_step=gs)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op, predictions=predictions,
                           eval_metric_ops=eval_metric_ops)
