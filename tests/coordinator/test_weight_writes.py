"""Decoupled weight decay written by hand after the optimizer (the modelzoo's AdamW-by-hand
style, issue 21): `v.assign_sub(wd * lr * v)` and `v.assign(v * (1 - wd))` under
tf.control_dependencies([the optimizer's op]), or before it, on every trainable variable
or the kernels only, with Adam and Momentum, a constant learning rate and a schedule, on an
MLP and a CNN, train on the CS as TensorFlow trains them (4 steps, rtol 1e-4); so do a
weight's renormalizations after the update (TransE's tf.nn.l2_normalize(ent, axis=1) of
looked-up entity embeddings, a max-norm constraint by hand or by tf.clip_by_norm, whose
tf.where guards a zero norm); the CS's write is TF's float32 arithmetic bit for bit; a
write it does not carry out (pruning by a cast mask) is refused in one line naming the op."""
from __future__ import annotations

import cs_inprocess
import numpy as np
import pytest
import renormalized_weight_models as r
import tensorflow as tf
import weight_decay_models as m

from common.errors import CSRunError
from cs_api import pb
from wafer.schedules import ScalarOp, Schedule
from wafer.weight_writes import FACTOR, WeightWrite, WriteStep, apply
from wse_sim.errors import CSError
from wse_sim.program import check_program

BASE = {"batch_size": 8, "runconfig": {"tf_random_seed": 1}}
CASES = {
    "adam_after": (m.mlp, m.input_fn, {}),
    "adam_schedule_after": (m.mlp, m.input_fn, {"schedule": True}),
    "momentum_scale": (m.mlp, m.input_fn, {"optimizer": "momentum", "form": "scale"}),
    "cnn_momentum_schedule_kernels": (m.cnn, m.image_input_fn, {
        "optimizer": "momentum", "schedule": True, "kernels_only": True}),
    "adam_schedule_before": (m.mlp, m.input_fn, {"schedule": True, "decay_first": True}),
}
RENORMALIZED = {"transe": (r.transe, r.triples_input_fn, {}),
                "max_norm_mlp": (r.max_norm_mlp, r.input_fn, {}),
                "clipped_by_norm_mlp": (r.clipped_by_norm_mlp, r.input_fn, {})}
@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    return cs_inprocess.cached_comparisons(CASES, BASE, tmp_path_factory)


@pytest.mark.parametrize("name", CASES)
def test_weight_decay_by_hand_trains_like_tensorflow(compared, name):
    result = compared(name)
    cs_inprocess.assert_same_training(result)
    program, extra = result.compiled.program, CASES[name][2]
    trained = {p.variable for k in program.kernels for p in k.params if not p.frozen}
    assert {w.variable for w in program.weight_writes} == {
        v for v in trained if "kernel" in v or not extra.get("kernels_only")}
    assert all(w.before_update == bool(extra.get("decay_first")) for w in program.weight_writes)
    assert all(any(o.op == "step" for f in w.factors for o in f.ops) == bool(extra.get("schedule"))
               for w in program.weight_writes)


def test_the_compile_report_shows_each_write_in_tfs_order(compared):
    report = compared("adam_after").compiled.report_text
    assert "Weight write of dense/kernel (after every update, at tests/weight_decay_models.py:" \
        in report
    assert "w = w - (0.005 * w)" in report
    assert "w = w * 0.9" in compared("momentum_scale").compiled.report_text


def test_a_scheduled_decay_resumes_where_it_stopped(tmp_path):
    params = {**BASE, **CASES["adam_schedule_after"][2]}
    cs_inprocess.assert_resume_is_unbroken(m.mlp, m.input_fn, params, str(tmp_path),
                                           {"dense/kernel/Adam"})


def test_without_the_decay_the_same_model_trains_to_other_weights(compared, tmp_path):
    decayed = compared("adam_after")
    plain = cs_inprocess.compare(m.mlp, m.input_fn, {**BASE, "weight_decay": 0.0},
                                 str(tmp_path), steps=4)
    assert not np.allclose(plain.cs.state["dense/kernel"], decayed.cs.state["dense/kernel"],
                           rtol=1e-4)


@pytest.mark.parametrize("form", ["product", "scale"])
def test_the_cs_writes_tfs_float32_values_bit_for_bit(form):
    rng = np.random.default_rng(5)
    weight = rng.normal(size=(64, 33)).astype(np.float32)
    wd, lr = np.float32(0.01), np.float32(0.0123)
    with tf.Graph().as_default():
        v = tf.compat.v1.get_variable("v", initializer=weight)
        rate = tf.constant(lr)
        write = v.assign_sub(wd * rate * v) if form == "product" else v.assign(v * (1 - wd))
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            expected = session.run(write)
    if form == "product":
        steps = (WriteStep("mul", ("f0", "w")), WriteStep("sub", ("w", "s0")))
        factors = [wd * lr]
    else:
        steps, factors = (WriteStep("mul", ("w", "f0")),), [np.float32(1) - wd]
    rule = WeightWrite("v", steps, tuple(Schedule(FACTOR, (ScalarOp("const", "float32", value=float(f)),))
                                         for f in factors))
    ours = weight.copy()
    apply(rule, ours, factors)
    np.testing.assert_array_equal(ours, expected)


@pytest.fixture(scope="module")
def renormalized(tmp_path_factory):
    return cs_inprocess.cached_comparisons(RENORMALIZED, BASE, tmp_path_factory)


@pytest.mark.parametrize("name", RENORMALIZED)
def test_a_weight_renormalized_after_its_update_trains_like_tensorflow(renormalized, name):
    result = renormalized(name)
    cs_inprocess.assert_same_training(result)
    (write,) = result.compiled.program.weight_writes
    assert not write.before_update and any(s.op.startswith("r:sum:") for s in write.steps)
    if name == "transe":  # every entity's embedding is a unit vector after each step
        np.testing.assert_allclose(np.linalg.norm(result.cs.state["entities"], axis=1), 1.0,
                                   rtol=1e-5)


def test_the_cs_renormalizes_with_tfs_float32_values(renormalized):
    write = WeightWrite.from_message(renormalized("transe").compiled.program.weight_writes[0])
    weight = np.random.default_rng(6).normal(size=(64, 33)).astype(np.float32)
    expected = tf.nn.l2_normalize(weight, axis=1).numpy()
    apply(write, weight, [np.float32(1e-12)])
    np.testing.assert_allclose(weight, expected, rtol=1e-6, atol=0)  # (sums: another order)


def test_the_cs_clips_by_norm_with_tfs_float32_values(renormalized):
    write = WeightWrite.from_message(
        renormalized("clipped_by_norm_mlp").compiled.program.weight_writes[0])
    assert {"greater", "select"} <= {s.op for s in write.steps}
    weight = np.random.default_rng(7).normal(scale=0.2, size=(12, 16)).astype(np.float32)
    weight[:, 3] = 0.0  # a zero norm: the guard's other branch
    expected = tf.clip_by_norm(weight, 0.5, axes=[0]).numpy()
    apply(write, weight, [np.float32(float(f.ops[0].value)) for f in write.factors])
    np.testing.assert_allclose(weight, expected, rtol=1e-6, atol=0)  # (sums: another order)
    assert (weight[:, 3] == 0).all()


def test_transe_evaluates_on_the_cs_with_the_cpu_paths_metrics(renormalized, tmp_path):
    assert cs_inprocess.evaluation_mismatch(r.transe, r.triples_input_fn, BASE, str(tmp_path),
                                            renormalized("transe")) == ""


def test_a_renormalization_the_cs_does_not_carry_out_is_refused_in_one_line(tmp_path):
    with pytest.raises(CSRunError) as refused:
        cs_inprocess.compile_checked(r.pruned_mlp, r.input_fn, BASE, str(tmp_path))
    message = str(refused.value)
    assert "not arithmetic, element-wise functions and reductions" in message
    assert "Cast" in message and "tf.nn.l2_normalize(v, axis=1)" in message
    assert cs_inprocess.refusal_problem(refused.value, r.__file__, cs_inprocess.model_op_words(
        r.pruned_mlp, r.input_fn, BASE)) == ""


def test_the_cs_refuses_a_weight_write_it_cannot_carry_out(compared):
    good = compared("adam_after").compiled.program
    for change, words in [(lambda p: setattr(p.weight_writes[0], "variable", "nope"),
                           "not a trained weight"),
                          (lambda p: p.weight_writes[0].steps[0].inputs.__setitem__(0, "s7"),
                           "the CS computes arithmetic"),
                          (lambda p: p.weight_writes.append(p.weight_writes[0]),
                           "written twice")]:
        bad = pb.Program()
        bad.CopyFrom(good)
        change(bad)
        with pytest.raises(CSError, match=words):
            check_program(bad)
