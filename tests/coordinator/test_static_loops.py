"""Loops whose number of steps is known when model_fn builds its graph (issue 21): a
tf.scan recurrence (its last state, or every state put back batch-major), a tf.while_loop recurrence reading the sequence by its counter and an Euler-integrated
neural ODE of a float time run as their unrolled steps on the CS, train as TensorFlow trains
them (4 steps) and evaluate there as the CPU path does; a loop whose trip count depends on
the batch stays refused, naming the While and its line. A linear-chain CRF (tf.scan over
em_t[1:] from em_t[0], Viterbi and its reverse backtracking scan) and a Kalman filter (its
covariance, of weights alone, tiled over the batch and carried by the scan) train, evaluate
and predict as TensorFlow and the CPU path do."""
import re

import cs_inprocess
import loop_models as m
import pytest
import tf_reference

from common.errors import CSRunError

PARAMS = {"runconfig": {"tf_random_seed": 2}}


@pytest.mark.slow
@pytest.mark.parametrize("model_fn", [m.scan_rnn, m.scan_sequence, m.while_rnn, m.neural_ode],
                         ids=lambda f: f.__name__)
def test_a_loop_of_known_steps_trains_like_tensorflow_and_evaluates_like_the_cpu(tmp_path,
                                                                               model_fn):
    result = cs_inprocess.compare(model_fn, m.sequence_input_fn, PARAMS, str(tmp_path), steps=4)
    cs_inprocess.assert_same_training(result, rtol=1e-5)
    for variable, start in result.compiled.initial_weights.items():
        if variable != "global_step":
            assert (result.cs.state[variable] != start).any(), f"{variable} was not trained"
    assert cs_inprocess.evaluation_mismatch(model_fn, m.sequence_input_fn, PARAMS,
                                            str(tmp_path), result) == ""


@pytest.mark.parametrize("model_fn", [m.until_small, m.gru_until_small], ids=lambda f: f.__name__)
def test_a_loop_whose_trip_count_depends_on_the_batch_is_refused_naming_it(tmp_path, model_fn):
    """...and only it: a GRU before it is unrolled, not blamed (unseen14's CRNN under
    tf.nn.ctc_loss was told its Bidirectional GRU loops an unknown number of steps)."""
    with pytest.raises(CSRunError) as caught:
        cs_inprocess.compile_checked(model_fn, m.sequence_input_fn, PARAMS, str(tmp_path))
    message = caught.value.message
    assert re.match(r"validation failed: (Stateless)?While 'while(_\d+)?' at \S*loop_models.py:\d+: ", message)
    assert "whose number of steps is not known when the graph is built" in message
    assert "GRU" not in message and "more unsupported" not in message


@pytest.mark.slow
@pytest.mark.parametrize("model_fn, input_fn", [(m.crf_tagger, m.tagging_input_fn),
                                                (m.kalman_filter, m.tracks_input_fn)],
                         ids=["crf_tagger", "kalman_filter"])
def test_a_scan_over_time_major_steps_trains_evaluates_and_predicts_like_tensorflow(
        tmp_path, model_fn, input_fn):
    result = cs_inprocess.compare(model_fn, input_fn, PARAMS, str(tmp_path), steps=4)
    cs_inprocess.assert_same_training(result, rtol=1e-5)
    for variable, start in result.compiled.initial_weights.items():
        if variable != "global_step":
            assert (result.cs.state[variable] != start).any(), f"{variable} was not trained"
    assert cs_inprocess.evaluation_mismatch(model_fn, input_fn, PARAMS, str(tmp_path),
                                            result) == ""
    assert cs_inprocess.prediction_mismatch(model_fn, input_fn, PARAMS, str(tmp_path),
                                            result) == ""


@pytest.mark.slow
def test_a_sinkhorn_loss_over_the_batch_trains_like_tensorflow_and_evaluates_like_the_cpu(
        tmp_path):
    result = cs_inprocess.compare(m.sinkhorn_loss, m.sequence_input_fn, PARAMS, str(tmp_path),
                                  steps=4)
    cs_inprocess.assert_same_training(result, rtol=1e-4)
    data = tf_reference.batches(m.sequence_input_fn, PARAMS, 4)
    exact = tf_reference.run(m.sinkhorn_loss, m.sequence_input_fn, PARAMS,
                             result.compiled.initial_weights, data, floatx="float64").state
    assert cs_inprocess.farther_than_tensorflow(result, exact, 2.0, floor=1e-5) == []
    assert cs_inprocess.evaluation_mismatch(m.sinkhorn_loss, m.sequence_input_fn, PARAMS,
                                            str(tmp_path), result) == ""


def test_an_unrolled_graph_computing_another_function_stays_refused_beyond_tensorflows_spread(
        tmp_path):
    """The proof's spread fallback (rounding_spread: within 2x TF's own spread from weights
    moved by 1 ULP) accepts rounding, not a second build that computes otherwise (without
    runconfig.tf_random_seed, which seeds numpy's generator too, each build draws another
    projection)."""
    with pytest.raises(CSRunError) as caught:
        cs_inprocess.compile_checked(m.redrawn_projection_rnn, m.sequence_input_fn, {},
                                     str(tmp_path))
    assert caught.value.message.startswith("the unrolled graph of the recurrent layers, loops "
                                           "or per-sample maps computes another loss or gradient")


def test_a_time_major_scan_output_pooled_over_time_is_refused_saying_what_to_write(tmp_path):
    with pytest.raises(CSRunError) as caught:
        cs_inprocess.compile_checked(m.scan_max_over_time, m.sequence_input_fn, PARAMS,
                                     str(tmp_path))
    message = caught.value.message
    assert message.startswith("validation failed: Transpose '") and "loop_models.py:" in message
    assert "transpose it back batch-major first (tf.transpose(x, [1, 0, 2])" in message
