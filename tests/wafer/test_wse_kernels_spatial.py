"""The spatial kernels against TensorFlow's: conv2d with dilations and explicit padding,
conv2d_transpose (Conv2DBackpropInput), depthwise_conv2d (DepthwiseConv2dNative), tile and
resize (bilinear, nearest): forward, input gradient and filter gradient (accumulated over
micro-batches) within float32 rounding, and the refusals of what does not fit."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from coordinator.compiler.lowering_spatial import max_pool3d_ties
from tests.wafer.test_wse_kernels_elementwise import BATCH, RNG, randn, run_kernel
from tests.wafer.test_wse_kernels_structural import check_against_tf
from wafer.kernels import KernelError, build_kernel


@pytest.mark.parametrize("strides, padding, dilations", [
    ((1, 1), "SAME", (2, 2)), ((1, 1), "VALID", (2, 3)), ((2, 1), [1, 0, 2, 1], (1, 1)),
    ((1, 1), [2, 2, 1, 3], (2, 1))])
def test_conv2d_with_dilations_and_explicit_padding_matches_tensorflow(strides, padding, dilations):
    """TF's CPU computes a dilated convolution through SpaceToBatchND (tf.nn.convolution)."""
    x, kernel = randn(BATCH, 9, 8, 3), randn(3, 2, 3, 4)

    def reference(xs, ws):
        if isinstance(padding, str):
            return tf.nn.convolution(xs[0], ws["kernel"], list(strides), padding, dilations=list(dilations))
        padded = tf.pad(xs[0], [[0, 0], padding[:2], padding[2:], [0, 0]])
        return tf.nn.convolution(padded, ws["kernel"], list(strides), "VALID", dilations=list(dilations))

    check_against_tf("conv2d", {"filters": 4, "kernel_size": [3, 2], "strides": list(strides),
                                "padding": padding, "dilations": list(dilations), "use_bias": False},
                     [x], reference, {"kernel": kernel}, rtol=1e-5, grad_rtol=1e-5)


@pytest.mark.parametrize("strides, padding", [((1, 1), "SAME"), ((2, 1), "VALID")])
def test_conv2d_by_each_samples_own_filter_matches_tensorflow(strides, padding):
    """The filter as the kernel's second input (the weight program's convolution by a value
    of weights): each sample's images [2, H, W, C] by its own filter; the filter's gradient
    is that input's (TF's Conv2DBackpropFilter), with no weight of the kernel's."""
    x, kernel = randn(BATCH, 2, 7, 6, 3), randn(BATCH, 3, 2, 3, 4)

    def reference(xs, ws):
        return tf.stack([tf.nn.conv2d(xs[0][s], xs[1][s], list(strides), padding)
                         for s in range(BATCH)])

    built = check_against_tf("conv2d", {"filters": 4, "kernel_size": [3, 2], "strides": list(strides),
                                        "padding": padding, "use_bias": False},
                             [x, kernel], reference, rtol=1e-5, grad_rtol=1e-5)
    assert built.param_shapes() == {}
    with pytest.raises(KernelError, match="filter input must be"):
        build_kernel("conv2d", "k1", {"filters": 4, "kernel_size": [3, 2], "strides": 1,
                                      "padding": "SAME"},
                     [(7, 6, 3), (3, 2, 3, 4)])  # (a bias)


# input (H, W), kernel, strides, padding, output size (Keras' output_padding picks among
# the sizes a conv2d maps back to the input's), dilations (TF's CPU computes none but 1)
TRANSPOSES = [((4, 5), (3, 3), (2, 2), "SAME", (8, 10), (1, 1)),
              ((4, 5), (3, 3), (2, 2), "VALID", (9, 11), (1, 1)),
              ((4, 5), (3, 3), (2, 2), "VALID", (10, 12), (1, 1)),  # output_padding 1
              ((4, 4), (2, 3), (3, 2), "SAME", (11, 8), (1, 1)),  # output_padding (2, 1)
              ((1, 6), (1, 3), (1, 2), "SAME", (1, 12), (1, 1))]  # Conv1DTranspose


@pytest.mark.parametrize("case", range(len(TRANSPOSES)), ids=lambda i: str(TRANSPOSES[i]))
def test_conv2d_transpose_matches_tensorflow(case):
    (h, w), (kh, kw), strides, padding, size, dilations = TRANSPOSES[case]
    x, kernel = randn(BATCH, h, w, 3), randn(kh, kw, 5, 3)
    built = check_against_tf(
        "conv2d_transpose", {"filters": 5, "kernel_size": [kh, kw], "strides": list(strides),
                             "padding": padding, "output_size": list(size),
                             "dilations": list(dilations)},
        [x], lambda xs, ws: tf.nn.conv2d_transpose(xs[0], ws["kernel"], [BATCH, *size, 5],
                                                   [1, *strides, 1], padding,
                                                   dilations=[1, *dilations, 1]),
        {"kernel": kernel}, rtol=1e-5, grad_rtol=1e-5)
    assert built.flops_per_sample() == 2 * h * w * 3 * kh * kw * 5
    assert built.param_shapes() == {"kernel": (kh, kw, 5, 3)}


def test_conv2d_transpose_refuses_an_output_size_a_conv2d_does_not_map_back():
    with pytest.raises(KernelError, match="does not give back the input's"):
        build_kernel("conv2d_transpose", "k1", {"filters": 2, "kernel_size": [3, 3],
                                                "strides": [2, 2], "padding": "SAME",
                                                "output_size": [12, 8]}, [(4, 4, 3)])


@pytest.mark.parametrize("multiplier, strides, padding, dilations", [
    (1, (1, 1), "SAME", (1, 1)), (2, (2, 2), "VALID", (1, 1)), (3, (2, 2), "SAME", (1, 1)),
    (2, (1, 1), "SAME", (2, 2)), (1, (1, 1), [2, 1, 0, 3], (2, 3))])
def test_depthwise_conv2d_matches_tensorflow(multiplier, strides, padding, dilations):
    x, kernel = randn(BATCH, 9, 8, 3), randn(3, 3, 3, multiplier)

    def reference(xs, ws):
        if isinstance(padding, str):
            return tf.nn.depthwise_conv2d(xs[0], ws["kernel"], [1, *strides, 1], padding,
                                          dilations=list(dilations))
        padded = tf.pad(xs[0], [[0, 0], padding[:2], padding[2:], [0, 0]])
        return tf.nn.depthwise_conv2d(padded, ws["kernel"], [1, *strides, 1], "VALID",
                                      dilations=list(dilations))

    built = check_against_tf(
        "depthwise_conv2d", {"depth_multiplier": multiplier, "kernel_size": [3, 3],
                             "strides": list(strides), "padding": padding, "dilations": list(dilations)},
        [x], reference, {"kernel": kernel}, rtol=1e-5, grad_rtol=1e-5)
    assert built.flops_per_sample() == 2 * np.prod(built.output_shape) * 9


@pytest.mark.parametrize("multiples", [(1, 2, 1), (3, 1, 2), (1, 1, 1)])
def test_tile_matches_tensorflow(multiples):
    check_against_tf("tile", {"multiples": list(multiples)}, [randn(BATCH, 3, 2, 4)],
                     lambda xs, ws: tf.tile(xs[0], [1, *multiples]))


@pytest.mark.parametrize("method", ["bilinear", "nearest"])
@pytest.mark.parametrize("size, align_corners, half_pixel", [
    ((8, 10), False, True), ((7, 3), False, True), ((8, 10), True, False), ((9, 6), False, False),
    ((3, 2), False, True), ((9, 9), True, False)])  # (9, 9): sources at halves, TF's roundf
def test_resize_matches_tensorflow(method, size, align_corners, half_pixel):
    op = {"bilinear": tf.raw_ops.ResizeBilinear, "nearest": tf.raw_ops.ResizeNearestNeighbor}[method]
    check_against_tf("resize", {"size": list(size), "method": method, "align_corners": align_corners,
                                "half_pixel_centers": half_pixel},
                     [randn(BATCH, 4, 5, 3)],
                     lambda xs, ws: op(images=xs[0], size=size, align_corners=align_corners,
                                       half_pixel_centers=half_pixel),
                     rtol=2e-6, grad_rtol=1e-5)


@pytest.mark.parametrize("strides, padding", [((1, 1, 1), "SAME"), ((2, 1, 2), "VALID"),
                                              ((2, 2, 1), "SAME")])
def test_conv3d_matches_tensorflow(strides, padding):
    x, kernel = randn(BATCH, 5, 4, 6, 2), randn(3, 2, 3, 2, 4)
    built = check_against_tf(
        "conv3d", {"filters": 4, "kernel_size": [3, 2, 3], "strides": list(strides), "padding": padding},
        [x], lambda xs, ws: tf.nn.conv3d(xs[0], ws["kernel"], [1, *strides, 1], padding),
        {"kernel": kernel}, rtol=1e-5, grad_rtol=1e-5)
    assert built.param_shapes() == {"kernel": (3, 2, 3, 2, 4)}


@pytest.mark.parametrize("kind", ["max_pool3d", "avg_pool3d"])
@pytest.mark.parametrize("pool, strides, padding", [((2, 2, 2), (2, 2, 2), "VALID"),
                                                    ((3, 2, 3), (1, 2, 2), "SAME")])
def test_pooling3d_matches_tensorflow_with_ties(kind, pool, strides, padding):
    """Eagerly TF runs Eigen's MaxPool3DGrad (the "near" ties) on any CPU."""
    x = randn(BATCH, 5, 4, 6, 2)
    attrs = {"pool_size": list(pool), "strides": list(strides), "padding": padding}
    if kind == "max_pool3d":
        x = np.round(x)
        attrs["ties"] = "near"
    op = tf.nn.max_pool3d if kind == "max_pool3d" else tf.nn.avg_pool3d
    check_against_tf(kind, attrs, [x], lambda xs, ws: op(xs[0], pool, strides, padding))


@pytest.mark.parametrize("gap", [0.0, 3e-6, 9e-6, 2e-5])
def test_max_pool3d_gradient_reaches_near_ties_as_tensorflows_cpu_kernel(gap):
    """Eigen's MaxPool3DGrad (eager here) hands a window's gradient to every value within
    1e-5 of its maximum (not only to values equal to it): values `gap` apart take it both
    below 1e-5, only the maximum above."""
    x = randn(BATCH, 2, 2, 4, 1) * 0.1
    x[:, :, :, 1] = x[:, :, :, 0] + np.float32(gap)  # a near-tie in each window along W
    check_against_tf("max_pool3d", {"pool_size": [1, 1, 2], "strides": [1, 1, 1], "padding": "SAME",
                                    "ties": "near"},
                     [x], lambda xs, ws: tf.nn.max_pool3d(xs[0], [1, 1, 2], [1, 1, 1], "SAME"))


@pytest.mark.parametrize("pool, strides, padding", [((1, 1, 2), (1, 1, 1), "SAME"),
                                                    ((2, 2, 2), (2, 2, 2), "VALID"),
                                                    ((3, 2, 3), (1, 2, 2), "SAME")])
def test_max_pool3d_gradient_routes_ties_as_the_hosts_tensorflow_graph(pool, strides, padding):
    """The rule the compiler probes (oneDNN's first maximum under the suite's
    TF_ENABLE_ONEDNN_OPTS=1) routes exact and near ties as tf.gradients in a session."""
    x = np.round(randn(BATCH, 5, 4, 6, 2))
    x[..., 1] += RNG.choice(np.float32([0, 3e-6, 2e-5]), x.shape[:-1])
    graph = tf.Graph()
    with graph.as_default():
        fed = tf.compat.v1.placeholder(tf.float32, x.shape)
        y = tf.nn.max_pool3d(fed, pool, strides, padding)
        dy = randn(*y.shape)
        grad = tf.gradients(y, fed, grad_ys=dy)[0]
    with tf.compat.v1.Session(graph=graph) as session:
        want = session.run(grad, {fed: x})
    attrs = {"pool_size": list(pool), "strides": list(strides), "padding": padding,
             "ties": max_pool3d_ties()}
    _, (got,), _ = run_kernel("max_pool3d", attrs, [x], dy=dy)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_max_pool3d_refuses_an_unknown_tie_rule():
    with pytest.raises(KernelError, match="ties must be one of"):
        build_kernel("max_pool3d", "k1", {"pool_size": [2, 2, 2], "strides": [1, 1, 1],
                                          "padding": "VALID", "ties": "last"}, [(4, 4, 4, 1)])


@pytest.mark.parametrize("pool, strides, padding", [((2, 2), (2, 2), "VALID"), ((3, 2), (1, 2), "SAME")])
def test_avg_pool_grad_is_tensorflows_and_differentiates_as_its_average_pooling(pool, strides, padding):
    """AvgPoolGrad as a value (a gradient penalty through AveragePooling2D), its gradient
    TF's second order (_AvgPoolGradGrad)."""
    image = (5, 6, 3)
    pooled = tf.nn.avg_pool2d(tf.zeros([1, *image]), pool, strides, padding).shape[1:]
    g = randn(BATCH, *pooled)
    check_against_tf(
        "avg_pool_grad", {"pool_size": list(pool), "strides": list(strides), "padding": padding,
                          "input_shape": list(image)}, [g],
        lambda xs, ws: tf.raw_ops.AvgPoolGrad(orig_input_shape=[BATCH, *image], grad=xs[0],
                                              ksize=[1, *pool, 1], strides=[1, *strides, 1],
                                              padding=padding))
