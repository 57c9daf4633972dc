"""State written from the whole batch under a tf.cond on the global step (Deep SVDD's center
set once to the mean of the outputs, tests/batch_write_models.py: deep_svdd) trains on the
simulated CS as TensorFlow trains it over steps crossing the predicate, and its checkpoint
evaluates and predicts as on the CPU; the original code (the center set at step 0 before the
loss reads it) and a value the CS does not compute are refused in one line naming the
user's op and line, never an op the compiler imported from the cond's branch."""
from __future__ import annotations

import batch_write_models as m
import cs_inprocess
import numpy as np
import pytest

PARAMS = {"batch_size": 8, "runconfig": {"tf_random_seed": 1}}
RTOL = 1e-5


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return cs_inprocess.compare(m.deep_svdd, m.labelled_input_fn, PARAMS,
                                str(tmp_path_factory.mktemp("svdd")), steps=4)


def test_the_center_set_once_after_the_step_trains_like_tensorflow(trained):
    """The center is 0 for two steps, set at the second step's end (global step 2) to the
    mean of that batch's outputs (before the step's update: TF computes them in the forward
    pass), then left: steps 3 and 4 read it."""
    cs_inprocess.assert_same_training(trained, rtol=RTOL)
    [write] = [w for w in trained.compiled.program.weight_writes if w.variable == "center"]
    assert list(write.batch) and write.HasField("predicate") and write.step_offset == 1
    center = trained.cs.state["center"]
    assert np.any(center != 0.0)
    np.testing.assert_allclose(center, trained.reference.state["center"], rtol=RTOL, atol=1e-7)


def test_the_checkpoint_evaluates_and_predicts_as_on_the_cpu(trained, tmp_path):
    args = (m.deep_svdd, m.labelled_input_fn, PARAMS)
    assert cs_inprocess.evaluation_mismatch(*args, str(tmp_path / "eval"), trained,
                                            rtol=RTOL) == ""
    assert cs_inprocess.prediction_mismatch(*args, str(tmp_path / "predict"), trained,
                                            rtol=RTOL) == ""


@pytest.mark.parametrize("extra, expected", [
    ({"before": True}, "the tf.cond sets center from the batch's values and the step reads "
                       "it: each sample's forward pass would read a value of the whole batch "
                       "computed in the same step"),
    ({"sorted": True}, "the train_op writes center with a value that is not arithmetic"),
])
def test_refusals_name_the_users_op_and_line(extra, expected, tmp_path):
    message = cs_inprocess.refusal(m.deep_svdd, m.labelled_input_fn, {**PARAMS, **extra},
                                   str(tmp_path), m.__file__)
    assert expected in message
    assert "csrun_" not in message and "<unknown source>" not in message
