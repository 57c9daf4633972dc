"""Selections by value in a loss (tests/value_selection_models.py): tf.boolean_mask and
tf.gather(x, tf.where(cond)[:, 0]) are refused in one line naming the op and the line with
the masked form to write instead (not the SparseTensor advice, which stays for
tf.sparse.from_dense); that masked form (an ignore-index classifier, a masked-token loss,
CFRNet's treated and control means) trains on the simulated CS as TensorFlow does and
evaluates with the CPU path's metrics, nan where nothing is selected, as TF's 0 / 0."""
from __future__ import annotations

import math

import cs_inprocess
import numpy as np
import pytest
import value_selection_models as models

from common.run_settings import RunSettings
from tf_model import cpu_session

PARAMS = {"batch_size": models.BATCH, "runconfig": {"tf_random_seed": 7}}
SELECTION = "selects elements by value (tf.boolean_mask / tf.where(cond) with one argument"
MASKED_FORM = "tf.reduce_sum(loss * mask) / tf.reduce_sum(mask)"


@pytest.mark.parametrize("model_fn, input_fn, gather", [
    (models.ignore_index_model_fn, models.ignore_index_input_fn, "GatherV2 'boolean_mask/GatherV2'"),
    (models.masked_token_model_fn, models.tokens_input_fn, "GatherV2 'boolean_mask/GatherV2'"),
    (models.masked_token_gather_nd_model_fn, models.tokens_input_fn, "GatherNd 'GatherNd'"),
    (models.cfrnet_model_fn, models.treatment_input_fn, "GatherV2 'GatherV2'")])
def test_a_selection_by_value_is_refused_with_the_masked_form(tmp_path, model_fn, input_fn, gather):
    """The Where and the gather reading its indices, each with its line, and what to write."""
    message = cs_inprocess.refusal(model_fn, input_fn, PARAMS, str(tmp_path), models.__file__)
    assert f"{SELECTION}, read by {gather} at " in message
    assert MASKED_FORM in message
    assert "SparseTensor" not in message


def test_a_sparse_tensor_keeps_its_own_refusal(tmp_path):
    message = cs_inprocess.refusal(models.sparse_features_model_fn, models.ignore_index_input_fn,
                                   PARAMS, str(tmp_path), models.__file__)
    assert "builds or reads a SparseTensor" in message
    assert SELECTION not in message


@pytest.mark.parametrize("model_fn, input_fn", [
    (models.ignore_index_masked_model_fn, models.ignore_index_input_fn),
    (models.masked_token_weighed_model_fn, models.tokens_input_fn),
    (models.cfrnet_masked_model_fn, models.treatment_input_fn)])
def test_the_masked_form_trains_and_evaluates_like_tensorflow(tmp_path, model_fn, input_fn):
    result = cs_inprocess.compare(model_fn, input_fn, PARAMS, str(tmp_path / "train"),
                                  steps=models.STEPS)
    cs_inprocess.assert_same_training(result)
    assert cs_inprocess.evaluation_mismatch(model_fn, input_fn, PARAMS, str(tmp_path / "eval"),
                                            result) == ""


def test_an_empty_selection_evaluates_to_nan_as_in_tensorflow(tmp_path):
    """A batch with every label ignored: sum(loss * mask) / sum(mask) is 0 / 0."""
    model_fn = models.ignore_index_masked_model_fn
    trained = cs_inprocess.compare(model_fn, models.ignore_index_input_fn, PARAMS,
                                   str(tmp_path / "train"), steps=models.STEPS)
    path = cs_inprocess.trained_checkpoint(str(tmp_path / "eval"), trained)
    settings = RunSettings(str(tmp_path / "eval"), PARAMS, None, None, None, None)
    cpu = cpu_session.evaluate(model_fn, models.unlabeled_input_fn, settings, steps=2,
                               checkpoint_path=path)
    cs = cs_inprocess.evaluate_like_the_chief(model_fn, models.unlabeled_input_fn, PARAMS,
                                              str(tmp_path / "eval"), path, steps=2)
    assert math.isnan(cpu["loss"]) and math.isnan(cpu["mean_loss"])
    assert np.isnan(cs["loss"]) and np.isnan(cs["mean_loss"])
