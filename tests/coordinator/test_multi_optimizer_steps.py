"""Several optimizers in one step: each with its own schedule of the global step (DLRM's
Adagrad tables beside an SGD warming up; two SGDs decayed apart; an AdamW beside an Adam) and a weighted sum of two
losses minimized beside a second loss's optimizer (an adversarial autoencoder): 4 steps on
the CS and on TF from the same weights and batches within 1e-5, evaluation and prediction
as the CPU path's (a weight two optimizers update: test_twice_updated_weights.py)."""
from __future__ import annotations

import multi_optimizer_models as mm
import pytest
from cs_inprocess import (
    assert_same_training,
    cached_comparisons,
    evaluation_mismatch,
    prediction_mismatch,
)

from common.errors import CSRunError
from coordinator.compiler import compile_model
from cs_api import pb
from wse_sim.errors import CSError
from wse_sim.program import check_program

CASES = {"dlrm": (mm.dlrm, mm.ctr_input_fn, {"mlp_lr": 0.1}),
         "two_decays": (mm.two_decays, mm.digits_input_fn, {}),
         "adamw_decoder": (mm.adamw_decoder, mm.digits_input_fn, {}),
         "aae_weighted": (mm.aae_weighted, mm.digits_input_fn, {})}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return cached_comparisons(CASES, {}, tmp_path_factory, drawn=True)


@pytest.mark.parametrize("case", sorted(CASES))
def test_trains_evaluates_and_predicts_as_tensorflow(trained, case, tmp_path):
    run = trained(case)
    assert_same_training(run, rtol=1e-5)
    model_fn, input_fn, params = CASES[case]
    assert evaluation_mismatch(model_fn, input_fn, params, str(tmp_path), run) == ""
    if case != "aae_weighted":  # (its prediction draws the prior: the eval covers the rest)
        assert prediction_mismatch(model_fn, input_fn, params, str(tmp_path), run) == ""


def test_each_optimizer_keeps_its_own_schedule(trained):
    """The warmup is the SGD's (the program's optimizer), the Adagrad's rate a constant."""
    program = trained("dlrm").compiled.program
    assert [(s.hyper_parameter, s.optimizer) for s in program.schedules] == [("learning_rate", 0)]
    assert [g.optimizer.type for g in program.optimizer_groups] == ["adagrad"]
    assert "sgd, learning rate from a schedule for bottom0/kernel" in \
        trained("dlrm").compiled.report_text
    assert "  adagrad, learning rate 0.05, initial accumulator 0.01 for embedding_0" in \
        trained("dlrm").compiled.report_text
    assert "  sgd, learning rate from a schedule for decoder/kernel" in \
        trained("two_decays").compiled.report_text
    adamw = trained("adamw_decoder").compiled.program
    assert [g.optimizer.type for g in adamw.optimizer_groups] == ["adamw"]
    assert [(s.optimizer, s.hyper_parameter) for s in adamw.schedules] == [(1, "learning_rate")]
    assert [(s.optimizer, s.hyper_parameter) for s in
            trained("two_decays").compiled.program.schedules] == [(0, "learning_rate"),
                                                                  (1, "learning_rate")]


@pytest.mark.parametrize("change, words", [
    (lambda s: setattr(s, "optimizer", 2), "optimizer 2 is none of the program's 2"),
    (lambda s: setattr(s, "hyper_parameter", "momentum"), "the sgd optimizer's schedules may "
                                                          "compute learning_rate"),
    (lambda s: setattr(s, "optimizer", 0), "a second schedule of learning_rate"),
], ids=["unknown_optimizer", "not_its_optimizers", "twice"])
def test_the_cs_refuses_a_malformed_group_schedule_before_anything_is_allocated(
        trained, change, words):
    program = pb.Program()
    program.CopyFrom(trained("two_decays").compiled.program)
    change(program.schedules[1])
    with pytest.raises(CSError) as error:
        check_program(program)
    assert words in str(error.value)


def test_a_schedule_racing_the_step_increment_of_another_optimizer_is_refused(tmp_path):
    """TF reads the decoder's decayed rate before or after the encoder's minimize counts the
    step, by chance."""
    with pytest.raises(CSRunError) as info:
        compile_model(mm.two_decays, mm.digits_input_fn, {"racing": True}, str(tmp_path),
                      validate_only=True)
    assert info.value.message.startswith("the global step's increment and the learning_rate "
                                         "of the optimizer")
    assert "do not wait for each other" in info.value.message and "\n" not in info.value.message
