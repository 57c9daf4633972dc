"""Weights two optimizers update in one step (training/reupdates.py, the simulator's
reupdates): the AAE chained phase by phase and the reference AAE of three grouped Adams, a
GAN sharing its generator with an autoencoder's decoder, two tasks' optimizers on one
embedding table and body (grouped and chained), a sequential chain over overlapping
var_lists: 4 steps on the CS and on TF from the same weights and batches within 1e-5
(losses, weights, every optimizer's slots and beta powers), evaluated and predicted as the
CPU path; what TF leaves to chance refused in one line naming both ops and lines."""
from __future__ import annotations

import inspect

import multi_optimizer_models as mm
import pytest
import tf_reference
import twice_updated_models as tm
from cs_inprocess import (
    assert_resume_is_unbroken,
    assert_same_training,
    cached_comparisons,
    compile_checked,
    cpu_path_mismatches,
    micro_batch_comparisons,
    refusal,
    resume_is_unbroken,
)

from cs_api import pb
from wse_sim.errors import CSError
from wse_sim.program import check_program

CASES = {"aae_chained": (tm.aae_chained, tm.digits_input_fn, {}),
         "aae_three_adams": (mm.aae_three_adams, mm.digits_input_fn, {}),
         "vaegan_trunk": (tm.vaegan_trunk, tm.digits_input_fn, {}),
         "two_tasks": (tm.two_tasks, tm.tasks_input_fn, {}),
         "two_tasks_chained": (tm.two_tasks, tm.tasks_input_fn, {"chained": True}),
         "sequential_chain": (tm.sequential_chain, tm.digits_input_fn, {})}
SECOND_SLOTS = {"aae_chained": "enc_h/kernel/Adam_2", "aae_three_adams": "enc_h/kernel/Adam_2",
                "vaegan_trunk": "dec_h/kernel/Adam_2",
                "two_tasks": "shared_embedding/embeddings/Momentum",
                "two_tasks_chained": "shared_body/kernel/Momentum",
                "sequential_chain": "trunk/kernel/RMSProp"}
EVALUATED = ("aae_chained", "vaegan_trunk", "two_tasks", "sequential_chain")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return cached_comparisons(CASES, {}, tmp_path_factory, drawn=True)


@pytest.mark.parametrize("case", sorted(CASES))
def test_trains_as_tensorflow(trained, case):
    run = trained(case)
    assert_same_training(run, rtol=1e-5)
    assert SECOND_SLOTS[case] in run.cs.state  # (the second optimizer's own, TF's name)
    assert SECOND_SLOTS[case].rsplit("/", 1)[0] in \
        [r.variable for r in run.compiled.program.reupdates]


@pytest.mark.parametrize("case", EVALUATED)
def test_evaluates_and_predicts_as_the_cpu_path(trained, case, tmp_path):
    model_fn, input_fn, params = CASES[case]
    assert cpu_path_mismatches(model_fn, input_fn, params, str(tmp_path), trained(case)) == []


@pytest.fixture(scope="module")
def streamed(tmp_path_factory):
    return micro_batch_comparisons(tm.tasks_input_fn, tmp_path_factory, steps=4)


@pytest.mark.parametrize("micro, replicas", [(4, None), (2, 2)])
def test_micro_batches_and_replicas_reupdate_as_tensorflow(streamed, micro, replicas):
    """The table's IndexedSlices and the body's gradient kept from the rating task's pass,
    whatever the micro-batch size and replicas."""
    assert_same_training(streamed(tm.two_tasks, {"chained": True}, micro, replicas), rtol=1e-5)


def test_a_checkpoint_resumes_every_optimizer_of_a_reupdated_weight(tmp_path):
    """The second and third Adams' slots and beta powers, read back as the chief resumes:
    the next steps an unbroken run's (bit for bit, the prior's draws too)."""
    compiled = compile_checked(tm.aae_chained, tm.digits_input_fn, {}, str(tmp_path / "aae"))
    data = tf_reference.batches(tm.digits_input_fn, {}, 6)
    _, state, _ = resume_is_unbroken(compiled, data, str(tmp_path / "aae"), 3)
    assert {"enc_h/kernel/Adam_2", "enc_h/kernel/Adam_3", "beta1_power_2"} <= set(state)
    assert_resume_is_unbroken(tm.two_tasks, tm.tasks_input_fn, {}, str(tmp_path / "tasks"),
                              {"shared_embedding/embeddings/Momentum", "shared_body/kernel/Momentum"})


def _line(module, fragment: str) -> str:
    lines = inspect.getsource(module).splitlines()
    return f"{module.__name__}.py:{next(i for i, s in enumerate(lines) if fragment in s) + 1}"


def test_an_update_reading_the_weight_with_no_order_to_the_other_is_refused(tmp_path):
    message = refusal(tm.sequential_chain, tm.digits_input_fn, {"ftrl": True}, str(tmp_path),
                      "twice_updated_models.py")
    assert message.startswith("trunk/kernel is updated by two optimizers with no order")
    assert "the ftrl update reads the weight" in message
    assert "ResourceApplyGradientDescent" in message and "ResourceApplyFtrl" in message
    assert _line(tm, "FtrlOptimizer") in message


def test_a_second_loss_computed_from_the_updated_weights_is_refused(tmp_path):
    """TF's second pass then reads the first update's weights (measured: 0.15 apart from
    the chain from one forward pass after 3 steps); the CS's passes all read the step's."""
    message = refusal(tm.sequential_chain, tm.digits_input_fn, {"recomputed": True},
                      str(tmp_path), "twice_updated_models.py")
    assert "after the train_op's update (under tf.control_dependencies)" in message
    assert _line(tm, "head_b(trunk_layer(features))") in message


def test_a_penalty_on_a_twice_updated_weight_is_refused(tmp_path):
    """TF adds the L2 gradient to the first loss's gradient alone; the CS's regions add a
    penalty in every pass."""
    message = refusal(tm.sequential_chain, tm.digits_input_fn, {"penalized": True},
                      str(tmp_path), "twice_updated_models.py")
    assert "a weight penalty on trunk/kernel, which two optimizers update" in message


def test_a_read_no_update_waits_for_is_refused(tmp_path):
    """Grouped, the generator's Adam may update the decoder before the reconstruction's
    backward pass reads it (TF's executor decides)."""
    message = refusal(tm.vaegan_trunk, tm.digits_input_fn, {"grouped": True}, str(tmp_path),
                      "twice_updated_models.py")
    assert "reads dec_h/kernel, which another loss's optimizer updates" in message
    assert _line(tm, "reconstruction line") in message and _line(tm, "grouped generator line") in message


def test_the_report_names_each_reupdate(trained):
    text = trained("aae_chained").compiled.report_text
    assert "Reupdates (a weight updated again after its first update, in TF's order" in text
    assert f"enc_h/kernel by optimizer 2 from objective 2 at tests/{_line(tm, 'generator line')}" \
        in text
    assert "for (reupdates only) (step counters beta1_power_2, beta2_power_2)" in text


@pytest.mark.parametrize("change, words", [
    (lambda r: setattr(r, "objective", 9), "objective 9 is none of the program's 3"),
    (lambda r: setattr(r, "optimizer", 3), "optimizer 3 is none of the program's 3"),
    (lambda r: r.slots.pop(), "are not its optimizer's, each once"),
    (lambda r: setattr(r, "variable", "disc_x/kernel"), "is not a trained weight"),
], ids=["objective", "optimizer", "slots", "variable"])
def test_the_cs_refuses_a_malformed_reupdate_before_anything_is_allocated(trained, change, words):
    program = pb.Program()
    program.CopyFrom(trained("aae_chained").compiled.program)
    change(program.reupdates[0])
    with pytest.raises(CSError) as error:
        check_program(program)
    assert "reupdate 0: " in str(error.value) and words in str(error.value)
