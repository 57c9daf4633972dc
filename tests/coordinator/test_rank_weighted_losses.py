"""Losses weighted by each item's rank in its list (unseen15's LambdaRank): the rank is
tf.argsort(tf.argsort(scores)) along a sample's own axis, an argsort of int32 positions (TF
negates them for the ascending order); the pairwise logistic loss of score differences,
weighted by the NDCG change of a swap under tf.stop_gradient, trains as TensorFlow trains it,
the final score's bias (cancelled in every difference) held at its exact gradient 0, and
evaluates and predicts on the CS as on the CPU. A float-only function of ints is refused in
one line."""
import cs_inprocess
import numpy as np
import pytest
import tensorflow as tf

from common.errors import CSRunError
from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

v1 = tf.compat.v1
DOCS, FEATURES = 6, 5
PARAMS = {"runconfig": {"tf_random_seed": 4}}


def input_fn(params):
    """Lists of DOCS documents of FEATURES values; relevance 0..3 from a linear score."""
    rng = np.random.default_rng(13)
    x = rng.normal(size=(64, DOCS, FEATURES)).astype(np.float32)
    relevance = np.digitize(x @ np.linspace(1.0, -0.5, FEATURES), [-0.5, 0.5, 1.5]).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((x, relevance)).batch(16, drop_remainder=True)


def discount(ranks):
    return np.log(2.0) / tf.math.log(tf.cast(ranks, tf.float32) + 2.0)


def model_fn(features, labels, mode, params):
    hidden = tf.keras.layers.Dense(16, activation="relu")(features)
    scores = tf.squeeze(tf.keras.layers.Dense(1, name="score")(hidden), -1)  # [B, DOCS]
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode=mode, predictions={"scores": scores})
    ranks = tf.argsort(tf.argsort(scores, direction="DESCENDING"))
    if params.get("squared_ranks"):
        ranks = tf.square(ranks)
    gain = tf.pow(2.0, labels) - 1.0
    ideal = tf.reduce_sum(tf.sort(gain, direction="DESCENDING") * discount(tf.range(DOCS))[None], 1)
    disc = discount(ranks)
    swap = tf.abs((gain[:, :, None] - gain[:, None, :]) * (disc[:, :, None] - disc[:, None, :]))
    swap = swap / tf.maximum(ideal, 1e-6)[:, None, None]
    pair = tf.cast(labels[:, :, None] > labels[:, None, :], tf.float32)
    margin = scores[:, :, None] - scores[:, None, :]
    loss = tf.reduce_sum(tf.stop_gradient(swap) * tf.nn.softplus(-margin) * pair) / \
        tf.maximum(tf.reduce_sum(pair), 1.0)
    if mode == ModeKeys.EVAL:
        ndcg = tf.reduce_sum(gain * disc, 1) / tf.maximum(ideal, 1e-6)
        return CSEstimatorSpec(mode=mode, loss=loss, eval_metric_ops={"ndcg": v1.metrics.mean(ndcg)})
    train_op = v1.train.AdamOptimizer(1e-2).minimize(loss, global_step=v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op)


def test_a_rank_weighted_pairwise_loss_trains_evaluates_and_predicts_like_tensorflow(tmp_path):
    result = cs_inprocess.compare(model_fn, input_fn, PARAMS, str(tmp_path), steps=4)
    assert cs_inprocess.zero_gradient_variables(result.compiled) == {"score/bias"}
    cs_inprocess.assert_same_training(result, rtol=1e-5)  # (the bias against its start)
    assert cs_inprocess.evaluation_mismatch(model_fn, input_fn, PARAMS, str(tmp_path), result) == ""
    assert cs_inprocess.prediction_mismatch(model_fn, input_fn, PARAMS, str(tmp_path), result) == ""


def test_a_float_only_function_of_ints_is_refused_in_one_line(tmp_path):
    with pytest.raises(CSRunError) as refused:
        cs_inprocess.compile_checked(model_fn, input_fn, {**PARAMS, "squared_ranks": True}, str(tmp_path))
    message = refused.value.message
    assert message.startswith("validation failed: Square ") and "test_rank_weighted_losses.py:" in message
    assert "Square of int32 values: the CS computes it of floats (and abs, neg of ints); tf.cast to " \
           "float32 first" in message
