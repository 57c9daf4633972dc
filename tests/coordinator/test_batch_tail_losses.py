"""Losses non-linear in statistics of the whole batch (tests/batch_loss_models.py): a
Mixture-of-Experts balance loss, VICReg, Barlow Twins, batch-mean matching, a Pearson
correlation, the entropy of the batch's mean prediction, Proxy-Anchor's loss over the
proxies with a positive in the batch, BPR's tf.nn.l2_loss of the looked-up embeddings, a
Dice loss over the flattened batch and GE2E's over the batch regrouped by speaker, evaluated
once per batch by a batch_tail_loss barrier, trained in process on the simulated CS against TensorFlow
(tests/cs_inprocess.py) whatever the micro-batch size and with replicas; evaluated on the CS
with the CPU's metrics; weight penalties and a learned temperature added; a batch statistic of that kind feeding
per-sample activations refused naming the op."""
from __future__ import annotations

import batch_loss_models as models
import cs_inprocess
import pytest

PARAMS = {"batch_size": models.BATCH, "runconfig": {"tf_random_seed": 7}}  # the same initial weights every run
RTOL = 1e-5


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return cs_inprocess.micro_batch_comparisons(models.input_fn, tmp_path_factory, models.STEPS)


@pytest.mark.parametrize("micro, replicas", [(8, 1), (1, 1), (2, 2)])
def test_moe_balance_loss_trains_like_tensorflow(prepared, micro, replicas):
    """importance x load: the barrier gathers every replica's gates and routing masks."""
    result = prepared(models.moe_balance_model_fn, PARAMS, micro, replicas)
    cs_inprocess.assert_same_training(result, rtol=RTOL)
    assert [k.type for k in result.compiled.program.kernels].count("batch_tail_loss") == 1
    assert f"Batch barrier: loss (the whole batch's values of the loss): the batch waits 2 x " \
        f"{8 - replicas} x" in result.compiled.report_text
    assert "Loss: evaluated once per batch from the whole batch's" in result.compiled.report_text


def test_weight_penalties_added_to_a_loss_of_the_whole_batch_train_like_tensorflow(prepared):
    """Keras L2 regularizers (model.losses) added to the balance loss: measured apart, each
    weight's penalty on its own region."""
    result = prepared(models.moe_penalised_model_fn, PARAMS, 2)
    cs_inprocess.assert_same_training(result, rtol=RTOL)
    penalised = {p.variable: [(r.kind, round(r.scale, 9)) for r in p.regularizers]
                 for k in result.compiled.program.kernels for p in k.params if p.regularizers}
    assert len(penalised) == 1 + models.EXPERTS
    assert set(map(tuple, penalised.values())) == {(("l2", 0.001),)}  # 1e-3 * sum(w ** 2)


@pytest.mark.parametrize("model_fn", [
    models.moe_cv_model_fn, models.vicreg_model_fn, models.barlow_twins_model_fn,
    models.mean_matching_model_fn, models.pearson_model_fn, models.diversity_model_fn,
    models.iic_model_fn, models.proxy_anchor_model_fn])
@pytest.mark.parametrize("micro", [8, 2])
def test_batch_level_losses_train_like_tensorflow(prepared, model_fn, micro):
    """cv_squared of the experts' summed gates, VICReg's variance hinge and off-diagonal
    covariance, Barlow Twins' cross-correlation (tf.linalg.diag_part), (mean(pred) -
    mean(y)) ** 2, 1 - Pearson's r, the batch's mean prediction's entropy and IIC's mutual
    information (a transpose and clip_by_value of the batch's joint distribution),
    Proxy-Anchor's terms over the proxies with a positive (a comparison cast to float32)."""
    result = prepared(model_fn, PARAMS, micro)
    cs_inprocess.assert_same_training(result, rtol=RTOL)
    assert [k.type for k in result.compiled.program.kernels].count("batch_tail_loss") == 1


@pytest.mark.parametrize("model_fn", [models.moe_balance_model_fn, models.diversity_model_fn,
                                      models.mean_matching_model_fn, models.proxy_anchor_model_fn])
def test_batch_level_losses_evaluate_on_the_cs_with_the_cpus_metrics(tmp_path, prepared, model_fn):
    """The eval batch's loss is its own batch's, its metrics (of the tail's values too:
    the balance, the entropy) the CPU's."""
    result = prepared(model_fn, PARAMS, 2)
    assert cs_inprocess.evaluation_mismatch(model_fn, models.input_fn, PARAMS, str(tmp_path),
                                            result, rtol=RTOL) == ""


def test_an_l2_penalty_of_looked_up_embeddings_trains_and_evaluates_like_tensorflow(tmp_path):
    """BPR's reg / B, reg = tf.nn.l2_loss of each [B, d] lookup: sum(x ** 2) / 2 of the
    whole batch, in the barrier (L2LossGrad x * g back to each sample's embeddings)."""
    result = cs_inprocess.compare(models.bpr_model_fn, models.pairs_input_fn, PARAMS,
                                  str(tmp_path / "train"), steps=models.STEPS)
    cs_inprocess.assert_same_training(result, rtol=RTOL)
    assert [k.type for k in result.compiled.program.kernels].count("batch_tail_loss") == 1
    assert cs_inprocess.evaluation_mismatch(models.bpr_model_fn, models.pairs_input_fn, PARAMS,
                                            str(tmp_path / "eval"), result, rtol=RTOL) == ""


@pytest.mark.parametrize("micro", [8, 2])
def test_a_dice_loss_over_the_flattened_batch_trains_and_evaluates_like_tensorflow(
        tmp_path, tmp_path_factory, micro):
    """BCE + 1 - Dice with K.flatten(y) over the batch ([B * 64]: each sample's pixels
    folded into the batch): the barrier reads the batch's [B, 64] in TF's [B * 64]."""
    compare = cs_inprocess.micro_batch_comparisons(models.masks_input_fn, tmp_path_factory,
                                                   models.STEPS)
    result = compare(models.dice_model_fn, PARAMS, micro)
    cs_inprocess.assert_same_training(result, rtol=RTOL)
    assert [k.type for k in result.compiled.program.kernels].count("batch_tail_loss") == 1
    assert cs_inprocess.cpu_path_mismatches(models.dice_model_fn, models.masks_input_fn, PARAMS,
                                            str(tmp_path), result) == []


def test_a_ge2e_loss_over_the_regrouped_batch_trains_and_evaluates_like_tensorflow(tmp_path):
    """tf.reshape(e, [speakers, utterances, d]) of the batch, centroids, a learned scale
    tf.maximum(w, 1e-6) and bias: the barrier regroups the batch as TF does, every sample
    given w and b; the eval's centroid accuracy is the CPU's."""
    params = {**PARAMS, "batch_size": models.SPEAKERS * models.UTTERANCES}
    result = cs_inprocess.compare(models.ge2e_model_fn, models.utterances_input_fn, params,
                                  str(tmp_path / "train"), steps=models.STEPS)
    cs_inprocess.assert_same_training(result, rtol=RTOL)
    start = result.compiled.initial_weights
    assert result.cs.state["ge2e_w"] != start["ge2e_w"]  # (b shifts every logit: its gradient 0)
    assert [k.type for k in result.compiled.program.kernels].count("batch_tail_loss") == 1
    assert cs_inprocess.evaluation_mismatch(models.ge2e_model_fn, models.utterances_input_fn,
                                            params, str(tmp_path / "eval"), result, rtol=RTOL) == ""


def test_a_batch_statistic_feeding_per_sample_activations_is_refused_naming_the_op(tmp_path):
    message = cs_inprocess.refusal(models.gated_by_importance_model_fn, models.input_fn, PARAMS,
                                   str(tmp_path), models.__file__)
    assert "Mul 'mul'" in message and "only in the loss" in message


def test_a_weight_scalar_inside_a_loss_of_the_whole_batch_trains_like_tensorflow(prepared):
    """The batch entropy times a learned temperature, on 2 replicas of micro-batch 2: every
    sample is given the temperature, the tail reads the batch's first copy, its gradient
    back to the weight through that sample's."""
    result = prepared(models.learned_temperature_model_fn, PARAMS, 2, 2)
    cs_inprocess.assert_same_training(result, rtol=RTOL)
    assert result.cs.state["temperature"] != result.compiled.initial_weights["temperature"]
