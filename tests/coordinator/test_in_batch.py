"""In-batch products (tests/inbatch_models.py), compiled and trained in process on the
simulated CS against TensorFlow (tests/cs_inprocess.py): a two-tower retrieval model with
in-batch negatives (tf.range labels), a SimCLR/CLIP-style symmetric InfoNCE (tf.eye labels,
tf.transpose of the logits) and attention over the batch feeding a Keras classifier, each
TF's numbers whatever the micro-batch size and with replicas; the CS's evaluation equals
the CPU's; the compile report charges the barriers; a product the CS does not carry out is
refused naming the op."""
from __future__ import annotations

import cs_inprocess
import inbatch_models as models
import pytest

PARAMS = {"batch_size": models.BATCH, "runconfig": {"tf_random_seed": 7}}  # the same initial weights every run
RTOL = 1e-5


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return cs_inprocess.micro_batch_comparisons(models.input_fn, tmp_path_factory, models.STEPS)


def train_both(prepared, model_fn, micro: int, replicas: int = 1) -> cs_inprocess.Comparison:
    return prepared(model_fn, {**PARAMS, "runconfig": {"num_replicas": replicas}}, micro)


@pytest.mark.slow
@pytest.mark.parametrize("micro, replicas", [(8, 1), (2, 1), (1, 1), (2, 2)])
def test_two_tower_retrieval_with_in_batch_negatives_trains_like_tensorflow(prepared, micro, replicas):
    """The batch barrier holds the whole batch (every replica's): the micro-batch size and
    the replicas change nothing."""
    result = train_both(prepared, models.two_tower_model_fn, micro, replicas)
    cs_inprocess.assert_same_training(result, rtol=RTOL)
    kernels = {k.type for k in result.compiled.program.kernels}
    assert {"in_batch_matmul", "sample_constant"} <= kernels
    assert f"Batch barrier: MatMul (the whole batch's operand): the batch waits 2 x {8 - replicas} x" \
        in result.compiled.report_text


@pytest.mark.slow
def test_symmetric_infonce_trains_like_tensorflow(prepared):
    result = train_both(prepared, models.symmetric_model_fn, 2)
    cs_inprocess.assert_same_training(result, rtol=RTOL)
    assert [k.type for k in result.compiled.program.kernels].count("sample_constant") == 2
    assert "Batch barrier: transpose (the whole batch's value)" in result.compiled.report_text


@pytest.mark.slow
def test_attention_over_the_batch_feeding_more_layers_trains_like_tensorflow(prepared):
    result = train_both(prepared, models.batch_attention_model_fn, 4)
    cs_inprocess.assert_same_training(result, rtol=RTOL)
    assert [k.type for k in result.compiled.program.kernels].count("in_batch_matmul") == 2


@pytest.mark.slow
def test_two_tower_evaluates_on_the_cs_with_the_cpus_metrics(tmp_path, prepared):
    result = train_both(prepared, models.two_tower_model_fn, 2)
    assert cs_inprocess.evaluation_mismatch(models.two_tower_model_fn, models.input_fn, PARAMS,
                                            str(tmp_path), result, rtol=RTOL) == ""


def test_a_product_over_the_batch_whose_rows_are_no_samples_trains_like_tensorflow(prepared):
    """Barlow Twins' cross-correlation tf.matmul(za, zb, transpose_a=True) is [n, n]: a value
    of the loss over the whole batch (a batch_tail_loss barrier)."""
    result = train_both(prepared, models.cross_correlation_model_fn, 2)
    cs_inprocess.assert_same_training(result, rtol=RTOL)
    assert "batch_tail_loss" in [k.type for k in result.compiled.program.kernels]


@pytest.mark.slow
def test_a_softmax_over_the_batch_axis_and_its_diagonal_train_like_tensorflow(prepared):
    """tf.nn.log_softmax(logits, axis=0) transposes the logits there and back (two
    batch_transpose barriers); tf.linalg.diag_part takes each sample's own entry."""
    result = train_both(prepared, models.column_softmax_model_fn, 2)
    cs_inprocess.assert_same_training(result, rtol=RTOL)
    types = [k.type for k in result.compiled.program.kernels]
    assert types.count("batch_transpose") == 2 and "sample_gather" in types


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
def test_random_in_batch_models_train_like_tensorflow(tmp_path, seed):
    """Differential: two-tower contrastive models drawn at random, at a random batch and
    micro-batch size."""
    result = cs_inprocess.random_split_comparison(models.random_model_fn(seed), models.input_fn,
                                                  models.STEPS, 1000 + seed, str(tmp_path))
    cs_inprocess.assert_same_training(result, rtol=RTOL)
