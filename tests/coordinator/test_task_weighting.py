"""Multi-task losses weighted by learned uncertainties (Kendall et al.): loss = sum_i
exp(-s_i) * L_i + s_i with s_i trainable scalars and L_i batch means, carried out on the CS
(each task's per-sample values times the weight program's exp(-s_i), the + s_i terms given
to every sample over the batch size) and trained and evaluated with TF's numbers; the
weightings the CS cannot carry out refused in one line."""
from __future__ import annotations

import cs_inprocess
import numpy as np
import pytest
import tensorflow as tf

from common.errors import CSRunError
from coordinator.compiler import compile_model
from tf_model.estimator_spec import CSEstimatorSpec

v1 = tf.compat.v1
BATCH = 8


def input_fn(params):
    rng = np.random.default_rng(4)
    n = BATCH * 8
    x = rng.normal(size=(n, 5)).astype(np.float32)
    target = (x[:, :1] * 2 - x[:, 1:2] + 0.3 * rng.normal(size=(n, 1))).astype(np.float32)
    labels = (x[:, 2] > 0).astype(np.int32) + (x[:, 3] > 1).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices(({"x": x, "target": target}, labels)).repeat().batch(
        params["batch_size"], drop_remainder=True)


def multitask(features, labels, mode, params):
    """A shared trunk, a regression head (MSE) and a classification head (cross-entropy),
    their losses weighted by learned log-variances as the paper's forms write them."""
    trunk, head = tf.keras.layers.Dense(8, activation="relu"), tf.keras.layers.Dense(1)
    h = trunk(features["x"])
    prediction = head(h)
    logits = tf.keras.layers.Dense(3)(h)
    regression = v1.losses.mean_squared_error(features["target"], prediction)
    classification = tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
    form = params["form"]
    if form == "log_vars":  # one vector of log-variances, s = log(sigma^2)
        s = v1.get_variable("log_vars", initializer=[0.3, -0.2])
        loss = tf.exp(-s[0]) * regression + s[0] + tf.exp(-s[1]) * classification + s[1]
    elif form == "half":  # s = log(sigma): 1/(2 sigma^2) L + log(sigma), and an L2 penalty
        # (one variable: a scalar variable read only by + s would race TF's own reported loss
        # with its Adam update, TF reading it before or after; the CS reads it before)
        s1, s2 = tf.unstack(v1.get_variable("log_sigma", initializer=[0.1, -0.1]))
        loss = 0.5 * tf.exp(-2.0 * s1) * regression + s1 + tf.exp(-2.0 * s2) * classification + s2
        loss += 1e-3 * (tf.nn.l2_loss(trunk.kernel) + tf.nn.l2_loss(head.kernel))
    elif form == "twice_weighted":  # a task weighted by two weights in turn: refused
        s1 = v1.get_variable("s1", initializer=0.5)
        loss = tf.exp(-s1) * regression * s1 + classification + s1
    elif form == "counted":  # a task's mean over its labelled samples (a count of the batch)
        s = v1.get_variable("log_vars", initializer=[0.3, -0.2])
        labelled = tf.cast(labels > 0, tf.float32)
        counted = v1.losses.mean_squared_error(features["target"], prediction,
                                               weights=labelled[:, None])
        loss = tf.exp(-s[0]) * counted + s[0] + classification
    elif form == "divided":  # L / (2 sigma^2) + log(sigma): a division by weights, refused
        sigma = v1.get_variable("sigma", initializer=1.0)
        loss = regression / (2.0 * tf.square(sigma)) + tf.math.log(sigma) + classification
    train_op = v1.train.AdamOptimizer(0.05).minimize(loss, global_step=v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op)


def params(form):
    return {"batch_size": BATCH, "form": form, "runconfig": {"tf_random_seed": 9}}


@pytest.mark.parametrize("form", ["log_vars", "half"])
def test_uncertainty_weighted_tasks_train_and_evaluate_like_tensorflow(tmp_path, form):
    run = cs_inprocess.compare(multitask, input_fn, params(form), str(tmp_path / "train"), steps=4)
    assert "broadcast" in [k.type for k in run.compiled.program.kernels]  # the + s terms
    cs_inprocess.assert_same_training(run)
    learned = run.cs.state["log_vars" if form == "log_vars" else "log_sigma"]
    assert np.all(learned != np.float32([0.3, -0.2] if form == "log_vars" else [0.1, -0.1]))
    assert cs_inprocess.evaluation_mismatch(multitask, input_fn, params(form),
                                            str(tmp_path / "eval"), run) == ""


@pytest.mark.parametrize("form, says", [
    ("twice_weighted", "a product of weights with each other"),
    ("divided", "write it as a factor, L * tf.math.reciprocal(2 * sigma ** 2)"),
    ("counted", "divide by the batch size, not by a count of its values")])
def test_weightings_the_cs_cannot_carry_out_are_refused_in_one_line(tmp_path, form, says):
    with pytest.raises(CSRunError) as error:
        compile_model(multitask, input_fn, params(form), str(tmp_path), validate_only=True)
    words = cs_inprocess.model_op_words(multitask, input_fn, params(form))
    assert cs_inprocess.refusal_problem(error.value, __file__, words) == ""
    assert says in str(error.value)
