"""Small tabular models written the way users write them, with the ops issue 21's unseen
tabular models needed: a hashed feature cross (tf.math.floormod of integer ids) with class
weights (tf.gather of a constant by label), ordinal regression with cut-points
tf.cumsum(tf.nn.softplus(raw)), and features made with tf.cumsum (exclusive, reverse),
tf.math.floormod of floats, tf.floor/ceil/round, tf.math.divide_no_nan, tf.reduce_prod,
numbers bucketized (Keras Discretization, tf.raw_ops.Bucketize) into embeddings; and what
stays refused (a Keras optimizer, a string feature, a Cox
partial likelihood's sort of the batch); TabNet with a hand-written sparsemax (tf.sort and
tf.cumsum along the features)."""
import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

L = tf.keras.layers
v1 = tf.compat.v1
gs = v1.train.get_or_create_global_step


def categorical_input_fn(params):
    rng = np.random.default_rng(params.get("data_seed", 2))
    a = rng.integers(0, 5, size=32).astype(np.int32)
    b = rng.integers(0, 4, size=32).astype(np.int32)
    num = rng.normal(size=(32, 3)).astype(np.float32)
    y = (((a + b) % 3 == 0) ^ (num[:, 0] > 0)).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices(({"a": a, "b": b, "num": num}, y)).batch(
        8, drop_remainder=True)


def ordinal_input_fn(params):
    rng = np.random.default_rng(params.get("data_seed", 3))
    x = rng.normal(size=(32, 6)).astype(np.float32)
    y = np.digitize(x[:, 0] + 0.5 * x[:, 1], [-1.0, 0.0, 1.0]).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(8, drop_remainder=True)


def regression_input_fn(params):
    rng = np.random.default_rng(params.get("data_seed", 4))
    x = (2 * rng.normal(size=(32, 6))).astype(np.float32)
    y = (np.sin(x[:, :1]) + 0.1 * x[:, 1:2] ** 2).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(8, drop_remainder=True)


def _spec(mode, loss, train_op, metrics):
    if mode == ModeKeys.TRAIN:
        return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op())
    return CSEstimatorSpec(mode=mode, loss=loss, eval_metric_ops=metrics)


def hashed_cross(features, labels, mode, params):
    """Wide & deep with a hashed cross of two categorical ids (floormod into 11 buckets),
    per-class loss weights gathered from a constant, trained with FTRL."""
    cross = tf.math.floormod(features["a"] * 131 + features["b"] * 17, 11)
    wide = L.Dense(2, use_bias=False)(tf.one_hot(cross, 11))
    deep = L.Dense(2)(L.Dense(8, activation="relu")(
        tf.concat([L.Embedding(11, 4)(cross), features["num"]], axis=1)))
    logits = wide + deep
    class_weights = tf.gather(tf.constant([1.0, 3.0]), labels)
    reduction = params.get("reduction", v1.losses.Reduction.SUM_OVER_BATCH_SIZE)
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits, weights=class_weights,
                                                  reduction=reduction)
    return _spec(mode, loss, lambda: v1.train.FtrlOptimizer(0.1).minimize(loss, global_step=gs()),
                 {"accuracy": v1.metrics.accuracy(labels, tf.argmax(logits, 1))})


def ordinal(features, labels, mode, params):
    """Cumulative-link ordinal regression: ordered cut-points tf.cumsum(tf.nn.softplus(raw))
    (computed on the CS's weight program), P(y <= k) = sigmoid(cut_k - score)."""
    score = L.Dense(1)(L.Dense(8, activation="relu")(features))
    raw = v1.get_variable("cut_raw", [3], initializer=v1.constant_initializer([0.1, 0.5, 0.5]))
    cuts = tf.cumsum(tf.nn.softplus(raw)) - 1.0
    cdf = tf.sigmoid(cuts - score)
    targets = tf.cast(tf.expand_dims(labels, 1) <= tf.range(3), tf.float32)
    loss = v1.losses.log_loss(targets, cdf)
    predicted = tf.reduce_sum(tf.cast(cdf < 0.5, tf.int32), 1)
    return _spec(mode, loss, lambda: v1.train.AdamOptimizer(1e-2).minimize(loss, global_step=gs()),
                 {"accuracy": v1.metrics.accuracy(labels, predicted)})


def rounded_features(features, labels, mode, params):
    """Running sums of a hidden layer (tf.cumsum reverse and exclusive), a periodic feature
    (tf.math.floormod of floats, whose gradient flows), tf.floor, tf.math.ceil and
    tf.math.divide_no_nan of the inputs, a straight-through tf.round and a noisy-OR's
    tf.reduce_prod."""
    h = L.Dense(6, activation="tanh")(features)
    sums = tf.cumsum(h, axis=-1, reverse=True) + tf.cumsum(h, axis=1, exclusive=True)
    period = tf.math.floormod(L.Dense(6)(features), 1.7)
    steps = tf.floor(features) + tf.math.divide_no_nan(tf.math.ceil(features * 0.5),
                                                       tf.round(features))
    rounded = h + tf.stop_gradient(tf.round(h * 4.0) / 4.0 - h)
    none = tf.reduce_prod(1.0 - tf.sigmoid(h), axis=1, keepdims=True)  # a noisy-OR's complement
    out = L.Dense(1)(tf.concat([sums, period, steps, rounded, none], 1))
    loss = v1.losses.huber_loss(labels, out)
    return _spec(mode, loss, lambda: v1.train.AdamOptimizer(1e-2).minimize(loss, global_step=gs()),
                 {"mae": v1.metrics.mean_absolute_error(labels, out)})


def bucketized(features, labels, mode, params):
    """Numbers in buckets: Keras Discretization into an Embedding, tf.raw_ops.Bucketize one-hot."""
    ages = L.Discretization(bin_boundaries=[-1.0, -0.25, 0.0, 0.5, 1.0])(features[:, :2])
    edges = tf.raw_ops.Bucketize(input=features[:, 2:4], boundaries=[-0.5, 0.0, 0.5])
    h = tf.concat([tf.reshape(L.Embedding(6, 3)(ages), [-1, 6]),
                   tf.reshape(tf.one_hot(edges, 4), [-1, 8]), features[:, 4:]], axis=1)
    pred = L.Dense(1)(L.Dense(8, activation="relu")(h))
    loss = v1.losses.mean_squared_error(labels, pred)
    return _spec(mode, loss, lambda: v1.train.AdamOptimizer(1e-2).minimize(loss, global_step=gs()),
                 {"mae": v1.metrics.mean_absolute_error(labels, pred)} if mode == ModeKeys.EVAL else {})


def string_input_fn(params):
    words = np.array(["apple", "pear", "plum", "fig"])[np.arange(32) % 4]
    return tf.data.Dataset.from_tensor_slices(({"word": words}, np.arange(32) % 2)).batch(
        8, drop_remainder=True)


def string_feature(features, labels, mode, params):
    ids = tf.strings.to_hash_bucket_fast(features["word"], 10)
    logits = L.Dense(2)(L.Embedding(10, 4)(ids))
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    return _spec(mode, loss, lambda: v1.train.AdamOptimizer(1e-2).minimize(loss, global_step=gs()),
                 {})


def keras_optimizer(features, labels, mode, params):
    """A Keras optimizer in an Estimator model_fn (TF 2.21's Keras 3 builds no graph train op)."""
    logits = L.Dense(2)(features["num"])
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    optimizer = tf.keras.optimizers.Nadam(1e-2)
    return _spec(mode, loss, lambda: optimizer.minimize(loss, var_list=v1.trainable_variables()), {})


def survival_input_fn(params):
    rng = np.random.default_rng(params.get("data_seed", 5))
    x = rng.normal(size=(32, 6)).astype(np.float32)
    time = rng.exponential(np.exp(-x[:, 0])).astype(np.float32)
    event = (rng.random(32) < 0.7).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((x, np.stack([time, event], 1))).batch(
        8, drop_remainder=True)


def cox_partial_likelihood(features, labels, mode, params):
    """DeepSurv: the Cox partial likelihood, each sample's risk against the batch's risk set
    of samples still at risk (the batch sorted by time: a loss of the whole batch)."""
    risk = tf.squeeze(L.Dense(1)(L.Dense(8, activation="relu")(features)), -1)
    order = tf.argsort(labels[:, 0], direction="DESCENDING")
    risk, event = tf.gather(risk, order), tf.gather(labels[:, 1], order)
    log_risk_set = tf.math.log(tf.cumsum(tf.exp(risk)))
    loss = -tf.reduce_sum((risk - log_risk_set) * event) / tf.maximum(tf.reduce_sum(event), 1.0)
    return _spec(mode, loss, lambda: v1.train.AdamOptimizer(0.01).minimize(loss, global_step=gs()),
                 {})


def tabnet_input_fn(params):
    rng = np.random.default_rng(13)
    x = rng.normal(size=(192, 16)).astype(np.float32)
    score = x[:, 0] * 1.5 - x[:, 3] + 0.5 * x[:, 7] * x[:, 2]
    y = np.digitize(score, [-0.7, 0.7]).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(32, drop_remainder=True).repeat()


def sparsemax(z):
    """Sparsemax (Martins & Astudillo 2016) along the last axis, written out as users do."""
    d = z.shape[-1]
    z_sorted = tf.sort(z, axis=-1, direction="DESCENDING")
    k = tf.range(1, d + 1, dtype=z.dtype)
    cums = tf.cumsum(z_sorted, axis=-1)
    support = tf.cast(1.0 + k * z_sorted > cums, z.dtype)
    k_z = tf.reduce_sum(support, axis=-1, keepdims=True)
    tau = (tf.reduce_sum(support * z_sorted, axis=-1, keepdims=True) - 1.0) / k_z
    return tf.nn.relu(z - tau)


def _glu_block(x, units, training, name, dense=None):
    dense = dense or L.Dense(2 * units, use_bias=False, name=name + "_fc")
    h = L.BatchNormalization(momentum=0.98, name=name + "_bn")(dense(x), training=training)
    return h[:, :units] * tf.sigmoid(h[:, units:])


def tabnet(features, labels, mode, params):
    """TabNet (Arik & Pfister 2021), compact: feature transformers of GLU blocks (two shared
    across the steps), attentive transformers whose sparsemax masks (tf.sort, tf.cumsum and
    the support test 1 + k z > cumsum) relax a prior by gamma, a mask-entropy regulariser,
    BatchNormalization in training, Adam with an exponential step decay (unseen28's)."""
    training = mode == ModeKeys.TRAIN
    nd = na = 16
    x = L.BatchNormalization(momentum=0.98, name="input_bn")(features, training=training)
    shared = [L.Dense(2 * (nd + na), use_bias=False, name=f"shared_fc{i}") for i in (1, 2)]

    def feature_transformer(inp, name):
        h = _glu_block(inp, nd + na, training, name + "_s1", shared[0])
        h = (h + _glu_block(h, nd + na, training, name + "_s2", shared[1])) * np.sqrt(0.5)
        return (h + _glu_block(h, nd + na, training, name + "_d1")) * np.sqrt(0.5)

    prior, out, entropy, masks = tf.ones_like(x), 0.0, 0.0, []
    a = feature_transformer(x, "ft0")[:, nd:]
    for step in range(3):
        logits = L.BatchNormalization(momentum=0.98, name=f"att_bn{step}")(
            L.Dense(16, use_bias=False, name=f"att_fc{step}")(a), training=training)
        mask = sparsemax(logits * prior)
        masks.append(mask)
        prior = prior * (1.3 - mask)
        entropy += tf.reduce_mean(tf.reduce_sum(-mask * tf.math.log(mask + 1e-10), axis=1)) / 3
        h = feature_transformer(mask * x, f"ft{step + 1}")
        out += tf.nn.relu(h[:, :nd])
        a = h[:, nd:]
    logits = L.Dense(3, name="head")(out)
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits) + 1e-3 * entropy
    lr = v1.train.exponential_decay(0.02, gs(), 2, 0.95, staircase=True)
    with tf.control_dependencies(v1.get_collection(v1.GraphKeys.UPDATE_OPS)):
        train_op = v1.train.AdamOptimizer(lr).minimize(loss, global_step=gs())
    cls = tf.argmax(logits, -1, output_type=tf.int32)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op,
                           predictions={"class": cls, "feature_importance": tf.add_n(masks) / 3},
                           eval_metric_ops={"accuracy": v1.metrics.accuracy(labels, cls)})
