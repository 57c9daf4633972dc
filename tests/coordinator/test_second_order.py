"""Losses holding a gradient (issue 21, tests/second_order_models.py): physics-informed
networks, a WGAN-GP critic's penalty (through Dense layers, and a Conv2D), input-gradient
regularisation of a fused (sparse and dense, one-hot or another network's soft labels) and
a log_softmax cross-entropy, FGSM adversarial training, double backprop,
a Jacobian penalty, Sobolev training, a Hamiltonian network and a force-matched potential
(distances by tf.newaxis and tf.sqrt) train on the CS as TensorFlow
trains them (4 steps, the second order included: TanhGrad, SigmoidGrad, LeakyReluGrad,
EluGrad, SqrtGrad and StridedSliceGrad (of tf.newaxis slices too) lowered per sample, Conv2DBackpropInput as the transposed
convolution, the fused cross-entropy's backprop with TF's registered gradient), and
evaluate there as the CPU path does; a gradient to a weight (a sum over the batch) and one
in float16 stay refused in one line naming the op and its forward op's line."""
import cs_inprocess
import pytest
import second_order_models as m

from common.errors import CSRunError

PARAMS = {"runconfig": {"tf_random_seed": 2}}
SLOW = {"pinn_heat", "pinn_gelu", "wgan_gp_critic"}  # (pinn_burgers, jacobian_penalty and
# wgan_gp_conv_critic cover their forms in the quick lane)
TRAINED = [pytest.param(name, marks=[pytest.mark.slow] if name in SLOW else [])
           for name in ("pinn_burgers", "pinn_heat", "pinn_gelu", "wgan_gp_critic",
                        "wgan_gp_conv_critic", "r1_pooled_discriminator", "input_gradient_classifier",
                        "input_gradient_dense_xent", "distilled_input_gradient",
                        "input_gradient_log_softmax", "double_backprop",
                        "jacobian_penalty", "sobolev", "force_matching", "hamiltonian")]


@pytest.mark.parametrize("name", TRAINED)
def test_a_loss_holding_a_gradient_trains_like_tensorflow(tmp_path, name):
    model_fn, input_fn = m.CORPUS[name]
    # the critic's interpolation draws: TF's numbers replayed on the CS (compare_drawn)
    result = cs_inprocess.compare_drawn(model_fn, input_fn, PARAMS, str(tmp_path), steps=4)
    cs_inprocess.assert_same_training(result, rtol=1e-5)
    for variable, start in result.compiled.initial_weights.items():
        if "kernel" in variable:  # (the critic's last bias has the gradient 0, in TF too)
            assert (result.cs.state[variable] != start).any(), f"{variable} was not trained"
    if name in ("pinn_burgers", "input_gradient_log_softmax", "input_gradient_classifier", "r1_pooled_discriminator",
                "input_gradient_dense_xent", "force_matching"):
        assert cs_inprocess.evaluation_mismatch(model_fn, input_fn, PARAMS, str(tmp_path),
                                                result) == ""


@pytest.mark.parametrize("stop_gradient", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_fgsm_adversarial_training_trains_evaluates_and_predicts_like_tensorflow(
        tmp_path, stop_gradient):
    """The fused cross-entropy's backprop output (softmax - one_hot) computed per sample;
    without tf.stop_gradient TF differentiates Sign (zeros) back through it."""
    params = {**PARAMS, "stop_gradient": stop_gradient}
    result = cs_inprocess.compare(m.fgsm_adversarial, m.class_input_fn, params, str(tmp_path),
                                  steps=4)
    cs_inprocess.assert_same_training(result, rtol=1e-5)
    assert "softmax_cross_entropy_backprop" in {k.type for k in result.compiled.program.kernels}
    for check in (cs_inprocess.evaluation_mismatch, cs_inprocess.prediction_mismatch):
        assert check(m.fgsm_adversarial, m.class_input_fn, params, str(tmp_path), result) == ""


def test_the_gradient_of_a_per_token_fused_cross_entropy_is_refused_naming_it(tmp_path):
    with pytest.raises(CSRunError) as caught:
        cs_inprocess.compile_checked(m.tagger_input_gradient, m.token_input_fn, PARAMS,
                                     str(tmp_path))
    message = caught.value.message
    assert "xentropy_grad" in message and "second_order_models.py:" in message
    assert "fused SparseSoftmaxCrossEntropyWithLogits" in message and "rank > 2" in message
    assert "log_softmax" in message


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
    assert "'gradients/" in message and "second_order_models.py:" in message
    assert "in float16: the CS computes a gradient inside the loss in float32" in message


def test_fgsm_in_mixed_float16_is_refused_naming_the_gradient_op(tmp_path):
    with pytest.raises(CSRunError) as caught:
        cs_inprocess.compile_checked(m.fgsm_mixed_float16, m.class_input_fn, PARAMS,
                                     str(tmp_path))
    message = caught.value.message
    assert "'gradients/sparse_softmax_cross_entropy_loss/" in message
    assert "second_order_models.py:" in message
    assert "in float16: the CS computes a gradient inside the loss in float32" in message


def test_a_force_matched_potential_predicts_like_the_cpu_path(tmp_path):
    model_fn, input_fn = m.CORPUS["force_matching"]
    result = cs_inprocess.compare(model_fn, input_fn, PARAMS, str(tmp_path), steps=4)
    assert {"activation_grad", "pad"} <= {k.type for k in result.compiled.program.kernels}
    assert cs_inprocess.prediction_mismatch(model_fn, input_fn, PARAMS, str(tmp_path),
                                            result) == ""


def test_the_gradient_of_a_strided_slice_is_refused_at_the_slices_line(tmp_path):
    with pytest.raises(CSRunError) as caught:
        cs_inprocess.compile_checked(m.strided_force_matching, m.atoms_input_fn, PARAMS,
                                     str(tmp_path))
    message = caught.value.message
    line = next(n for n, text in enumerate(open(m.__file__), 1) if "features[:, ::2]" in text)
    assert message.startswith("validation failed: StridedSliceGrad "
                              "'gradients/strided_slice_grad/StridedSliceGrad'"
                              f" at tests/second_order_models.py:{line}: ")  # (not tf.gradients')
    assert "of a strided slice" in message and "\n" not in message
