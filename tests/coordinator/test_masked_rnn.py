"""Keras recurrent layers reading a mask (Embedding(mask_zero=True), Keras' Masking layer,
a mask= argument) train on the CS with TensorFlow's numbers and evaluate and predict with the
CPU path's: GRU, LSTM, SimpleRNN and Bidirectional, returning sequences or the last state,
one masked layer after another. Bidirectional's
layers returning sequences zero their masked steps' outputs (zero_output_for_mask), which
the unrolled graph does as TF's While does, in the backward layer's own time order."""
import cs_inprocess
import masked_rnn_models as m
import numpy as np
import pytest
import tensorflow as tf

from coordinator.compiler.recurrences import keras_unrolled

L = tf.keras.layers

SEED = {"runconfig": {"tf_random_seed": 3}}
RTOL = 1e-5

# GRU, LSTM, SimpleRNN, Bidirectional; the last state and sequences; mask_zero, mask= and
# Masking (sentiment with LSTM, SimpleRNN and Bidirectional GRU, a GRU tagger and Masking
# before an LSTM passed too, measured once: 110 s more for forms these cover)
CASES = {
    "sentiment_gru": (m.sentiment, m.reviews_input_fn, {"rnn": "gru"}),
    "sentiment_lstm_mask_argument": (m.sentiment, m.reviews_input_fn,
                                     {"rnn": "lstm", "mask_argument": True}),
    "tagger_bidirectional_lstm": (m.tagger, m.reviews_input_fn,
                                  {"rnn": "lstm", "bidirectional": True}),
    "tagger_stacked_gru_simple_rnn": (m.tagger, m.reviews_input_fn,
                                      {"rnn": "simple_rnn", "stacked": True}),
    "masking_bidirectional_simple_rnn_sequences": (
        m.masked_series, m.series_input_fn,
        {"rnn": "simple_rnn", "bidirectional": True, "return_sequences": True}),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_masked_rnn_trains_like_tensorflow_and_runs_like_the_cpu(tmp_path, case):
    model_fn, input_fn, params = CASES[case]
    params = {**SEED, **params}
    result = cs_inprocess.compare(model_fn, input_fn, params, str(tmp_path), steps=4)
    assert cs_inprocess.mismatches(result, RTOL) == []
    assert "select" in {k.type for k in result.compiled.program.kernels}  # the mask is used
    assert cs_inprocess.cpu_path_mismatches(model_fn, input_fn, params, str(tmp_path), result) == []


@pytest.mark.parametrize("layer", [
    lambda: L.Bidirectional(L.SimpleRNN(3, return_sequences=True)),
    lambda: L.GRU(3, return_sequences=True, go_backwards=True, zero_output_for_mask=True),
    lambda: L.LSTM(3, go_backwards=True, zero_output_for_mask=True),
], ids=["bidirectional_sequences", "backward_gru_sequences", "backward_lstm_last"])
def test_unrolled_masked_layer_computes_what_its_loop_does(layer):
    """A layer zeroing its masked steps' outputs (zero_output_for_mask: Bidirectional's layers
    returning sequences), unrolled as the compiler unrolls it, outputs what its While loop
    does, backward in time too (Keras' own unrolling zeroes a backward layer's reversed
    outputs by the mask in forward time)."""
    ids = np.array([[5, 7, 2, 0, 0], [3, 0, 0, 0, 0], [1, 2, 3, 4, 6]], np.int32)
    x = L.Embedding(8, 2, mask_zero=True)
    rnn = layer()
    loop = rnn(x(ids)).numpy()
    with keras_unrolled():
        unrolled = rnn(x(ids)).numpy()
    np.testing.assert_allclose(unrolled, loop, rtol=1e-6, atol=1e-7)
