"""The CS's float16 kernels against TensorFlow's float16 CPU ops, bit for bit: the same
float16 inputs and output gradient to TF's op (and its registered gradient) and to the CS's
kernel as the executor runs it (output and received gradient rounded to float16), counting
the values that differ (docs/design.md, "Mixed precision")."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from wafer.kernels import RunContext, build_kernel
from wafer.precision import round_half
from wafer.weight_programs import WeightProgram, WeightStep

N = 4096
_RNG = np.random.default_rng(0)
X = (_RNG.normal(size=(1, N)) * 2).astype(np.float16)
Y = _RNG.normal(size=(1, N)).astype(np.float16)
POSITIVE = (np.abs(X) + np.float16(0.01)).astype(np.float16)
AWAY_FROM_ZERO = (np.abs(Y) + np.float16(0.5)).astype(np.float16)
INSIDE_ONE = np.clip(Y * 0.5, -0.999, 0.999).astype(np.float16)
DY = _RNG.normal(size=(1, N)).astype(np.float16)


def tf_values(function, inputs):
    """TF's float16 output and input gradients (for output gradient DY)."""
    tensors = [tf.constant(i) for i in inputs]
    with tf.GradientTape() as tape:
        tape.watch(tensors)
        out = function(*tensors)
    grads = tape.gradient(out, tensors, output_gradients=tf.constant(DY))
    return [np.asarray(v, np.float32) for v in (out, *grads)]


def cs_values(kind, attrs, inputs):
    """The CS kernel's, with the executor's roundings of a float16 region's output and of
    the gradient its producer receives."""
    kernel = build_kernel(kind, "k", {**attrs, "precision": "float16"}, [i.shape[1:] for i in inputs])
    ctx = RunContext(training=True, batch_size=1)
    out, cache = kernel.forward({}, [i.astype(np.float32) for i in inputs], ctx)
    grads, _ = kernel.backward({}, cache, DY.astype(np.float32), ctx)
    return [round_half(v) for v in (out, *grads)]


@pytest.mark.parametrize("function, tf_function, x", [
    ("erf", tf.math.erf, X), ("erfc", tf.math.erfc, X), ("tanh", tf.math.tanh, X),
    ("sigmoid", tf.math.sigmoid, X),
    ("exp", tf.math.exp, X), ("neg", tf.negative, X), ("square", tf.math.square, X),
    ("relu", tf.nn.relu, X), ("sin", tf.math.sin, X), ("rsqrt", tf.math.rsqrt, POSITIVE), ("sqrt", tf.math.sqrt, POSITIVE),
    ("reciprocal", tf.math.reciprocal, POSITIVE), ("log", tf.math.log, POSITIVE),
    ("tan", tf.math.tan, X), ("atan", tf.math.atan, X), ("asin", tf.math.asin, INSIDE_ONE),
    ("acos", tf.math.acos, INSIDE_ONE),
])
def test_float16_functions_and_their_gradients_are_tensorflows_bit_for_bit(function, tf_function, x):
    want = tf_values(tf_function, [x])
    got = cs_values("activation", {"function": function}, [x])
    for name, a, b in zip(("output", "gradient"), got, want):
        differ = int(np.sum(a.view(np.uint32) != b.view(np.uint32)))
        assert differ == 0, f"{function} {name}: {differ} of {N} values differ from TF's"


@pytest.mark.parametrize("function, tf_function", [
    ("tan", tf.math.tan), ("atan", tf.math.atan), ("asin", tf.math.asin), ("acos", tf.math.acos)])
def test_float16_trigonometric_functions_are_tensorflows_on_every_float16_input(function, tf_function):
    """TF's float16 tan, atan, asin, acos are its float32 ones rounded; the CS's (numpy's
    float32, rounded) differ on at most 2 of every finite float16 input (a float32 ULP
    across a float16 rounding boundary)."""
    x = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    x = x[np.isfinite(x) & ((np.abs(x) <= 1) | (function in ("tan", "atan")))].reshape(1, -1)
    want = np.asarray(tf_function(tf.constant(x)), np.float32)
    kernel = build_kernel("activation", "k", {"function": function, "precision": "float16"}, [x.shape[1:]])
    with np.errstate(all="ignore"):
        got = round_half(kernel.forward({}, [x.astype(np.float32)], RunContext(True, 1))[0])
    assert np.sum((got.view(np.uint32) != want.view(np.uint32)) & ~(np.isnan(got) & np.isnan(want))) <= 2


def test_float16_sigmoid_is_tensorflows_on_every_float16_input():
    """Eigen's float16 logistic rounds exp(x), 1 + e and e / (1 + e) each (the CS's was the
    float32 sigmoid rounded once: 86 % of float16 arguments bit-equal, which moved unseen26's
    se_net's SE gates and flipped a later ReLU); on Eigen's packet path (a long tensor) and
    its scalar path (tensors shorter than a packet)."""
    every = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    every = every[np.isfinite(every)]
    short = every[np.random.default_rng(5).integers(0, every.size, (40, 7))]
    for values in (every[None], *short[:, None]):
        kernel = build_kernel("activation", "k", {"function": "sigmoid", "precision": "float16"},
                              [values.shape[1:]])
        with np.errstate(all="ignore"):
            got = round_half(kernel.forward({}, [values.astype(np.float32)], RunContext(True, 1))[0])
        assert np.array_equal(got, np.asarray(tf.math.sigmoid(tf.constant(values)), np.float32))


@pytest.mark.parametrize("op, tf_function, y", [
    ("add", tf.add, Y), ("sub", tf.subtract, Y), ("mul", tf.multiply, Y),
    ("div", tf.math.divide, AWAY_FROM_ZERO), ("squared_difference", tf.math.squared_difference, Y),
])
def test_float16_binary_ops_and_their_gradients_are_tensorflows_bit_for_bit(op, tf_function, y):
    want = tf_values(tf_function, [X, y])
    got = cs_values("binary", {"op": op, "operands": "ii"}, [X, y])
    for name, a, b in zip(("output", "x gradient", "y gradient"), got, want):
        differ = int(np.sum(a.view(np.uint32) != b.view(np.uint32)))
        assert differ == 0, f"{op} {name}: {differ} of {N} values differ from TF's"


def test_float16_einsum_sums_in_float32_where_tensorflows_sums_in_float16():
    """Keras MultiHeadAttention's query . key product: TF's float16 Einsum on CPU accumulates
    in float16 (Eigen's kernel on Eigen::half, its accumulators laid out by the shape), the
    CS in float32, rounding once: the CS's is the exactly rounded product and TF's is
    farther from it (the one float16 op of this model the CS does not reproduce)."""
    rng = np.random.default_rng(1)
    a = rng.normal(size=(4, 10, 2, 8)).astype(np.float16)
    b = rng.normal(size=(4, 10, 2, 8)).astype(np.float16)
    equation = "BTNH,BSNH->BNTS"
    exact = np.einsum(equation, a.astype(np.float64), b.astype(np.float64))
    kernel = build_kernel("einsum", "e", {"equation": equation, "operands": "ii",
                                          "precision": "float16"}, [a.shape[1:], b.shape[1:]])
    got = round_half(kernel.forward({}, [a.astype(np.float32), b.astype(np.float32)],
                                    RunContext(training=True, batch_size=4))[0])
    assert np.array_equal(got, round_half(exact.astype(np.float32)))
    theirs = np.asarray(tf.einsum(equation, tf.constant(a), tf.constant(b)), np.float64)
    assert np.abs(got - exact).max() < np.abs(theirs - exact).max()


@pytest.mark.parametrize("activation", ["tanh", "sigmoid"])
def test_float16_dense_with_a_fused_activation_takes_tensorflows_gradient(activation):
    """Dense(activation=tanh or sigmoid) under the policy: TanhGrad/SigmoidGrad in float16
    feed the bias gradient (BiasAddGrad: float32 sums, rounded once) and the input gradient."""
    rng = np.random.default_rng(4)
    x = rng.normal(size=(64, 40)).astype(np.float16)
    w = (rng.normal(size=(40, 30)) * 0.3).astype(np.float32)
    b = rng.normal(size=30).astype(np.float32)
    dy = rng.normal(size=(64, 30)).astype(np.float16)
    xt, wt, bt = tf.constant(x), tf.constant(w), tf.constant(b)
    with tf.GradientTape() as tape:
        tape.watch([xt, wt, bt])
        z = tf.nn.bias_add(tf.matmul(xt, tf.cast(wt, tf.float16)), tf.cast(bt, tf.float16))
        y = tf.math.tanh(z) if activation == "tanh" else tf.math.sigmoid(z)
    dx, db = (np.asarray(g, np.float32) for g in tape.gradient(y, [xt, bt], output_gradients=tf.constant(dy)))
    kernel = build_kernel("dense", "d", {"units": 30, "use_bias": True, "activation": activation,
                                         "precision": "float16"}, [(40,)])
    ctx = RunContext(training=True, batch_size=64)
    half = {"kernel": round_half(w), "bias": round_half(b)}
    out, cache = kernel.forward(half, [x.astype(np.float32)], ctx)
    grads_in, grads = kernel.backward(half, cache, dy.astype(np.float32), ctx)
    assert np.mean(round_half(grads["bias"]) == np.asarray(round_half(db))) == 1.0
    assert np.mean(round_half(grads_in[0]) == dx) > 0.99


@pytest.mark.parametrize("size,channels,stride,padding,held,multiplier", [
    (8, 16, 1, "SAME", False, 1), (9, 12, 2, "SAME", False, 1), (7, 24, 1, "VALID", False, 1),
    (9, 12, 2, "SAME", True, 1), (8, 6, 1, "SAME", False, 2), (9, 4, 2, "VALID", False, 3)],
    ids=["same", "stride2", "valid", "constant_stride2", "multiplier2", "multiplier3_stride2_valid"])
def test_float16_depthwise_conv_is_tensorflows_bit_for_bit(size, channels, stride, padding, held,
                                                           multiplier):
    """DepthwiseConv2dNative in float16 and its two gradient ops (Eigen's kernels, one thread,
    as the reference runs them; each multiply-add rounded to float16): the CS's output, input
    gradient and filter gradient, the batch in two micro-batches, are TF's; by a constant
    filter (`held`: a blur-pool's), the output and input gradient; with a depth multiplier,
    whose input gradient TF sums per output channel, then over an input channel's
    multiplier in turn."""
    rng = np.random.default_rng(size)
    x = rng.normal(size=(4, size, size, channels)).astype(np.float16)
    w = (rng.normal(size=(3, 3, channels, multiplier)) * 0.5).astype(np.float16)
    graph = tf.Graph()
    with graph.as_default():
        xs, ws = tf.constant(x), tf.constant(w)
        y = tf.nn.depthwise_conv2d(xs, ws, [1, stride, stride, 1], padding)
        dy = tf.constant((rng.normal(size=y.shape) * 0.1).astype(np.float16))
        grads = tf.gradients(y, [xs, ws], grad_ys=dy)
        config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1,
                                          inter_op_parallelism_threads=1)
        with tf.compat.v1.Session(config=config) as session:
            want_y, want_dx, want_dw, g = session.run([y] + grads + [dy])
    kernel = build_kernel("depthwise_conv2d", "dw", {
        "kernel_size": [3, 3], "strides": [stride, stride], "padding": padding,
        "depth_multiplier": multiplier, "precision": "float16",
        **({"filter": w.astype(np.float32)} if held else {})}, [x.shape[1:]])
    params = {} if held else {"kernel": w.astype(np.float32)}
    accumulated = {} if held else {"kernel": np.full(w.shape, np.nan, np.float32)}
    for half, first in ((slice(0, 2), True), (slice(2, 4), False)):
        ctx = RunContext(training=True, batch_size=4, accumulate=not first)
        out, cache = kernel.forward(params, [x[half].astype(np.float32)], ctx)
        dx, grads = kernel.backward(params, cache, g[half].astype(np.float32), ctx, accumulated)
        assert np.array_equal(out, want_y[half]) and np.array_equal(dx[0], want_dx[half])
    assert grads.keys() == accumulated.keys()
    assert held or np.array_equal(accumulated["kernel"], want_dw)


@pytest.mark.parametrize("size, out, align_corners, half_pixel", [
    (5, 10, False, True), (6, 13, False, True), (7, 4, False, True), (5, 9, True, False),
    (6, 11, False, False)])
def test_float16_nearest_resize_and_its_gradient_are_tensorflows_bit_for_bit(size, out, align_corners,
                                                                             half_pixel):
    """ResizeNearestNeighbor in float16 copies; its gradient (TF's float16 kernel adds the
    output positions into their sources in row-major order, each sum rounded: 61-81 % of an
    upsampling's values bit-equal to the float32 sum rounded once) is TF's."""
    rng = np.random.default_rng(size * out)
    x = rng.normal(size=(4, size, size, 3)).astype(np.float16)
    kwargs = {"align_corners": align_corners, "half_pixel_centers": half_pixel}
    y = tf.raw_ops.ResizeNearestNeighbor(images=tf.constant(x), size=[out, out], **kwargs).numpy()
    dy = rng.normal(size=y.shape).astype(np.float16)
    dx = tf.raw_ops.ResizeNearestNeighborGrad(grads=tf.constant(dy), size=[size, size], **kwargs).numpy()
    kernel = build_kernel("resize", "r", {"size": [out, out], "method": "nearest", "precision": "float16",
                                          **kwargs}, [x.shape[1:]])
    ctx = RunContext(training=True, batch_size=4)
    got, cache = kernel.forward({}, [x.astype(np.float32)], ctx)
    (grad,), _ = kernel.backward({}, cache, dy.astype(np.float32), ctx)
    assert np.array_equal(got, y.astype(np.float32))
    assert np.array_equal(round_half(grad), dx.astype(np.float32))


@pytest.mark.parametrize("pool, stride, padding, frames", [
    (2, 2, "VALID", ()), (3, 2, "SAME", ()), (3, 1, "SAME", ()), (2, 2, "SAME", (3,))])
def test_float16_average_pooling_and_its_gradient_are_tensorflows_bit_for_bit(pool, stride, padding,
                                                                              frames):
    """AvgPool in float16 (TF's float16 kernel rounds each window's sum after every addend,
    and its gradient's shares onto each input after every one: 67 % of a 2x2 pool's outputs
    and 42-58 % of overlapping windows' gradients bit-equal to the float32 sums rounded
    once), on a sample's frames folded into the batch too."""
    rng = np.random.default_rng(pool * stride)
    x = rng.normal(size=(12, 7, 7, 4)).astype(np.float16)
    y = tf.nn.avg_pool2d(tf.constant(x), pool, stride, padding).numpy()
    dy = rng.normal(size=y.shape).astype(np.float16)
    dx = tf.raw_ops.AvgPoolGrad(orig_input_shape=x.shape, grad=tf.constant(dy), ksize=[1, pool, pool, 1],
                                strides=[1, stride, stride, 1], padding=padding).numpy()
    kernel = build_kernel("avg_pool", "p", {"pool_size": [pool, pool], "strides": [stride, stride],
                                            "padding": padding, "precision": "float16"},
                          [(*frames, 7, 7, 4)])
    ctx = RunContext(training=True, batch_size=12 // max(frames, default=1))
    got, cache = kernel.forward({}, [x.astype(np.float32).reshape(-1, *frames, 7, 7, 4)], ctx)
    (grad,), _ = kernel.backward({}, cache, dy.astype(np.float32).reshape(-1, *frames, *y.shape[1:]), ctx)
    assert np.array_equal(got.reshape(y.shape), y.astype(np.float32))
    assert np.array_equal(round_half(grad).reshape(dx.shape), dx.astype(np.float32))


@pytest.mark.parametrize("kind", ["cumsum", "cumprod"])
@pytest.mark.parametrize("exclusive, reverse", [(False, False), (True, False), (False, True), (True, True)])
def test_float16_scans_and_their_gradients_are_tensorflows_bit_for_bit(kind, exclusive, reverse):
    """TF's float16 Cumsum and Cumprod round each partial sum (product) to float16 (40-53 %
    of a 37-long cumsum bit-equal to the float32 sum rounded once); their gradients are
    float16 graphs (_CumprodGrad: cumsum(cumprod(x) * g) the other way, div_no_nan by x, 0
    where x is 0). The CS's, with zeros in x, are TF's bit for bit."""
    rng = np.random.default_rng(37)
    x = (rng.normal(size=(4, 37)) * 0.3 + 1.0).astype(np.float16)
    x[:, 5] = 0
    function = {"cumsum": tf.math.cumsum, "cumprod": tf.math.cumprod}[kind]
    xt = tf.constant(x)
    dy = rng.normal(size=x.shape).astype(np.float16)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        y = function(xt, axis=1, exclusive=exclusive, reverse=reverse)
    dx = tape.gradient(y, xt, output_gradients=tf.constant(dy))
    kernel = build_kernel(kind, "s", {"axis": 0, "exclusive": exclusive, "reverse": reverse,
                                      "precision": "float16"}, [(37,)])
    ctx = RunContext(training=True, batch_size=4)
    out, cache = kernel.forward({}, [x.astype(np.float32)], ctx)
    (grad,), _ = kernel.backward({}, cache, dy.astype(np.float32), ctx)
    assert np.array_equal(round_half(out), y.numpy().astype(np.float32))
    assert np.array_equal(round_half(grad), dx.numpy().astype(np.float32))


def test_a_weight_autocast_to_float16_and_its_gradient_are_tensorflows_bit_for_bit():
    """The weight program's float16 cast of a float32 weight (Keras' AutoCastVariable read),
    a float16 op on it (PReLU's -alpha) and TF's float32 op meeting it (weight -> Cast
    float16 -> Neg -> Cast float32): the value and the weight's gradient for a float32
    output gradient, overflows to infinity included."""
    weight = np.concatenate([_RNG.normal(size=N - 4) * 3, [65519.0, 65520.0, -1e6, 3e-8]])
    weight = weight.astype(np.float32)[None]
    dz = (_RNG.normal(size=(1, N)) * np.logspace(-9, 6, N)).astype(np.float32)
    w = tf.constant(weight)
    with tf.GradientTape() as tape:
        tape.watch(w)
        z = tf.cast(tf.negative(tf.cast(w, tf.float16)), tf.float32)
    want = [np.asarray(v) for v in (z, tape.gradient(z, w, output_gradients=tf.constant(dz)))]
    half = {"precision": "float16"}
    program = WeightProgram(["w"], [
        WeightStep(build_kernel("cast", "c", {"dtype": "float32", **half}, [(N,)]), ("w",)),
        WeightStep(build_kernel("activation", "n", {"function": "neg", **half}, [(N,)]), ("c",))])
    got = [program.forward({"w": weight[0]})["n"], program.backward({"n": dz[0]})["w"]]
    for name, a, b in zip(("value", "gradient"), got, want):
        differ = int(np.sum(a.view(np.uint32) != b[0].view(np.uint32)))
        assert differ == 0, f"{name}: {differ} of {N} values differ from TF's"


@pytest.mark.parametrize("keys", [1, 7, 8, 12, 13, 31, 32, 40, 64, 100, 1000, 1024])
def test_float16_softmax_is_tensorflows_bit_for_bit(keys):
    """Keras MultiHeadAttention's float16 softmax over the keys (a padding mask's -65504 added
    to some): TF's Eigen kernel rounds x - max, exp, each partial sum of its 8-lane packets,
    the inverse and the product; the CS's float16 softmax does the same (it summed in
    float32 and rounded once: 33 % of a 13-key attention's probabilities bit-equal), and its
    gradient as _SoftmaxGrad's float16 ops (g * y, Eigen's Sum, the difference, times y)."""
    rng = np.random.default_rng(keys)
    scores = (rng.normal(size=(6, 3, keys)) * 4).astype(np.float16)
    scores[rng.uniform(size=scores.shape) < 0.2] = np.float16(-65504.0)
    kernel = build_kernel("softmax", "s", {"axis": -1, "precision": "float16"}, [scores.shape[1:]])
    ctx = RunContext(training=True, batch_size=6)
    got, cache = kernel.forward({}, [scores.astype(np.float32)], ctx)
    dy = rng.normal(size=scores.shape).astype(np.float16)
    logits = tf.constant(scores)
    with tf.GradientTape() as tape:
        tape.watch(logits)
        theirs = tf.nn.softmax(logits)
    assert np.array_equal(round_half(got), np.asarray(theirs, np.float32))
    grad = kernel.backward({}, cache, dy.astype(np.float32), ctx)[0][0]
    their_grad = tape.gradient(theirs, logits, output_gradients=tf.constant(dy))
    assert np.array_equal(round_half(grad), np.asarray(their_grad, np.float32))
    middle = build_kernel("softmax", "s", {"axis": 0, "precision": "float16"}, [scores.shape[1:]])
    along = round_half(middle.forward({}, [scores.astype(np.float32)], RunContext(training=False, batch_size=6))[0])
    assert np.array_equal(along, np.asarray(tf.nn.softmax(tf.constant(scores), axis=1), np.float32))
