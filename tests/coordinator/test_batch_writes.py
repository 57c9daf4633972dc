"""Frozen state written from the whole batch (tests/batch_write_models.py: a REINFORCE
reward baseline, a running feature mean, a running loss the weight program reads, center
loss's scatter_sub and its per-class mean form, MoCo's key queue)
trains on the simulated CS as TensorFlow trains it, the state included, whatever the
micro-batch size and on 2 replicas; the checkpoint evaluates and predicts as on the CPU; a
run resumed across a checkpoint is an unbroken one; what the CS cannot order or compute is
refused in one line naming the op."""
from __future__ import annotations

import batch_write_models as m
import cs_inprocess
import numpy as np
import pytest
import tf_reference

from cs_api import pb
from wafer import timing
from wafer.weight_writes import WeightWrite, apply
from wse_sim.errors import CSError
from wse_sim.program import check_program

PARAMS = {"batch_size": 8, "runconfig": {"tf_random_seed": 1}}
RTOL = 1e-5
STATE = {m.reinforce_baseline: "baseline", m.running_feature_mean: "feature_mean",
         m.center_loss: "centers", m.center_loss_class_means: "centers", m.moco_queue: "queue",
         m.running_loss: "running_loss"}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return cs_inprocess.micro_batch_comparisons(m.labelled_input_fn, tmp_path_factory, 4)


@pytest.mark.parametrize("micro, replicas", [(8, 1), (1, 1), (2, 2)])
@pytest.mark.parametrize("model_fn", list(STATE), ids=lambda f: f.__name__)
def test_state_written_from_the_batch_trains_like_tensorflow(prepared, model_fn, micro,
                                                             replicas):
    """Every micro-batch's (and replica's) values make the write: TF's state after each
    step, read by the next step's forward pass."""
    result = prepared(model_fn, PARAMS, micro, replicas)
    cs_inprocess.assert_same_training(result, rtol=RTOL)
    name = STATE[model_fn]
    [write] = [w for w in result.compiled.program.weight_writes if w.variable == name]
    assert list(write.batch) and not write.before_update
    assert not np.allclose(result.cs.state[name], result.compiled.initial_weights[name])
    np.testing.assert_allclose(result.cs.state[name], result.reference.state[name],
                               rtol=RTOL, atol=1e-6)


def test_center_loss_beside_the_optimizer_trains_like_tensorflow(tmp_path):
    """tf.group(minimize, scatter_sub): the write reads the forward pass's gathered rows,
    so TF orders it after them."""
    result = cs_inprocess.compare(m.center_loss, m.labelled_input_fn,
                                  {**PARAMS, "beside": True}, str(tmp_path), steps=4)
    cs_inprocess.assert_same_training(result, rtol=RTOL)


def test_center_loss_by_segment_sums_trains_like_tensorflow(prepared):
    """The class means as tf.math.unsorted_segment_sum of the embeddings over that of
    ones (TF's CPU kernel adds the rows in order, as the CS's), one sample a micro-batch."""
    result = prepared(m.center_loss_class_means, {**PARAMS, "segment_sum": True}, 1)
    cs_inprocess.assert_same_training(result, rtol=RTOL)
    steps = [s.op for s in result.compiled.program.weight_writes[0].steps]
    assert steps.count("segment_sum:4") == 2 and "select" in steps


@pytest.mark.parametrize("micro, replicas", [(8, 1), (1, 1), (2, 2)])
@pytest.mark.parametrize("ring", ["scatter_update", "nd"])
def test_a_queue_at_a_ring_pointer_trains_like_tensorflow(prepared, ring, micro, replicas):
    """MoCo's queue written at ptr + tf.range(B) (scatter_update or
    tf.tensor_scatter_nd_update), reading the pointer before its own write (ptr + B) % K,
    which the CS carries as int32 state no kernel holds."""
    result = prepared(m.moco_queue, {**PARAMS, "ring": ring}, micro, replicas)
    cs_inprocess.assert_same_training(result, rtol=RTOL)
    queue, ptr = result.compiled.program.weight_writes
    assert list(queue.sources) == ["ptr"] and ptr.carried_dtype == "int32"
    assert result.cs.state["ptr"].dtype == np.int32 and result.cs.state["ptr"] == 0  # (4 x 8) % 16
    assert "State write of ptr, int32 (after the writes reading it, at " in \
        result.compiled.report_text
    assert "State write of queue from the whole batch (after the step's updates, at " in \
        result.compiled.report_text


def test_a_resumed_ring_queue_restores_its_pointer(prepared, tmp_path):
    """After 3 steps the pointer is 8: the checkpoint holds it as TF's int32."""
    compiled = prepared(m.moco_queue, {**PARAMS, "ring": "nd"}, 8).compiled  # the ring tests' compile
    data = tf_reference.batches(m.labelled_input_fn, {**PARAMS, "ring": "nd"}, 6)
    _, state, _ = cs_inprocess.resume_is_unbroken(compiled, data, str(tmp_path), 3)
    assert state["ptr"] == 8


def test_a_running_loss_weighting_the_batchs_mean_trains_like_tensorflow(tmp_path):
    """The state read as a scalar factor of the loss's mean (a loss weight the loss tail
    reads each step), written from the per-sample losses."""
    result = cs_inprocess.compare(m.running_loss, m.labelled_input_fn,
                                  {**PARAMS, "outside": True}, str(tmp_path), steps=4)
    cs_inprocess.assert_same_training(result, rtol=RTOL)
    assert not np.allclose(result.cs.state["running_loss"], 1.0)


def test_the_write_takes_every_sample_of_the_batch(prepared):
    """Written from the first micro-batch alone, the running mean is another."""
    result = prepared(m.running_feature_mean, PARAMS, 8)
    [message] = result.compiled.program.weight_writes
    write = WeightWrite.from_message(message)
    hidden = np.random.default_rng(0).normal(size=(8, m.EMBED)).astype(np.float32)
    whole, half = np.zeros(m.EMBED, np.float32), np.zeros(m.EMBED, np.float32)
    apply(write, whole, [np.float32(0.2)], batch=(hidden,))
    apply(write, half, [np.float32(0.2)], batch=(hidden[:4],))
    np.testing.assert_allclose(whole, 0.2 * hidden.mean(0), rtol=1e-6)
    assert not np.allclose(whole, half, rtol=1e-3)


@pytest.mark.parametrize("model_fn", [m.center_loss, m.moco_queue, m.reinforce_baseline,
                                      m.running_loss],
                         ids=lambda f: f.__name__)
def test_the_checkpoint_evaluates_as_on_the_cpu(prepared, model_fn, tmp_path):
    """Evaluation reads the written state from the checkpoint and writes nothing."""
    assert cs_inprocess.evaluation_mismatch(model_fn, m.labelled_input_fn, PARAMS, str(tmp_path),
                                            prepared(model_fn, PARAMS, 8), rtol=RTOL) == ""


def test_the_checkpoint_predicts_as_on_the_cpu(prepared, tmp_path):
    """The running feature mean centres the predicted samples' features."""
    assert cs_inprocess.prediction_mismatch(m.running_feature_mean, m.labelled_input_fn, PARAMS,
                                            str(tmp_path), prepared(m.running_feature_mean,
                                                                    PARAMS, 8), rtol=RTOL) == ""


def test_a_resumed_run_restores_the_state(tmp_path):
    cs_inprocess.assert_resume_is_unbroken(m.center_loss, m.labelled_input_fn, PARAMS,
                                           str(tmp_path), {"centers", "embed/kernel/Adam"})


def test_the_report_shows_each_state_write(prepared):
    report = prepared(m.moco_queue, PARAMS, 8).compiled.report_text
    assert "State write of queue from the whole batch (after the step's updates, at " \
        "tests/batch_write_models.py:" in report
    assert "w = concat(batch(StopGradient), w[0:8])\n" in report
    center = prepared(m.center_loss, PARAMS, 8).compiled.report_text
    assert "w = scatter_sub(w, batch(labels), (0.5 * ((batch(Gather) - batch(embed)) / " \
        "cast((1 + reshape(gather(unique_with_counts(batch(labels)).count, " \
        "unique_with_counts(batch(labels)).idx), 8,1)), float32))))\n" in center


def test_the_step_time_charges_the_batchs_values_to_the_state(prepared):
    """MoCo's write moves the batch's 8 keys of 5 float32 values into the queue's region
    after the updates: the compile report and the CS's timing charge it."""
    compiled = prepared(m.moco_queue, PARAMS, 8).compiled
    [(moved, edge)] = timing.program_state_writes(compiled.program)
    assert moved == 8 * m.EMBED * 4 and edge >= 1
    assert "+ update " in compiled.report_text and " + state writes " in compiled.report_text


@pytest.mark.parametrize("model_fn, extra, expected", [
    (m.reinforce_baseline, {"after": False}, "the write of baseline does not wait for the "
                                             "step's read of it"),
    (m.reinforce_baseline, {"scaled": True}, "the write of baseline reads reward_scale: the "
                                             "CS writes state from itself, constants and the "
                                             "batch's values"),
    (m.running_feature_mean, {"twice": True}, "the train_op writes feature_mean twice a step"),
    (m.center_loss, {"facenet": True}, "computes the loss under tf.control_dependencies([the "
                                       "write of centers] (ResourceScatterSub at "),
    (m.moco_queue, {"ring": "unordered"}, "the write of queue reads ptr: the CS writes state "
                                          "from itself"),
])
def test_what_the_cs_cannot_order_or_compute_is_refused_in_one_line(model_fn, extra, expected,
                                                                    tmp_path):
    message = cs_inprocess.refusal(model_fn, m.labelled_input_fn, {**PARAMS, **extra},
                                   str(tmp_path), m.__file__)
    assert expected in message


def test_a_state_write_reading_an_unknown_value_is_refused_at_load(prepared):
    """The CS's Load checks the batch values a write reads are the program's."""
    program = pb.Program()
    program.CopyFrom(prepared(m.running_feature_mean, PARAMS, 8).compiled.program)
    program.weight_writes[0].batch[0] = "nowhere"
    with pytest.raises(CSError, match="its batch value 'nowhere' is no kernel or input"):
        check_program(program)
