"""Updates inside a tf.cond on the global step (hand-written gradient accumulation, applying
every N steps): the CS evaluates the cond's predicate at each step's global step, adds the
gradients to the accumulators (checkpointed under TF's names) and applies them when it holds,
with TF's numbers across several apply points, resumed mid-accumulation and evaluated as the
CPU path; a cond deciding from the batch refused in one line."""
from __future__ import annotations

import inspect

import conditional_update_models as cm
import cs_inprocess
import numpy as np
import pytest

BASE = {"batch_size": 8, "runconfig": {"tf_random_seed": 7}}  # the same initial weights every run
ACCUMULATORS = {"dense/kernel/accum", "dense/bias/accum", "dense_1/kernel/accum",
                "dense_1/bias/accum"}


@pytest.mark.parametrize("optimizer, every, steps", [("momentum", 2, 6), ("adam", 3, 7)])
def test_accumulated_gradients_train_like_tensorflow(tmp_path, optimizer, every, steps):
    """Applied at steps 1, 3, 5 (momentum) or 2, 5 and ending mid-accumulation (Adam: the
    accumulators hold step 6's gradient); weights, slots, Adam's powers and the accumulators
    within 1e-4 of TF; the checkpoint evaluates as on the CPU."""
    params = {**BASE, "optimizer": optimizer, "every": every}
    run = cs_inprocess.compare(cm.accumulated, cm.input_fn, params, str(tmp_path / "train"),
                               steps=steps)
    update = run.compiled.program.conditional_update
    assert set(update.accumulators) == ACCUMULATORS
    lines = inspect.getsource(cm).splitlines()
    line = next(i for i, text in enumerate(lines) if text.endswith("# cond")) + 1
    assert update.source.endswith(f"conditional_update_models.py:{line}")
    assert ACCUMULATORS <= set(run.cs.state)
    reported = next(line for line in run.compiled.report_text.splitlines()
                    if line.startswith("Updates inside a tf.cond"))
    assert f"when float32((0 == ((global_step + 1) % {every}))), applying the sums of " in reported
    assert all(name in reported for name in ACCUMULATORS)
    assert cs_inprocess.mismatches(run) == []
    if optimizer == "adam":
        assert abs(run.cs.state["dense/kernel/accum"]).max() > 0
        assert cs_inprocess.evaluation_mismatch(cm.accumulated, cm.input_fn, params,
                                                str(tmp_path / "eval"), run) == ""


@pytest.mark.parametrize("inside, negated", [(False, False), (True, False), (False, True)])
def test_updates_every_n_steps_train_like_tensorflow(tmp_path, inside, negated):
    """Adam's updates on steps 0 and 2 of 4, no accumulators; the gradients computed before
    the cond or by minimize in its branch; the updates in its true or false branch."""
    params = {**BASE, "optimizer": "adam", "every": 2, "minimize_inside": inside,
              "negated": negated}
    run = cs_inprocess.compare(cm.every_n, cm.input_fn, params, str(tmp_path), steps=4)
    assert not run.compiled.program.conditional_update.accumulators
    assert cs_inprocess.mismatches(run) == []


def test_a_resume_mid_accumulation_is_unbroken(tmp_path):
    """Every 3 steps, resumed at step 4 with step 3's gradient in the accumulators."""
    cs_inprocess.assert_resume_is_unbroken(cm.accumulated, cm.input_fn,
                                           {**BASE, "optimizer": "momentum", "every": 3},
                                           str(tmp_path), ACCUMULATORS)


def test_sums_divided_when_applied_are_refused_in_one_line(tmp_path):
    """(the CS transforms each step's gradient before adding it: not the sum)"""
    message = cs_inprocess.refusal(cm.accumulated, cm.input_fn,
                                   {**BASE, "optimizer": "momentum", "every": 2,
                                    "divide_after": True}, str(tmp_path), cm.__file__)
    assert "does not apply the accumulator" in message
    assert "divide each step's gradient before adding it" in message


def test_a_cond_deciding_from_the_batch_is_refused_in_one_line(tmp_path):
    message = cs_inprocess.refusal(cm.accuracy_gated, cm.input_fn,
                                   {**BASE, "optimizer": "adam", "every": 2}, str(tmp_path),
                                   cm.__file__)
    assert "the tf.cond applying the updates decides from the batch (features, labels)" in message
    assert "predicate is computed from the global step and constants" in message


def test_a_cond_on_a_step_nothing_increments_is_refused_in_one_line(tmp_path):
    """(TF's predicate holds every step or never; the CS would count the batches)"""
    message = cs_inprocess.refusal(cm.every_n, cm.input_fn,
                                   {**BASE, "optimizer": "adam", "every": 2, "uncounted": True},
                                   str(tmp_path), cm.__file__)
    assert "reads the global step, which the train_op does not increment" in message


@pytest.mark.parametrize("check, counted", [("loss", True), ("gradients", False)])
def test_a_step_with_a_non_finite_loss_or_gradient_is_skipped_like_tensorflow(tmp_path, check,
                                                                               counted):
    """The third batch holds a NaN image: its loss and gradients are NaN on both, TF's cond
    skips its update and so does the CS; the 5 steps' weights and slots within 1e-4 of TF,
    and the global step counts the applied steps when the increment is in the cond."""
    params = {**BASE, "optimizer": "adam", "check": check, "counted": counted}
    run = cs_inprocess.compare(cm.skip_non_finite, cm.diverging_input_fn, params,
                               str(tmp_path), steps=5)
    assert run.compiled.program.conditional_update.finite == check
    assert np.isnan(run.cs.losses[2]) and np.isnan(run.reference.losses[2])
    np.testing.assert_allclose(run.cs.losses, run.reference.losses, rtol=1e-4)
    assert [p for p in cs_inprocess.mismatches(run) if not p.startswith("losses")] == []
    assert run.cs.global_steps == ([1, 2, 2, 3, 4] if counted else [1, 2, 3, 4, 5])
    assert run.cs.global_steps[-1] == int(run.reference.state["global_step"])


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_a_warm_up_training_the_head_alone_trains_like_tensorflow(tmp_path, optimizer):
    """tf.cond(step < 2, apply the head's gradients, apply all): the body frozen for steps 0
    and 1 and trained on 2 to 4 (Adam's powers move every step), within 1e-4 of TF."""
    params = {**BASE, "optimizer": optimizer, "warmup": 2}
    run = cs_inprocess.compare(cm.warm_head, cm.input_fn, params, str(tmp_path), steps=5)
    update = run.compiled.program.conditional_update
    assert (list(update.if_true), sorted(update.if_false)) == ([], ["body/bias", "body/kernel"])
    assert cs_inprocess.mismatches(run) == []
