"""Keras ConvLSTM2D (issue 21): a next-frame model, ConvLSTM2D then a 1x1 sigmoid Conv2D
with log loss and Adam, trains on the CS as TensorFlow trains it (4 steps, rtol 1e-4) and
evaluates there with the CPU path's metrics, returning its last state or every step's. Its
gates' convolutions read tf.split views of the layer's two kernels (conv2d kernels reading a
view), and the first step's recurrent convolutions of the zero initial state are zeros."""
import conv_lstm_models as m
import cs_inprocess
import pytest

PARAMS = {"runconfig": {"tf_random_seed": 4}}


@pytest.mark.slow
@pytest.mark.parametrize("sequences", [False, True], ids=["last_state", "return_sequences"])
def test_conv_lstm_trains_like_tensorflow_and_evaluates_like_the_cpu(tmp_path, sequences):
    params = {**PARAMS, "return_sequences": sequences}
    result = cs_inprocess.compare(m.next_frame, m.clip_input_fn, params, str(tmp_path), steps=4)
    cs_inprocess.assert_same_training(result)
    assert len(result.cs.losses) == 4 and result.cs.losses[0] != result.cs.losses[-1]
    for variable, start in result.compiled.initial_weights.items():
        if variable != "global_step":
            assert (result.cs.state[variable] != start).any(), f"{variable} was not trained"
    gates = [p for k in result.compiled.program.kernels if k.type == "conv2d" for p in k.params
             if p.variable.startswith("conv_lstm2d/")]
    # 4 gates x (the input's convolution at each of 4 steps + the state's at steps 2 to 4)
    assert len(gates) == 4 * (4 + 3) and all(p.view is not None for p in gates)
    assert cs_inprocess.evaluation_mismatch(m.next_frame, m.clip_input_fn, params,
                                            str(tmp_path), result) == ""
