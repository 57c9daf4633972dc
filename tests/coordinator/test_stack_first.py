"""Values laid out stacked in front of the batch by forms other than tf.stack(values, axis=0)
(unseen22): timm-style attention's qkv permute (tf.transpose(qkv, [2, 0, 3, 1, 4]) then
unstacked or indexed) trains 4 steps with TF's numbers, evaluates and predicts with the CPU
path's, and so does Swin's form of it on windows folded into the batch; a VIB's K Monte
Carlo samples (eps = tf.random.normal([K, tf.shape(mu)[0], Z]), mu[None] + sigma[None] *
eps, a Dense on the [K, B, Z] samples) train with TF's replayed
draws and evaluate drawing every batch, and so does an IWAE as unseen28 wrote it (its
Bernoulli targets tf.broadcast_to(x[None], tf.shape(logits)), tf.exp(logvar[None]) in the
Gaussian log-density, tf.nn.sigmoid_cross_entropy_with_logits' zeros and selects on
[K, B, ...], tf.reduce_logsumexp over the K samples); what reads such a value other than the stack-first
layout supports stays refused in one line."""
from __future__ import annotations

import cs_inprocess
import numpy as np
import pytest
import tensorflow as tf
from coincidence_models import spec as _spec

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

L = tf.keras.layers
v1 = tf.compat.v1
PARAMS = {"runconfig": {"tf_random_seed": 1}, "heads": 2, "dim": 8}
TOKENS, FEATURES, STEPS = 5, 6, 4
SAMPLES, CODE = 3, 4


def input_fn(params):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, TOKENS, FEATURES)).astype(np.float32)
    y = rng.integers(0, 3, size=(64,)).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(16, drop_remainder=True)


def _attention(x, heads, dim, unstack):
    """timm's Attention: one Dense for q, k and v, permuted to [3, batch, heads, tokens, dh]."""
    n, dh = x.shape[1], dim // heads
    qkv = tf.reshape(L.Dense(3 * dim)(x), [-1, n, 3, heads, dh])
    qkv = tf.transpose(qkv, [2, 0, 3, 1, 4])
    q, k, v = tf.unstack(qkv, axis=0) if unstack else (qkv[0], qkv[1], qkv[2])
    attn = tf.nn.softmax(tf.matmul(q, k, transpose_b=True) * dh ** -0.5, axis=-1)
    out = tf.reshape(tf.transpose(tf.matmul(attn, v), [0, 2, 1, 3]), [-1, n, dim])
    return L.Dense(dim)(out)


def vit_block(features, labels, mode, params):
    """A pre-norm ViT encoder block, the attention written as timm's."""
    x = L.Dense(params["dim"])(features)
    x = x + _attention(L.LayerNormalization()(x), params["heads"], params["dim"],
                       params.get("unstack", True))
    x = x + L.Dense(params["dim"])(L.Dense(2 * params["dim"], activation="gelu")(
        L.LayerNormalization()(x)))
    return _spec(mode, labels, L.Dense(3)(tf.reduce_mean(x, 1)))


def vib(features, labels, mode, params):
    """A variational information bottleneck: K samples of the code per example, decoded and
    averaged over K and the batch; predictions decode the mean code."""
    h = L.Dense(8, activation="relu")(L.Flatten()(features))
    stats = L.Dense(2 * CODE)(h)
    mu, std = stats[:, :CODE], tf.nn.softplus(stats[:, CODE:] - 1.0)
    decoder = L.Dense(3)
    if mode == ModeKeys.PREDICT:
        return _spec(mode, labels, decoder(mu))
    eps = tf.random.normal([SAMPLES, tf.shape(mu)[0], CODE])
    z = mu[None] + std[None] * eps  # [K, B, Z]
    if params["decode"] == "unstacked":
        loss = tf.add_n([v1.losses.sparse_softmax_cross_entropy(labels, decoder(zk))
                         for zk in tf.unstack(z)]) / SAMPLES
    elif params["decode"] == "rank3":  # logits [K, B, C]
        log_p = tf.nn.log_softmax(decoder(z))
        loss = -tf.reduce_mean(tf.reduce_sum(tf.one_hot(labels, 3) * log_p, -1))
    else:  # (TF flattens rank-3 logits, merging K and the batch)
        loss = v1.losses.sparse_softmax_cross_entropy(tf.tile(labels[None], [SAMPLES, 1]), decoder(z))
    kl = tf.reduce_mean(0.5 * tf.reduce_sum(tf.square(mu) + tf.square(std) - 2 * tf.math.log(std) - 1, 1))
    return _spec(mode, labels, decoder(mu), loss + 0.01 * kl)


def _log_normal(z, mu, logvar):
    return -0.5 * tf.reduce_sum(np.log(2 * np.pi) + logvar + tf.square(z - mu) / tf.exp(logvar), -1)


def iwae(features, labels, mode, params):
    """An importance-weighted autoencoder: K codes per example, the bound a logsumexp over
    K of the log weights; predictions the mean code."""
    x = tf.cast(L.Flatten()(features) > 0.0, tf.float32)
    h = L.Dense(16, activation="tanh")(x)
    mu, logvar = L.Dense(CODE)(h), L.Dense(CODE)(h)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"code": mu})
    eps = tf.random.normal([SAMPLES, tf.shape(x)[0], CODE])
    z = mu[None] + tf.exp(0.5 * logvar)[None] * eps  # [K, B, Z]
    logits = L.Dense(TOKENS * FEATURES)(L.Dense(16, activation="tanh")(z))
    log_px_z = -tf.reduce_sum(tf.nn.sigmoid_cross_entropy_with_logits(
        labels=tf.broadcast_to(x[None], tf.shape(logits)), logits=logits), -1)
    log_w = log_px_z + _log_normal(z, 0.0, 0.0) - _log_normal(z, mu[None], logvar[None])
    bound = tf.reduce_logsumexp(log_w, axis=0) - np.log(SAMPLES)
    loss = -tf.reduce_mean(bound)
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss, eval_metric_ops={"bound": v1.metrics.mean(bound)})
    train_op = v1.train.AdamOptimizer(1e-3).minimize(loss, v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode, loss=loss, train_op=train_op)


def permuted_windows(features, labels, mode, params):
    """Swin's form: windows folded into the batch ([B*n, N, ...]) before the permute (no stack:
    each part taken apart, sequences._folded_parts; params parts_mean: the permuted value
    averaged over its parts, refused)."""
    windows = tf.reshape(features, [-1, 1, FEATURES])  # (a window per token)
    qkv = tf.reshape(L.Dense(3 * params["dim"])(windows), [-1, 1, 3, params["heads"], 4])
    permuted = tf.transpose(qkv, [2, 0, 3, 1, 4])
    if params.get("parts_mean"):
        return _spec(mode, labels, L.Dense(3)(tf.reshape(tf.reduce_mean(permuted, 0), [-1, TOKENS * 8])))
    q, k, v = tf.unstack(permuted, axis=0)
    out = tf.reshape(tf.matmul(tf.nn.softmax(tf.matmul(q, k, transpose_b=True)), v), [-1, TOKENS * 8])
    return _spec(mode, labels, L.Dense(3)(out))


CASES = {
    "vit_block_unstacked": (vit_block, PARAMS),
    "vit_block_indexed": (vit_block, {**PARAMS, "unstack": False}),
    "permuted_windows": (permuted_windows, PARAMS),
}


@pytest.mark.parametrize("name", CASES)
def test_trains_evaluates_and_predicts_like_tensorflow(tmp_path, name):
    model_fn, params = CASES[name]
    result = cs_inprocess.compare(model_fn, input_fn, params, str(tmp_path), STEPS)
    cs_inprocess.assert_same_training(result, 1e-5)
    assert cs_inprocess.cpu_path_mismatches(model_fn, input_fn, params, str(tmp_path), result) == []


DRAWN = {"vib_unstacked": (vib, {**PARAMS, "decode": "unstacked"}),
         "vib_rank3": (vib, {**PARAMS, "decode": "rank3"}), "iwae": (iwae, PARAMS)}


@pytest.mark.parametrize("name", DRAWN)
def test_monte_carlo_samples_train_with_tensorflows_draws(tmp_path, name):
    """4 steps handed TF's [K, B, Z] draws (each sample its [K, Z]) at 1e-5; predictions (of
    the mean code) as the CPU path's; evaluation draws every batch, TF's losses when handed
    TF's draws."""
    model_fn, params = DRAWN[name]
    result = cs_inprocess.compare_drawn(model_fn, input_fn, params, str(tmp_path / "train"), STEPS)
    cs_inprocess.assert_same_training(result, 1e-5)
    assert cs_inprocess.prediction_mismatch(model_fn, input_fn, params, str(tmp_path / "train"),
                                            result) == ""
    path = cs_inprocess.trained_checkpoint(str(tmp_path / "train"), result)
    cs_inprocess.assert_evaluation_draws_every_batch(model_fn, input_fn, params,
                                                     str(tmp_path / "eval"), path)


def permuted_then_reduced_over_the_batch(features, labels, mode, params):
    qkv = tf.reshape(L.Dense(3 * params["dim"])(features), [-1, TOKENS, 3, params["heads"], 4])
    qkv = tf.transpose(qkv, [2, 0, 3, 1, 4])
    pooled = tf.reduce_mean(qkv, 1)  # over the batch: no sample's own
    logits = L.Dense(3)(L.Flatten()(features)) + tf.reduce_sum(pooled)
    return _spec(mode, labels, logits)


@pytest.mark.parametrize("model_fn, params, words", [
    (permuted_windows, {**PARAMS, "parts_mean": True}, "tf.unstack(qkv, axis=2)"),
    (permuted_then_reduced_over_the_batch, PARAMS, "reduce over the stack axis 0 first"),
    (vib, {**PARAMS, "decode": "tiled_labels"}, "views a per-sample value as a row"),
])
def test_what_stays_refused_says_what_to_write_in_one_line(tmp_path, model_fn, params, words):
    line = cs_inprocess.refusal(model_fn, input_fn, params, str(tmp_path), __file__)
    assert words in line, line
