"""Issue 21's breadth sweep: layers and ops users train with that the CS refused or computed
differently, now trained with TF's numbers and evaluated and predicted like the CPU path."""
import breadth_models as bm
import cs_inprocess
import numpy as np
import pytest
import tensorflow as tf

from coordinator.compiler.lowering_spatial import patch_positions
from cs_api.attrs import from_attr
from wafer.kernels import RunContext, build_kernel

PARAMS = {"runconfig": {"tf_random_seed": 1}}


def _trains_evaluates_and_predicts(model_fn, input_fn, model_dir, rtol=1e-4, twin=False, params=PARAMS):
    """`twin`: a mixed_float16 model (params["policy"]), judged by the mixed rule."""
    result = cs_inprocess.compare(model_fn, input_fn, params, model_dir, steps=4)
    problems = cs_inprocess.mixed_training_problems(model_fn, input_fn, params, result, 4) if twin \
        else cs_inprocess.mismatches(result, rtol)
    assert not problems, problems
    for check in (cs_inprocess.evaluation_mismatch, cs_inprocess.prediction_mismatch):
        problem = check(model_fn, input_fn, params, model_dir, result, rtol=rtol)
        assert not problem, problem
    return result


def test_float16_tile_gradient_is_the_float32_sum_of_the_copies_rounded_once():
    """TF's float16 TileGrad sums in float16 (70 % of a 2x2 upsampling's gradient bit-equal
    to the float32 sum rounded once, measured); the CS sums in float32, rounded once by the
    executor: TF's float16 partial sums put it up to 2 float16 ULPs of the copies' absolute
    sum from that."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 4, 4, 3)).astype(np.float16)
    dy = rng.normal(size=(8, 8, 8, 3)).astype(np.float16)
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        y = tf.tile(xt, [1, 2, 2, 1])
    expected = tape.gradient(y, xt, output_gradients=tf.constant(dy)).numpy()
    kernel = build_kernel("tile", "t", {"multiples": [2, 2, 1], "precision": "float16"}, [(4, 4, 3)])
    out, cache = kernel.forward({}, [x.astype(np.float32)], RunContext(True, 8))
    assert np.array_equal(out, y.numpy().astype(np.float32))
    (grad,), _ = kernel.backward({}, cache, dy.astype(np.float32), RunContext(True, 8))
    assert np.array_equal(grad.astype(np.float16), dy.astype(np.float32).reshape(
        8, 2, 4, 2, 4, 3).sum(axis=(1, 3)).astype(np.float16))
    ulp = np.spacing(np.abs(dy).astype(np.float32).reshape(8, 2, 4, 2, 4, 3).sum(
        axis=(1, 3)).astype(np.float16)).astype(np.float32)
    apart = np.abs(grad.astype(np.float16).astype(np.float32) - expected.astype(np.float32))
    assert np.all(apart <= 2 * ulp) and np.mean(apart == 0) > 0.6


def test_mixed_float16_upsampling_and_tile_train_like_tensorflow(tmp_path):
    """UpSampling2D and tf.tile under mixed_float16 were refused ('Tile in float16 ... not
    proven'); the tile is a copy, its gradient float16 noise from TF's (rtol 1e-2, as every
    mixed-precision comparison)."""
    result = _trains_evaluates_and_predicts(bm.upsampling_mixed, bm.image_input_fn,
                                            str(tmp_path), rtol=1e-2)
    tiles = [from_attr(k.attrs["precision"]) for k in result.compiled.program.kernels
             if k.type == "tile"]  # UpSampling2D's repeat of each axis, the tf.tile
    assert tiles == ["float16"] * 3


def test_float16_transposed_convolution_is_the_float32_sum_rounded_once():
    """TF's float16 Conv2DBackpropInput (Eigen, oneDNN off) accumulates in float16: 42 % of
    a 3x3 stride-2 transposed convolution's outputs bit-equal to the float64 result rounded
    (measured); the CS's float32 sum rounded once is that result (as TF's float16 Conv2D
    forward, dilated or not: 99.9 %)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 4, 4, 6)).astype(np.float16)
    w = (rng.normal(size=(3, 3, 5, 6)) * 0.3).astype(np.float16)
    exact = tf.nn.conv2d_transpose(tf.constant(x, tf.float64), tf.constant(w, tf.float64),
                                   [8, 8, 8, 5], 2, "SAME").numpy()
    half = tf.nn.conv2d_transpose(tf.constant(x), tf.constant(w), [8, 8, 8, 5], 2, "SAME").numpy()
    kernel = build_kernel("conv2d_transpose", "t", {
        "filters": 5, "kernel_size": [3, 3], "strides": [2, 2], "padding": "SAME",
        "output_size": [8, 8], "precision": "float16"}, [(4, 4, 6)])
    out, _ = kernel.forward({"kernel": w.astype(np.float32)}, [x.astype(np.float32)],
                            RunContext(True, 8))
    assert np.mean(out.astype(np.float16) == exact.astype(np.float16)) > 0.999
    assert np.mean(half == exact.astype(np.float16)) < 0.6  # TF's own float16 rounding


def test_mixed_float16_transposed_and_dilated_convolutions_train_like_tensorflow(tmp_path):
    """Conv2DTranspose, Conv1DTranspose and dilated Conv2D/Conv1D under mixed_float16 were
    refused ('not proven against TF's float16 kernel'); now float16 kernels, within TF
    mixed's float16 noise (rtol 1e-2)."""
    result = _trains_evaluates_and_predicts(bm.transposed_and_dilated_mixed, bm.image_input_fn,
                                            str(tmp_path), rtol=1e-2)
    kinds = {k.type for k in result.compiled.program.kernels
             if "precision" in k.attrs and from_attr(k.attrs["precision"]) == "float16"}
    assert {"conv2d_transpose", "conv2d"} <= kinds


@pytest.mark.parametrize("mixed", [False, True], ids=["float32", "mixed_float16"])
def test_depth_to_space_and_space_to_depth_train_like_tensorflow(tmp_path, mixed):
    """tf.nn.depth_to_space and space_to_depth were refused ('no CS kernel'): each is a
    reshape, a transpose and a reshape of the sample, in float16 too. Mixed: the losses
    within 1e-2 and the predictions from one checkpoint TF's; the slots not (TF's Eigen
    float16 Conv2DBackpropFilter sums in float16: one Adam element of the first conv 2x
    TF's, docs/design.md's 'Float16 convolution gradients')."""
    params = {**PARAMS, "mixed": mixed}
    result = cs_inprocess.compare(bm.pixel_shuffle, bm.image_input_fn, params, str(tmp_path), steps=4)
    assert [k.type for k in result.compiled.program.kernels].count("transpose") == 2
    if mixed:
        np.testing.assert_allclose(result.cs.losses, result.reference.losses, rtol=1e-2)
    else:
        cs_inprocess.assert_same_training(result)
    rtol = 1e-2 if mixed else 1e-4
    for check in (cs_inprocess.evaluation_mismatch, cs_inprocess.prediction_mismatch):
        problem = check(bm.pixel_shuffle, bm.image_input_fn, params, str(tmp_path), result, rtol=rtol)
        assert not problem, problem


def test_extract_patches_train_like_tensorflow(tmp_path):
    """tf.image.extract_patches (ViT's patches) was refused ('no CS kernel'): pad, take, and
    reshape of the sample; overlapping dilated SAME patches too."""
    result = _trains_evaluates_and_predicts(bm.vit_patches, bm.image_input_fn, str(tmp_path))
    assert [k.type for k in result.compiled.program.kernels].count("take") == 2


@pytest.mark.parametrize("h, w, k, stride, rate, padding", [
    (8, 7, 3, 2, 1, "SAME"), (9, 8, 3, 1, 2, "SAME"), (8, 8, 3, 3, 1, "SAME"), (7, 7, 2, 3, 2, "VALID")])
def test_patch_positions_are_tensorflows(h, w, k, stride, rate, padding):
    """The rows and columns the lowering takes, padded as it pads, are TF's patches."""
    x = np.random.default_rng(0).normal(size=(2, h, w, 3)).astype(np.float32)
    expected = tf.image.extract_patches(x, [1, k, k, 1], [1, stride, stride, 1], [1, rate, rate, 1],
                                        padding).numpy()
    (rows, top), (cols, left) = (patch_positions(n, k, stride, rate, padding) for n in (h, w))
    padded = np.pad(x, [(0, 0), (top, max(max(rows) + 1, h + top) - h - top),
                        (left, max(max(cols) + 1, w + left) - w - left), (0, 0)])
    taken = padded[:, np.asarray(rows)][:, :, np.asarray(cols)]  # [2, oh·k, ow·k, 3]
    oh, ow = len(rows) // k, len(cols) // k
    patches = taken.reshape(2, oh, k, ow, k, 3).transpose(0, 1, 3, 2, 4, 5).reshape(expected.shape)
    assert np.array_equal(patches, expected)


def test_grouped_conv1d_trains_like_tensorflow(tmp_path):
    """Keras Conv1D(groups=) was refused ('no CS kernel computes StatefulPartitionedCall':
    Keras runs grouped convolutions as an XLA function): now a reshape, a grouped conv2d
    kernel and a reshape, as Conv2D(groups=)."""
    result = _trains_evaluates_and_predicts(bm.grouped_conv1d, bm.sequence_input_fn, str(tmp_path))
    groups = [from_attr(k.attrs["groups"]) for k in result.compiled.program.kernels
              if k.type == "conv2d"]
    assert groups == [2, 4]


def test_float16_grouped_convolution_is_tensorflows_float32_result_rounded_once():
    """TF runs Keras' Conv2D(groups=) as an XLA function whose float16 convolution and its
    two gradients are the float32 ones rounded once (100 % bit-equal at scales 0.1-30, oneDNN
    on or off, measured); the CS's float16 grouped conv2d (float32 GEMMs, rounded once) too."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 7, 7, 8)).astype(np.float16)
    w = (rng.normal(size=(3, 3, 2, 12)) * 0.3).astype(np.float16)
    layer = tf.keras.layers.Conv2D(12, 3, strides=2, groups=4, padding="same", use_bias=False,
                                   dtype="float16")
    layer.build((None, 7, 7, 8))
    layer.kernel.assign(w)
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        y = layer(xt)
    dy = rng.normal(size=y.shape).astype(np.float16)
    dx, dw = tape.gradient(y, [xt, layer.kernel], output_gradients=tf.constant(dy))
    kernel = build_kernel("conv2d", "g", {
        "filters": 12, "kernel_size": [3, 3], "strides": [2, 2], "padding": "SAME", "groups": 4,
        "use_bias": False, "activation": "linear", "precision": "float16"}, [(7, 7, 8)])
    params, ctx = {"kernel": w.astype(np.float32)}, RunContext(True, 8)
    out, cache = kernel.forward(params, [x.astype(np.float32)], ctx)
    (grad,), grads = kernel.backward(params, cache, dy.astype(np.float32), ctx)
    for name, got, want in (("output", out, y), ("input gradient", grad, dx),
                            ("filter gradient", grads["kernel"], dw)):
        same = np.mean(got.astype(np.float16) == np.asarray(want, np.float16))
        assert same > 0.99, f"{name}: {same:.4f} bit-equal to TF's"


@pytest.mark.slow  # (compiling the XLA functions' float16 graph: 7 s)
def test_mixed_float16_grouped_convolutions_train_like_tensorflow(tmp_path):
    """Conv2D(groups=) and Conv1D(groups=) under mixed_float16 were refused ('a grouped
    convolution (groups > 1) in float16 ... not proven'); now float16 grouped conv2d
    kernels, within TF mixed's float16 noise (rtol 1e-2)."""
    result = _trains_evaluates_and_predicts(bm.grouped_conv_mixed, bm.image_input_fn,
                                            str(tmp_path), rtol=1e-2)
    grouped = [(from_attr(k.attrs["groups"]), from_attr(k.attrs["precision"]))
               for k in result.compiled.program.kernels if k.type == "conv2d" and "groups" in k.attrs]
    assert grouped == [(3, "float16"), (2, "float16")]


@pytest.mark.slow
def test_mixed_float16_upsampling_decoder_trains_like_tensorflow(tmp_path):
    """Resize under mixed_float16 was refused ('ResizeNearestNeighbor in float16 ... not
    proven'): bilinear reads float16 and outputs float32 as TF's does, nearest copies in
    float16 and sums its gradient as TF's float16 kernel; by the mixed rule (Eigen's float16
    conv filter gradients put 2 of 360 Adam elements past 1e-2)."""
    result = _trains_evaluates_and_predicts(bm.upsampling_decoder_mixed, bm.image_input_fn,
                                            str(tmp_path), rtol=1e-2, twin=True)
    resizes = [(from_attr(k.attrs["method"]),
                from_attr(k.attrs["precision"]) if "precision" in k.attrs else "float32")
               for k in result.compiled.program.kernels if k.type == "resize"]
    assert resizes == [("bilinear", "float32"), ("nearest", "float16"), ("nearest", "float16")]


def test_mixed_float16_trigonometric_functions_train_like_tensorflow(tmp_path):
    """tan, atan, asin and acos in float16 were refused ('not proven against TF's float16
    kernel'); now float16 activations with TF's rounded gradient ops (test_half_parity)."""
    result = _trains_evaluates_and_predicts(bm.angles_mixed, bm.image_input_fn, str(tmp_path), rtol=1e-2)
    functions = {from_attr(k.attrs["function"]) for k in result.compiled.program.kernels
                 if k.type == "activation" and "precision" in k.attrs
                 and from_attr(k.attrs["precision"]) == "float16"}
    assert {"atan", "tan", "asin", "acos"} <= functions


def test_a_float16_function_without_tensorflows_float16_rounding_is_refused_in_one_line(tmp_path):
    message = cs_inprocess.refusal(bm.angles_mixed, bm.image_input_fn, {**PARAMS, "function": "lgamma"},
                                   str(tmp_path), bm.__file__)
    assert "Lgamma" in message and "in float16 (mixed precision) is not proven" in message, message


def test_category_encoding_trains_like_tensorflow(tmp_path):
    """Keras CategoryEncoding (multi_hot, count) was refused as combining samples: its
    bincount's size reads the batch's largest id, but Keras clamps it to num_tokens; each
    row's encoding is its own (a one_hot and a sum or max)."""
    result = _trains_evaluates_and_predicts(bm.category_encoding, bm.ids_input_fn, str(tmp_path))
    reductions = [from_attr(k.attrs["op"]) for k in result.compiled.program.kernels
                  if k.type == "reduce"]
    assert sorted(reductions) == ["max", "sum"]


def test_a_bincount_sized_by_the_batch_is_refused_in_one_line(tmp_path):
    message = cs_inprocess.refusal(bm.category_encoding, bm.ids_input_fn,
                                   {**PARAMS, "unbounded": True}, str(tmp_path), bm.__file__)
    assert "minlength = maxlength" in message, message


@pytest.mark.parametrize("radius, bias, alpha, beta", [
    (5, 1.0, 1.0, 0.5), (4, 1.0, 0.001 / 9.0, 0.75), (1, 1.0, 0.1, 1.0)])
def test_lrn_kernel_computes_tensorflows_lrn_and_lrn_grad(radius, bias, alpha, beta):
    """The lrn kernel against TF's LRN and LRNGrad (beta 0.5: rsqrt, 1: inverse, else
    exp(-beta log)): within 5e-7 of the largest value (measured 1e-7 to 2e-7)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 3, 3, 12)).astype(np.float32)
    dy = rng.normal(size=x.shape).astype(np.float32)
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        y = tf.nn.lrn(xt, radius, bias, alpha, beta)
    dx = tape.gradient(y, xt, output_gradients=tf.constant(dy)).numpy()
    kernel = build_kernel("lrn", "n", {"depth_radius": radius, "bias": bias, "alpha": alpha,
                                       "beta": beta}, [(3, 3, 12)])
    out, cache = kernel.forward({}, [x], RunContext(True, 4))
    (grad,), _ = kernel.backward({}, cache, dy, RunContext(True, 4))
    np.testing.assert_allclose(out, y.numpy(), rtol=0, atol=5e-7 * np.abs(y.numpy()).max())
    np.testing.assert_allclose(grad, dx, rtol=0, atol=5e-7 * np.abs(dx).max())


def test_cifar10_tutorial_with_lrn_trains_like_tensorflow(tmp_path):
    """tf.nn.lrn was refused ('no CS kernel computes this op (LRN)')."""
    result = _trains_evaluates_and_predicts(bm.cifar10_tutorial, bm.image_input_fn, str(tmp_path))
    assert [k.type for k in result.compiled.program.kernels].count("lrn") == 2


def test_random_rotation_is_refused_saying_to_augment_in_input_fn(tmp_path):
    message = cs_inprocess.refusal(bm.rotation_augmented, bm.image_input_fn, PARAMS, str(tmp_path),
                                   bm.__file__)
    assert "RandomRotation at " in message and "augment in input_fn" in message


def test_a_bias_under_a_standard_deviation_keeps_its_exact_zero_gradient(tmp_path):
    """The sweep's tf.math.reduce_std model validated, then its Dense bias (gradient 0:
    x − mean(x) cancels it) trained to rounding noise under Adam (CS 1e-4, TF -3e-4)."""
    result = _trains_evaluates_and_predicts(bm.std_pooling, bm.sequence_input_fn, str(tmp_path))
    assert cs_inprocess.zero_gradient_variables(result.compiled) == {"frames/bias"}


@pytest.mark.parametrize("exclusive, reverse", [(False, False), (True, False), (False, True),
                                                (True, True)])
def test_cumprod_kernel_computes_tensorflows_cumprod_and_gradient(exclusive, reverse):
    rng = np.random.default_rng(0)
    x = rng.uniform(0.5, 1.5, size=(4, 6, 3)).astype(np.float32)
    dy = rng.normal(size=x.shape).astype(np.float32)
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        y = tf.math.cumprod(xt, axis=1, exclusive=exclusive, reverse=reverse)
    dx = tape.gradient(y, xt, output_gradients=tf.constant(dy)).numpy()
    kernel = build_kernel("cumprod", "c", {"axis": 0, "exclusive": exclusive, "reverse": reverse},
                          [(6, 3)])
    out, cache = kernel.forward({}, [x], RunContext(True, 4))
    (grad,), _ = kernel.backward({}, cache, dy, RunContext(True, 4))
    np.testing.assert_array_equal(out, y.numpy())
    np.testing.assert_allclose(grad, dx, rtol=1e-6, atol=1e-6 * np.abs(dx).max())


@pytest.mark.parametrize("mixed", [False, True], ids=["float32", "mixed_float16"])
def test_stick_breaking_cumprod_trains_like_tensorflow(tmp_path, mixed):
    """tf.math.cumprod was refused ('no CS kernel computes this op (Cumprod)'), in float16
    too ('not proven'); in float16 it scans as TF's float16 kernel (test_half_parity)."""
    result = _trains_evaluates_and_predicts(bm.stick_breaking, bm.sequence_input_fn, str(tmp_path),
                                            rtol=1e-2 if mixed else 1e-4, params={**PARAMS, "mixed": mixed})
    scans = [k for k in result.compiled.program.kernels if k.type == "cumprod"]
    assert [from_attr(k.attrs["precision"]) if "precision" in k.attrs else "float32" for k in scans] == \
        ["float16" if mixed else "float32"] * 2
