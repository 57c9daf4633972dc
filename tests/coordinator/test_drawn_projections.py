"""A random projection drawn every step, shared by the batch and read like a weight (a
Performer's FAVOR+ features x @ tf.random.normal([dh, m]) in an einsum, random Fourier
features of the input; unseen23's refusal 1). The weight program draws it once a step, as
noise on weights, and the kernels read it as a weight. Proven here: (1) with TF's draws
replayed the models train 4 steps to TF's losses and weights (1e-5), dh equal to the batch
size too (the draw's first axis is the einsum's letter d, not the batch); (2) evaluation
draws a new projection for every batch, TF's numbers with TF's draws; prediction with TF's
draws predicts TF's logits; (3) a draw a batched matmul pairs with the batch stays
per-sample. (The Fourier features' random phase, added to the samples' values:
test_batch_shared_draws.)"""
from __future__ import annotations

import cs_inprocess
import numpy as np
import projection_models as m
import pytest
import tf_reference

from coordinator.chief import cs_state
from tf_model import checkpoints

BASE = {"batch_size": 16, "runconfig": {"tf_random_seed": 1}}
CASES = {"performer_dh8": (m.performer, m.tokens_input_fn, {"heads": 2}),
         # dh 16 = the batch size: the [16, 8] draw is no per-sample [batch, 8] one
         "performer_dh_of_the_batch": (m.performer, m.tokens_input_fn, {"heads": 1}),
         "fourier_features": (m.fourier_features, m.points_input_fn, {})}


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    """compare_drawn() of each case, once."""
    return cs_inprocess.cached_comparisons(CASES, BASE, tmp_path_factory, drawn=True)


@pytest.mark.parametrize("name", sorted(CASES))
def test_with_tfs_draws_a_projection_drawn_once_a_step_trains_like_tensorflow(drawn, name):
    result = drawn(name)
    program = result.compiled.program
    assert len(cs_inprocess.weight_draws(program)) == 1 and "random" not in [k.type for k in program.kernels]
    assert cs_inprocess.mismatches(result, rtol=1e-5) == []
    assert result.cs.losses[0] != result.cs.losses[-1]  # it trained


@pytest.mark.parametrize("name", ["performer_dh_of_the_batch", "fourier_features"])
def test_evaluation_draws_a_new_projection_for_every_batch_like_tensorflow(drawn, name, tmp_path):
    model_fn, input_fn, extra = CASES[name]
    path = cs_inprocess.trained_checkpoint(str(tmp_path), drawn(name))
    program = cs_inprocess.assert_evaluation_draws_every_batch(
        model_fn, input_fn, {**BASE, **extra}, str(tmp_path / "eval"), path)
    assert cs_inprocess.weight_draws(program)


def test_prediction_with_tfs_draws_predicts_tfs_logits(drawn, tmp_path):
    """The PREDICT program handed the projections TF's graph drew for two batches predicts
    the logits TF computed with them, from the trained weights."""
    params = {**BASE, **CASES["performer_dh8"][2]}
    program = cs_inprocess.compile_checked(m.performer, m.tokens_input_fn, params,
                                           str(tmp_path / "infer"), mode="infer").program
    path = cs_inprocess.trained_checkpoint(str(tmp_path), drawn("performer_dh8"))
    state = cs_state(program, checkpoints.read_checkpoint(path), path)
    data = cs_inprocess.first_batches(m.tokens_input_fn, params, 2)
    logits = cs_inprocess.output_tensor_names(program)["head"]  # the head Dense's output
    reference = tf_reference.run(m.performer, m.tokens_input_fn, params, state, data,
                                 mode="eval", fetch=[*cs_inprocess.drawn_tensors(program), logits])
    with cs_inprocess.tfs_draws(program, reference.fetched):
        run = cs_inprocess.run_on_cs(program, state, data, kind="predict")
    for outputs, tf_step in zip(run.outputs, reference.fetched, strict=True):
        np.testing.assert_allclose(outputs["head"], tf_step[logits], rtol=1e-5, atol=1e-6)


def test_a_draw_a_batched_matmul_pairs_with_the_batch_stays_per_sample(tmp_path):
    """A [16, 16, 4] draw in tf.matmul(x, eps) at batch 16 is each sample's own: drawn per
    sample on the CS (no weight-program draw), TF's training with TF's draws (1e-5)."""
    result = cs_inprocess.compare_drawn(m.per_sample_products, m.tokens_input_fn, BASE,
                                        str(tmp_path))
    program = result.compiled.program
    assert not cs_inprocess.weight_draws(program) and "random" in [k.type for k in program.kernels]
    assert cs_inprocess.mismatches(result, rtol=1e-5) == []

