"""Batch statistics (tests/batch_statistic_models.py): a sum, mean, max or min over the batch
axis that every sample reads (DEC's target distribution, centring, scaling, standardising), a
batch_reduce barrier, trained in process on the simulated CS against TensorFlow
(tests/cs_inprocess.py) whatever the micro-batch size and with replicas; evaluated on the CS
with the CPU's metrics; the statistics the CS does not carry out refused naming the op."""
from __future__ import annotations

import batch_statistic_models as models
import cs_inprocess
import pytest

from common.errors import CSRunError

PARAMS = {"batch_size": models.BATCH, "runconfig": {"tf_random_seed": 7}}  # the same initial weights every run
RTOL = 1e-5


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return cs_inprocess.micro_batch_comparisons(models.input_fn, tmp_path_factory, models.STEPS)


def train_both(prepared, model_fn, micro: int, replicas: int = 1) -> cs_inprocess.Comparison:
    return prepared(model_fn, {**PARAMS, "runconfig": {"num_replicas": replicas}}, micro)


@pytest.mark.parametrize("micro, replicas", [(8, 1), (4, 1), (1, 1), (2, 2)])
def test_deep_embedded_clustering_trains_like_tensorflow(prepared, micro, replicas):
    """The barrier sums the whole batch's soft assignments (every replica's)."""
    result = train_both(prepared, models.dec_model_fn, micro, replicas)
    cs_inprocess.assert_same_training(result, rtol=RTOL)
    assert [k.type for k in result.compiled.program.kernels].count("batch_reduce") == 1
    assert f"Batch barrier: Sum_2 (the whole batch's statistic): the batch waits 2 x {8 - replicas} x" \
        in result.compiled.report_text


@pytest.mark.parametrize("model_fn, statistics", [
    (models.centred_model_fn, 2), (models.max_shifted_model_fn, 1), (models.standardised_model_fn, 3),
    (models.moments_whitened_model_fn, 2)])
@pytest.mark.parametrize("micro", [8, 1])
def test_features_normalised_by_batch_statistics_train_like_tensorflow(prepared, model_fn,
                                                                      statistics, micro):
    """Centred by the batch's mean, shifted by its max, standardised by its mean and
    tf.math.reduce_std (+ eps: element-wise ops of a statistic alone run per sample; the
    variance's own mean is a statistic too), whitened by tf.nn.moments (its stop_gradient
    and squeezes)."""
    result = train_both(prepared, model_fn, micro)
    cs_inprocess.assert_same_training(result, rtol=RTOL)
    assert [k.type for k in result.compiled.program.kernels].count("batch_reduce") == statistics


def test_deep_embedded_clustering_evaluates_on_the_cs_with_the_cpus_metrics(tmp_path, prepared):
    """An eval batch computes its own statistic, as TF does."""
    result = train_both(prepared, models.dec_model_fn, 2)
    assert cs_inprocess.evaluation_mismatch(models.dec_model_fn, models.input_fn, PARAMS,
                                            str(tmp_path), result, rtol=RTOL) == ""


@pytest.mark.parametrize("model_fn", [models.vicreg_model_fn, models.barlow_twins_model_fn])
def test_losses_that_are_functions_of_batch_statistics_train_like_tensorflow(prepared, model_fn):
    """VICReg's variance hinge (of tf.math.reduce_variance, whose mean is a batch_reduce
    barrier) and Barlow Twins' cross-correlation: a batch_tail_loss barrier."""
    result = train_both(prepared, model_fn, 2)
    cs_inprocess.assert_same_training(result, rtol=RTOL)
    assert "batch_tail_loss" in [k.type for k in result.compiled.program.kernels]


@pytest.mark.parametrize("model_fn, words", [
    (models.min_max_model_fn, "reduce over non-batch axes"),
    (models.max_scaled_model_fn, "reduce over non-batch axes"),
])
def test_batch_statistics_the_cs_does_not_carry_out_are_refused_naming_the_op(tmp_path, model_fn, words):
    with pytest.raises(CSRunError) as error:
        cs_inprocess.compile_checked(model_fn, models.input_fn, PARAMS, str(tmp_path))
    op_words = cs_inprocess.model_op_words(model_fn, models.input_fn, PARAMS)
    assert cs_inprocess.refusal_problem(error.value, models.__file__, op_words) == ""
    assert words in str(error.value)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(8))
def test_random_batch_statistic_models_train_like_tensorflow(tmp_path, seed):
    """Differential: classifiers normalised by batch statistics drawn at random, at a random
    batch and micro-batch size."""
    result = cs_inprocess.random_split_comparison(models.random_model_fn(seed), models.input_fn,
                                                  models.STEPS, 2100 + seed, str(tmp_path))
    assert any(k.type == "batch_reduce" for k in result.compiled.program.kernels)
    # the differential corpus's tolerance: seed 3 (Adam, two standardised layers) once ended
    # 3e-5 apart on one kernel element in a loaded fresh-clone run, 1e-6 alone
    cs_inprocess.assert_same_training(result, rtol=1e-4)
