"""Target networks moved by Polyak averaging (soft updates): a DDPG-like actor-critic of
Keras layers whose target networks are moved toward the trained ones after both Adam
optimizers' updates (four ways users write it, tau a constant or a schedule of the global
step) or before them, a BYOL-style momentum encoder (the target applied to two views, a
cosine-similarity loss) and a DQN whose target is a hard copy every 2 steps under tf.cond
train on the CS as TensorFlow trains them, the target weights included (4 steps, rtol
1e-5), evaluate from the checkpoint as on the CPU, and resume across a checkpoint; a soft
update or copy with no order to the optimizer's update or to the forward pass's reads of
the target, and a cond writing in both branches, are refused in one line naming the op."""
from __future__ import annotations

import cs_inprocess
import numpy as np
import pytest
import soft_update_models as m
import tensorflow as tf
import tf_reference

from cs_api import pb
from wafer.schedules import evaluate
from wafer.weight_writes import WeightWrite, apply
from wse_sim.errors import CSError
from wse_sim.program import check_program

BASE = {"batch_size": 8, "runconfig": {"tf_random_seed": 1}}
DDPG = (m.ddpg, m.transitions_input_fn)
CASES = {
    "ddpg_assign": (*DDPG, {}),
    "ddpg_tau_schedule": (*DDPG, {"form": "tau", "schedule": True}),
    "ddpg_assign_sub": (*DDPG, {"form": "sub"}),
    "ddpg_assign_add_before_updates": (*DDPG, {"form": "add", "soft_first": True}),
    "byol": (m.byol, m.features_input_fn, {}),
    "dqn_hard_copy": (m.dqn_hard_copy, m.transitions_input_fn, {}),
}
TARGETS = {"tactor": "actor", "tcritic": "critic", "target": "online", "qtarget": "q"}


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    return cs_inprocess.cached_comparisons(CASES, BASE, tmp_path_factory)


@pytest.mark.parametrize("name", CASES)
def test_soft_updates_train_like_tensorflow(compared, name):
    result = compared(name)
    cs_inprocess.assert_same_training(result, rtol=1e-5)
    writes = result.compiled.program.weight_writes
    frozen = {p.variable for k in result.compiled.program.kernels for p in k.params if p.frozen}
    assert {w.variable for w in writes} == {v for v in frozen if v.split("_")[0] in TARGETS}
    for w in writes:  # each target weight reads its online weight, and moved
        prefix, rest = w.variable.split("_", 1)
        assert list(w.sources) == [f"{TARGETS[prefix]}_{rest}"]
        assert w.before_update == bool(CASES[name][2].get("soft_first"))
        assert not np.allclose(result.cs.state[w.variable],
                               result.compiled.initial_weights[w.variable], rtol=1e-4)


def test_a_float16_target_network_reads_its_rounded_soft_update(tmp_path):
    """Under mixed_float16 the DQN's target layers compute with a float16 copy of the
    target weights, rounded anew after each copy (rtol 1e-2, as every mixed-precision
    comparison)."""
    result = cs_inprocess.compare(m.dqn_hard_copy, m.transitions_input_fn,
                                  {**BASE, "mixed": True}, str(tmp_path), steps=4)
    cs_inprocess.assert_same_training(result, rtol=1e-2)
    assert len(result.compiled.program.weight_writes) == 4


def test_the_cs_reads_the_sources_when_tf_does(compared):
    """Reading the online weights after their update where TF reads them before gives
    other target weights: the order the compiler proves is the one that matters."""
    result = compared("ddpg_assign_add_before_updates")
    program = type(result.compiled.program)()
    program.CopyFrom(result.compiled.program)
    for w in program.weight_writes:
        w.before_update = False
    params = {**BASE, **CASES["ddpg_assign_add_before_updates"][2]}
    late = cs_inprocess.run_on_cs(program, result.compiled.initial_weights,
                                  tf_reference.batches(m.transitions_input_fn, params, 4))
    assert not np.allclose(late.state["tcritic_1/kernel"],
                           result.reference.state["tcritic_1/kernel"], rtol=1e-5)


def test_the_report_shows_each_soft_update(compared):
    report = compared("ddpg_assign").compiled.report_text
    assert "Soft update of tcritic_1/kernel (after the updates, reading the weights after " \
        "theirs, at tests/soft_update_models.py:" in report
    assert "w = (0.99 * w) + (0.01 * critic_1/kernel)" in report


@pytest.mark.parametrize("name", ["ddpg_assign", "byol", "dqn_hard_copy"])
def test_the_checkpoint_evaluates_as_on_the_cpu(compared, name, tmp_path):
    model_fn, input_fn, extra = CASES[name]
    assert cs_inprocess.evaluation_mismatch(model_fn, input_fn, {**BASE, **extra},
                                            str(tmp_path), compared(name)) == ""


def test_a_scheduled_soft_update_resumes_where_it_stopped(tmp_path):
    cs_inprocess.assert_resume_is_unbroken(m.ddpg, m.transitions_input_fn,
                                           {**BASE, **CASES["ddpg_tau_schedule"][2]},
                                           str(tmp_path), {"tcritic_0/kernel", "actor_0/kernel/Adam"})


def test_a_hard_copy_every_2_steps_copies_on_the_steps_tf_does(compared):
    """The predicate reads the global step after the step's increment: the copy runs after
    the second and the fourth update, so the target equals the Q network after 4 steps
    (bit for bit) and neither its initial value nor the Q network after 3."""
    result = compared("dqn_hard_copy")
    program = result.compiled.program
    assert all(w.HasField("predicate") and w.step_offset == 1 for w in program.weight_writes)
    assert [s.op for s in program.weight_writes[0].steps] == ["copy"]
    for name in ("qtarget_0/kernel", "qtarget_1/bias"):
        online = name.replace("qtarget", "q")
        np.testing.assert_array_equal(result.cs.state[name], result.cs.state[online])
    params = {**BASE, **CASES["dqn_hard_copy"][2]}
    three = cs_inprocess.run_on_cs(program, result.compiled.initial_weights,
                                   tf_reference.batches(m.transitions_input_fn, params, 3))
    assert not np.array_equal(three.state["qtarget_0/kernel"], three.state["q_0/kernel"])
    assert "Soft update of qtarget_0/kernel (after the updates, reading the weights after " \
        "theirs, when " in result.compiled.report_text


@pytest.mark.parametrize("model_fn,extra,expected", [
    (m.ddpg, {"unordered": True}, "the soft update of tactor_0/kernel reads actor_0/kernel with "
                                  "no order to its update"),
    (m.ddpg, {"soft_first": "unwaited"}, "the soft update of tactor_0/kernel does not wait "
                                         "for the step's read of it"),
    (m.ddpg, {"decay": True}, "which the train_op writes besides its update too"),
    (m.dqn_hard_copy, {"unordered": True}, "with no order to"),
    (m.dqn_hard_copy, {"both_branches": True}, "both branches of the tf.cond write variables"),
    (m.dqn_hard_copy, {"target_unread": True}, "which the training step does not read"),
])
def test_what_cannot_be_ordered_is_refused_in_one_line(model_fn, extra, expected, tmp_path):
    message = cs_inprocess.refusal(model_fn, m.transitions_input_fn, {**BASE, **extra},
                                   str(tmp_path), m.__file__)
    assert expected in message


@pytest.mark.parametrize("name", ["ddpg_assign", "ddpg_assign_sub", "ddpg_assign_add_before_updates"])
def test_the_cs_writes_tfs_float32_values_bit_for_bit(compared, name):
    """The compiled write of a target kernel on random values is TF's write of them."""
    write = next(WeightWrite.from_message(w) for w in compared(name).compiled.program.weight_writes
                 if w.variable == "tcritic_0/kernel")
    rng = np.random.default_rng(7)
    target, online = (rng.normal(size=(m.STATE + m.ACTION, 16)).astype(np.float32) for _ in "to")
    with tf.Graph().as_default():
        t, o = (tf.compat.v1.get_variable(n, initializer=v) for n, v in (("t", target), ("o", online)))
        write_tf = m.soft_write(o, t, CASES[name][2].get("form", "mix"), 0.01)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            expected = session.run(write_tf)
    ours = target.copy()
    apply(write, ours, [np.float32(evaluate(f, 0, {})) for f in write.factors], (online,))
    np.testing.assert_array_equal(ours, expected)


def test_the_cs_refuses_a_soft_update_it_cannot_carry_out(compared):
    good = compared("ddpg_assign").compiled.program
    for change, words in [(lambda p: p.weight_writes[0].sources.__setitem__(0, "tcritic_0/bias"),
                           "not a trained weight of the program no write writes"),
                          (lambda p: p.weight_writes[0].ClearField("sources"),
                           "not a trained weight of the program, or a frozen one"),
                          (lambda p: p.weight_writes[0].steps[0].inputs.__setitem__(0, "v1"),
                           "the CS computes arithmetic")]:
        bad = pb.Program()
        bad.CopyFrom(good)
        change(bad)
        with pytest.raises(CSError, match=words):
            check_program(bad)
