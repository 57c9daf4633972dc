"""Tabular and recommender models written the Estimator way (issue 21): features a dict of
tensors from input_fn, turned into one dense input by
`tf.compat.v1.feature_column.input_layer(features, columns)` (TF 2.21 has no
tf.keras.layers.DenseFeatures) with numeric, bucketized, identity, hashed, vocabulary,
embedding (combiner mean, sum, sqrtn), indicator and crossed columns; wide & deep, DCN
cross layers, DeepFM's second-order interactions, two towers over multi-hot ids, a
sequence of ids mean-pooled, CTR and CVR heads, class weights, a Tweedie claims model."""
import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

L = tf.keras.layers
v1 = tf.compat.v1
fc = v1.feature_column
gs = v1.train.get_or_create_global_step


def input_fn(params):
    """32 policy holders / users: numbers, categorical ids, multi-hot ids padded with -1 (a
    sample may have none), a click, a conversion and a claim amount."""
    rng = np.random.default_rng(params.get("data_seed", 7))
    n = 32
    tags = rng.integers(0, 6, size=(n, 3)).astype(np.int64)
    tags[rng.random((n, 3)) < 0.3] = -1
    tags[0] = -1  # no tag at all
    items = rng.integers(0, 12, size=(n, 4)).astype(np.int32)
    items[rng.random((n, 4)) < 0.25] = -1
    features = {"age": rng.uniform(18, 80, n).astype(np.float32),
                "dense": rng.normal(size=(n, 4)).astype(np.float32),
                "city": rng.integers(0, 10, n).astype(np.int32),
                "device": rng.integers(0, 5, n).astype(np.int64),
                "user": rng.integers(0, 20, n).astype(np.int32),
                "tags": tags, "items": items}
    click = (features["dense"][:, 0] + 0.3 * (features["city"] % 3) > 0.4).astype(np.int32)
    labels = {"click": click, "buy": (click * (rng.random(n) < 0.5)).astype(np.float32),
              "claim": (rng.random(n) < 0.4) * rng.gamma(2.0, 50.0, n).astype(np.float32)}
    labels["claim"] = labels["claim"].astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((features, labels)).batch(8, drop_remainder=True)


def _numeric():
    return [fc.numeric_column("dense", shape=(4,)),
            fc.bucketized_column(fc.numeric_column("age"), [25.0, 35.0, 50.0, 65.0])]


def _city(n=10):
    return fc.categorical_column_with_identity("city", n)


def _spec(mode, loss, metrics, optimizer=None):
    if mode == ModeKeys.TRAIN:
        optimizer = optimizer or v1.train.AdamOptimizer(1e-2)
        return CSEstimatorSpec(mode=mode, loss=loss,
                               train_op=optimizer.minimize(loss, global_step=gs()))
    return CSEstimatorSpec(mode=mode, loss=loss, eval_metric_ops=metrics)


def _ctr(mode, labels, logit, optimizer=None):
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode=mode, predictions={"p_click": tf.sigmoid(logit)})
    y = tf.cast(tf.reshape(labels["click"], [-1, 1]), tf.float32)
    loss = v1.losses.sigmoid_cross_entropy(y, logit)
    return _spec(mode, loss, {"auc_proxy": v1.metrics.accuracy(y, tf.cast(logit > 0, tf.float32))}
                 if mode == ModeKeys.EVAL else {}, optimizer)


def numeric_bucketized(features, labels, mode, params):
    """Logistic regression on a numeric and a bucketized column."""
    return _ctr(mode, labels, L.Dense(1)(fc.input_layer(features, _numeric())))


def indicator(features, labels, mode, params):
    """One-hot (indicator) columns of identity ids, a single and a multi-hot one, in a DNN."""
    columns = _numeric() + [fc.indicator_column(_city()),
                            fc.indicator_column(fc.categorical_column_with_identity("tags", 6))]
    h = L.Dense(8, activation="relu")(fc.input_layer(features, columns))
    return _ctr(mode, labels, L.Dense(1)(h))


def embedding_mean(features, labels, mode, params):
    """An embedding column of one id per sample (mean, the default combiner), SGD."""
    columns = _numeric() + [fc.embedding_column(_city(), 4)]
    h = L.Dense(8, activation="relu")(fc.input_layer(features, columns))
    return _ctr(mode, labels, L.Dense(1)(h), v1.train.GradientDescentOptimizer(0.1))


def embedding_sqrtn(features, labels, mode, params):
    """Multi-hot tags (-1 pads, one sample with none) in an embedding column, sqrtn, Adagrad."""
    columns = _numeric() + [fc.embedding_column(fc.categorical_column_with_identity("tags", 6), 3,
                                                combiner="sqrtn")]
    h = L.Dense(8, activation="relu")(fc.input_layer(features, columns))
    return _ctr(mode, labels, L.Dense(1)(h), v1.train.AdagradOptimizer(0.1))


def sequence_mean_pool(features, labels, mode, params):
    """A user's last items (ids padded with -1) mean-pooled by an embedding column (sum
    combiner then divided here), with class weights gathered by the label, momentum."""
    items = fc.categorical_column_with_identity("items", 12)
    pooled = fc.input_layer(features, [fc.embedding_column(items, 4, combiner="sum")])
    count = tf.reduce_sum(tf.cast(features["items"] >= 0, tf.float32), 1, keepdims=True)
    h = L.Dense(8, activation="relu")(tf.concat([pooled / tf.maximum(count, 1.0),
                                                 features["dense"]], 1))
    logits = L.Dense(2)(h)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode=mode, predictions={"click": tf.argmax(logits, 1)})
    weights = tf.gather(tf.constant([1.0, 2.5]), labels["click"])
    loss = v1.losses.sparse_softmax_cross_entropy(labels["click"], logits, weights=weights)
    return _spec(mode, loss, {"accuracy": v1.metrics.accuracy(labels["click"], tf.argmax(logits, 1))}
                 if mode == ModeKeys.EVAL else {}, v1.train.MomentumOptimizer(0.05, 0.9))


def hash_bucket(features, labels, mode, params):
    """An integer id hashed into buckets (TF hashes its decimal string)."""
    device = fc.categorical_column_with_hash_bucket("device", 7, dtype=tf.int64)
    columns = _numeric() + [fc.embedding_column(device, 3)]
    return _ctr(mode, labels, L.Dense(1)(fc.input_layer(features, columns)))


def vocabulary_list(features, labels, mode, params):
    """Ids mapped through a vocabulary list (a lookup table)."""
    device = fc.categorical_column_with_vocabulary_list("device", [4, 2, 0], dtype=tf.int64)
    columns = _numeric() + [fc.indicator_column(device)]
    return _ctr(mode, labels, L.Dense(1)(fc.input_layer(features, columns)))


def crossed(features, labels, mode, params):
    """A crossed column of age buckets and city, one-hot, in a linear model."""
    cross = fc.crossed_column([fc.bucketized_column(fc.numeric_column("age"), [30.0, 50.0]),
                               "city"], 16)
    columns = _numeric() + [fc.indicator_column(cross)]
    return _ctr(mode, labels, L.Dense(1)(fc.input_layer(features, columns)))


def linear_model(features, labels, mode, params):
    """tf.compat.v1.feature_column.linear_model: a weighted sum of sparse columns."""
    logit = fc.linear_model(features, _numeric() + [_city()])
    return _ctr(mode, labels, logit)


def wide_and_deep(features, labels, mode, params):
    """Wide: one-hot city and device in a linear layer; deep: embeddings and numbers in a DNN;
    the logits added."""
    device = fc.categorical_column_with_identity("device", 5)
    wide = L.Dense(1, use_bias=False)(fc.input_layer(
        features, [fc.indicator_column(_city()), fc.indicator_column(device)]))
    deep_in = fc.input_layer(features, _numeric() + [fc.embedding_column(_city(), 4),
                                                     fc.embedding_column(device, 2)])
    deep = L.Dense(1)(L.Dense(8, activation="relu")(L.Dense(16, activation="relu")(deep_in)))
    return _ctr(mode, labels, wide + deep, v1.train.FtrlOptimizer(0.1) if params.get("ftrl") else None)


def dcn(features, labels, mode, params):
    """Deep & Cross: two cross layers x0 * (x . w) + b + x beside a DNN."""
    x0 = fc.input_layer(features, _numeric() + [fc.embedding_column(_city(), 3)])
    x = x0
    for i in range(2):
        w = v1.get_variable(f"cross_w{i}", [x0.shape[1], 1])
        b = v1.get_variable(f"cross_b{i}", [x0.shape[1]], initializer=v1.zeros_initializer())
        x = x0 * tf.matmul(x, w) + b + x
    deep = L.Dense(8, activation="relu")(x0)
    return _ctr(mode, labels, L.Dense(1)(tf.concat([x, deep], 1)))


def deepfm(features, labels, mode, params):
    """DeepFM: per-field embeddings of one size, FM's second order 0.5 ((sum v)^2 - sum v^2),
    a first-order linear part and a DNN over the same embeddings."""
    fields = [_city(), fc.categorical_column_with_identity("device", 5),
              fc.categorical_column_with_identity("user", 20)]
    emb = tf.stack([fc.input_layer(features, [fc.embedding_column(c, 4)]) for c in fields], 1)
    second = 0.5 * tf.reduce_sum(tf.square(tf.reduce_sum(emb, 1)) - tf.reduce_sum(tf.square(emb), 1),
                                 1, keepdims=True)
    first = L.Dense(1)(fc.input_layer(features, [fc.indicator_column(c) for c in fields]))
    deep = L.Dense(1)(L.Dense(8, activation="relu")(tf.reshape(emb, [-1, 12])))
    return _ctr(mode, labels, first + second + deep)


def two_tower(features, labels, mode, params):
    """A user tower (user id and numbers) and an item tower (multi-hot item ids, mean), their
    normalized dot product a click's logit."""
    user = L.Dense(8)(fc.input_layer(features, [fc.embedding_column(
        fc.categorical_column_with_identity("user", 20), 6), fc.numeric_column("dense", shape=(4,))]))
    item = L.Dense(8)(fc.input_layer(features, [fc.embedding_column(
        fc.categorical_column_with_identity("items", 12), 6, combiner="mean")]))
    logit = 5.0 * tf.reduce_sum(tf.nn.l2_normalize(user, 1) * tf.nn.l2_normalize(item, 1), 1,
                                keepdims=True)
    return _ctr(mode, labels, logit)


def multi_task(features, labels, mode, params):
    """ESMM: shared feature columns, a CTR and a CVR tower, pCTCVR = pCTR * pCVR."""
    x = fc.input_layer(features, _numeric() + [fc.embedding_column(_city(), 4),
                                               fc.indicator_column(fc.categorical_column_with_identity("device", 5))])
    ctr = L.Dense(1)(L.Dense(8, activation="relu")(x))
    cvr = L.Dense(1)(L.Dense(8, activation="relu")(x))
    click = tf.cast(tf.reshape(labels["click"], [-1, 1]), tf.float32)
    buy = tf.reshape(labels["buy"], [-1, 1])
    p_ctcvr = tf.sigmoid(ctr) * tf.sigmoid(cvr)
    loss = v1.losses.sigmoid_cross_entropy(click, ctr) + v1.losses.log_loss(buy, p_ctcvr)
    return _spec(mode, loss, {"ctcvr": v1.metrics.mean_absolute_error(buy, p_ctcvr)}
                 if mode == ModeKeys.EVAL else {})


def tweedie_claims(features, labels, mode, params):
    """Insurance claims: a Tweedie (p = 1.5) deviance on log mu from embedding, indicator and
    numeric columns (issue 21's refused model)."""
    columns = _numeric() + [fc.embedding_column(_city(), 3),
                            fc.indicator_column(fc.categorical_column_with_identity("device", 5)),
                            fc.embedding_column(fc.categorical_column_with_identity("tags", 6), 2,
                                                combiner="sum")]
    log_mu = L.Dense(1)(L.Dense(8, activation="relu")(fc.input_layer(features, columns)))
    y, p = tf.reshape(labels["claim"], [-1, 1]), 1.5
    loss = tf.reduce_mean(-y * tf.exp((1 - p) * log_mu) / (1 - p) + tf.exp((2 - p) * log_mu) / (2 - p))
    return _spec(mode, loss, {"mae": v1.metrics.mean_absolute_error(y, tf.exp(log_mu))}
                 if mode == ModeKeys.EVAL else {})


MODELS = [numeric_bucketized, indicator, embedding_mean, embedding_sqrtn, sequence_mean_pool,
          hash_bucket, vocabulary_list, crossed, linear_model, wide_and_deep, dcn, deepfm,
          two_tower, multi_task, tweedie_claims]


def default_id(features, labels, mode, params):
    """Identity columns with a default id for ids outside [0, n) (devices 0..4 in 4 buckets,
    cities 0..9 in 8), one-hot and embedded, into a DNN."""
    device = fc.categorical_column_with_identity("device", 4, default_value=3)
    tags = fc.categorical_column_with_identity("tags", 5, default_value=0)
    city = fc.categorical_column_with_identity("city", 8, default_value=7)  # int32
    columns = _numeric() + [fc.indicator_column(device), fc.embedding_column(tags, 3),
                            fc.embedding_column(city, 2)]
    h = L.Dense(8, activation="relu")(fc.input_layer(features, columns))
    return _ctr(mode, labels, L.Dense(1)(h))


MODELS.append(default_id)
