"""Models computing on rows folded into the batch with einsums, argmax and constant-index
gathers, as users write them: a PatchTST encoder (each channel's series framed into patches by
tf.signal.frame, Keras MultiHeadAttention over the patches, channels folded into the batch:
channel independence) and a Switch-style per-token router ([batch * T, d] tokens, argmax
routing to one expert) with a per-token classifier."""
import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

L = tf.keras.layers
v1 = tf.compat.v1
gs = v1.train.get_or_create_global_step
CHANNELS, LENGTH, PATCH, D = 3, 16, 4, 8
TOKENS, WIDTH, EXPERTS, CLASSES = 6, 8, 3, 5


def series_input_fn(params):
    """3-channel series of 16 steps; the target is the next step's mean."""
    rng = np.random.default_rng(21)
    x = rng.normal(size=(64, LENGTH, CHANNELS)).astype(np.float32)
    y = x[:, -4:, :].mean((1, 2))[:, None].astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(8, drop_remainder=True)


def patchtst(features, labels, mode, params):
    """PatchTST: channels folded into the batch, patches by tf.signal.frame, a linear patch
    embedding plus learned positions, one pre-norm Keras MultiHeadAttention block, a flatten
    head per channel, the channels' forecasts averaged."""
    x = tf.transpose(features, [0, 2, 1])                      # [B, C, L]
    x = tf.reshape(x, [-1, LENGTH])                            # [B*C, L]
    patches = tf.signal.frame(x, PATCH, PATCH, axis=-1)        # [B*C, P, PATCH]
    n = LENGTH // PATCH
    h = L.Dense(D)(patches)
    position = v1.get_variable("position", [n, D], initializer=v1.random_normal_initializer(0, 0.1))
    h = h + position
    a = L.MultiHeadAttention(num_heads=2, key_dim=4, name="enc_mha")(
        L.LayerNormalization()(h), L.LayerNormalization()(h))
    h = h + a
    h = h + L.Dense(D)(L.Dense(16, activation="gelu")(L.LayerNormalization()(h)))
    per_channel = L.Dense(1)(tf.reshape(h, [-1, n * D]))       # [B*C, 1]
    forecast = tf.reduce_mean(tf.reshape(per_channel, [-1, CHANNELS]), 1, keepdims=True)
    loss = v1.losses.mean_squared_error(labels, forecast)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"forecast": forecast})
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss, eval_metric_ops={
            "mae": v1.metrics.mean_absolute_error(labels, forecast)})
    return CSEstimatorSpec(mode, loss=loss,
                           train_op=v1.train.AdamOptimizer(3e-3).minimize(loss, global_step=gs()))


def tokens_input_fn(params):
    """Sequences of 6 tokens of 8 features, each token's class from its features."""
    rng = np.random.default_rng(22)
    x = rng.normal(size=(64, TOKENS, WIDTH)).astype(np.float32)
    y = (np.argmax(x[:, :, :CLASSES], -1)).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(8, drop_remainder=True)


def switch_router(features, labels, mode, params):
    """A Switch layer's top-1 router per token over [B*T, d] (argmax, the chosen expert's gate
    probability), then a per-token classifier, sparse softmax cross-entropy per token, its
    mean over the tokens reshaped back to [B, T] or over the B*T tokens; predictions and accuracy of the logits reshaped back to [B, T, classes]."""
    tokens = tf.reshape(features, [-1, WIDTH])                 # [B*T, d]
    probs = tf.nn.softmax(L.Dense(EXPERTS, name="router")(tokens), -1)
    choice = tf.argmax(probs, -1)
    gate = tf.reduce_max(probs, -1, keepdims=True)
    experts = tf.reshape(L.Dense(EXPERTS * 16, activation="relu")(tokens), [-1, EXPERTS, 16])
    routed = tf.reduce_sum(experts * tf.one_hot(choice, EXPERTS)[:, :, None], 1) * gate
    logits = L.Dense(CLASSES)(routed)
    if params.get("top_k"):
        logits = logits + tf.reduce_sum(tf.math.top_k(logits, 2).values, -1, keepdims=True)
    if params.get("losses"):  # tf.compat.v1.losses' mean over the B*T tokens
        loss = v1.losses.sparse_softmax_cross_entropy(tf.reshape(labels, [-1]), logits)
    else:
        per_token = tf.nn.sparse_softmax_cross_entropy_with_logits(tf.reshape(labels, [-1]),
                                                                   logits)
        loss = tf.reduce_mean(tf.reshape(per_token, [-1, TOKENS]))
    predicted = tf.argmax(tf.reshape(logits, [-1, TOKENS, CLASSES]), -1, output_type=tf.int32)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"classes": predicted})
    if mode == ModeKeys.EVAL:
        metrics = {"accuracy": v1.metrics.accuracy(labels, predicted)}
        if params.get("loss_metric"):  # the host would recompute it from the folded tokens'
            metrics["xent"] = v1.metrics.mean(loss)
            loss = loss + 1e-3 * tf.reduce_mean(tf.square(gate))
        return CSEstimatorSpec(mode, loss=loss, eval_metric_ops=metrics)
    return CSEstimatorSpec(mode, loss=loss,
                           train_op=v1.train.AdamOptimizer(3e-3).minimize(loss, global_step=gs()))


def switch_capacity(features, labels, mode, params):
    """The Switch router's capacity: each token's position among its expert's tokens, a
    cumulative sum over the B*T tokens (every sample's tokens together: refused)."""
    tokens = tf.reshape(features, [-1, WIDTH])
    mask = tf.one_hot(tf.argmax(L.Dense(EXPERTS, name="router")(tokens), -1), EXPERTS)
    kept = tf.cast(tf.math.cumsum(mask, axis=0) * mask <= 4.0, tf.float32) * mask
    logits = L.Dense(CLASSES)(tf.concat([tokens, kept], -1))
    loss = v1.losses.sparse_softmax_cross_entropy(tf.reshape(labels, [-1]), logits)
    return CSEstimatorSpec(mode, loss=loss,
                           train_op=v1.train.AdamOptimizer(3e-3).minimize(loss, global_step=gs()))
