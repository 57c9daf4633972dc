"""Losses holding a gradient (issue 21, tests/second_order_models.py): physics-informed
networks, a WGAN-GP critic's penalty (through Dense layers, and a Conv2D), input-gradient
regularisation of a log_softmax cross-entropy, double backprop,
a Jacobian penalty, Sobolev training and a Hamiltonian network train on the CS as TensorFlow
trains them (4 steps, the second order included: TanhGrad, SigmoidGrad, LeakyReluGrad,
EluGrad and StridedSliceGrad lowered per sample, Conv2DBackpropInput as the transposed
convolution), and evaluate there as the CPU path does; the gradient of a fused softmax
cross-entropy, a gradient to a weight (a sum over the batch) and one in float16 stay refused
in one line naming the op and its line."""
import cs_inprocess
import pytest
import second_order_models as m

from common.errors import CSRunError

PARAMS = {"runconfig": {"tf_random_seed": 2}}
SLOW = {"pinn_heat", "pinn_gelu", "wgan_gp_critic"}  # (pinn_burgers, jacobian_penalty and
# wgan_gp_conv_critic cover their forms in the quick lane)
TRAINED = [pytest.param(name, marks=[pytest.mark.slow] if name in SLOW else [])
           for name in ("pinn_burgers", "pinn_heat", "pinn_gelu", "wgan_gp_critic",
                        "wgan_gp_conv_critic", "input_gradient_log_softmax", "double_backprop",
                        "jacobian_penalty", "sobolev", "hamiltonian")]


@pytest.mark.parametrize("name", TRAINED)
def test_a_loss_holding_a_gradient_trains_like_tensorflow(tmp_path, name):
    model_fn, input_fn = m.CORPUS[name]
    # the critic's interpolation draws: TF's numbers replayed on the CS (compare_drawn)
    result = cs_inprocess.compare_drawn(model_fn, input_fn, PARAMS, str(tmp_path), steps=4)
    cs_inprocess.assert_same_training(result, rtol=1e-5)
    for variable, start in result.compiled.initial_weights.items():
        if "kernel" in variable:  # (the critic's last bias has the gradient 0, in TF too)
            assert (result.cs.state[variable] != start).any(), f"{variable} was not trained"
    if name in ("pinn_burgers", "input_gradient_log_softmax"):
        assert cs_inprocess.evaluation_mismatch(model_fn, input_fn, PARAMS, str(tmp_path),
                                                result) == ""


def test_the_gradient_of_a_fused_cross_entropy_is_refused_naming_it(tmp_path):
    with pytest.raises(CSRunError) as caught:
        cs_inprocess.compile_checked(m.input_gradient_classifier, m.class_input_fn, PARAMS,
                                     str(tmp_path))
    message = caught.value.message
    assert "xentropy_grad" in message and "second_order_models.py:" in message
    assert "fused SparseSoftmaxCrossEntropyWithLogits" in message and "log_softmax" in message


def test_a_gradient_to_a_weight_inside_the_loss_is_refused_naming_it(tmp_path):
    with pytest.raises(CSRunError) as caught:
        cs_inprocess.compile_checked(m.weight_gradient_penalty, m.points_input_fn, PARAMS,
                                     str(tmp_path))
    message = caught.value.message
    assert "MatMul_grad" in message and "second_order_models.py:" in message
    assert "takes a gradient to a weight inside the loss" in message


def test_a_gradient_inside_the_loss_in_float16_is_refused_naming_it(tmp_path):
    with pytest.raises(CSRunError) as caught:
        cs_inprocess.compile_checked(m.sobolev_mixed_float16, m.points_input_fn, PARAMS,
                                     str(tmp_path))
    message = caught.value.message
    assert "TanhGrad 'gradients/" in message and "second_order_models.py:" in message
    assert "TanhGrad in float16" in message
