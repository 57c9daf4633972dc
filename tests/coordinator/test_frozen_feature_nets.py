"""A loss network on a constant style image (Johnson et al.'s style targets): its Conv2D,
BiasAdd, ReLU, MaxPool / AvgPool layers and Gram matrices are values of weights and constants,
which the weight program computes once a step with the samples' conv2d and pooling kernels
(the filter the conv2d kernel's second input). Frozen (trainable=False) or trained with the
transformer (the filters' gradient from the style image's features comes back through the
convolutions on the constant, summed with their uses on the samples), it trains as TF trains
it, evaluates and predicts with the CPU path's numbers, and the weight program's
convolutions are charged in the timing model; a depthwise layer on the constant is refused in
one line naming it."""
from __future__ import annotations

import cs_inprocess
import frozen_feature_models as m
import numpy as np
import pytest

from wafer import timing

BASE = {"batch_size": 4, "runconfig": {"tf_random_seed": 1}}
VGG = ("vgg_c1/kernel", "vgg_c2/kernel", "vgg_c3/kernel", "vgg_c1/bias", "vgg_c2/bias", "vgg_c3/bias")


@pytest.fixture(scope="module")
def frozen(tmp_path_factory):
    return cs_inprocess.compare(m.frozen_vgg_style, m.input_fn, BASE,
                                str(tmp_path_factory.mktemp("frozen")), steps=4)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return cs_inprocess.compare(m.trained_loss_network_style, m.input_fn, BASE,
                                str(tmp_path_factory.mktemp("trained")), steps=4)


def _weight_program_kernels(result) -> dict[str, list]:
    kernels: dict[str, list] = {}
    for k in result.compiled.program.weight_program.kernels:
        kernels.setdefault(k.type, []).append(k)
    return kernels


def test_a_frozen_loss_network_on_a_constant_style_image_trains_like_tensorflow(frozen):
    cs_inprocess.assert_same_training(frozen)
    assert frozen.cs.losses[0] != frozen.cs.losses[-1]
    kernels = _weight_program_kernels(frozen)
    # the style image's three convolutions (each by its filter, the program's second
    # input), two max pools and three Gram matrices
    assert [len(k.inputs) for k in kernels["conv2d"]] == [2, 2, 2]
    assert len(kernels["max_pool"]) == 2 and len(kernels["matmul"]) == 3
    assert len(kernels["sample_constant"]) == 1  # the style image
    for name in VGG:  # frozen: read, never moved
        assert np.array_equal(frozen.cs.state[name], frozen.compiled.initial_weights[name])


def test_the_frozen_loss_network_evaluates_and_predicts_with_the_cpu_paths_numbers(frozen, tmp_path):
    assert cs_inprocess.cpu_path_mismatches(m.frozen_vgg_style, m.input_fn, BASE, str(tmp_path),
                                            frozen) == []


def test_a_loss_network_trained_through_the_style_image_trains_like_tensorflow(trained):
    """TF's gradient of each filter sums its uses on the samples and on the style image (its
    Conv2DBackpropFilter on the constant): the CS takes the Grams' gradient back through the
    weight program's avg pools and convolutions to the same variables."""
    cs_inprocess.assert_same_training(trained)
    kernels = _weight_program_kernels(trained)
    assert len(kernels["conv2d"]) == 3 and len(kernels["avg_pool"]) == 2
    sources = {p.variable for p in trained.compiled.program.weight_program.sources}
    assert set(VGG) <= sources
    for name in VGG:
        assert not np.array_equal(trained.cs.state[name], trained.compiled.initial_weights[name])


def test_the_trained_loss_network_evaluates_and_predicts_with_the_cpu_paths_numbers(trained, tmp_path):
    assert cs_inprocess.cpu_path_mismatches(m.trained_loss_network_style, m.input_fn, BASE,
                                            str(tmp_path), trained) == []


def test_the_weight_programs_convolutions_are_charged_once_a_step(frozen):
    t, steps, fabric = cs_inprocess.weight_program_timing(frozen.compiled.program)
    convs = [s.kernel for s in steps if s.kernel.type_name == "conv2d"]
    # the first: 16 x 16 positions of a 3 x 3 x 3 patch by 8 filters
    assert convs[0].flops_per_sample() == 16 * 16 * 2 * 27 * 8
    fastest = sum(timing.TRAIN_FLOPS_FACTOR * k.flops_per_sample()
                  / (k.max_cores() * fabric.core_flops_per_sec) for k in convs)
    assert t.weight_program_seconds >= fastest > 0
    assert f"weight program {1e6 * t.weight_program_seconds:.3f} us" in frozen.compiled.report_text


def test_a_depthwise_layer_on_the_style_image_is_refused_in_one_line_naming_it(tmp_path):
    line = cs_inprocess.refusal(m.depthwise_style, m.input_fn, BASE, str(tmp_path), m.__file__)
    assert "computes on weights with DepthwiseConv2dNative" in line, line
    assert "which the CS cannot run on weights" in line, line


def test_the_loss_network_in_float16_on_weights_is_refused_in_one_line_naming_its_convolution(tmp_path):
    """Under mixed_float16 TF convolves the style image in float16; the weight program
    computes in float32."""
    line = cs_inprocess.refusal(m.frozen_vgg_style, m.input_fn, {**BASE, "policy": "mixed_float16"},
                                str(tmp_path), m.__file__)
    assert "computes on weights in float16 with Conv2D 'vgg_c1" in line, line
    assert "dtype='float32'" in line, line
