"""The differential harness itself: the in-process CS run matches TensorFlow on a model the
compiler supports, and the comparison and refusal checks catch what they are for."""
from __future__ import annotations

import dataclasses

import compiler_models as m
import cs_inprocess
import numpy as np
import pytest

from common.errors import CSRunError

PARAMS = {"batch_size": 16, "hidden": [12], "optimizer": "momentum", "learning_rate": 0.05,
          "runconfig": {"tf_random_seed": 1}}


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    return cs_inprocess.compare(m.keras_mlp, m.input_fn, PARAMS, str(tmp_path_factory.mktemp("md")),
                                steps=2)


def test_a_supported_model_trains_in_process_like_tensorflow(result):
    assert len(result.cs.losses) == 2 and result.cs.losses == pytest.approx(result.reference.losses, rel=1e-5)
    assert "dense/kernel/Momentum" in result.cs.state
    assert cs_inprocess.mismatches(result) == []


def with_state(result, name, value):
    cs = dataclasses.replace(result.cs, state={**result.cs.state, name: value})
    return dataclasses.replace(result, cs=cs)


def test_a_weight_that_did_not_move_like_tensorflows_is_a_mismatch(result):
    frozen = with_state(result, "dense/kernel", result.compiled.initial_weights["dense/kernel"])
    assert any(p.startswith("dense/kernel:") for p in cs_inprocess.mismatches(frozen))
    nudged = result.cs.state["dense/bias"] + np.float32(1e-3)
    assert any(p.startswith("dense/bias:") for p in cs_inprocess.mismatches(
        with_state(result, "dense/bias", nudged)))


def test_a_missing_optimizer_slot_or_other_losses_are_mismatches(result):
    state = {n: v for n, v in result.cs.state.items() if n != "dense/kernel/Momentum"}
    assert any("dense/kernel/Momentum" in p for p in cs_inprocess.mismatches(
        dataclasses.replace(result, cs=dataclasses.replace(result.cs, state=state))))
    losses = [loss * 1.001 for loss in result.cs.losses]
    assert any(p.startswith("losses:") for p in cs_inprocess.mismatches(
        dataclasses.replace(result, cs=dataclasses.replace(result.cs, losses=losses))))


@pytest.mark.parametrize("message, ok", [
    ("validation failed: Sort 'Sort' at tests/compiler_models.py:126", True),
    ("validation failed: Sort 'Sort' at /abs/tests/compiler_models.py:126 (hint: x)", True),
    ("validation failed: Sort 'Sort' at <unknown source>", False),  # no line
    ("no supported loss found at tests/compiler_models.py:126", False),  # no op
    ("validation failed: Sort 'Sort' at tests/other.py:126", False),  # not the model's file
    ("variable dense/bias at tests/compiler_models.py:60 is float16", True),  # in user terms
    ("the labels are reshaped at tests/compiler_models.py:60", True),
    ("variable dense/bias_2 at tests/compiler_models.py:60 is float16", False)])
def test_a_refusal_must_name_an_op_and_a_line_of_the_models_file(message, ok):
    words = {"Sort", "MatMul", "dense/bias", "labels"}
    problem = cs_inprocess.refusal_problem(CSRunError(message), m.__file__, words)
    assert (problem == "") == ok, problem
