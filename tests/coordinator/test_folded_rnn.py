"""An Embedding and Keras' recurrent layers on rows folded into the batch (a hierarchical
attention network's sentences, [B, S, W] -> [B*S, W]; an LSTM per window) train on the CS
with TensorFlow's numbers at micro-batch 8 and 1 and evaluate and predict with the CPU path's,
masked on padded sentences too; a prediction of a recurrent layer's folded states is refused
naming the layer."""
import cs_inprocess
import folded_rnn_models as f
import pytest
import tf_reference

from common.errors import CSRunError
from coordinator.compiler import compile_model

SEED = {"runconfig": {"tf_random_seed": 3}}
RTOL = 1e-5


@pytest.fixture(scope="module")
def han(tmp_path_factory):
    model_dir = str(tmp_path_factory.mktemp("han"))
    return model_dir, cs_inprocess.compare(f.han, f.documents_input_fn, SEED, model_dir, steps=4)


@pytest.mark.slow
def test_han_trains_like_tensorflow_at_micro_batch_8_and_1(han):
    _, result = han
    assert cs_inprocess.mismatches(result, RTOL) == []
    kernels = result.compiled.program.kernels
    # each document's 4 sentences looked up as its own (4, 6, 16) words
    assert [list(k.output_shape) for k in kernels if k.type == "gather"] == [[4, 6, 16]]
    data = tf_reference.batches(f.documents_input_fn, SEED, 4)
    one = cs_inprocess.run_on_cs(cs_inprocess.at_micro_batch(result.compiled.program, 1),
                                 result.compiled.initial_weights, data)
    assert cs_inprocess.mismatches(cs_inprocess.Comparison(result.compiled, one, result.reference),
                                   RTOL) == []


@pytest.mark.slow
def test_han_evaluates_and_predicts_like_the_cpu(han):
    model_dir, result = han
    assert cs_inprocess.cpu_path_mismatches(f.han, f.documents_input_fn, SEED, model_dir,
                                            result) == []


@pytest.mark.slow
@pytest.mark.parametrize("params", [{"word_rnn": "lstm", "embed_first": True},
                                    {"word_rnn": "simple_rnn"}], ids=["lstm", "simple_rnn"])
def test_han_with_other_word_encoders_trains_like_tensorflow(tmp_path, params):
    result = cs_inprocess.compare(f.han, f.documents_input_fn, {**SEED, **params}, str(tmp_path),
                                  steps=4)
    assert cs_inprocess.mismatches(result, RTOL) == []


@pytest.mark.parametrize("keras", [False, True], ids=["by_hand", "keras_time_distributed"])
def test_an_lstm_per_window_trains_and_predicts_like_tensorflow(tmp_path, keras):
    model_dir, params = str(tmp_path), {**SEED, "keras": keras}
    result = cs_inprocess.compare(f.window_lstm, f.windows_input_fn, params, model_dir, steps=4)
    assert cs_inprocess.mismatches(result, RTOL) == []
    # each series' 3 windows' last states: (3, 6)
    assert [3, 6] in [list(k.output_shape) for k in result.compiled.program.kernels]
    assert cs_inprocess.prediction_mismatch(f.window_lstm, f.windows_input_fn, params, model_dir,
                                            result) == ""


@pytest.mark.slow
def test_han_masked_on_padded_sentences_trains_like_tensorflow(tmp_path):
    """Embedding(mask_zero=True) on sentences of 2 to 6 words: the Bidirectional word GRU
    returning sequences holds its state over the padding and zeroes its outputs there, per
    folded sentence; eval and predict like the CPU path."""
    params = {**SEED, "mask_zero": True, "padded": True}
    result = cs_inprocess.compare(f.han, f.documents_input_fn, params, str(tmp_path), steps=4)
    assert cs_inprocess.mismatches(result, RTOL) == []
    assert cs_inprocess.cpu_path_mismatches(f.han, f.documents_input_fn, params, str(tmp_path),
                                            result) == []


def test_prediction_of_folded_states_is_refused_naming_the_recurrent_layer(tmp_path):
    """A prediction of the word encoder's folded states: the host would read (S, W, 16) per
    sample in place of TF's [B*S, W, 16]."""
    with pytest.raises(CSRunError) as info:
        compile_model(f.han, f.documents_input_fn, {**SEED, "predict_words": True}, str(tmp_path),
                      mode="infer", validate_only=True)
    line = str(info.value)
    assert line.startswith("validation failed: Bidirectional at tests/folded_rnn_models.py:") \
        and "(layer 'word_rnn" in line and "the host reads this value" in line \
        and "\n" not in line, line
