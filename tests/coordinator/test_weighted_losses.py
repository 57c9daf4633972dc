"""Losses with per-sample weights train on the CS with TF's numbers (issue 21's fraud
classifier and NER tagger): tf.compat.v1.losses' default reduction SUM_BY_NONZERO_WEIGHTS
divides by the batch's count of nonzero weights (DivNoNan), MEAN by their sum; the CS
computes that count or sum from the batch's inputs and labels before the batch streams
through (wafer.kernels.losses.BatchLoss). A batch whose weights are all 0 has loss 0 and
zero gradients, and Adam still moves, as in TF. A denominator computed from the model's
outputs makes a loss evaluated once per batch (wafer.kernels.batch_tail)."""
import inspect

import cs_inprocess
import numpy as np
import pytest
import tensorflow as tf
import weighted_loss_models as w

from common.errors import CSRunError
from coordinator.compiler import compile_model
from cs_api.attrs import from_attr
from wafer.kernels.base import RunContext
from wafer.kernels.losses import BatchLoss, divisor_programs

R = tf.compat.v1.losses.Reduction
BASE = {"runconfig": {"tf_random_seed": 5}}
LOSSES = ["sparse_softmax_cross_entropy", "softmax_cross_entropy", "sigmoid_cross_entropy",
          "mean_squared_error", "absolute_difference", "huber_loss", "log_loss"]
CASES = {
    **{f"nonzero_{loss}": (w.fraud_classifier, w.tabular_input_fn, {"loss": loss})
       for loss in LOSSES},
    **{f"reduction_{r}": (w.fraud_classifier, w.tabular_input_fn, {"reduction": r})
       for r in (R.MEAN, R.SUM, R.SUM_OVER_BATCH_SIZE)},
    "two_denominators": (w.fraud_classifier, w.tabular_input_fn, {"two_tasks": True}),
    "tagger_nonzero": (w.ner_tagger, w.tagging_input_fn, {}),
    "tagger_mean": (w.ner_tagger, w.tagging_input_fn, {"reduction": R.MEAN}),
    "tagger_hand_written": (w.ner_tagger, w.tagging_input_fn, {"hand_written": True}),
    "tagger_count_nonzero": (w.ner_tagger, w.tagging_input_fn, {"hand_written": "count_nonzero"}),
    "zero_weights_adam": (w.fraud_classifier, w.tabular_input_fn, {"zero_batch": True, "l2": 0.0}),
    "zero_mask_tagger": (w.ner_tagger, w.tagging_input_fn, {"zero_batch": True}),
    "keras_sample_weight": (w.keras_sample_weight, w.tabular_input_fn, {}),
    "mixed_float16": (w.fraud_classifier, w.tabular_input_fn, {"mixed": True}),
    # everyday masked-loss divisors (batch 1's mask all zero: d from tf.maximum(0, 1) etc.)
    **{f"divisor_{d}": (w.masked_tagger, w.tagging_input_fn, {"divisor": d, "zero_batch": True})
       for d in ("maximum", "epsilon", "count_nonzero", "clip", "sqrt", "where", "per_sequence",
                 "divide_no_nan", "mean_ratio", "two_level")},
}
RTOL = {"mixed_float16": 1e-2}  # (float16 layers: the project's mixed-precision tolerance)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return cs_inprocess.cached_comparisons(CASES, BASE, tmp_path_factory)


def _divided(result) -> list:
    return [k for k in result.compiled.program.kernels if k.type == "loss" and "divided_by" in k.attrs]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_weighted_loss_trains_with_tensorflows_numbers(trained, name):
    result = trained(name)
    rtol = RTOL.get(name, 1e-5)
    assert not cs_inprocess.mismatches(result, rtol), cs_inprocess.mismatches(result, rtol)
    # divided by the batch's count or sum of weights, but for SUM and SUM_OVER_BATCH_SIZE
    # (and each sequence's own count: per-sample arithmetic)
    assert bool(_divided(result)) == (not name.startswith(("reduction_weighted_sum", "keras",
                                                           "divisor_two_level")))
    if name == "two_denominators":  # each loss divided by its own count (DivNoNan's 0 at 0)
        assert from_attr(_divided(result)[0].attrs["div_no_nan"]) == [1, 1]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["zero_weights_adam", "zero_mask_tagger",
                                  *(n for n in CASES if n.startswith("divisor_"))])
def test_a_batch_of_zero_weights_has_loss_0_as_in_tf(trained, name):
    """DivNoNan's 0 and zero gradients: Adam's moments still move the weights (the parity
    above covers the weights after it; SGD stands still: tests/wse_sim/
    test_wse_loss_denominators.py)."""
    result = trained(name)
    assert result.cs.losses[1] == result.reference.losses[1] == 0.0
    assert all(loss > 0 for k, loss in enumerate(result.cs.losses) if k != 1)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["nonzero_sparse_softmax_cross_entropy", "tagger_nonzero"])
def test_the_cs_evaluates_a_weighted_loss_as_the_cpu_does(trained, name, tmp_path):
    model_fn, input_fn, extra = CASES[name]
    problem = cs_inprocess.evaluation_mismatch(model_fn, input_fn, {**BASE, **extra},
                                               str(tmp_path), trained(name), rtol=1e-5)
    assert not problem, problem


def test_a_loss_divided_by_the_models_outputs_trains_like_tensorflow(tmp_path):
    """sum(l * confidence) / sum(confidence): no divisor known before the batch, a loss
    evaluated once per batch (a batch_tail_loss barrier), TF's numbers."""
    result = cs_inprocess.compare(w.divided_by_outputs, w.tabular_input_fn, BASE, str(tmp_path),
                                  steps=4)
    cs_inprocess.assert_same_training(result, rtol=1e-5)
    assert [k.type for k in result.compiled.program.kernels].count("batch_tail_loss") == 1


def _compiled(tmp_path, divisor):
    return compile_model(w.masked_tagger, w.tagging_input_fn, {**BASE, "divisor": divisor},
                         str(tmp_path))


def test_a_masked_mean_divided_by_at_least_one_is_evaluated_as_tf_does(tmp_path):
    """sum(l * mask) / tf.maximum(tf.cast(tf.math.count_nonzero(mask), tf.float32), 1.0):
    the loss kernel's divisor is TF's program of the batch's count (an int64 sum, cast, then
    the maximum with 1), the report shows it, and the kernel divides by 1 when the count is 0
    and by the count otherwise."""
    compiled = _compiled(tmp_path, "count_nonzero")
    loss = next(k for k in compiled.program.kernels if k.type == "loss")
    (program,) = divisor_programs(from_attr(loss.attrs["divisors"]))
    assert [(o.op, o.dtype) for o in program.ops] == [
        ("input", "int64"), ("cast", "float32"), ("const", "float32"), ("maximum", "float32")]
    assert "mul divided by maximum(float32(S0), 1), computed before each batch from its " \
           "inputs: S0 = the batch's sum of count_nonzero/Cast" in compiled.report_text
    kernel = BatchLoss("loss", {k: from_attr(v) for k, v in loss.attrs.items()},
                       [(w.STEPS_T,), (w.STEPS_T,)])
    per_sample = np.ones((4, w.STEPS_T), np.float32)
    for count, divisor in ((0, 1.0), (7, 7.0)):
        mask = np.zeros((4, w.STEPS_T), np.int64)
        mask.flat[:count] = 1
        kernel.set_batch([mask])
        values, _ = kernel.forward([], [per_sample, mask], RunContext(training=True, batch_size=4))
        assert values.tolist() == [np.float32(w.STEPS_T) / np.float32(divisor)] * 4


def test_a_divisor_the_cs_cannot_evaluate_is_refused_naming_the_op(tmp_path):
    """sum(l * mask) / tf.reduce_max(lengths): the batch's longest sequence is not a sum."""
    with pytest.raises(CSRunError) as info:
        compile_model(w.masked_tagger, w.tagging_input_fn, {**BASE, "divisor": "longest"},
                      str(tmp_path), validate_only=True)
    lines = inspect.getsource(w).splitlines()
    line = next(i for i, text in enumerate(lines) if '"longest":' in text) + 1
    assert "\n" not in str(info.value)
    assert f"Max 'Max' at tests/weighted_loss_models.py:{line}: the loss is divided by a value " \
           "computed by Max: the CS evaluates a divisor from sums or means of the batch's " \
           "inputs and labels" in info.value.message
