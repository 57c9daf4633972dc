"""A constant tiled over the batch (IQN's fixed quantile fractions, by tf.tile and by
tf.broadcast_to, through a Dense of their cosines and multiplied with per-sample features)
is each sample's row: it trains 4 Adam steps within 1e-5 of TensorFlow and evaluates and
predicts on the CS with the CPU path's numbers. A weight value whose first axis TF pairs with
the samples (a Dense of per-position scales as long as the batch, a GP's K + noise *
tf.eye(batch)) is refused at validation in one line naming the op, the value and its line."""
from __future__ import annotations

import cs_inprocess
import numpy as np
import pytest
import tiled_constant_models as m

from common.errors import CSRunError
from cs_api.attrs import from_attr

BASE = {"batch_size": 8, "runconfig": {"tf_random_seed": 1}}
CASES = {"iqn_tiled_fractions": (m.iqn_tiled_fractions, m.input_fn, {}),
         "iqn_broadcast_fractions": (m.iqn_broadcast_fractions, m.input_fn, {}),
         "episode_tiled_labels": (m.episode_tiled_labels, m.input_fn, {}),
         "episode_broadcast_labels": (m.episode_tiled_labels, m.input_fn, {"broadcast": True})}
LABELLED = ("episode_tiled_labels", "episode_broadcast_labels")


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    return cs_inprocess.cached_comparisons(CASES, BASE, tmp_path_factory)


@pytest.mark.parametrize("name", [n for n in CASES if n not in LABELLED])
def test_a_constant_tiled_over_the_batch_is_each_samples_row(compared, name):
    result = compared(name)
    cs_inprocess.assert_same_training(result, rtol=1e-5)
    assert result.cs.losses[0] != result.cs.losses[-1]  # it trained
    [rows] = [k for k in result.compiled.program.kernels if k.type == "sample_constant"]
    value = from_attr(rows.attrs["value"])
    np.testing.assert_allclose(value, np.tile(m.FRACTIONS, (BASE["batch_size"], 1)), rtol=1e-7)


def test_iqn_evaluates_and_predicts_on_the_cs_with_the_cpu_paths_numbers(compared, tmp_path):
    trained = compared("iqn_tiled_fractions")
    for mismatch in (cs_inprocess.evaluation_mismatch, cs_inprocess.prediction_mismatch):
        assert mismatch(m.iqn_tiled_fractions, m.input_fn, BASE, str(tmp_path), trained, rtol=1e-5) == ""


@pytest.mark.parametrize("model_fn, value, mode, batch", [
    (m.per_position_scales, "scale_1/BiasAdd", "train", 8),
    (m.per_position_scales, "scale_1/BiasAdd", "infer", 8),
    (m.gp_marginal_likelihood, "mul_1", "train", 4),  # (its Cholesky unrolled over the batch)
])
def test_a_weight_value_along_the_batch_is_refused_at_validation(tmp_path, model_fn, value, mode, batch):
    params = {**BASE, "batch_size": batch}
    with pytest.raises(CSRunError) as refused:
        cs_inprocess.compile_checked(model_fn, m.input_fn, params, str(tmp_path), mode=mode)
    text = str(refused.value)
    assert text.startswith("validation failed: ") and f"'{value}' at " in text
    assert "whose first axis TF pairs with the batch's samples" in text
    assert cs_inprocess.refusal_problem(refused.value, m.__file__, cs_inprocess.model_op_words(
        model_fn, m.input_fn, params)) == ""


@pytest.mark.parametrize("name", LABELLED)
def test_cross_entropy_labels_tiled_over_the_batch_are_each_samples_labels(compared, name):
    """GE2E episodes (unseen24 ge2e_episodes): tf.nn.sparse_softmax_cross_entropy_with_logits
    of [batch, utterances, speakers] scores flattens them to rank 2 itself, the speaker ids a
    constant tiled over the batch: each sample's ids, training 4 steps as TF does."""
    result = compared(name)
    cs_inprocess.assert_same_training(result, rtol=1e-5)
    assert result.cs.losses[0] != result.cs.losses[-1]
    [rows] = [k for k in result.compiled.program.kernels if k.type == "sample_constant"]
    np.testing.assert_array_equal(from_attr(rows.attrs["value"]),
                                  np.tile(m.ORDER, (BASE["batch_size"], 1)))


def test_episodes_evaluate_and_predict_on_the_cs_with_the_cpu_paths_numbers(compared, tmp_path):
    trained = compared("episode_tiled_labels")
    for mismatch in (cs_inprocess.evaluation_mismatch, cs_inprocess.prediction_mismatch):
        assert mismatch(m.episode_tiled_labels, m.input_fn, BASE, str(tmp_path), trained, rtol=1e-5) == ""
