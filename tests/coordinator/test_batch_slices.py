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
import pytest

PARAMS = {"batch_size": models.BATCH, "runconfig": {"tf_random_seed": 7}}
RTOL = 1e-5
MODELS = [models.prototypes_model_fn, models.nt_xent_model_fn, models.temporal_model_fn]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return cs_inprocess.micro_batch_comparisons(models.input_fn, tmp_path_factory, models.STEPS)


@pytest.mark.parametrize("model_fn", MODELS)
@pytest.mark.parametrize("micro, replicas", [(8, 1), (1, 1)])
def test_losses_slicing_the_batch_train_like_tensorflow(prepared, model_fn, micro, replicas):
    result = prepared(model_fn, PARAMS, micro, replicas)
    cs_inprocess.assert_same_training(result, rtol=RTOL)
    assert [k.type for k in result.compiled.program.kernels].count("batch_tail_loss") == 1
