"""Losses that slice the batch (tests/batch_slice_models.py): a prototypical network's
support set and queries, NT-Xent's two views split from the batch, neighbouring frames'
differences and tf.roll(z, 1, 0) negatives, carried out by the batch tail (a batch_tail_loss
barrier: the slices are kernels of its program on the whole batch, their gradients the
rows back to their samples), trained in process on the simulated CS against TensorFlow at
micro-batches 8 and 1 and on 2 replicas, evaluated with the CPU path's metrics, predicted;
a slice of the batch feeding per-sample layers or a prediction refused in one line."""
from __future__ import annotations

import batch_slice_models as models
import cs_inprocess
import numpy as np
import pytest

from wafer.kernels import KernelError, build_kernel
from wafer.kernels.batch_tail import steps_attrs

PARAMS = {"batch_size": models.BATCH, "runconfig": {"tf_random_seed": 7}}
RTOL = 1e-5
MODELS = [models.prototypes_model_fn, models.segment_prototypes_model_fn,
          models.nt_xent_model_fn, models.two_views_model_fn, models.temporal_model_fn]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return cs_inprocess.micro_batch_comparisons(models.input_fn, tmp_path_factory, models.STEPS)


@pytest.mark.parametrize("model_fn", MODELS)
@pytest.mark.parametrize("micro, replicas", [(8, 1), (1, 1)])
def test_losses_slicing_the_batch_train_like_tensorflow(prepared, model_fn, micro, replicas):
    result = prepared(model_fn, PARAMS, micro, replicas)
    cs_inprocess.assert_same_training(result, rtol=RTOL)
    assert [k.type for k in result.compiled.program.kernels].count("batch_tail_loss") == 1


def test_weight_penalties_added_to_a_loss_slicing_the_batch_train_like_tensorflow(prepared):
    """Keras L2 penalties: their factors measured with the batch's labels fed as valid
    classes, each weight's penalty on its own region."""
    result = prepared(models.penalised_prototypes_model_fn, PARAMS, 8)
    cs_inprocess.assert_same_training(result, rtol=RTOL)
    penalised = {p.variable for k in result.compiled.program.kernels for p in k.params
                 if p.regularizers}
    assert len(penalised) == 2


def test_a_loss_slicing_the_batch_trains_like_tensorflow_on_two_replicas(prepared):
    """Each replica streams its micro-batches of 2 (a support set on one replica, the queries
    on the other): the barrier holds the whole batch and gives each its rows back."""
    result = prepared(models.prototypes_model_fn, PARAMS, 2, 2)
    cs_inprocess.assert_same_training(result, rtol=RTOL)


@pytest.mark.parametrize("model_fn", MODELS)
def test_losses_slicing_the_batch_evaluate_and_predict_like_the_cpu_path(tmp_path, prepared,
                                                                        model_fn):
    """The eval batch's loss its own batch's (metrics of sliced labels and values the host's,
    from the streamed per-sample values); predictions of per-sample values per sample."""
    result = prepared(model_fn, PARAMS, 2)
    assert cs_inprocess.evaluation_mismatch(model_fn, models.input_fn, PARAMS,
                                            str(tmp_path / "eval"), result, rtol=RTOL) == ""
    assert cs_inprocess.prediction_mismatch(model_fn, models.input_fn, PARAMS,
                                            str(tmp_path / "predict"), result, rtol=RTOL) == ""


@pytest.mark.parametrize("model_fn, says", [
    (models.sliced_layer_model_fn, "slices the batch axis"),
    (models.split_layer_model_fn, "slices the batch axis"),
    (models.sliced_prediction_model_fn, "slices the batch axis"),
])
def test_slices_of_the_batch_outside_a_loss_are_refused_in_one_line(tmp_path, model_fn, says):
    mode = "infer" if model_fn is models.sliced_prediction_model_fn else "train"
    message = cs_inprocess.refusal(model_fn, models.input_fn, PARAMS, str(tmp_path),
                                   models.__file__, mode=mode)
    assert says in message and "each sample on its own" in message, message


def test_ops_refused_only_for_reading_a_refused_split_are_not_listed(tmp_path):
    """Per-example kernels over the batch split into examples (unseen24's condconv_experts),
    each example by the next one's: the report lists the two splits, not the cross entropy
    that mixes samples only through their refused pieces (false on its own)."""
    message = cs_inprocess.refusal(models.shifted_example_kernels_model_fn, models.input_fn,
                                   PARAMS, str(tmp_path), models.__file__)
    assert message.startswith("validation failed: Split 'split' at ")
    report = (tmp_path / "cs_compile" / "validation_report.txt").read_text()
    assert "Unsupported layers and operations (2):" in report, report
    assert "combines values of different samples" not in report, report


@pytest.mark.parametrize("seed", range(8))
def test_random_losses_slicing_the_batch_train_like_tensorflow(tmp_path, seed):
    """Differential: losses slicing the batch drawn at random, at a random batch (4, 6 or 8)
    and micro-batch size."""
    result = cs_inprocess.random_split_comparison(models.random_model_fn(seed), models.input_fn,
                                                  models.STEPS, 2000 + seed, str(tmp_path))
    cs_inprocess.assert_same_training(result, rtol=RTOL)


def test_a_tail_computing_on_the_batchs_integers_is_refused_at_load():
    """The barrier checks the dtypes along its program: labels sliced and one-hot encoded
    load; labels fed to a float32 kernel (exp) do not."""
    def tail(steps):
        attrs = {**steps_attrs(steps), "batch_size": 4}
        return build_kernel("batch_tail_loss", "loss", attrs, [()])
    one_hot = tail([("s", "slice", ["input0"], {"begin": [1], "end": [4], "strides": [1],
                                                "shrink": []}),
                    ("h", "one_hot", ["s"], {"depth": 2}),
                    ("l", "reduce", ["h"], {"op": "sum", "axes": [0, 1], "keepdims": False})])
    assert one_hot.output_dtype([np.dtype(np.int32)]) == np.float32
    exp = tail([("e", "activation", ["input0"], {"function": "exp"}),
                ("l", "reduce", ["e"], {"op": "sum", "axes": [0], "keepdims": False})])
    assert exp.output_dtype([np.dtype(np.float32)]) == np.float32
    with pytest.raises(KernelError, match="int32"):
        exp.output_dtype([np.dtype(np.int32)])
