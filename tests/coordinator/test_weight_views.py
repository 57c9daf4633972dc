"""Weights sliced, split, gathered, concatenated or transposed before they meet the samples
(issue 21): Keras GRU with reset_after False (the reset state times a slice of the recurrent
kernel) and True, a hand-written LSTM splitting its kernels with tf.split, a language model
tying its output layer to its embedding table, and a kernel pieced together from gathered,
reversed and concatenated weights, and a kernel concatenated with a constant column, train
on the CS as TensorFlow trains them (4 steps, rtol 1e-4) and evaluate there with the CPU
path's metrics."""
from __future__ import annotations

import cs_inprocess
import pytest
import weight_view_models as m

BASE = {"batch_size": 8, "runconfig": {"tf_random_seed": 1}}
CASES = {
    "gru_reset_before": (m.gru_reset_before, m.sequence_input_fn, {}),
    "gru_reset_after": (m.gru_reset_after, m.sequence_input_fn, {"optimizer": "adam"}),
    "split_kernel_lstm": (m.split_kernel_lstm, m.sequence_input_fn, {"optimizer": "adam"}),
    "tied_embedding_lm": (m.tied_embedding_lm, m.token_input_fn, {}),
    "pieced_kernel": (m.pieced_kernel, m.sequence_input_fn, {"optimizer": "adam"}),
    "unrolled_ista": (m.unrolled_ista, m.sequence_input_fn, {"optimizer": "adam"}),  # scalars theta[k]
    "constant_column": (m.kernel_with_constant_column, m.sequence_input_fn, {}),
}


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    return cs_inprocess.cached_comparisons(CASES, BASE, tmp_path_factory)


SLOW = {"gru_reset_before", "gru_reset_after", "split_kernel_lstm"}  # unrolled sequences


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n
                                  for n in CASES])
def test_models_viewing_their_weights_train_and_evaluate_like_tensorflow(compared, name,
                                                                         tmp_path):
    result = compared(name)
    cs_inprocess.assert_same_training(result)
    assert result.cs.losses[0] != result.cs.losses[-1]  # it trained
    for variable, start in result.compiled.initial_weights.items():
        if variable in result.cs.state and variable != "global_step":
            assert (result.cs.state[variable] != start).any(), f"{variable} was not trained"
    model_fn, input_fn, extra = CASES[name]
    assert cs_inprocess.evaluation_mismatch(model_fn, input_fn, {**BASE, **extra},
                                            str(tmp_path), result) == ""


def test_a_pieced_kernel_is_computed_by_the_weight_program_from_its_two_weights(compared):
    program = compared("pieced_kernel").compiled.program.weight_program
    assert {p.variable for p in program.sources} == {"a", "b"}
    assert {"take", "slice", "concat", "transpose"} <= {k.type for k in program.kernels}


def test_a_constant_column_is_a_sample_constant_of_the_weight_program(compared):
    program = compared("constant_column").compiled.program.weight_program
    assert {p.variable for p in program.sources} == {"w"}
    assert {"sample_constant", "concat"} <= {k.type for k in program.kernels}
