"""Survival and ranking losses over the batch, written the ordinary way: DeepSurv's Cox
partial likelihood (each sample's risk against its risk set, the samples still at risk at its
time), in its sort form (tf.argsort of the times, tf.gather of the risks and events,
tf.math.cumulative_logsumexp or log(cumsum(exp))) and its mask form (the [B, B] risk set
t[None, :] >= t[:, None] times exp(risk), or picking the risks by tf.where), with a
hand-written concordance index as an eval metric; ListMLE over the batch (sort by relevance, a reversed cumulative logsumexp)
and a pairwise hinge over the batch's [B, B] pairs.
Survival data is drawn in input_fn: features, exponential event times from a linear
log-hazard, exponential censoring, times rounded to tenths (ties within a batch)."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec

BATCH, STEPS, FEATURES = 8, 4, 6


def _survival(params):
    rng = np.random.default_rng(41)
    n = params["batch_size"] * STEPS * 2
    x = rng.normal(size=(n, FEATURES)).astype(np.float32)
    hazard = np.exp(x @ rng.normal(scale=0.6, size=FEATURES))
    event_time = rng.exponential(1.0 / hazard)
    censor_time = rng.exponential(1.5, size=n)
    time = np.round(np.minimum(event_time, censor_time), 1).astype(np.float32)
    event = (event_time <= censor_time).astype(np.float32)
    return x, time, event


def input_fn(params):
    """Labels {"time", "event"}."""
    x, time, event = _survival(params)
    return tf.data.Dataset.from_tensor_slices((x, {"time": time, "event": event})).batch(
        params["batch_size"], drop_remainder=True)


def stacked_input_fn(params):
    """Labels [B, 2]: (time, event)."""
    x, time, event = _survival(params)
    return tf.data.Dataset.from_tensor_slices((x, np.stack([time, event], 1))).batch(
        params["batch_size"], drop_remainder=True)


def _risk(features):
    h = tf.keras.layers.Dense(16, activation="tanh")(features)
    h = tf.keras.layers.Dense(8, activation="tanh")(h)
    return tf.keras.layers.Dense(1, use_bias=False)(h)[:, 0]


def concordance(risk, time, event):
    """Harrell's C over the batch's comparable pairs (i had its event before j's time)."""
    comparable = event[:, None] * tf.cast(time[:, None] < time[None, :], tf.float32)
    concordant = tf.cast(risk[:, None] > risk[None, :], tf.float32)
    return tf.reduce_sum(comparable * concordant) / tf.maximum(tf.reduce_sum(comparable), 1.0)


def _spec(mode, loss, risk, time, event, params):
    if mode == "infer":
        return CSEstimatorSpec(mode=mode, predictions={"risk": risk})
    if mode == "eval":
        return CSEstimatorSpec(mode=mode, loss=loss, eval_metric_ops={
            "c_index": tf.compat.v1.metrics.mean(concordance(risk, time, event)),
            "mean_risk": tf.compat.v1.metrics.mean(risk)})
    optimizer = tf.compat.v1.train.AdamOptimizer(params.get("learning_rate", 0.01))
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=optimizer.minimize(
        loss, global_step=tf.compat.v1.train.get_or_create_global_step()))


def cox_sort_model_fn(features, labels, mode, params):
    """Sorted by time, latest first: each risk against the logsumexp of those before it."""
    risk = _risk(features)
    if mode == "infer":
        return _spec(mode, None, risk, None, None, params)
    time, event = labels["time"], labels["event"]
    order = tf.argsort(time, direction="DESCENDING")
    risk_sorted = tf.gather(risk, order)
    event_sorted = tf.gather(event, order)
    log_risk_set = tf.math.cumulative_logsumexp(risk_sorted)
    loss = -tf.reduce_sum((risk_sorted - log_risk_set) * event_sorted) / \
        tf.maximum(tf.reduce_sum(event_sorted), 1.0)
    return _spec(mode, loss, risk, time, event, params)


def cox_cumsum_model_fn(features, labels, mode, params):
    """Labels [B, 2]; sorted earliest first, the risk set's sum as a reversed
    log(cumsum(exp(risk)))."""
    risk = _risk(features)
    if mode == "infer":
        return _spec(mode, None, risk, None, None, params)
    time, event = labels[:, 0], labels[:, 1]
    order = tf.argsort(time)
    risk_sorted = tf.gather(risk, order)
    log_risk_set = tf.math.log(tf.cumsum(tf.exp(risk_sorted), reverse=True))
    event_sorted = tf.gather(event, order)
    loss = -tf.reduce_sum((risk_sorted - log_risk_set) * event_sorted) / tf.reduce_sum(event)
    return _spec(mode, loss, risk, time, event, params)


def cox_mask_model_fn(features, labels, mode, params):
    """The [B, B] risk set: row i the samples still at risk at sample i's time."""
    risk = _risk(features)
    if mode == "infer":
        return _spec(mode, None, risk, None, None, params)
    time, event = labels["time"], labels["event"]
    risk_set = tf.cast(time[None, :] >= time[:, None], tf.float32)
    log_risk_set = tf.math.log(tf.reduce_sum(risk_set * tf.exp(risk)[None, :], 1))
    loss = -tf.reduce_sum(event * (risk - log_risk_set)) / tf.reduce_sum(event)
    return _spec(mode, loss, risk, time, event, params)


def cox_masked_logsumexp_model_fn(features, labels, mode, params):
    """The risk set as a masked tf.reduce_logsumexp: log(0) = -inf outside it."""
    risk = _risk(features)
    if mode == "infer":
        return _spec(mode, None, risk, None, None, params)
    time, event = labels["time"], labels["event"]
    risk_set = tf.cast(tf.expand_dims(time, 0) >= tf.expand_dims(time, 1), tf.float32)
    log_risk_set = tf.reduce_logsumexp(risk[None, :] + tf.math.log(risk_set), axis=1)
    loss = -tf.reduce_sum(event * (risk - log_risk_set)) / tf.reduce_sum(event)
    return _spec(mode, loss, risk, time, event, params)


def cox_where_model_fn(features, labels, mode, params):
    """The risk set picked by tf.where from the batch's row of risks, -inf elsewhere."""
    risk = _risk(features)
    if mode == "infer":
        return _spec(mode, None, risk, None, None, params)
    time, event = labels["time"], labels["event"]
    at_risk = tf.expand_dims(time, 0) >= tf.expand_dims(time, 1)
    log_risk_set = tf.reduce_logsumexp(tf.where(at_risk, risk[None, :], -np.inf), axis=1)
    loss = -tf.reduce_sum(event * (risk - log_risk_set)) / tf.reduce_sum(event)
    return _spec(mode, loss, risk, time, event, params)


def cox_tiled_model_fn(features, labels, mode, params):
    """The batch's row of risks tiled to [B, B] before tf.where (refused: the CS gives each
    sample the row only to meet its own values; write tf.where(at_risk, risk[None, :], ...))."""
    risk = _risk(features)
    time, event = labels["time"], labels["event"]
    at_risk = time[None, :] >= time[:, None]
    scores = tf.where(at_risk, tf.tile(risk[None, :], [params["batch_size"], 1]), -1e9)
    loss = -tf.reduce_sum(event * (risk - tf.reduce_logsumexp(scores, 1))) / tf.reduce_sum(event)
    return _spec(mode, loss, risk, time, event, params)


def list_mle_model_fn(features, labels, mode, params):
    """ListMLE over the batch: the scores in the order of the labels' relevance (the time
    here), each against the logsumexp of those ranked at or below it."""
    scores = _risk(features)
    if mode == "infer":
        return _spec(mode, None, scores, None, None, params)
    order = tf.argsort(labels["time"], direction="DESCENDING")
    ranked = tf.gather(scores, order)
    loss = tf.reduce_mean(tf.math.cumulative_logsumexp(ranked, reverse=True) - ranked)
    return _spec(mode, loss, scores, labels["time"], labels["event"], params)


def pairwise_hinge_model_fn(features, labels, mode, params):
    """RankNet-style pairwise hinge over every [B, B] pair: each pair ordered by time should
    be ordered by score by a margin of 1, averaged over the ordered pairs."""
    scores = _risk(features)
    if mode == "infer":
        return _spec(mode, None, scores, None, None, params)
    time = labels["time"]
    ordered = tf.cast(time[:, None] > time[None, :], tf.float32)
    hinge = tf.nn.relu(1.0 - (scores[:, None] - scores[None, :]))
    loss = tf.reduce_sum(ordered * hinge) / tf.maximum(tf.reduce_sum(ordered), 1.0)
    return _spec(mode, loss, scores, time, labels["event"], params)
