"""A T5 relative-position bias computed on weights: tf.einsum of a constant one-hot and the
bias table in the weight program (TF's numbers and gradient), with the per-sample einsums
of attention around it. The table gathered at constant bucket ids, which TF's optimizers
update sparsely (IndexedSlices): the CS applies the optimizer's sparse rule to the rows the
buckets name (rows never named and their slots untouched, duplicates summed, the raw slices
under clip_by_global_norm) and trains as TF does under RMSProp, Momentum, Adagrad, FTRL and
Adam, evaluates and predicts as the CPU path does; a table gathered again (each layer its
own tf.gather) stays refused in one line naming the second gather."""
from __future__ import annotations

import cs_inprocess
import numpy as np
import pytest
import relative_bias_models as m
import tensorflow as tf

BASE = {"batch_size": 8, "runconfig": {"tf_random_seed": 1}}


@pytest.fixture(scope="module")
def onehot(tmp_path_factory):
    return cs_inprocess.compare(m.onehot_bias, m.input_fn, BASE,
                                str(tmp_path_factory.mktemp("onehot")))


def test_an_einsum_of_a_constant_one_hot_and_a_bias_table_trains_like_tensorflow(onehot):
    cs_inprocess.assert_same_training(onehot, rtol=1e-5)
    assert onehot.cs.losses[0] != onehot.cs.losses[-1]
    program = onehot.compiled.program.weight_program
    assert {p.variable for p in program.sources} == {"rel_bias"}
    assert "einsum" in {k.type for k in program.kernels}
    assert not (onehot.cs.state["rel_bias"] == onehot.compiled.initial_weights["rel_bias"]).all()


def test_the_one_hot_bias_evaluates_and_predicts_with_the_cpu_paths_numbers(onehot, tmp_path):
    assert cs_inprocess.cpu_path_mismatches(m.onehot_bias, m.input_fn, BASE, str(tmp_path),
                                            onehot) == []


def test_a_bias_gathered_under_rmsprop_trains_its_named_rows_like_tensorflow_and_evaluates_like_the_cpu(
        tmp_path):
    """TF's sparse RMSProp leaves the never-named bucket and its slots (ms starts at 1) as
    they were; a dense update would decay them."""
    result = cs_inprocess.compare(m.gathered_bias, m.input_fn, BASE, str(tmp_path), steps=4)
    cs_inprocess.assert_same_training(result, rtol=1e-5)
    start, trained = result.compiled.initial_weights["rel_bias"], result.cs.state["rel_bias"]
    assert np.array_equal(trained[-1], start[-1]) and (trained[:-1] != start[:-1]).all()
    assert (result.cs.state["rel_bias/RMSProp"][-1] == 1).all()
    assert cs_inprocess.cpu_path_mismatches(m.gathered_bias, m.input_fn, BASE, str(tmp_path),
                                            result) == []


T5 = {"runconfig": {"tf_random_seed": 3}}


def _named_buckets() -> np.ndarray:
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        return session.run(m.relative_buckets())


def test_t5s_buckets_leave_rows_unnamed_and_name_others_more_than_once():
    ids, counts = np.unique(_named_buckets(), return_counts=True)
    assert len(ids) < m.T5_BUCKETS and counts.max() > 1


def _trains_like_tensorflow(tmp_path, params: dict) -> cs_inprocess.Comparison:
    result = cs_inprocess.compare(m.t5_block, m.attention_input_fn, {**T5, **params},
                                  str(tmp_path), steps=4)
    cs_inprocess.assert_same_training(result, rtol=1e-5)
    start, trained = result.compiled.initial_weights["rel_bias"], result.cs.state["rel_bias"]
    named = np.unique(_named_buckets())
    unnamed = np.setdiff1d(np.arange(m.T5_BUCKETS), named)
    assert np.array_equal(trained[unnamed], start[unnamed])
    assert (trained[named] != start[named]).all()
    return result


@pytest.mark.parametrize("optimizer", [
    "momentum", pytest.param("adagrad", marks=pytest.mark.slow),
    pytest.param("ftrl", marks=pytest.mark.slow)])
def test_a_t5_bias_gathered_at_its_buckets_trains_the_named_rows_like_tensorflow(tmp_path, optimizer):
    _trains_like_tensorflow(tmp_path, {"optimizer": optimizer})


@pytest.mark.slow
def test_adam_under_global_norm_clipping_trains_like_tensorflow_and_evaluates_and_predicts_like_the_cpu(
        tmp_path):
    """TF's global norm reads the gather's raw slices (a bucket's duplicates apart); Adam's
    sparse rule decays m and v on every row."""
    params = {**T5, "optimizer": "adam", "clip_norm": 0.05}
    result = _trains_like_tensorflow(tmp_path, params)
    assert cs_inprocess.cpu_path_mismatches(m.t5_block, m.attention_input_fn, params,
                                            str(tmp_path), result) == []


def test_a_table_gathered_by_each_layer_is_refused_naming_the_second_gather(tmp_path):
    """TF's IndexedSlices then hold each layer's slices apart (their global norm differs from
    the summed view's): the line says to gather once."""
    line = cs_inprocess.refusal(m.t5_block, m.attention_input_fn,
                                {**T5, "optimizer": "momentum", "gather_per_layer": True},
                                str(tmp_path), m.__file__)
    assert "the model also reads it here" in line and "gather once" in line, line


def test_an_einsum_of_a_weight_summing_a_letter_of_one_operand_is_refused_in_one_line(tmp_path):
    line = cs_inprocess.refusal(m.mean_bias_per_head, m.input_fn, BASE, str(tmp_path),
                                m.__file__)
    assert "with Einsum" in line and "'qkn,nh->h' sums over a letter of one operand only (k, q)" \
        in line, line
