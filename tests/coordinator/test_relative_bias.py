"""A T5 relative-position bias computed on weights: tf.einsum of a constant one-hot and the
bias table in the weight program (TF's numbers and gradient), with the per-sample einsums
of attention around it; the table gathered at constant bucket ids under RMSProp (TF's
sparse update) refused in one line naming the gather."""
from __future__ import annotations

import cs_inprocess
import pytest
import relative_bias_models as m

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


def test_a_bias_gathered_under_a_sparse_rmsprop_update_is_refused_naming_the_gather(tmp_path):
    line = cs_inprocess.refusal(m.gathered_bias, m.input_fn, BASE, str(tmp_path), m.__file__)
    assert "GatherV2" in line or "ResourceGather" in line, line
    assert "never" in line and "tf.einsum" in line, line


def test_an_einsum_of_a_weight_summing_a_letter_of_one_operand_is_refused_in_one_line(tmp_path):
    line = cs_inprocess.refusal(m.mean_bias_per_head, m.input_fn, BASE, str(tmp_path),
                                m.__file__)
    assert "with Einsum" in line and "'qkn,nh->h' sums over a letter of one operand only (k, q)" \
        in line, line
