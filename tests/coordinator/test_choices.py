"""Choosing classes on the CS (issue 21): tf.argmax / tf.argmin (`arg_reduce`) and
tf.random.categorical (`categorical`). Proven here: the argmax of a classifier's loss and
its accuracy(argmax) metric evaluate and predict like the CPU path; Gumbel-max actions
(tf.one_hot, tf.gather(batch_dims=1)) and argmin/argmax along a rank-3 value's axes train like
TF with TF's uniform numbers replayed, and in float16; a REINFORCE policy's categorical
actions, TF's replayed, train like TF (num_samples 1 and 3, int64 and int32,
tf.compat.v1.multinomial, float16 logits); the CS's own classes have TF's distribution, are what one batch
draws for any micro-batch split, and are not the replay's; an argmax over the batch axis is
refused in one line. The kernels' rules against TF (ties, NaN, dtypes, axes):
tests/wafer/test_wse_kernels_structural.py."""
from __future__ import annotations

import choice_models as cm
import cs_inprocess
import numpy as np
import pytest
import tensorflow as tf
import tf_reference

from cs_api.attrs import from_attr
from wafer.kernels import KernelError, RunContext, build_kernel

PARAMS = {"batch_size": 8, "runconfig": {"tf_random_seed": 2}}


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    return cs_inprocess.compare(cm.classifier, cm.input_fn, PARAMS,
                                str(tmp_path_factory.mktemp("classifier")), steps=4)


def _arg_reduces(result) -> list[tuple]:
    return [(from_attr(k.attrs["op"]), from_attr(k.attrs["axis"]), from_attr(k.attrs["output"]),
             from_attr(k.attrs["half"])) for k in result.compiled.program.kernels
            if k.type == "arg_reduce"]


def test_a_classifier_weighing_its_mistakes_by_argmax_trains_like_tensorflow(classifier):
    assert _arg_reduces(classifier) == [("max", 0, "int64", False)]
    cs_inprocess.assert_same_training(classifier, rtol=1e-5)


def test_accuracy_of_the_argmax_evaluates_on_the_cs_like_the_cpu(classifier, tmp_path):
    program = cs_inprocess.compile_checked(cm.classifier, cm.input_fn, PARAMS, str(tmp_path),
                                           mode="eval").program
    assert "arg_reduce" in [k.type for k in program.kernels]  # the CS computes the metric's argmax
    assert cs_inprocess.evaluation_mismatch(cm.classifier, cm.input_fn, PARAMS, str(tmp_path),
                                            classifier, steps=4) == ""


def test_argmax_classes_predict_like_the_cpu(classifier, tmp_path):
    assert cs_inprocess.prediction_mismatch(cm.classifier, cm.input_fn, PARAMS, str(tmp_path),
                                            classifier) == ""


def test_gumbel_max_actions_and_argmin_along_axes_train_like_tensorflow(tmp_path):
    result = cs_inprocess.compare_drawn(cm.gumbel_choice, cm.input_fn, PARAMS, str(tmp_path))
    assert sorted(_arg_reduces(result)) == [("max", 0, "int32", False), ("max", 1, "int64", False),
                                            ("min", 0, "int64", False)]
    cs_inprocess.assert_same_training(result, rtol=1e-5)


def test_the_argmax_of_float16_logits_trains_like_tensorflows_mixed_precision(tmp_path):
    """(1e-2: a mixed_float16 model's values differ from TF's at float16 noise, argmax or not:
    docs/design.md, "Mixed precision".)"""
    result = cs_inprocess.compare(cm.half_choice, cm.input_fn, PARAMS, str(tmp_path), steps=4)
    assert _arg_reduces(result) == [("max", 0, "int64", True)]
    assert not cs_inprocess.mismatches(result, rtol=1e-2)


@pytest.mark.parametrize("extra", [{}, {"v1": True, "samples": 3, "int32": True}, {"half": True}])
def test_reinforce_with_tfs_categorical_actions_trains_like_tensorflow(extra, tmp_path):
    """(float16 logits: within TF's float16 noise, 1e-2.)"""
    result = cs_inprocess.compare_drawn(cm.reinforce, cm.input_fn, {**PARAMS, **extra},
                                        str(tmp_path))
    drawing = [k for k in result.compiled.program.kernels if k.type == "categorical"]
    assert [(from_attr(k.attrs["num_samples"]), from_attr(k.attrs["output"])) for k in drawing] == \
        [(extra.get("samples", 1), "int32" if "int32" in extra else "int64")]
    assert not cs_inprocess.mismatches(result, rtol=1e-2 if "half" in extra else 1e-5)
    if not extra:  # the seam hands over the draws only: the CS's own classes train otherwise
        own = cs_inprocess.run_on_cs(result.compiled.program, result.compiled.initial_weights,
                                     tf_reference.batches(cm.input_fn, PARAMS, 4))
        assert own.losses != result.cs.losses


LOGITS = np.array([[0, 1, 2, -np.inf], [np.nan, 0, 0, 0], [np.inf, 0, 1, 0], [3, 3, 3, 3],
                   [-1, 5, -1, 0.5]], np.float32)
DRAWS = 1 << 16


def _stream():
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([5, 2, 9])))


def test_the_cs_draws_tfs_categorical_distribution():
    """2^16 classes per row of logits with ties and non-finite values (never drawn, as TF's
    CPU kernel): each class's frequency within 6 standard errors of its softmax probability
    among the finite logits, and of TF's frequency."""
    kernel = build_kernel("categorical", "c", {"num_samples": DRAWS}, [(4,)])
    ctx = RunContext(training=True, batch_size=len(LOGITS), rng=_stream())
    cs, _ = kernel.forward({}, [LOGITS], ctx)
    ref = tf.random.categorical(LOGITS, DRAWS, seed=1).numpy()
    assert cs.dtype == np.int64 and cs.shape == ref.shape
    finite = np.isfinite(LOGITS)
    weights = np.where(finite, np.exp(np.where(finite, LOGITS, 0) - 5), 0)
    probabilities = weights / weights.sum(1, keepdims=True)
    error = np.sqrt(probabilities * (1 - probabilities) / DRAWS)
    for drawn in (cs, ref):
        frequencies = np.stack([np.bincount(row, minlength=4) for row in drawn]) / DRAWS
        assert np.all(np.abs(frequencies - probabilities) <= 6 * error + 1e-9)
        assert np.all(frequencies[~finite] == 0)


def test_micro_batches_draw_the_classes_the_whole_batch_draws():
    kernel = build_kernel("categorical", "c", {"num_samples": 3, "output": "int32"}, [(4,)])
    logits = np.tile(LOGITS, (3, 1))

    def drawn(rng, rows):
        return kernel.forward({}, [rows], RunContext(training=True, batch_size=15, rng=rng))[0]
    whole, rng = drawn(_stream(), logits), _stream()
    parts = np.concatenate([drawn(rng, logits[a:b]) for a, b in ((0, 4), (4, 5), (5, 15))])
    np.testing.assert_array_equal(parts, whole)
    assert whole.dtype == np.int32


def test_a_samples_folded_rows_draw_what_the_same_rows_as_samples_draw():
    """Logits (k, classes) per sample (tf.random.categorical of [batch * k, classes] folded
    rows): each row's classes from its own logits, the rows in sample order."""
    rows = np.tile(LOGITS, (2, 1))  # (10, 4): 5 samples of 2 rows
    folded = build_kernel("categorical", "c", {"num_samples": 3}, [(2, 4)])
    flat = build_kernel("categorical", "c", {"num_samples": 3}, [(4,)])
    assert folded.output_shape == (2, 3)
    ctx = RunContext(training=True, batch_size=5, rng=_stream())
    drawn = folded.forward({}, [rows.reshape(5, 2, 4)], ctx)[0]
    ctx = RunContext(training=True, batch_size=10, rng=_stream())
    np.testing.assert_array_equal(drawn.reshape(10, 3), flat.forward({}, [rows], ctx)[0])


@pytest.mark.parametrize("attrs, shape", [({"num_samples": 0}, (4,)), ({"num_samples": 1}, (2, 3, 4)),
                                          ({"num_samples": 1, "output": "float32"}, (4,))])
def test_a_categorical_kernel_it_cannot_draw_is_refused_at_load(attrs, shape):
    with pytest.raises(KernelError, match="categorical takes 1 input of logits"):
        build_kernel("categorical", "c", attrs, [shape])


def test_argmax_over_the_batch_axis_is_refused_in_one_line(tmp_path):
    message = cs_inprocess.refusal(cm.best_sample, cm.input_fn, PARAMS, str(tmp_path),
                                   "tests/choice_models.py")
    assert "ArgMax along the batch axis (axis 0)" in message and "axis=-1" in message
