"""Random numbers drawn for weights, once a step (Bayes by backprop: w = mu + softplus(rho) *
eps, eps in the weight's shape; unseen13's refusal 1). The weight program draws them before
each batch, every micro-batch of the step reads the same drawn weights, and the gradient is
taken back through the program to mu and rho. Proven here: (1) with TF's draws handed to the
CS (tfs_draws) the models train 4 steps to TF's losses and weights (1e-5), at micro-batches
of 1 too; (2) evaluation draws a new w for every batch, as TF's graph does (with TF's draws,
TF's losses), and the chief's evaluation and prediction of a model using the mean (a mode
switch) are the CPU path's; (3) prediction draws once a batch; (4) a resumed run draws what
an unbroken one draws; (5) drawn weights a prediction reads stay refused in one line naming
the draw (draws broadcast over the batch: test_batch_shared_draws)."""
from __future__ import annotations

import tempfile

import cs_inprocess
import noise_models as nm
import numpy as np
import pytest
import tf_reference
import weight_draw_models as m

from common.errors import CSRunError
from common.run_settings import RunSettings
from coordinator.compiler import compile_model
from cs_api import pb
from tf_model import cpu_session
from wse_sim.errors import CSError
from wse_sim.program import check_program

BASE = {"batch_size": 8, "runconfig": {"tf_random_seed": 1}}
CASES = {"bayes_linreg": (m.bayes_linreg, m.regression_input_fn, {}),
         "uniform_draw": (m.bayes_linreg, m.regression_input_fn, {"draw": "uniform"}),
         "bayes_layers": (m.bayes_mlp, m.classes_input_fn, {}),
         # a bias of as many units as the batch: its eps's first axis the batch's size
         "units_of_the_batch": (m.bayes_mlp, m.classes_input_fn, {"batch_size": m.HIDDEN,
                                                                  "closed_kl": True}),
         "shared_draw": (m.shared_draw, m.classes_input_fn, {}),
         "weight_noise": (nm.weight_noise, nm.input_fn, {})}


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    """compare_drawn() of each case, once."""
    return cs_inprocess.cached_comparisons(CASES, BASE, tmp_path_factory, drawn=True)


@pytest.mark.parametrize("name", sorted(CASES))
def test_with_tfs_draws_weights_drawn_once_a_step_train_like_tensorflow(drawn, name):
    result = drawn(name)
    program = result.compiled.program
    assert cs_inprocess.weight_draws(program) and "random" not in [k.type for k in program.kernels]
    assert cs_inprocess.mismatches(result, rtol=1e-5) == []
    assert result.cs.losses[0] != result.cs.losses[-1]  # it trained


def test_a_layer_draws_its_kernel_and_bias_and_two_layers_their_own(drawn):
    assert len(cs_inprocess.weight_draws(drawn("bayes_layers").compiled.program)) == 4
    assert len(cs_inprocess.weight_draws(drawn("shared_draw").compiled.program)) == 1


def test_every_micro_batch_reads_the_steps_one_draw(drawn):
    """At micro-batches of 1 each sample's kernels read the step's drawn weights: TF's
    training (1e-5), whose batch used one draw."""
    result = drawn("bayes_layers")
    program = cs_inprocess.at_micro_batch(result.compiled.program, 1)
    data = tf_reference.batches(m.classes_input_fn, BASE, 4)
    with cs_inprocess.tfs_draws(program, result.reference.fetched):
        cs = cs_inprocess.run_on_cs(program, result.compiled.initial_weights, data)
    micro = cs_inprocess.Comparison(result.compiled, cs, result.reference)
    assert cs_inprocess.mismatches(micro, rtol=1e-5) == []


def test_the_cs_draws_its_own_weights_fresh_every_step(drawn, tmp_path):
    """Without the replay the CS trains differently (the seam replaced the draws); with a
    learning rate of 0 the same batch gives another loss at every step (a new w each step),
    and a second run the same losses (the program's seed)."""
    result = drawn("bayes_linreg")
    data = tf_reference.batches(m.regression_input_fn, BASE, 1)
    own = cs_inprocess.run_on_cs(result.compiled.program, result.compiled.initial_weights, data)
    assert own.losses[0] != result.cs.losses[0]
    still = cs_inprocess.compile_checked(m.bayes_linreg, m.regression_input_fn,
                                         {**BASE, "learning_rate": 0.0}, str(tmp_path))
    runs = [cs_inprocess.run_on_cs(still.program, still.initial_weights, data * 3).losses
            for _ in range(2)]
    assert len(set(runs[0])) == 3 and runs[0] == runs[1]


def test_evaluation_draws_a_new_weight_for_every_batch_like_tensorflow(drawn, tmp_path):
    """TF's EVAL graph draws eps at every session.run: handed TF's draws, the CS's
    evaluation losses are TF's batch by batch (1e-5); with its own, one batch evaluated twice
    gives two losses, and the same checkpoint and input the same losses."""
    path = cs_inprocess.trained_checkpoint(str(tmp_path), drawn("bayes_linreg"))
    program = cs_inprocess.assert_evaluation_draws_every_batch(
        m.bayes_linreg, m.regression_input_fn, BASE, str(tmp_path / "eval"), path)
    assert cs_inprocess.weight_draws(program)


def test_the_chiefs_evaluation_of_a_drawn_model_has_the_cpu_paths_other_metrics(drawn, tmp_path):
    """The textbook model's eval loss reads the drawn w (each path its own draws); its rmse
    and KL (of the means) are the CPU path's."""
    path = cs_inprocess.trained_checkpoint(str(tmp_path), drawn("bayes_linreg"))
    settings = RunSettings(str(tmp_path), BASE, None, None, None, None)
    cpu = cpu_session.evaluate(m.bayes_linreg, m.regression_input_fn, settings, steps=2,
                               checkpoint_path=path)
    cs = cs_inprocess.evaluate_like_the_chief(m.bayes_linreg, m.regression_input_fn, BASE,
                                              str(tmp_path), path, steps=2)
    for metric in ("rmse", "kl"):
        np.testing.assert_allclose(cs[metric], cpu[metric], rtol=1e-5, err_msg=metric)


def test_a_model_using_the_mean_outside_training_evaluates_and_predicts_like_the_cpu(drawn, tmp_path):
    trained = drawn("bayes_layers")
    assert cs_inprocess.evaluation_mismatch(m.bayes_mlp, m.classes_input_fn, BASE,
                                            str(tmp_path / "eval"), trained) == ""
    assert cs_inprocess.prediction_mismatch(m.bayes_mlp, m.classes_input_fn, BASE,
                                            str(tmp_path / "infer"), trained) == ""


def test_prediction_draws_one_weight_for_each_batch(drawn, tmp_path):
    """The predicted sample x @ w + b with w = mu + sigma * eps: within a batch the residual
    from the mean is x @ (sigma * eps) for one eps (least squares over the batch's 8 samples
    leaves nothing), eps differs from batch to batch, and the mean is mu's."""
    trained = drawn("bayes_linreg")
    path = cs_inprocess.trained_checkpoint(str(tmp_path), trained)
    predicted = cs_inprocess.predict_like_the_chief(m.bayes_linreg, m.regression_input_fn, BASE,
                                                    str(tmp_path), path, steps=4)
    state = trained.cs.state
    x = np.concatenate([b[0] for b in cs_inprocess.first_batches(m.regression_input_fn, BASE, 4)])
    np.testing.assert_allclose(predicted["mean"], x @ state["w_mu"] + state["b_mu"], rtol=1e-5,
                               atol=1e-6)
    sigma = np.log1p(np.exp(state["w_rho"].astype(np.float64)))
    draws = []
    for batch in range(4):
        rows = slice(8 * batch, 8 * batch + 8)
        residual = (predicted["sample"] - predicted["mean"])[rows].astype(np.float64)
        v, *_ = np.linalg.lstsq(x[rows].astype(np.float64), residual, rcond=None)
        np.testing.assert_allclose(x[rows] @ v, residual, atol=1e-5)
        draws.append((v / sigma).reshape(-1))
    assert all(np.abs(eps).max() < 6 for eps in draws)
    assert not any(np.allclose(draws[0], other, atol=1e-3) for other in draws[1:])


def test_a_resumed_run_draws_the_weights_an_unbroken_run_draws(drawn, tmp_path):
    data = tf_reference.batches(m.regression_input_fn, BASE, 6)
    cs_inprocess.resume_is_unbroken(drawn("bayes_linreg").compiled, data, str(tmp_path), 3)


def test_drawn_weights_a_prediction_reads_are_refused_in_one_line():
    """Drawn weights a prediction reads besides the samples' values computed from them: the
    host would draw its own."""
    with tempfile.TemporaryDirectory() as model_dir, pytest.raises(CSRunError) as refused:
        compile_model(m.predicted_weight_sample, m.regression_input_fn, BASE, model_dir,
                      mode="infer", validate_only=True)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("validation failed: RandomStandardNormal ")
    assert "_models.py:" in message and "the host would draw its own" in message


def test_load_refuses_a_weight_program_kernel_without_inputs_that_does_not_draw(drawn):
    program = pb.Program()
    program.CopyFrom(drawn("bayes_linreg").compiled.program)
    draw = next(k for k in program.weight_program.kernels if k.type == "random")
    draw.type = "dropout"
    with pytest.raises(CSError, match=r"inputs among its sources and earlier kernels \(none: a draw\)"):
        check_program(program)
