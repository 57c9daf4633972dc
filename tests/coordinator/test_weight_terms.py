"""Terms of the loss computed from weights alone that are no L2/L1 penalty - a variational
model's KL(q(w) || p(w)), an orthogonality penalty ||W^T W - I||^2, a log-determinant - added
to a loss of per-sample values (also one divided by a count of the batch, or annealed) or of
the whole batch: the weight program computes each once a step, every sample takes d * W /
batch of it (a loss of the whole batch reads the first sample's W), its gradient back through
the weight program, so the CS trains, evaluates and predicts with TensorFlow's numbers (a
precision factor tf.stack'ed from weight scalars and zeros included); the terms the CS cannot
carry refused in one line naming the op, and the blockers a first refusal hides named with it."""
from __future__ import annotations

import cs_inprocess
import numpy as np
import pytest
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

v1 = tf.compat.v1
BATCH, N, D = 8, 64, 4


def input_fn(params):
    rng = np.random.default_rng(6)
    x = rng.normal(size=(N, 3)).astype(np.float32)
    y = (np.sin(x[:, :1]) + 0.5 * x[:, 1:2] + 0.1 * rng.normal(size=(N, 1))).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(params["batch_size"],
                                                                     drop_remainder=True)


def _kl(q_mu, q_sqrt):
    """KL(N(q_mu, q_sqrt q_sqrt^T) || N(0, I)), q_sqrt lower triangular."""
    return 0.5 * (tf.reduce_sum(tf.square(q_sqrt)) + tf.reduce_sum(tf.square(q_mu)) - D
                  - 2.0 * tf.reduce_sum(tf.math.log(tf.abs(tf.linalg.diag_part(q_sqrt)))))


def variational_regression(features, labels, mode, params):
    """Bayesian linear regression on a learned feature map: q(w) = N(mu, L L^T), L lower
    triangular, a learned noise; the ELBO's expected log-likelihood per sample minus the KL
    scaled to the data set (as an SVGP's)."""
    form = params["form"]
    h = tf.keras.layers.Dense(D, activation="tanh", name="features")(features)
    q_mu = v1.get_variable("q_mu", [D, 1], initializer=v1.zeros_initializer())
    q_sqrt = tf.linalg.band_part(v1.get_variable("q_sqrt", initializer=np.eye(D, dtype=np.float32)),
                                 -1, 0)
    noise = tf.nn.softplus(v1.get_variable("raw_noise", [], initializer=v1.constant_initializer(-1.0)))
    mean = tf.matmul(h, q_mu)
    var = tf.reduce_sum(tf.square(tf.matmul(h, q_sqrt)), 1, keepdims=True)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"mean": mean, "variance": var + noise})
    nll = 0.5 * tf.math.log(2 * np.pi * noise) + 0.5 * (tf.square(labels - mean) + var) / noise
    if form == "kl":
        loss = tf.reduce_mean(nll) + _kl(q_mu, q_sqrt) / N
    elif form == "counted":  # the likelihood of the samples with a positive target only
        kept = tf.cast(labels > 0, tf.float32)
        loss = v1.losses.compute_weighted_loss(nll, weights=kept) + _kl(q_mu, q_sqrt) / N
    elif form == "annealed":  # the KL's weight warmed up over the first steps: 0, 1/3, 2/3, 1
        beta = tf.minimum(1.0, tf.cast(v1.train.get_or_create_global_step(), tf.float32) / 3.0)
        loss = tf.reduce_mean(nll) + beta * _kl(q_mu, q_sqrt) / N
    elif form == "kl_counted":  # the KL inside the division by the count: refused
        kept = tf.cast(labels > 0, tf.float32)
        loss = (tf.reduce_sum(nll * kept) + _kl(q_mu, q_sqrt)) / tf.maximum(tf.reduce_sum(kept), 1.0)
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss, eval_metric_ops={
            "rmse": v1.metrics.root_mean_squared_error(labels, mean),
            "nll": v1.metrics.mean(nll)})
    train_op = v1.train.AdamOptimizer(0.05).minimize(loss, global_step=v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode, loss=loss, train_op=train_op)


def penalised_regression(features, labels, mode, params):
    """A two-layer regression whose square hidden kernel is kept near orthogonal
    (||W^T W - I||^2) or volume-preserving (its log-determinant)."""
    form = params["form"]
    first = tf.keras.layers.Dense(D, activation="tanh", name="first")
    hidden = tf.keras.layers.Dense(D, activation="tanh", name="hidden")
    out = tf.keras.layers.Dense(1, name="out")
    prediction = out(hidden(first(features)))
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"y": prediction})
    w = hidden.kernel
    if form == "orthogonal":
        term = 1e-2 * tf.reduce_sum(tf.square(tf.matmul(w, w, transpose_a=True) - tf.eye(D)))
    elif form == "log_det":
        term = -0.1 * tf.linalg.slogdet(w)[1]
    elif form == "eigen":  # log det W^T W by its eigenvalues: no CS kernel
        term = -0.1 * tf.reduce_sum(tf.math.log(tf.linalg.eigvalsh(tf.matmul(w, w, transpose_a=True))))
    loss = v1.losses.mean_squared_error(labels, prediction) + term
    if params.get("matched"):  # a loss of the whole batch: the means of predictions and labels
        loss += tf.square(tf.reduce_mean(prediction) - tf.reduce_mean(labels))
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss, eval_metric_ops={
            "mae": v1.metrics.mean_absolute_error(labels, prediction)})
    train_op = v1.train.AdamOptimizer(0.02).minimize(loss, global_step=v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode, loss=loss, train_op=train_op)


def pair_input_fn(params):
    rng = np.random.default_rng(7)
    x = rng.normal(size=(N, 3)).astype(np.float32)
    noise = rng.normal(size=(N, 2)) @ np.array([[0.5, 0.3], [0.0, 0.2]])
    y = (x[:, :2] * [1.0, -0.5] + noise).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(params["batch_size"],
                                                                     drop_remainder=True)


def correlated_regression(features, labels, mode, params):
    """A Gaussian of two correlated targets, its precision's Cholesky factor P built by hand
    from a weight vector (tf.stack of weight scalars and a 0 above the diagonal): the NLL
    0.5 ||P^T (y - mu)||^2 - log det P, the log-determinant a term of weights alone."""
    mu = tf.keras.layers.Dense(2, name="mean")(tf.keras.layers.Dense(8, activation="tanh")(features))
    raw = v1.get_variable("precision_factor", initializer=[0.0, 0.1, 0.0])
    p = tf.stack([tf.stack([tf.exp(raw[0]), 0.0]), tf.stack([raw[1], tf.exp(raw[2])])])
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"mean": mu})
    z = tf.matmul(labels - mu, p)
    loss = 0.5 * tf.reduce_mean(tf.reduce_sum(tf.square(z), 1)) - tf.reduce_sum(
        tf.math.log(tf.linalg.diag_part(p)))
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss, eval_metric_ops={
            "mse": v1.metrics.mean_squared_error(labels, mu)})
    train_op = v1.train.AdamOptimizer(0.05).minimize(loss, global_step=v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode, loss=loss, train_op=train_op)


def hidden_blockers(features, labels, mode, params):
    """An RBF network on learned centres whitened by the eigen-decomposition of R^T R, R
    their Gram matrix's QR factor, its features written with the batch second (an SVGP's
    k(Z, x)), and a nuclear norm of them: four ops the CS cannot run, hidden behind each
    other."""
    z = v1.get_variable("centres", initializer=np.linspace(-2.0, 2.0, D)[:, None].astype(np.float32))
    r = tf.linalg.qr(tf.exp(-tf.square(z - tf.transpose(z))) + 1e-3 * tf.eye(D))[1]
    e, v = tf.linalg.eigh(tf.matmul(r, r, transpose_a=True))
    kzx = tf.exp(-tf.reduce_sum(tf.square(z[:, None, :] - features[None, :, :1]), -1))  # [D, B]
    h = tf.matmul(v, kzx, transpose_a=True) / tf.sqrt(e)[:, None]
    loss = v1.losses.mean_squared_error(labels[:, 0], tf.reduce_sum(h, 0)) + \
        1e-3 * tf.reduce_sum(tf.linalg.svd(h, compute_uv=False))
    train_op = v1.train.AdamOptimizer(0.05).minimize(loss, global_step=v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode, loss=loss, train_op=train_op)


def params(form):
    matched = form.endswith("_matched")
    return {"batch_size": BATCH, "form": form.removesuffix("_matched"), "matched": matched,
            "runconfig": {"tf_random_seed": 5}}


@pytest.mark.parametrize("model_fn, data, form", [
    (variational_regression, input_fn, "kl"), (variational_regression, input_fn, "counted"),
    (variational_regression, input_fn, "annealed"),
    (penalised_regression, input_fn, "orthogonal"), (penalised_regression, input_fn, "log_det"),
    (penalised_regression, input_fn, "orthogonal_matched"),
    (correlated_regression, pair_input_fn, "stacked")])
def test_weight_terms_train_evaluate_and_predict_like_tensorflow(tmp_path, model_fn, data, form):
    run = cs_inprocess.compare(model_fn, data, params(form), str(tmp_path / "train"), steps=4)
    share = "schedule" if form == "annealed" else "broadcast"  # (the term's share: beta * W)
    assert share in [k.type for k in run.compiled.program.kernels]
    cs_inprocess.assert_same_training(run, rtol=1e-5)
    assert cs_inprocess.evaluation_mismatch(model_fn, data, params(form),
                                            str(tmp_path / "eval"), run) == ""
    assert cs_inprocess.prediction_mismatch(model_fn, data, params(form),
                                            str(tmp_path / "predict"), run) == ""


@pytest.mark.parametrize("model_fn, form, says", [
    (variational_regression, "kl_counted", "divides a term of the loss computed from weights "
                                           "by a count or sum of the batch"),
    (penalised_regression, "eigen", "SelfAdjointEigV2")])
def test_weight_terms_the_cs_cannot_carry_are_refused_in_one_line(tmp_path, model_fn, form, says):
    line = cs_inprocess.refusal(model_fn, input_fn, params(form), str(tmp_path), __file__)
    assert says in line


def test_the_first_validation_names_the_blockers_a_refusal_hides(tmp_path):
    """Behind the batch-second view the pass swallows what follows unexamined: the
    eigen-decomposition of weights, the QR before it and the singular values are named at
    first contact too."""
    line = cs_inprocess.refusal(hidden_blockers, input_fn, params(""), str(tmp_path), __file__)
    report = (tmp_path / "cs_compile" / "validation_report.txt").read_text()
    assert "give all 4 with their source lines" in line
    for says in ("StridedSlice 'strided_slice", "Svd 'Svd' at", "no CS kernel computes this op (Svd)",
                 "computes on weights with SelfAdjointEigV2", "computes on weights with Qr"):
        assert says in report
