"""An embedding table's gradient clipped or made dense between compute_gradients and
apply_gradients. tf.clip_by_value of the IndexedSlices clips each looked-up row before
duplicates are summed, as the CS holds them (in micro-batches too; the sparse rule then). Made dense
(tf.convert_to_tensor, tf.math.unsorted_segment_sum or tf.scatter_nd of its values at its
indices), it is the table's summed gradient, transformed like any dense gradient (signSGD
of it: a gradient program), under the optimizer's dense rule on the whole table (rows not
looked up in a step move as TF's dense rule moves them). Both train 4 steps like TF within
1e-5, evaluate and predict like the CPU path; signSGD of an IndexedSlices stays refused in
one line saying what to write. Two Adams on disjoint var_lists, a penalty on one, their sum
returned (the S4 recipe) train like TF."""
from __future__ import annotations

import cs_inprocess
import densified_gradient_models as m
import numpy as np
import pytest

from common.errors import CSRunError

SEED = {"runconfig": {"tf_random_seed": 1}}


def _updates(result) -> dict[str, str]:
    return {p.variable: p.update for k in result.compiled.program.kernels for p in k.params}


@pytest.fixture(scope="module")
def tagger(tmp_path_factory):
    return cs_inprocess.micro_batch_comparisons(m.tagger_input_fn, tmp_path_factory, steps=4)


@pytest.mark.parametrize("dense, micro", [(False, 8), (False, 2), (True, 8)])
def test_a_char_cnn_tagger_clipping_every_gradient_by_value_trains_like_tensorflow(
        tagger, dense, micro, tmp_path):
    """The sparse clip in micro-batches too: each one's looked-up rows clipped alike."""
    params = {**SEED, "batch_size": 8, "dense": dense}
    result = tagger(m.charcnn_tagger, params, micro)
    cs_inprocess.assert_same_training(result, rtol=1e-5)
    kind = "dense" if dense else "sparse"
    assert _updates(result)["char_emb/embeddings"] == _updates(result)["word_emb/embeddings"] == kind
    assert [t.kind for t in result.compiled.program.gradient_transforms] == ["clip_by_value"]
    if dense:  # (the tagger's own numbers: evaluation and prediction once)
        assert cs_inprocess.cpu_path_mismatches(m.charcnn_tagger, m.tagger_input_fn, params,
                                                str(tmp_path), result) == []


@pytest.mark.parametrize("optimizer, densify", [
    ("adam", "convert"), ("momentum", "convert"), ("momentum", "segment_sum"),
    ("adam", "scatter_nd"), ("momentum", "sign")])
def test_an_embedding_gradient_made_dense_takes_the_optimizers_dense_rule_like_tensorflow(
        optimizer, densify, tmp_path):
    params = {**SEED, "batch_size": 8, "optimizer": optimizer, "densify": densify}
    result = cs_inprocess.compare(m.bag_of_words, m.bag_input_fn, params, str(tmp_path), steps=4)
    cs_inprocess.assert_same_training(result, rtol=1e-5)
    assert _updates(result)["emb/embeddings"] == "dense"
    assert [t.kind for t in result.compiled.program.gradient_transforms] == (
        ["program", "scale"] if densify == "sign" else [])
    ids = [x for x, _ in cs_inprocess.first_batches(m.bag_input_fn, params, 4)]
    assert np.setdiff1d(np.concatenate(ids[:3]), ids[3]).size  # rows step 4 moves by momentum
    if densify == "convert":
        assert cs_inprocess.cpu_path_mismatches(m.bag_of_words, m.bag_input_fn, params,
                                                str(tmp_path), result) == []


def test_sign_sgd_of_an_indexed_slices_is_refused_saying_to_make_it_dense(tmp_path):
    params = {**SEED, "batch_size": 8, "optimizer": "momentum", "sign": True}
    with pytest.raises(CSRunError) as error:
        cs_inprocess.compile_checked(m.bag_of_words, m.bag_input_fn, params, str(tmp_path))
    line = str(error.value)
    assert "\n" not in line and "Sign" in line and "densified_gradient_models.py:" in line
    assert "tf.convert_to_tensor" in line


def test_two_adams_with_a_penalty_on_one_list_returning_the_sum_train_like_tensorflow(tmp_path):
    result = cs_inprocess.compare(m.two_adams, m.sequence_input_fn, {**SEED, "batch_size": 16},
                                  str(tmp_path), steps=4)
    cs_inprocess.assert_same_training(result, rtol=1e-5)
    assert cs_inprocess.cpu_path_mismatches(m.two_adams, m.sequence_input_fn,
                                            {**SEED, "batch_size": 16}, str(tmp_path), result) == []


def test_two_adams_returning_the_data_loss_alone_is_refused_in_one_line(tmp_path):
    with pytest.raises(CSRunError) as error:
        cs_inprocess.compile_checked(m.two_adams, m.sequence_input_fn,
                                     {**SEED, "batch_size": 16, "returned": "data"}, str(tmp_path))
    line = str(error.value)
    assert "\n" not in line and "densified_gradient_models.py:" in line
    assert "return the sum of the minimized losses" in line
