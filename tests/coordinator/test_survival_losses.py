"""Survival and ranking losses over the batch (tests/survival_models.py): DeepSurv's Cox
partial likelihood in its sort form (tf.argsort of the times, tf.gather, cumulative
logsumexp or log(cumsum(exp))) carried out by a batch_tail_loss barrier, in its [B, B] mask
form by batch rows, ListMLE over the batch and a pairwise hinge over its [B, B] pairs; trained in process on the simulated CS
against TensorFlow (tied times in every batch) whatever the micro-batch size, evaluated (a
hand-written concordance index) and predicted on the CS with the CPU path's numbers; what
the CS cannot sort refused naming the op."""
from __future__ import annotations

import cs_inprocess
import pytest
import survival_models as models
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec

PARAMS = {"batch_size": models.BATCH, "runconfig": {"tf_random_seed": 7}}
RTOL = 1e-5


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return cs_inprocess.micro_batch_comparisons(models.input_fn, tmp_path_factory, models.STEPS)


@pytest.mark.parametrize("model_fn", [models.cox_sort_model_fn, models.list_mle_model_fn])
@pytest.mark.parametrize("micro, replicas", [(8, 1), (1, 1), (2, 2)])
def test_losses_of_the_batch_sorted_train_like_tensorflow(prepared, model_fn, micro, replicas):
    """The order of the times (equal ones by lower index first, as TF's top_k) taken once
    the whole batch is in: the same numbers for any micro-batch size and on replicas."""
    result = prepared(model_fn, PARAMS, micro, replicas)
    cs_inprocess.assert_same_training(result, rtol=RTOL)
    assert [k.type for k in result.compiled.program.kernels].count("batch_tail_loss") == 1


@pytest.mark.parametrize("model_fn", [models.cox_mask_model_fn,
                                      models.cox_masked_logsumexp_model_fn,
                                      models.cox_where_model_fn,
                                      models.pairwise_hinge_model_fn])
def test_losses_over_every_pair_of_the_batch_train_like_tensorflow(prepared, model_fn):
    """The Cox loss's mask form, t[None, :] >= t[:, None] (ties at risk, as TF compares)
    times exp(risk)[None, :], plus its log in a tf.reduce_logsumexp or picking the risks by
    tf.where(at_risk, risk[None, :], -inf), and a pairwise hinge
    over the pairs ordered by time: batch rows, the loss a sum divided by a count of the
    labels."""
    for micro in (8, 1):
        result = prepared(model_fn, PARAMS, micro)
        cs_inprocess.assert_same_training(result, rtol=RTOL)
    assert "batch_row" in [k.type for k in result.compiled.program.kernels]


def test_the_cox_loss_with_labels_of_two_columns_trains_like_tensorflow(tmp_path):
    """Labels [B, 2] (time, event); the risk set's sum as log(cumsum(exp(risk)))."""
    result = cs_inprocess.compare(models.cox_cumsum_model_fn, models.stacked_input_fn, PARAMS,
                                  str(tmp_path), steps=models.STEPS)
    cs_inprocess.assert_same_training(result, rtol=RTOL)


@pytest.mark.parametrize("model_fn", [models.cox_sort_model_fn, models.cox_mask_model_fn])
def test_the_cox_loss_evaluates_and_predicts_on_the_cs_like_the_cpu(tmp_path, prepared, model_fn):
    """Eval: each batch's partial likelihood and the concordance index of its pairs; predict:
    each sample's risk, no barrier."""
    result = prepared(model_fn, PARAMS, 2)
    assert cs_inprocess.evaluation_mismatch(model_fn, models.input_fn, PARAMS,
                                            str(tmp_path / "eval"), result, rtol=RTOL) == ""
    assert cs_inprocess.prediction_mismatch(model_fn, models.input_fn, PARAMS,
                                            str(tmp_path / "predict"), result, rtol=RTOL) == ""


def ranked_model_fn(features, labels, mode, params):
    """A per-sample loss; predictions and a metric that rank the batch by risk."""
    risk = tf.keras.layers.Dense(1)(features)[:, 0]
    if mode == "infer":
        return CSEstimatorSpec(mode=mode, predictions={
            "risk": risk, "order": tf.argsort(risk, direction="DESCENDING")})
    loss = tf.reduce_mean(tf.square(risk - tf.math.log1p(labels["time"])))
    if mode == "eval":
        riskiest = tf.gather(labels["time"], tf.argsort(risk, direction="DESCENDING"))[:2]
        return CSEstimatorSpec(mode=mode, loss=loss, eval_metric_ops={
            "riskiest_time": tf.compat.v1.metrics.mean(riskiest)})
    return _train(mode, loss)


def test_a_ranking_of_the_batch_the_host_reads_is_the_cpus(tmp_path, prepared):
    """tf.argsort of the batch's risks in predictions and a metric: computed by the host
    from the streamed risks of the whole batch."""
    result = prepared(ranked_model_fn, PARAMS, 2)
    assert cs_inprocess.evaluation_mismatch(ranked_model_fn, models.input_fn, PARAMS,
                                            str(tmp_path / "eval"), result, rtol=RTOL) == ""
    assert cs_inprocess.prediction_mismatch(ranked_model_fn, models.input_fn, PARAMS,
                                            str(tmp_path / "predict"), result, rtol=RTOL) == ""


def top_half_model_fn(features, labels, mode, params):
    """Hard-example mining: the mean of the largest half of the per-sample losses."""
    risk = tf.keras.layers.Dense(1)(features)[:, 0]
    losses = tf.square(risk - tf.math.log1p(labels["time"]))
    loss = tf.reduce_mean(tf.math.top_k(losses, models.BATCH // 2).values)
    return _train(mode, loss)


def test_the_largest_losses_of_the_batch_train_like_tensorflow(prepared):
    """tf.math.top_k of the per-sample losses with k < B: its gradient to the chosen
    samples alone (TF's _TopKGrad)."""
    cs_inprocess.assert_same_training(prepared(top_half_model_fn, PARAMS, 2), rtol=RTOL)


def integer_days_model_fn(features, labels, mode, params):
    """The risk set ordered by whole days, an int32 value."""
    risk = tf.keras.layers.Dense(1)(features)[:, 0]
    days = tf.cast(labels["time"] * 10.0, tf.int32)
    ranked = tf.gather(risk, tf.argsort(days, direction="DESCENDING"))
    loss = -tf.reduce_mean(ranked - tf.math.cumulative_logsumexp(ranked))
    return _train(mode, loss)


def unsorted_top_k_model_fn(features, labels, mode, params):
    """The largest half of the losses in the order TF's top_k leaves them (sorted=False)."""
    risk = tf.keras.layers.Dense(1)(features)[:, 0]
    losses = tf.square(risk - tf.math.log1p(labels["time"]))
    largest = tf.math.top_k(losses, models.BATCH // 2, sorted=False).values
    return _train(mode, tf.reduce_sum(largest * tf.range(1.0, 1.0 + models.BATCH // 2)))


def sorted_layer_model_fn(features, labels, mode, params):
    """The batch's risks in time order fed to a layer: samples meeting inside the model."""
    risk = tf.keras.layers.Dense(1)(features)[:, 0]
    ranked = tf.gather(risk, tf.argsort(labels["time"]))
    return _train(mode, tf.reduce_mean(tf.keras.layers.Dense(1)(ranked[:, None])))


def _train(mode, loss):
    optimizer = tf.compat.v1.train.AdamOptimizer(0.01)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=optimizer.minimize(
        loss, global_step=tf.compat.v1.train.get_or_create_global_step()))


@pytest.mark.parametrize("model_fn, words", [
    (integer_days_model_fn, "TopKV2 'argsort/TopKV2'"),
    (unsorted_top_k_model_fn, "TopKV2 'TopKV2'"),
    (sorted_layer_model_fn, "GatherV2 'GatherV2'"),
    (models.cox_tiled_model_fn, "views a per-sample value as a row of the whole batch")])
def test_what_the_cs_cannot_sort_is_refused_naming_the_op(tmp_path, model_fn, words):
    """An int32 order, top_k with sorted=False, samples sorted into a layer, the batch's row
    tiled before tf.where."""
    source = models.__file__ if model_fn is models.cox_tiled_model_fn else __file__
    message = cs_inprocess.refusal(model_fn, models.input_fn, PARAMS, str(tmp_path), source)
    assert words in message, message
