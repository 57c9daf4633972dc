"""Losses that are non-linear in statistics of the whole batch, written the ordinary way: a
Mixture-of-Experts classifier with its load-balancing loss (Shazeer's importance x load,
and the coefficient of variation squared of the experts' summed gates), VICReg's variance
hinge and covariance, Barlow Twins' cross-correlation of batch-normalised embeddings, a
squared difference of the batch's mean prediction and mean target, a Pearson-correlation
loss over the batch, the entropy of the batch's mean prediction (a clustering "diversity"
term), IIC's mutual information of two views' assignments, a BPR recommender whose
loss adds tf.nn.l2_loss of the looked-up embeddings / batch, and a segmentation net's Dice
loss over the flattened batch. What the CS does not carry
out: a batch statistic of this kind feeding back into per-sample activations, a weight
inside such a loss."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec

BATCH, STEPS, CLASSES, EXPERTS = 8, 4, 3, 4


def input_fn(params):
    rng = np.random.default_rng(23)
    n = params["batch_size"] * STEPS * 2
    x = rng.normal(size=(n, 6)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int32) + (x[:, 2] > 1).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(params["batch_size"],
                                                             drop_remainder=True)


def _train(loss, params):
    optimizer = tf.compat.v1.train.AdamOptimizer(params.get("learning_rate", 0.01))
    return optimizer.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())


def _spec(mode, loss, params, metrics=None):
    if mode == "eval":
        return CSEstimatorSpec(mode=mode, loss=loss, eval_metric_ops=metrics or {})
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=_train(loss, params))


def _experts(features):
    """A softmax gate over EXPERTS Dense experts, mixed: (gates, logits)."""
    gates = tf.nn.softmax(tf.keras.layers.Dense(EXPERTS)(features))
    outputs = tf.stack([tf.keras.layers.Dense(CLASSES)(features) for _ in range(EXPERTS)], 1)
    logits = tf.reduce_sum(gates[:, :, None] * outputs, axis=1)
    return gates, logits


def moe_balance_model_fn(features, labels, mode, params):
    """Switch/GShard-style balance: the batch's mean gate times the share of samples routed
    to each expert (its top-1), summed and scaled by the number of experts."""
    gates, logits = _experts(features)
    importance = tf.reduce_mean(gates, 0)
    mask = tf.one_hot(tf.math.top_k(gates, 1).indices[:, 0], EXPERTS)
    load = tf.reduce_mean(tf.cast(mask, tf.float32), 0)
    aux = EXPERTS * tf.reduce_sum(importance * load)
    ce = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    loss = ce + 0.1 * aux
    metrics = {"balance": tf.compat.v1.metrics.mean(aux),
               "accuracy": tf.compat.v1.metrics.accuracy(labels, tf.math.top_k(logits, 1).indices[:, 0])}
    return _spec(mode, loss, params, metrics)


def moe_penalised_model_fn(features, labels, mode, params):
    """The balance loss with Keras L2 regularizers on the experts and the gate, added as
    users add them (model.losses)."""
    regularizer = tf.keras.regularizers.L2(1e-3)
    gate = tf.keras.layers.Dense(EXPERTS, kernel_regularizer=regularizer)
    experts = [tf.keras.layers.Dense(CLASSES, kernel_regularizer=regularizer)
               for _ in range(EXPERTS)]
    gates = tf.nn.softmax(gate(features))
    logits = tf.reduce_sum(gates[:, :, None] * tf.stack([e(features) for e in experts], 1), 1)
    importance = tf.reduce_mean(gates, 0)
    load = tf.reduce_mean(tf.one_hot(tf.math.top_k(gates, 1).indices[:, 0], EXPERTS), 0)
    penalty = tf.add_n(gate.losses + [w for e in experts for w in e.losses])
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits) + \
        0.1 * EXPERTS * tf.reduce_sum(importance * load) + penalty
    return _spec(mode, loss, params)


def learned_temperature_model_fn(features, labels, mode, params):
    """The entropy of the batch's mean prediction at a learned temperature: a weight inside
    a loss of the whole batch."""
    logits = tf.keras.layers.Dense(CLASSES)(features)
    temperature = tf.compat.v1.get_variable("temperature", [], initializer=tf.ones_initializer())
    p_mean = tf.reduce_mean(tf.nn.softmax(logits), 0)
    entropy = -tf.reduce_sum(p_mean * tf.math.log(p_mean)) * temperature
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits) - entropy
    return _spec(mode, loss, params)


def cv_squared(x):
    """The squared coefficient of variation (Shazeer et al.'s importance loss)."""
    eps = 1e-10
    return tf.math.reduce_variance(x) / (tf.square(tf.reduce_mean(x)) + eps)


def moe_cv_model_fn(features, labels, mode, params):
    """The sparsely-gated MoE's importance loss: cv_squared of each expert's summed gate."""
    gates, logits = _experts(features)
    importance = tf.reduce_sum(gates, 0)
    ce = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    loss = ce + 0.1 * cv_squared(importance)
    return _spec(mode, loss, params)


def vicreg_model_fn(features, labels, mode, params):
    """VICReg: invariance (MSE of two views), each view's per-feature std hinge and the
    off-diagonal squared covariance."""
    encoder = tf.keras.layers.Dense(5, activation="tanh")
    projector = tf.keras.layers.Dense(4, use_bias=False)  # (centred: its bias's gradient is 0)
    za = projector(encoder(features))
    zb = projector(encoder(features * 0.9 + 0.1))
    batch = params["batch_size"]
    invariance = tf.compat.v1.losses.mean_squared_error(za, zb)

    def variance(z):
        std = tf.sqrt(tf.math.reduce_variance(z, 0) + 1e-4)
        return tf.reduce_mean(tf.nn.relu(1.0 - std))

    def covariance(z):
        centred = z - tf.reduce_mean(z, 0)
        c = tf.matmul(centred, centred, transpose_a=True) / (batch - 1)
        off = c * (1.0 - tf.eye(4))
        return tf.reduce_sum(tf.square(off)) / 4.0

    loss = 25.0 * invariance + 25.0 * (variance(za) + variance(zb)) + \
        covariance(za) + covariance(zb)
    return _spec(mode, loss, params)


def barlow_twins_model_fn(features, labels, mode, params):
    """Barlow Twins: the cross-correlation of two views' embeddings normalised over the
    batch, its diagonal pulled to 1 and the rest to 0."""
    dense = tf.keras.layers.Dense(4, use_bias=False)  # (normalised over the batch)
    za, zb = dense(features), dense(features * 0.5 - 0.2)

    def normalised(z):
        return (z - tf.reduce_mean(z, 0)) / (tf.math.reduce_std(z, 0) + 1e-5)

    c = tf.einsum("bi,bj->ij", normalised(za), normalised(zb)) / params["batch_size"]
    on_diag = tf.reduce_sum(tf.square(tf.linalg.diag_part(c) - 1.0))
    off_diag = tf.reduce_sum(tf.square(c)) - tf.reduce_sum(tf.square(tf.linalg.diag_part(c)))
    loss = on_diag + 0.05 * off_diag
    return _spec(mode, loss, params)


def mean_matching_model_fn(features, labels, mode, params):
    """A regression whose loss also matches the batch's mean prediction to its mean target."""
    pred = tf.keras.layers.Dense(1)(tf.keras.layers.Dense(6, activation="tanh")(features))
    y = tf.cast(labels, tf.float32)[:, None]
    loss = tf.compat.v1.losses.mean_squared_error(y, pred) + \
        tf.square(tf.reduce_mean(pred) - tf.reduce_mean(y))
    return _spec(mode, loss, params, {"mse": tf.compat.v1.metrics.mean_squared_error(y, pred)})


def pearson_model_fn(features, labels, mode, params):
    """1 - the Pearson correlation of predictions and targets over the batch."""
    pred = tf.keras.layers.Dense(1, use_bias=False)(  # (a correlation ignores its shift)
        tf.keras.layers.Dense(6, activation="tanh")(features))
    y = tf.cast(labels, tf.float32)[:, None]
    pm, ym = pred - tf.reduce_mean(pred), y - tf.reduce_mean(y)
    r = tf.reduce_sum(pm * ym) / tf.sqrt(tf.reduce_sum(tf.square(pm)) * tf.reduce_sum(tf.square(ym)) + 1e-8)
    loss = 1.0 - r
    return _spec(mode, loss, params)


def diversity_model_fn(features, labels, mode, params):
    """Cross entropy minus the entropy of the batch's mean prediction (a diversity term)."""
    logits = tf.keras.layers.Dense(CLASSES)(tf.keras.layers.Dense(8, activation="relu")(features))
    p_mean = tf.reduce_mean(tf.nn.softmax(logits), 0)
    entropy = -tf.reduce_sum(p_mean * tf.math.log(p_mean + 1e-8))
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits) - 0.5 * entropy
    return _spec(mode, loss, params, {"entropy": tf.compat.v1.metrics.mean(entropy)})


def iic_model_fn(features, labels, mode, params):
    """Invariant Information Clustering: minus the mutual information of two views' cluster
    assignments, their joint distribution summed over the batch and symmetrised."""
    head = tf.keras.layers.Dense(CLASSES)
    p1 = tf.nn.softmax(head(features))
    p2 = tf.nn.softmax(head(features * 0.9 + 0.05))
    joint = tf.reduce_sum(p1[:, :, None] * p2[:, None, :], 0)
    joint = (joint + tf.transpose(joint)) / 2.0
    joint = tf.clip_by_value(joint / tf.reduce_sum(joint), 1e-8, 1.0)
    pi = tf.reduce_sum(joint, 1, keepdims=True)
    pj = tf.reduce_sum(joint, 0, keepdims=True)
    loss = tf.reduce_sum(joint * (tf.math.log(pi) + tf.math.log(pj) - tf.math.log(joint)))
    return _spec(mode, loss, params)


def proxy_anchor_model_fn(features, labels, mode, params):
    """Proxy-Anchor metric learning: each class proxy pulls the batch's embeddings of its class
    and pushes the others, its positive term averaged over the proxies that have a positive
    in the batch (tf.cast(tf.reduce_sum(pos, 0) > 0, tf.float32): a count of the batch's)."""
    emb = tf.nn.l2_normalize(tf.keras.layers.Dense(4)(tf.keras.layers.Dense(8, activation="relu")(features)), 1)
    proxies = tf.compat.v1.get_variable("proxies", [CLASSES, 4])
    sim = tf.matmul(emb, tf.nn.l2_normalize(proxies, 1), transpose_b=True)
    pos = tf.one_hot(labels, CLASSES)
    pos_exp = tf.exp(-32.0 * (sim - 0.1)) * pos
    neg_exp = tf.exp(32.0 * (sim + 0.1)) * (1.0 - pos)
    num_valid = tf.reduce_sum(tf.cast(tf.reduce_sum(pos, 0) > 0, tf.float32))
    loss = tf.reduce_sum(tf.math.log1p(tf.reduce_sum(pos_exp, 0))) / num_valid + \
        tf.reduce_sum(tf.math.log1p(tf.reduce_sum(neg_exp, 0))) / CLASSES
    return _spec(mode, loss, params, {"accuracy": tf.compat.v1.metrics.accuracy(labels, tf.argmax(sim, 1))})


def gated_by_importance_model_fn(features, labels, mode, params):
    """The batch's mean gate scaling each sample's hidden features: a non-linear batch
    statistic feeding back into per-sample activations (refused)."""
    gates = tf.nn.softmax(tf.keras.layers.Dense(EXPERTS)(features))
    importance = tf.reduce_mean(gates, 0)
    scale = importance / tf.reduce_sum(tf.square(importance))
    logits = tf.keras.layers.Dense(CLASSES)(gates * scale)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    return _spec(mode, loss, params)


USERS, ITEMS = 10, 16


def pairs_input_fn(params):
    """(user, positive item, negative item) ids."""
    rng = np.random.default_rng(7)
    n = params["batch_size"] * STEPS * 2
    user = rng.integers(0, USERS, n)
    features = {"user": user.astype(np.int32),
                "pos": ((user * 3 + rng.integers(0, 3, n)) % ITEMS).astype(np.int32),
                "neg": rng.integers(0, ITEMS, n).astype(np.int32)}
    return tf.data.Dataset.from_tensor_slices((features, np.ones(n, np.float32))).batch(
        params["batch_size"], drop_remainder=True)


def bpr_model_fn(features, labels, mode, params):
    """BPR: the pairwise log-sigmoid of score differences, plus an L2 penalty of the
    embeddings the batch looked up, tf.nn.l2_loss of each [B, d] lookup / the batch size."""
    init = tf.compat.v1.random_normal_initializer(stddev=0.5)
    users = tf.compat.v1.get_variable("user_emb", [USERS, 4], initializer=init)
    items = tf.compat.v1.get_variable("item_emb", [ITEMS, 4], initializer=init)
    u = tf.nn.embedding_lookup(users, features["user"])
    i = tf.nn.embedding_lookup(items, features["pos"])
    j = tf.nn.embedding_lookup(items, features["neg"])
    x_uij = tf.reduce_sum(u * i, 1) - tf.reduce_sum(u * j, 1)
    reg = 0.05 * (tf.nn.l2_loss(u) + tf.nn.l2_loss(i) + tf.nn.l2_loss(j))
    loss = -tf.reduce_mean(tf.math.log_sigmoid(x_uij)) + reg / params["batch_size"]
    metrics = {"pairwise_auc": tf.compat.v1.metrics.mean(tf.cast(x_uij > 0, tf.float32))}
    if mode == "eval":
        return CSEstimatorSpec(mode=mode, loss=loss, eval_metric_ops=metrics)
    optimizer = tf.compat.v1.train.AdagradOptimizer(0.2)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=optimizer.minimize(
        loss, global_step=tf.compat.v1.train.get_or_create_global_step()))


def masks_input_fn(params):
    """8x8 noisy images of a bright square and its mask."""
    rng = np.random.default_rng(11)
    n = params["batch_size"] * STEPS * 2
    corner = rng.integers(0, 5, size=(n, 2))
    yy, xx = np.mgrid[:8, :8]
    mask = ((yy[None] >= corner[:, :1, None]) & (yy[None] < corner[:, :1, None] + 3) &
            (xx[None] >= corner[:, 1:, None]) & (xx[None] < corner[:, 1:, None] + 3))
    images = mask[..., None] * 0.8 + rng.normal(0, 0.3, size=(n, 8, 8, 2))
    return tf.data.Dataset.from_tensor_slices((images.astype(np.float32),
                                               mask[..., None].astype(np.float32))).batch(
        params["batch_size"], drop_remainder=True)


def dice_coef(y_true, y_pred, smooth=1.0):
    """The Dice coefficient the common Keras way: K.flatten over the whole batch."""
    y_true_f = tf.keras.backend.flatten(y_true)
    y_pred_f = tf.keras.backend.flatten(y_pred)
    intersection = tf.reduce_sum(y_true_f * y_pred_f)
    return (2.0 * intersection + smooth) / (tf.reduce_sum(y_true_f) + tf.reduce_sum(y_pred_f) + smooth)


def dice_model_fn(features, labels, mode, params):
    """A small segmentation net, loss binary cross entropy + 1 - Dice of the batch."""
    h = tf.keras.layers.Conv2D(6, 3, padding="same", activation="relu")(features)
    probs = tf.keras.layers.Conv2D(1, 1, activation="sigmoid")(h)
    mask = tf.cast(probs > 0.5, tf.int32)
    if mode == "infer":
        return CSEstimatorSpec(mode=mode, predictions={"mask": mask, "probs": probs})
    bce = tf.reduce_mean(tf.keras.losses.binary_crossentropy(labels, probs))
    loss = bce + (1.0 - dice_coef(labels, probs))
    metrics = {"dice": tf.compat.v1.metrics.mean(dice_coef(labels, probs)),
               "mean_iou": tf.compat.v1.metrics.mean_iou(tf.cast(labels, tf.int32), mask, 2)}
    return _spec(mode, loss, params, metrics)


SPEAKERS, UTTERANCES = 4, 4


def utterances_input_fn(params):
    """Batches of SPEAKERS speakers' UTTERANCES utterances each (speaker-major), 6 features."""
    rng = np.random.default_rng(5)
    centers = rng.normal(size=(SPEAKERS * STEPS * 2, 6))
    x = centers.repeat(UTTERANCES, 0) + 0.5 * rng.normal(size=(len(centers) * UTTERANCES, 6))
    y = np.tile(np.arange(SPEAKERS).repeat(UTTERANCES), STEPS * 2).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x.astype(np.float32), y)).batch(
        SPEAKERS * UTTERANCES, drop_remainder=True)


def ge2e_model_fn(features, labels, mode, params):
    """GE2E's softmax loss: the batch regrouped [speakers, utterances, d], each utterance
    against every centroid (its own speaker's without itself), a learned scale w and bias b."""
    e = tf.math.l2_normalize(tf.keras.layers.Dense(8)(features), axis=-1)
    w = tf.compat.v1.get_variable("ge2e_w", [], initializer=tf.constant_initializer(10.0))
    b = tf.compat.v1.get_variable("ge2e_b", [], initializer=tf.constant_initializer(-5.0))
    emb = tf.reshape(e, [SPEAKERS, UTTERANCES, -1])
    sums = tf.reduce_sum(emb, axis=1)
    centroids = tf.math.l2_normalize(sums / UTTERANCES, axis=-1)
    without_self = tf.math.l2_normalize((sums[:, None, :] - emb) / (UTTERANCES - 1), axis=-1)
    own = tf.eye(SPEAKERS)[:, None, :]
    cos = own * tf.reduce_sum(emb * without_self, -1)[:, :, None] + \
        (1.0 - own) * tf.einsum("jmd,kd->jmk", emb, centroids)
    sim = tf.maximum(w, 1e-6) * cos + b
    target = tf.tile(tf.range(SPEAKERS)[:, None], [1, UTTERANCES])
    loss = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=target, logits=sim))
    metrics = {"centroid_accuracy": tf.compat.v1.metrics.accuracy(
        target, tf.argmax(sim, axis=-1, output_type=tf.int32))}
    return _spec(mode, loss, params, metrics)
