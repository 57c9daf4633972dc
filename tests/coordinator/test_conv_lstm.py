"""Keras ConvLSTM2D (issue 21): a next-frame model, ConvLSTM2D then a 1x1 sigmoid Conv2D
with log loss and Adam, trains on the CS as TensorFlow trains it (4 steps, rtol 1e-4) and
evaluates there with the CPU path's metrics, returning its last state or every step's; so do
dilated ConvLSTM2D, ConvLSTM1D and ConvLSTM3D. Their gates' convolutions read tf.split views
of the layer's two kernels, and the first step's recurrent convolutions of the zero initial
state are zeros."""
import conv_lstm_models as m
import cs_inprocess
import pytest

PARAMS = {"runconfig": {"tf_random_seed": 4}}
CASES = {
    "last_state": (m.next_frame, {}, 4 * (4 + 3)),  # 4 gates x (4 input + 3 state convolutions)
    "return_sequences": (m.next_frame, {"return_sequences": True}, 4 * (4 + 3)),
    "dilated": (m.dilated_next_frame, {}, 4 * (4 + 3)),
    "conv_lstm_1d": (m.next_frame_1d, {}, 4 * (4 + 3)),
    "conv_lstm_3d": (m.next_frame_3d, {}, 4 * (4 + 3)),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", CASES)
def test_conv_lstm_trains_like_tensorflow_and_evaluates_like_the_cpu(tmp_path, name):
    model_fn, extra, convolutions = CASES[name]
    params = {**PARAMS, **extra}
    result = cs_inprocess.compare(model_fn, m.clip_input_fn, params, str(tmp_path), steps=4)
    cs_inprocess.assert_same_training(result)
    assert len(result.cs.losses) == 4 and result.cs.losses[0] != result.cs.losses[-1]
    for variable, start in result.compiled.initial_weights.items():
        if variable != "global_step":
            assert (result.cs.state[variable] != start).any(), f"{variable} was not trained"
    gates = [p for k in result.compiled.program.kernels for p in k.params
             if p.variable.startswith("conv_lstm") and p.role == "kernel"]
    assert len(gates) == convolutions and all(p.view is not None for p in gates)
    assert cs_inprocess.evaluation_mismatch(model_fn, m.clip_input_fn, params,
                                            str(tmp_path), result) == ""
