"""Models written the way users write them, tried on the compiler after the lowering landed
(each exposed a gap: Keras Conv1D, tf.nn.embedding_lookup with momentum and a huber loss,
BatchNormalization (inference) + swish + SpatialDropout + label smoothing + clip_by_norm)."""
import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec

gs = tf.compat.v1.train.get_or_create_global_step
def seq_input_fn(params):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 20, 3)).astype(np.float32)
    y = (x[:, :, 0].sum(1) > 0).astype(np.int64)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(16, drop_remainder=True)
def conv1d(features, labels, mode, params):
    h = tf.keras.layers.Conv1D(8, 3, activation="relu", padding="same")(features)
    h = tf.keras.layers.GlobalMaxPooling1D()(h)
    logits = tf.keras.layers.Dense(2)(h)
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
    opt = tf.compat.v1.train.RMSPropOptimizer(1e-3)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=opt.minimize(loss, global_step=gs()))
def emb_input_fn(params):
    rng = np.random.default_rng(1)
    x = rng.integers(0, 30, size=(64, 6)).astype(np.int32)
    y = rng.normal(size=(64, 1)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(16, drop_remainder=True)
def bag_of_words(features, labels, mode, params):
    table = tf.compat.v1.get_variable("table", [30, 4])
    e = tf.nn.embedding_lookup(table, features)
    h = tf.reduce_sum(e, axis=1)
    w = tf.compat.v1.get_variable("w", [4, 1])
    pred = tf.matmul(h, w)
    loss = tf.compat.v1.losses.huber_loss(labels, pred)
    grads = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9).compute_gradients(loss)
    train_op = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9).apply_gradients(grads, global_step=gs())
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op)
def img_input_fn(params):
    rng = np.random.default_rng(2)
    x = rng.normal(size=(32, 8, 8, 3)).astype(np.float32)
    y = (np.arange(32) % 4).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(8, drop_remainder=True)
def cnn_bn(features, labels, mode, params):
    h = tf.keras.layers.Conv2D(4, 3, padding="same", use_bias=False)(features)
    h = tf.keras.layers.BatchNormalization()(h, training=False)
    h = tf.keras.layers.Activation("swish")(h)
    h = tf.keras.layers.SpatialDropout2D(0.0)(h)
    h = tf.keras.layers.GlobalAveragePooling2D()(h)
    logits = tf.keras.layers.Dense(4)(h)
    loss = tf.compat.v1.losses.softmax_cross_entropy(tf.one_hot(labels, 4), logits, label_smoothing=0.1)
    opt = tf.compat.v1.train.AdamOptimizer(1e-3)
    gv = opt.compute_gradients(loss)
    gv = [(tf.clip_by_norm(g, 1.0), v) for g, v in gv]
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=opt.apply_gradients(gv, global_step=gs()))
