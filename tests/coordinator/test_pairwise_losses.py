"""Losses over every pair of the batch (tests/pairwise_models.py: batch-hard triplet,
SupCon, a contrastive pair loss, N-pair losses, a loss averaged over the same-label pairs),
compiled and trained in process on the simulated CS against TensorFlow
(tests/cs_inprocess.py): a per-sample value viewed as a row of the batch (sq[None, :],
tf.expand_dims(x, 0), tf.reshape(x, [1, -1]), tf.transpose(x[:, None]), labels[None, :])
is a batch_row barrier, TF's numbers whatever the micro-batch size and with replicas; the
CS's evaluation equals the CPU's; a row no element-wise op pairs with the samples is refused
naming the op."""
from __future__ import annotations

import cs_inprocess
import pairwise_models as models
import pytest

from common.errors import CSRunError

PARAMS = {"batch_size": models.BATCH, "runconfig": {"tf_random_seed": 7}}  # the same initial weights every run
RTOL = 1e-5


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return cs_inprocess.micro_batch_comparisons(models.input_fn, tmp_path_factory, models.STEPS)


def kernel_types(result: cs_inprocess.Comparison) -> list[str]:
    return [k.type for k in result.compiled.program.kernels]


@pytest.mark.parametrize("micro, replicas", [(16, 1), (4, 1), (8, 2)])
def test_batch_hard_triplet_loss_trains_like_tensorflow(prepared, micro, replicas):
    """sq[None, :] and labels[None, :] are rows of the whole batch (every replica's): the
    hardest positive and negative of each row, the margin's relu and the mean are per-sample
    computation and the loss's."""
    result = prepared(models.batch_hard_triplet_model_fn, PARAMS, micro, replicas)
    cs_inprocess.assert_same_training(result, rtol=RTOL)
    assert kernel_types(result).count("batch_row") == 2
    report = result.compiled.report_text
    assert "Batch barrier: strided_slice_3 (the whole batch's values)" in report


def test_triplet_loss_with_expand_dims_reshape_and_transpose_rows_trains_like_tensorflow(prepared):
    result = prepared(models.triplet_expand_dims_model_fn, PARAMS, 4)
    cs_inprocess.assert_same_training(result, rtol=RTOL)
    assert kernel_types(result).count("batch_row") == 3


@pytest.mark.parametrize("micro, replicas", [(4, 1), (4, 2)])
def test_the_widely_copied_batch_hard_triplet_code_trains_like_tensorflow(prepared, micro,
                                                                          replicas):
    """tf.matmul(e, tf.transpose(e)) is the in-batch product, tf.linalg.diag_part of it each
    sample's squared norm, tf.logical_not of the masks per sample; the distances' sqrt
    behind its tf.equal(distances, 0.0) guard."""
    result = prepared(models.moindrot_batch_hard_model_fn, PARAMS, micro, replicas)
    cs_inprocess.assert_same_training(result, rtol=RTOL)
    types = kernel_types(result)
    assert types.count("batch_row") == 3 and {"in_batch_matmul", "sample_gather"} <= set(types)


@pytest.mark.parametrize("model_fn, micro, replicas", [
    (models.supcon_model_fn, 8, 1), (models.supcon_model_fn, 4, 2),
    (models.supcon_logsumexp_model_fn, 4, 1)])
def test_supervised_contrastive_loss_trains_like_tensorflow(prepared, model_fn, micro, replicas):
    result = prepared(model_fn, PARAMS, micro, replicas)
    cs_inprocess.assert_same_training(result, rtol=RTOL)
    assert {"batch_row", "in_batch_matmul", "sample_constant"} <= set(kernel_types(result))


@pytest.mark.parametrize("micro, replicas", [(4, 1), (8, 2)])
def test_contrastive_pair_loss_of_broadcast_embeddings_trains_like_tensorflow(prepared, micro,
                                                                              replicas):
    """e[None, :, :]: each sample reads the whole batch's embeddings, [batch, n], and its
    gradient sums every sample's."""
    result = prepared(models.contrastive_pair_model_fn, PARAMS, micro, replicas)
    cs_inprocess.assert_same_training(result, rtol=RTOL)
    rows = [k for k in result.compiled.program.kernels if k.type == "batch_row"]
    assert [tuple(k.output_shape) for k in rows] == [(models.BATCH, 4), (models.BATCH,)]


def test_npairs_losses_train_like_tensorflow(prepared):
    """TF Addons' npairs_loss (a row-normalised same-label mask as soft targets) and Sohn's
    multi-class N-pair loss (the positives by tf.linalg.tensor_diag_part)."""
    for model_fn in (models.npairs_model_fn, models.multiclass_npair_model_fn):
        result = prepared(model_fn, PARAMS, 4)
        cs_inprocess.assert_same_training(result, rtol=RTOL)
    assert "sample_gather" in kernel_types(result)


def test_a_loss_averaged_over_the_same_label_pairs_trains_like_tensorflow(prepared):
    """The divisor tf.reduce_sum(similar) is computed from the labels' row ahead of the
    batch (a barrier among the loss's denominator kernels)."""
    result = prepared(models.positive_pairs_mean_model_fn, PARAMS, 4)
    cs_inprocess.assert_same_training(result, rtol=RTOL)


def test_a_time_major_one_step_sequence_is_no_row_and_trains_like_tensorflow(prepared):
    result = prepared(models.one_step_sequence_model_fn, PARAMS, 4)
    cs_inprocess.assert_same_training(result, rtol=RTOL)
    assert "batch_row" not in kernel_types(result)


def test_batch_hard_triplet_evaluates_on_the_cs_with_the_cpus_metrics(tmp_path, prepared):
    result = prepared(models.batch_hard_triplet_model_fn, PARAMS, 8)
    assert cs_inprocess.evaluation_mismatch(models.batch_hard_triplet_model_fn, models.input_fn,
                                            PARAMS, str(tmp_path), result, rtol=RTOL) == ""


def test_a_row_no_element_wise_op_pairs_with_the_samples_is_refused_naming_the_op(tmp_path):
    """tf.reduce_sum(sq[None, :], axis=0) sums the row over its own unit axis."""
    message = cs_inprocess.refusal(models.batch_sum_of_row_model_fn, models.input_fn, PARAMS,
                                   str(tmp_path), models.__file__)
    assert "StridedSlice" in message and "sq[:, None] + sq[None, :]" in message


def test_a_row_the_host_reads_is_refused_saying_to_give_it_the_per_sample_value(tmp_path):
    """A metric of sq[None, :] itself: the CS's row is every sample's copy."""
    model_fn = models.row_metric_model_fn
    with pytest.raises(CSRunError) as error:
        cs_inprocess.compile_checked(model_fn, models.input_fn, PARAMS, str(tmp_path), mode="eval")
    words = cs_inprocess.model_op_words(model_fn, models.input_fn, PARAMS)
    assert cs_inprocess.refusal_problem(error.value, models.__file__, words) == ""
    assert "that the host reads" in str(error.value)
