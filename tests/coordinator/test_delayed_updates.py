"""Delayed updates under a tf.cond of the global step beside updates every step: TD3 (critic
every step; actor and target networks every 2 steps, the cond after the critic's step, which
increments the global step, or before the increment with its target policy smoothing's
noise drawn in the graph: TF's draws handed to the CS), a WGAN training its generator every 3rd
step (RMSProp with the critic's weight clipping, or Adam, with and without WGAN-GP's gradient
penalty) and a GAN alternating its Adam updates between the branches (its discriminator
clipped in its branch) train 6 steps with TF's losses, weights, slots and step counters (rtol
1e-5): the predicate reads the step TF reads, a branch's optimizer moves its slots and Adam's
powers only on the steps it runs; a run resumed across a delayed step equals an unbroken
one; the checkpoints evaluate and predict as on the CPU; what TF does not order is refused in
one line."""
from __future__ import annotations

import cs_inprocess
import delayed_update_models as d
import numpy as np
import pytest
import soft_update_models as m
import tf_reference

BASE = {"batch_size": 8, "runconfig": {"tf_random_seed": 1}}
STEPS = 6
TD3 = (d.td3, m.transitions_input_fn)
GAN = (d.wgan_n_critic, d.ring_input_fn)
ACTOR = {"actor_0/kernel", "actor_0/bias", "actor_1/kernel", "actor_1/bias"}
GENERATOR = {"g_hidden/kernel", "g_hidden/bias", "g_out/kernel", "g_out/bias"}
CRITIC = {"d_hidden/kernel", "d_hidden/bias", "d_out/kernel", "d_out/bias"}
# case: (model_fn, input_fn, params), (the variables updated when the predicate holds,
# otherwise; the step offset of its read), each Adam's beta1_power after 6 steps (beta1 **
# (1 + the steps it ran))
CASES = {
    "td3_after_the_increment": ((*TD3, {}), (ACTOR, set(), 1), {0.9 ** 7, 0.9 ** 4}),
    "td3_before_the_increment": ((*TD3, {"form": "before", "smoothing": True}), (ACTOR, set(), 0),
                                 {0.9 ** 7, 0.9 ** 4}),
    "td3_targets_after_the_cond": ((*TD3, {"form": "targets_after"}), (ACTOR, set(), 1),
                                   {0.9 ** 7, 0.9 ** 4}),
    "wgan_clipped": ((*GAN, {}), (GENERATOR, set(), 1), set()),
    "wgan_adam": ((*GAN, {"adam": True}), (GENERATOR, set(), 1), {0.5 ** 7, 0.5 ** 3}),
    "alternating_gan": ((d.alternating_gan, d.ring_input_fn, {}), (CRITIC, GENERATOR, 0),
                        {0.5 ** 4}),
    "alternating_gan_clipped": ((d.alternating_gan, d.ring_input_fn, {"clip": True}),
                                (CRITIC, GENERATOR, 0), {0.5 ** 4}),
}


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    return cs_inprocess.cached_comparisons({k: v[0] for k, v in CASES.items()}, BASE,
                                           tmp_path_factory, steps=STEPS, drawn=True)


@pytest.mark.parametrize("name", CASES)
def test_delayed_updates_train_like_tensorflow(compared, name):
    result = compared(name)
    cs_inprocess.assert_same_training(result, rtol=1e-5)
    update = result.compiled.program.conditional_update
    if_true, if_false, offset = CASES[name][1]
    assert (set(update.if_true), set(update.if_false), update.step_offset) == \
        (if_true, if_false, offset)
    powers = {float(v) for k, v in result.cs.state.items() if k.startswith("beta1_power")}
    np.testing.assert_allclose(sorted(powers), sorted(CASES[name][2]), rtol=1e-6)


def test_a_wgan_gp_trains_its_generator_every_third_step_like_tensorflow(tmp_path):
    """The critic's gradient penalty at random interpolates (TF's draws handed to the CS)."""
    result = cs_inprocess.compare_drawn(*GAN, {**BASE, "adam": True, "gp": True},
                                        str(tmp_path), steps=STEPS)
    cs_inprocess.assert_same_training(result, rtol=1e-5)
    assert set(result.compiled.program.conditional_update.if_true) == GENERATOR
    powers = {float(v) for k, v in result.cs.state.items() if k.startswith("beta1_power")}
    np.testing.assert_allclose(sorted(powers), [0.5 ** 7, 0.5 ** 3], rtol=1e-6)


def test_writes_in_a_branch_run_under_its_predicate(compared):
    """TD3's soft updates in the cond run under its predicate (read after the increment),
    the WGAN critic's weight clipping every step after its update, the alternating GAN's
    clipping of its discriminator in the discriminator's branch."""
    td3 = compared("td3_after_the_increment").compiled.program.weight_writes
    assert {w.variable.split("_")[0] for w in td3} == {"tactor", "tcritic"}
    assert all(w.HasField("predicate") and w.step_offset == 1 for w in td3)
    wgan = compared("wgan_clipped").compiled.program.weight_writes
    assert {w.variable for w in wgan} == CRITIC
    assert not any(w.HasField("predicate") for w in wgan)
    alternating = compared("alternating_gan_clipped").compiled.program.weight_writes
    assert {w.variable for w in alternating} == CRITIC
    assert all(w.HasField("predicate") and w.step_offset == 0 for w in alternating)
    report = compared("td3_after_the_increment").compiled.report_text
    assert "at the incremented global step; only then: actor_0/kernel" in report


def test_soft_updates_after_the_cond_run_every_step_after_the_gated_update(compared):
    """TD3's target networks under tf.control_dependencies([the cond holding the actor's
    update]): every step, reading the actor after the cond, updated or not."""
    writes = compared("td3_targets_after_the_cond").compiled.program.weight_writes
    assert {w.variable.split("_")[0] for w in writes} == {"tactor", "tcritic"}
    assert not any(w.HasField("predicate") or w.before_update for w in writes)


def test_a_cond_moving_a_target_network_alone_trains_like_tensorflow(tmp_path):
    """A DQN's soft update (assign_sub) every 2 steps beside its optimizer's every step: the
    writes carry the predicate, no update is gated."""
    result = cs_inprocess.compare(d.dqn_polyak_every_2, m.transitions_input_fn, BASE,
                                  str(tmp_path), steps=STEPS)
    cs_inprocess.assert_same_training(result, rtol=1e-5)
    program = result.compiled.program
    assert not program.HasField("conditional_update")
    assert len(program.weight_writes) == 4
    assert all(w.HasField("predicate") and w.step_offset == 1 for w in program.weight_writes)


def test_the_step_the_predicate_reads_matters(compared):
    """Reading the step before its increment where TF reads it after moves the actor on
    other steps: other weights than TF's."""
    result = compared("td3_after_the_increment")
    program = type(result.compiled.program)()
    program.CopyFrom(result.compiled.program)
    program.conditional_update.step_offset = 0
    early = cs_inprocess.run_on_cs(program, result.compiled.initial_weights,
                                   tf_reference.batches(m.transitions_input_fn, BASE, STEPS))
    assert not np.allclose(early.state["actor_1/kernel"],
                           result.reference.state["actor_1/kernel"], rtol=1e-3)


def test_a_run_resumed_across_delayed_steps_is_unbroken(tmp_path):
    """Resumed at step 4: the actor's Adam (its own step counters) and the targets continue
    on steps 6 and 8 as an unbroken run and TF."""
    cs_inprocess.assert_resume_is_unbroken(*TD3, BASE, str(tmp_path),
                                           {"tactor_0/kernel", "actor_0/kernel/Adam",
                                            "beta1_power_1"})


@pytest.mark.parametrize("name", ["td3_after_the_increment", "alternating_gan"])
def test_the_checkpoint_evaluates_and_predicts_as_on_the_cpu(compared, name, tmp_path):
    model_fn, input_fn, extra = CASES[name][0]
    params = {**BASE, **extra}
    assert cs_inprocess.evaluation_mismatch(model_fn, input_fn, params, str(tmp_path / "eval"),
                                            compared(name)) == ""
    assert cs_inprocess.prediction_mismatch(model_fn, input_fn, params,
                                            str(tmp_path / "predict"), compared(name)) == ""


@pytest.mark.parametrize("extra,source,expected", [
    ({"form": "unordered"}, d, "the tf.cond's predicate reads the global step (ReadVariableOp "
                               "'ReadVariableOp' at tests/delayed_update_models.py:"),
    ({"form": "probe"}, m, "reads critic_0/kernel, which another loss's optimizer updates in "
                           "the step, with no order to that update"),
    ({"form": "counted"}, d, "the tf.cond applying the updates increments the global step"),
    ({"one_adam": True}, d, "writes beta1_power both inside the tf.cond applying the updates "
                            "and outside it"),
    ({"schedule": True}, d, "the tf.cond writes tactor_0/kernel with a factor computed per step"),
    ({"form": "uncounted"}, d, "reads the global step, which the train_op does not increment"),
    ({"form": "targets_unordered"}, m, "the soft update of tactor_0/kernel reads actor_0/kernel "
                                       "with no order to its update"),
    ({"form": "nested"}, d, "a If inside the tf.cond applying the updates writes variables"),
])
def test_what_tf_does_not_order_is_refused_in_one_line(extra, source, expected, tmp_path):
    message = cs_inprocess.refusal(*TD3, {**BASE, **extra}, str(tmp_path), source.__file__)
    assert expected in message
    if extra.get("form") == "unordered":  # which read, and which write
        assert "with no order to the step's increment (AssignAddVariableOp 'Adam' at " \
            "tests/delayed_update_models.py:" in message
