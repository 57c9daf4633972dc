"""Probabilistic and likelihood-based models written the way users write them: count models
(Poisson, negative binomial, zero-inflated Poisson), likelihoods of positive, unit-interval,
simplex, heavy-tailed and angular targets (Gamma, Beta, Dirichlet, Student-t, von Mises),
deep evidential regression, a mixture density network, Gaussian and heteroscedastic
regression with a learned variance, a VAE, focal, Tweedie, ordinal, Beta-Bernoulli KL,
quantile and expectile losses. Each takes `input_fn` with params["target"] naming the kind of
label (TARGETS)."""
from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

L, v1 = tf.keras.layers, tf.compat.v1
FEATURES, BATCH, CLASSES, SIMPLEX = 6, 16, 4, 3


def _targets(kind: str, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    signal = x[:, :2].sum(1)
    if kind == "count":
        return rng.poisson(np.exp(0.5 * signal)).astype(np.float32)[:, None]
    if kind == "positive":
        return rng.gamma(2.0, np.exp(0.3 * signal)).astype(np.float32)[:, None] + 0.05
    if kind == "unit":
        return np.clip(1 / (1 + np.exp(-signal)) + rng.normal(0, 0.05, len(x)), 0.02, 0.98
                       ).astype(np.float32)[:, None]
    if kind == "simplex":
        return rng.dirichlet([2.0, 3.0, 4.0], len(x)).astype(np.float32) * 0.98 + 0.02 / SIMPLEX
    if kind == "angle":
        return np.mod(signal + rng.normal(0, 0.3, len(x)) + math.pi, 2 * math.pi
                      ).astype(np.float32)[:, None] - np.float32(math.pi)
    if kind == "ordinal":
        return np.digitize(signal, [-1.0, 0.0, 1.0]).astype(np.int32)
    if kind == "binary":
        return (signal + rng.normal(0, 0.5, len(x)) > 0.8).astype(np.float32)[:, None]
    return (signal + rng.normal(0, 0.3 + 0.3 * np.abs(x[:, 2]))).astype(np.float32)[:, None]


TARGETS = ("count", "positive", "unit", "simplex", "angle", "ordinal", "binary", "real")


def input_fn(params):
    """Batches of FEATURES normal features and a target of the kind params["target"] names."""
    rng = np.random.default_rng(params.get("data_seed", 3))
    x = rng.normal(size=(8 * BATCH, FEATURES)).astype(np.float32)
    y = _targets(params["target"], x, rng)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH, drop_remainder=True)


def _hidden(features, units=16):
    return L.Dense(units, activation="tanh")(features)


def _spec(mode, loss, predictions, optimizer=None):
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode=mode, predictions=predictions)
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode=mode, loss=loss, eval_metric_ops={
            "mean_prediction": v1.metrics.mean(tf.reduce_mean(predictions))})
    optimizer = optimizer or v1.train.AdamOptimizer(1e-2)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=optimizer.minimize(
        loss, global_step=v1.train.get_or_create_global_step()))


def poisson_regression(features, labels, mode, params):
    """log-rate by a small MLP; tf.nn.log_poisson_loss, with Stirling's term when
    params["full"]."""
    log_rate = L.Dense(1)(_hidden(features))
    loss = tf.reduce_mean(tf.nn.log_poisson_loss(labels, log_rate,
                                                 compute_full_loss=params.get("full", False)))
    return _spec(mode, loss, tf.exp(log_rate))


def negative_binomial(features, labels, mode, params):
    """NB2 negative log-likelihood: mean mu and dispersion r, log Γ terms by tf.math.lgamma."""
    h = _hidden(features)
    mu = tf.nn.softplus(L.Dense(1)(h)) + 1e-4
    r = tf.nn.softplus(L.Dense(1)(h)) + 1e-4
    log_likelihood = (tf.math.lgamma(labels + r) - tf.math.lgamma(r) - tf.math.lgamma(labels + 1.0)
                      + r * tf.math.log(r / (r + mu)) + labels * tf.math.log(mu / (r + mu)))
    return _spec(mode, -tf.reduce_mean(log_likelihood), mu)


def zero_inflated_poisson(features, labels, mode, params):
    """A zero-inflated Poisson: a gate pi of structural zeros, a Poisson rate otherwise."""
    h = _hidden(features)
    gate_logit = L.Dense(1)(h)
    log_rate = L.Dense(1)(h)
    rate = tf.exp(log_rate)
    log_pi = tf.math.log_sigmoid(gate_logit)
    log_not_pi = tf.math.log_sigmoid(-gate_logit)
    poisson = labels * log_rate - rate - tf.math.lgamma(labels + 1.0)
    zero = tf.math.reduce_logsumexp(tf.concat([log_pi, log_not_pi - rate], 1), 1, keepdims=True)
    log_likelihood = tf.where(labels < 0.5, zero, log_not_pi + poisson)
    return _spec(mode, -tf.reduce_mean(log_likelihood), tf.sigmoid(-gate_logit) * rate)


def gamma_likelihood(features, labels, mode, params):
    """Gamma(alpha, beta) NLL of positive targets, both parameters by softplus."""
    h = _hidden(features)
    alpha = tf.nn.softplus(L.Dense(1)(h)) + 0.1
    beta = tf.nn.softplus(L.Dense(1)(h)) + 0.1
    nll = (tf.math.lgamma(alpha) - alpha * tf.math.log(beta) - (alpha - 1.0) * tf.math.log(labels)
           + beta * labels)
    return _spec(mode, tf.reduce_mean(nll), alpha / beta)


def beta_likelihood(features, labels, mode, params):
    """Beta(a, b) NLL of targets in (0, 1), the normaliser by tf.math.lbeta."""
    h = _hidden(features)
    concentration = tf.nn.softplus(L.Dense(2)(h)) + 0.5
    a, b = concentration[:, :1], concentration[:, 1:]
    nll = (tf.math.lbeta(concentration)[:, None] - (a - 1.0) * tf.math.log(labels)
           - (b - 1.0) * tf.math.log1p(-labels))
    return _spec(mode, tf.reduce_mean(nll), a / (a + b))


def dirichlet_likelihood(features, labels, mode, params):
    """Dirichlet NLL of compositions: lgamma of the concentrations and of their sum."""
    alpha = tf.exp(L.Dense(SIMPLEX)(_hidden(features))) + 0.1
    nll = (tf.reduce_sum(tf.math.lgamma(alpha), 1) - tf.math.lgamma(tf.reduce_sum(alpha, 1))
           - tf.reduce_sum((alpha - 1.0) * tf.math.log(labels), 1))
    return _spec(mode, tf.reduce_mean(nll), alpha / tf.reduce_sum(alpha, 1, keepdims=True))


def dirichlet_kl(features, labels, mode, params):
    """Evidential classification's KL(Dir(alpha) || Dir(1)) regulariser: lgamma and digamma."""
    alpha = tf.nn.softplus(L.Dense(SIMPLEX)(_hidden(features))) + 1.0
    total = tf.reduce_sum(alpha, 1, keepdims=True)
    expected = tf.reduce_sum(labels * (tf.math.digamma(total) - tf.math.digamma(alpha)), 1)
    kl = (tf.math.lgamma(total[:, 0]) - tf.reduce_sum(tf.math.lgamma(alpha), 1)
          - math.lgamma(SIMPLEX)
          + tf.reduce_sum((alpha - 1.0) * (tf.math.digamma(alpha) - tf.math.digamma(total)), 1))
    return _spec(mode, tf.reduce_mean(expected + 0.1 * kl), alpha / total)


def student_t(features, labels, mode, params):
    """Student-t NLL with a learned location, scale and degrees of freedom."""
    h = _hidden(features)
    loc = L.Dense(1)(h)
    scale = tf.nn.softplus(L.Dense(1)(h)) + 1e-3
    df = tf.nn.softplus(L.Dense(1)(h)) + 2.0
    z = (labels - loc) / scale
    nll = (tf.math.lgamma(df / 2.0) - tf.math.lgamma((df + 1.0) / 2.0)
           + 0.5 * tf.math.log(df * math.pi) + tf.math.log(scale)
           + (df + 1.0) / 2.0 * tf.math.log1p(tf.square(z) / df))
    return _spec(mode, tf.reduce_mean(nll), loc)


def evidential_regression(features, labels, mode, params):
    """Deep evidential regression (Amini et al.): a Normal-Inverse-Gamma's NLL plus the
    evidence regulariser."""
    out = L.Dense(4)(_hidden(features))
    gamma = out[:, :1]
    nu = tf.nn.softplus(out[:, 1:2])
    alpha = tf.nn.softplus(out[:, 2:3]) + 1.0
    beta = tf.nn.softplus(out[:, 3:])
    omega = 2.0 * beta * (1.0 + nu)
    nll = (0.5 * tf.math.log(math.pi / nu) - alpha * tf.math.log(omega)
           + (alpha + 0.5) * tf.math.log(nu * tf.square(labels - gamma) + omega)
           + tf.math.lgamma(alpha) - tf.math.lgamma(alpha + 0.5))
    regulariser = tf.abs(labels - gamma) * (2.0 * nu + alpha)
    return _spec(mode, tf.reduce_mean(nll + 0.01 * regulariser), gamma)


def mixture_density(features, labels, mode, params):
    """A mixture density network of 3 Gaussians: logsumexp over the components."""
    h = _hidden(features, 24)
    logits = L.Dense(3)(h)
    means = L.Dense(3)(h)
    scales = tf.nn.softplus(L.Dense(3)(h)) + 1e-3
    log_prob = (-0.5 * tf.square((labels - means) / scales) - tf.math.log(scales)
                - 0.5 * math.log(2 * math.pi))
    log_mix = tf.nn.log_softmax(logits) + log_prob
    nll = -tf.reduce_logsumexp(log_mix, axis=1)
    return _spec(mode, tf.reduce_mean(nll), tf.reduce_sum(tf.nn.softmax(logits) * means, 1))


def gaussian_nll(features, labels, mode, params):
    """A Gaussian NLL whose log-variance is one learned variable shared by all samples."""
    mean = L.Dense(1)(_hidden(features))
    log_var = v1.get_variable("log_var", [], initializer=v1.zeros_initializer())
    nll = 0.5 * (log_var + tf.square(labels - mean) / tf.exp(log_var) + math.log(2 * math.pi))
    return _spec(mode, tf.reduce_mean(nll), mean)


def heteroscedastic(features, labels, mode, params):
    """Heteroscedastic regression: a mean and a per-sample log-variance head."""
    h = _hidden(features)
    mean, log_var = L.Dense(1)(h), L.Dense(1)(h)
    nll = 0.5 * tf.exp(-log_var) * tf.square(labels - mean) + 0.5 * log_var
    return _spec(mode, tf.reduce_mean(nll), mean)


def vae(features, labels, mode, params):
    """A VAE of the features: the reparameterisation trick with tf.random.normal noise per
    sample, a Gaussian reconstruction and the KL to N(0, 1)."""
    h = _hidden(features)
    mean, log_var = L.Dense(2)(h), L.Dense(2)(h)
    z = mean + tf.exp(0.5 * log_var) * tf.random.normal(tf.shape(mean))
    reconstruction = L.Dense(FEATURES)(L.Dense(16, activation="relu")(z))
    kl = -0.5 * tf.reduce_sum(1.0 + log_var - tf.square(mean) - tf.exp(log_var), 1)
    loss = tf.reduce_mean(tf.reduce_sum(tf.square(features - reconstruction), 1) + kl)
    return _spec(mode, loss, mean)


def focal_loss(features, labels, mode, params):
    """Binary focal loss (gamma 2, alpha 0.25) on sigmoid logits."""
    logits = L.Dense(1)(_hidden(features))
    p = tf.sigmoid(logits)
    cross_entropy = tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
    p_t = labels * p + (1.0 - labels) * (1.0 - p)
    alpha_t = labels * 0.25 + (1.0 - labels) * 0.75
    loss = tf.reduce_mean(alpha_t * tf.pow(1.0 - p_t, 2.0) * cross_entropy)
    return _spec(mode, loss, p)


def tweedie(features, labels, mode, params):
    """Tweedie deviance (power 1.5) of a log-linked mean."""
    log_mu = L.Dense(1)(_hidden(features))
    p = 1.5
    loss = tf.reduce_mean(-labels * tf.exp(log_mu * (1.0 - p)) / (1.0 - p)
                          + tf.exp(log_mu * (2.0 - p)) / (2.0 - p))
    return _spec(mode, loss, tf.exp(log_mu))


def von_mises(features, labels, mode, params):
    """von Mises NLL of angles: log I0(kappa) by tf.math.bessel_i0e."""
    h = _hidden(features)
    mu = L.Dense(1)(h)
    kappa = tf.nn.softplus(L.Dense(1)(h)) + 1e-3
    log_i0 = tf.math.log(tf.math.bessel_i0e(kappa)) + kappa
    nll = -kappa * tf.cos(labels - mu) + log_i0 + math.log(2 * math.pi)
    return _spec(mode, tf.reduce_mean(nll), mu)


def ordinal_regression(features, labels, mode, params):
    """Cumulative-logit ordinal regression: one score, ordered cut points by cumsum of
    softplus increments, P(y = k) = sigma(c_k - s) - sigma(c_{k-1} - s)."""
    score = L.Dense(1)(_hidden(features))
    raw = v1.get_variable("cut_points", [CLASSES - 1],
                          initializer=v1.constant_initializer([-1.0, 0.0, 1.0]))
    cuts = tf.cumsum(tf.concat([raw[:1], tf.nn.softplus(raw[1:])], 0))
    cumulative = tf.sigmoid(cuts[None, :] - score)
    upper = tf.concat([cumulative, tf.ones_like(score)], 1)
    lower = tf.concat([tf.zeros_like(score), cumulative], 1)
    probabilities = tf.maximum(upper - lower, 1e-6)
    nll = -tf.reduce_sum(tf.one_hot(labels, CLASSES) * tf.math.log(probabilities), 1)
    return _spec(mode, tf.reduce_mean(nll), score)


def beta_bernoulli(features, labels, mode, params):
    """A Beta-Bernoulli model: the expected log-likelihood under Beta(a, b) (digamma) and
    the KL to a Beta(1, 1) prior (lbeta and digamma)."""
    ab = tf.nn.softplus(L.Dense(2)(_hidden(features))) + 0.5
    a, b = ab[:, :1], ab[:, 1:]
    total = a + b
    expected = (labels * (tf.math.digamma(a) - tf.math.digamma(total))
                + (1.0 - labels) * (tf.math.digamma(b) - tf.math.digamma(total)))
    kl = (-tf.math.lbeta(ab)[:, None] + (a - 1.0) * tf.math.digamma(a)
          + (b - 1.0) * tf.math.digamma(b) - (total - 2.0) * tf.math.digamma(total))
    return _spec(mode, tf.reduce_mean(-expected + 0.1 * kl), a / total)


def quantile_regression(features, labels, mode, params):
    """Pinball losses of three quantiles."""
    q = L.Dense(3)(_hidden(features))
    tau = tf.constant([0.1, 0.5, 0.9])
    error = labels - q
    loss = tf.reduce_mean(tf.maximum(tau * error, (tau - 1.0) * error))
    return _spec(mode, loss, q[:, 1])


def expectile_regression(features, labels, mode, params):
    """An asymmetric squared loss (expectile 0.8)."""
    prediction = L.Dense(1)(_hidden(features))
    error = labels - prediction
    weight = tf.where(error > 0, 0.8 * tf.ones_like(error), 0.2 * tf.ones_like(error))
    return _spec(mode, tf.reduce_mean(weight * tf.square(error)), prediction)


def binomial_counts(features, labels, mode, params):
    """A binomial NLL of counts out of 6 trials: the coefficient by lgamma, the likelihood
    by tf.math.xlogy and tf.math.xlog1py."""
    trials = 6.0
    p = tf.sigmoid(L.Dense(1)(_hidden(features)))
    successes = tf.minimum(labels, trials)
    log_coefficient = (tf.math.lgamma(trials + 1.0) - tf.math.lgamma(successes + 1.0)
                       - tf.math.lgamma(trials - successes + 1.0))
    log_likelihood = (log_coefficient + tf.math.xlogy(successes, p)
                      + tf.math.xlog1py(trials - successes, -p))
    return _spec(mode, -tf.reduce_mean(log_likelihood), trials * p)


def keras_poisson(features, labels, mode, params):
    """Keras' Poisson loss of a softplus rate."""
    rate = L.Dense(1, activation="softplus")(_hidden(features))
    return _spec(mode, tf.reduce_mean(tf.keras.losses.poisson(labels, rate)), rate)


def censored_gamma(features, labels, mode, params):
    """A Gamma survival likelihood with right-censoring (targets above 3 are censored): the
    survival function by tf.math.igammac (refused: no CS kernel computes Igammac)."""
    h = _hidden(features)
    alpha = tf.nn.softplus(L.Dense(1)(h)) + 0.1
    beta = tf.nn.softplus(L.Dense(1)(h)) + 0.1
    censored = labels > 3.0
    log_density = (alpha * tf.math.log(beta) + (alpha - 1.0) * tf.math.log(labels)
                   - beta * labels - tf.math.lgamma(alpha))
    log_survival = tf.math.log(tf.math.igammac(alpha, beta * 3.0))
    return _spec(mode, -tf.reduce_mean(tf.where(censored, log_survival, log_density)),
                 alpha / beta)


def mixed_precision_gamma(features, labels, mode, params):
    """The Gamma NLL with its layers under mixed_float16: lgamma of a float16 concentration
    (refused: the CS's lgamma is proven in float32 only)."""
    h = L.Dense(16, activation="tanh", dtype="mixed_float16")(features)
    alpha = tf.nn.softplus(L.Dense(1, dtype="mixed_float16")(h)) + 0.1
    beta = tf.nn.softplus(L.Dense(1)(tf.cast(h, tf.float32))) + 0.1
    log_gamma = tf.cast(tf.math.lgamma(alpha), tf.float32)
    alpha = tf.cast(alpha, tf.float32)
    nll = log_gamma - alpha * tf.math.log(beta) - (alpha - 1.0) * tf.math.log(labels) + beta * labels
    return _spec(mode, tf.reduce_mean(nll), alpha / beta)


# name -> (model_fn, params): the corpus, each model with the target it reads
CORPUS = {
    "poisson": (poisson_regression, {"target": "count"}),
    "poisson_full": (poisson_regression, {"target": "count", "full": True}),
    "negative_binomial": (negative_binomial, {"target": "count"}),
    "zero_inflated_poisson": (zero_inflated_poisson, {"target": "count"}),
    "gamma": (gamma_likelihood, {"target": "positive"}),
    "beta": (beta_likelihood, {"target": "unit"}),
    "dirichlet": (dirichlet_likelihood, {"target": "simplex"}),
    "dirichlet_kl": (dirichlet_kl, {"target": "simplex"}),
    "student_t": (student_t, {"target": "real"}),
    "evidential": (evidential_regression, {"target": "real"}),
    "mixture_density": (mixture_density, {"target": "real"}),
    "gaussian_nll": (gaussian_nll, {"target": "real"}),
    "heteroscedastic": (heteroscedastic, {"target": "real"}),
    "vae": (vae, {"target": "real"}),
    "focal": (focal_loss, {"target": "binary"}),
    "tweedie": (tweedie, {"target": "positive"}),
    "von_mises": (von_mises, {"target": "angle"}),
    "ordinal": (ordinal_regression, {"target": "ordinal"}),
    "beta_bernoulli": (beta_bernoulli, {"target": "binary"}),
    "binomial": (binomial_counts, {"target": "count"}),
    "keras_poisson": (keras_poisson, {"target": "count"}),
    "quantile": (quantile_regression, {"target": "real"}),
    "expectile": (expectile_regression, {"target": "real"}),
}

# what the CS refuses, each with the op its one line names
REFUSED = {
    "censored_gamma": (censored_gamma, {"target": "positive"}, "Igammac"),
    "mixed_precision_gamma": (mixed_precision_gamma, {"target": "positive"}, "Lgamma"),
}
