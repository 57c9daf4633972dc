"""The element-wise kernels against TensorFlow: every function and op's forward and
gradients (tf.GradientTape on the same float32 values), broadcasting against constants and
weights, ties, dtypes, and the refusals of what a kernel cannot do."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cs_api import cs_api_pb2 as pb
from cs_api.attrs import from_attr, to_attr
from cs_api.tensors import dtype_code
from wafer.kernels import KernelError, RunContext, build_kernel
from wafer.kernels.activations import FUNCTIONS, erf, erfc
from wafer.kernels.elementwise import where
from wafer.optimizers import make_optimizer
from wse_sim.errors import CSError
from wse_sim.pipeline import Pipeline
from wse_sim.program import check_program

RNG = np.random.default_rng(20261123)
BATCH, MICRO = 6, 3


def close(actual, expected, rtol=1e-6, scale=None):
    """Equal to float32 rounding: relative per element, absolute against the array's scale
    (or `scale`, e.g. a sum's summands, whose order may differ)."""
    assert actual is not None
    expected = np.asarray(expected)
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    if scale is None:
        scale = float(np.max(np.abs(expected), initial=0.0))
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * scale + 1e-30)


def run_kernel(kernel_type, attrs, inputs, params=None, dy=None, seed_grad=True):
    """Forward and backward in micro-batches of MICRO (weight gradients accumulated):
    (output, input gradients, weight gradients)."""
    kernel = build_kernel(kernel_type, "k1", attrs, [a.shape[1:] for a in inputs])
    params = params or {}
    acc = {role: np.full(v.shape, np.nan, np.float32) for role, v in params.items()}
    outs, grads = [], [[] for _ in inputs]
    for i, start in enumerate(range(0, BATCH, MICRO)):
        ctx = RunContext(training=True, batch_size=BATCH)
        y, cache = kernel.forward(params, [a[start:start + MICRO] for a in inputs], ctx)
        outs.append(y)
        if dy is None and not kernel.is_loss:
            continue
        ctx.accumulate = i > 0
        g = None if kernel.is_loss else dy[start:start + MICRO]
        gin, _ = kernel.backward(params, cache, g, ctx, acc or None)
        for j, gj in enumerate(gin):
            grads[j].append(gj)
    in_grads = [None if not g or g[0] is None else np.concatenate(g) for g in grads]
    return np.concatenate(outs), in_grads, acc


def tf_grads(fn, inputs, params, dy):
    """TF's output and gradients of sum(dy * fn(inputs, weights)) w.r.t. inputs and weights."""
    xs = [tf.constant(a) for a in inputs]
    ws = {role: tf.Variable(v) for role, v in params.items()}
    with tf.GradientTape(persistent=True) as tape:
        for x in xs:
            if x.dtype.is_floating:
                tape.watch(x)
        y = fn(xs, ws)
    out = y.numpy()
    if dy is None:
        return out, [], {}
    gx = [tape.gradient(y, x, output_gradients=dy) if x.dtype.is_floating else None for x in xs]
    gw = {role: tape.gradient(y, w, output_gradients=dy) for role, w in ws.items()}
    return (out, [None if g is None else g.numpy() for g in gx],
            {role: g.numpy() for role, g in gw.items()})


def randn(*shape, low=None, high=None):
    if low is not None:
        return RNG.uniform(low, high, shape).astype(np.float32)
    return RNG.standard_normal(shape).astype(np.float32)


# ---- activation functions ----
# function -> (TF op, input range)
ACTIVATIONS = {
    "neg": (tf.negative, None), "abs": (tf.abs, None), "square": (tf.square, None),
    "sqrt": (tf.sqrt, (0.05, 4)), "rsqrt": (tf.math.rsqrt, (0.05, 4)), "exp": (tf.exp, None),
    "expm1": (tf.math.expm1, None), "log": (tf.math.log, (0.05, 4)),
    "log1p": (tf.math.log1p, (-0.9, 4)), "reciprocal": (tf.math.reciprocal, (0.2, 3)),
    "erf": (tf.math.erf, (-5, 5)), "erfc": (tf.math.erfc, (-5, 5)), "sin": (tf.sin, (-6, 6)), "cos": (tf.cos, (-6, 6)),
    "sign": (tf.sign, None), "softsign": (tf.nn.softsign, None), "identity": (tf.identity, None),
    "tan": (tf.math.tan, (-1.3, 1.3)), "asin": (tf.math.asin, (-0.95, 0.95)),
    "acos": (tf.math.acos, (-0.95, 0.95)), "atan": (tf.math.atan, None),
}


@pytest.mark.parametrize("function", sorted(ACTIVATIONS))
def test_activation_function_matches_tensorflow(function):
    op, bounds = ACTIVATIONS[function]
    x = randn(BATCH, 5, 7) * 2 if bounds is None else randn(BATCH, 5, 7, low=bounds[0], high=bounds[1])
    if bounds is None:
        x[0, 0, :3] = 0.0  # abs' and sign's kink
    dy = randn(BATCH, 5, 7)
    out, (dx,), _ = run_kernel("activation", {"function": function}, [x], dy=dy)
    ref, (ref_dx,), _ = tf_grads(lambda xs, ws: op(xs[0]), [x], {}, dy)
    close(out, ref)
    close(dx, ref_dx, rtol=2e-6)


@pytest.mark.parametrize("exponent, low", [(2.0, -3), (3.0, -3), (0.5, 0.1), (-1.5, 0.1), (1.7, 0.1)])
def test_pow_with_a_constant_exponent_matches_tensorflow(exponent, low):
    x, dy = randn(BATCH, 9, low=low, high=3), randn(BATCH, 9)
    out, (dx,), _ = run_kernel("activation", {"function": "pow", "exponent": exponent}, [x], dy=dy)
    ref, (ref_dx,), _ = tf_grads(lambda xs, ws: tf.pow(xs[0], np.float32(exponent)), [x], {}, dy)
    close(out, ref, rtol=2e-6)
    close(dx, ref_dx, rtol=4e-6)


def test_erf_is_tensorflows_float32_erf_bit_for_bit():
    # normal floats: TF flushes subnormals to zero, numpy does not
    x = np.concatenate([np.linspace(-6, 6, 100_001, dtype=np.float32),
                        np.float32(10.0) ** np.arange(-37, 2, dtype=np.float32)])
    np.testing.assert_array_equal(erf(x), tf.math.erf(x).numpy())


ROUNDING = {"floor": tf.floor, "ceil": tf.math.ceil, "round": tf.round}


@pytest.mark.parametrize("function", sorted(ROUNDING))
def test_rounding_is_tensorflows_with_no_gradient(function):
    """Halves round to even (tf.round); TF registers no gradient for them: the CS passes 0."""
    x = randn(BATCH, 5, 7) * 3
    x[0, 0, :6] = [-2.5, -1.5, -0.5, 0.5, 1.5, 2.5]
    out, (dx,), _ = run_kernel("activation", {"function": function}, [x], dy=randn(BATCH, 5, 7))
    np.testing.assert_array_equal(out, ROUNDING[function](x).numpy())
    np.testing.assert_array_equal(dx, np.zeros_like(x))


def test_every_activation_function_is_tested_or_was_there_before():
    earlier = {"relu", "relu6", "leaky_relu", "elu", "selu", "tanh", "sigmoid", "softplus", "linear"}
    special = {"lgamma", "digamma", "bessel_i0e"}  # tests/wafer/test_special_functions.py
    assert set(FUNCTIONS) == earlier | set(ACTIVATIONS) | set(ROUNDING) | {"pow"} | special


# ---- binary ----
TF_BINARY = {
    "add": tf.add, "sub": tf.subtract, "mul": tf.multiply, "div": tf.math.truediv,
    "maximum": tf.maximum, "minimum": tf.minimum, "squared_difference": tf.math.squared_difference,
    "pow": tf.pow, "greater": tf.greater, "greater_equal": tf.greater_equal, "less": tf.less,
    "less_equal": tf.less_equal, "equal": tf.equal, "not_equal": tf.not_equal,
    "xlogy": tf.math.xlogy, "xlog1py": tf.math.xlog1py, "atan2": tf.math.atan2,
}
ARITHMETIC = ["add", "sub", "mul", "div", "maximum", "minimum", "squared_difference", "pow",
              "xlogy", "xlog1py", "atan2"]
# operands, per-sample input shapes, constant/weight shapes by position
LAYOUTS = [
    ("ii", [(4, 5), (4, 5)], {}),
    ("ii", [(4, 1), (1, 5)], {}),  # both broadcast
    ("ic", [(4, 5)], {1: ()}),  # a scalar constant
    ("ci", [(4, 5)], {0: (5,)}),
    ("ic", [(4, 5)], {1: (1, 4, 1)}),  # full rank, leading 1
    ("ip", [(4, 5)], {1: (5,)}),  # a bias-like weight
    ("pi", [(4, 5)], {0: (1, 4, 5)}),  # a weight with a leading 1
    ("ip", [(4, 1)], {1: (4, 5)}),  # the weight is bigger than the input
]


def operand_values(op, letters, input_shapes, other_shapes):
    """Inputs (batch first) and constants/weights, in a range the op is defined on."""
    low, high = (0.3, 2.5) if op in ("pow", "div", "xlogy", "xlog1py") else (-2, 2)
    inputs = [randn(BATCH, *s, low=low, high=high) for s in input_shapes]
    others = {k: randn(*s, low=low, high=high) for k, s in other_shapes.items()}
    if op in ("maximum", "minimum", "equal", "not_equal", "greater_equal", "less_equal"):
        # ties: values on a coarse grid meet each other
        inputs = [np.round(a * 2) / 2 for a in inputs]
        others = {k: np.asarray(np.round(v * 2) / 2, np.float32) for k, v in others.items()}
    arrays, n = [], 0
    for k, letter in enumerate(letters):
        if letter == "i":
            arrays.append(("i", inputs[n]))
            n += 1
        else:
            arrays.append((letter, others[k]))
    if op in ("xlogy", "xlog1py"):  # x = 0 (value and gradients 0 whatever y)
        arrays[0][1].reshape(-1)[::3] = 0
    return inputs, arrays


def kernel_setup(letters, arrays):
    attrs = {"operands": letters}
    params = {}
    for k, (letter, value) in enumerate(arrays):
        if letter == "c":
            attrs[f"c{k}"] = value
        elif letter == "p":
            attrs[f"p{k}"] = list(value.shape)
            params[f"p{k}"] = value
    return attrs, params


def tf_operands(arrays, xs, ws):
    out, n = [], 0
    for k, (letter, value) in enumerate(arrays):
        if letter == "i":
            out.append(xs[n])
            n += 1
        else:
            out.append(tf.constant(value) if letter == "c" else ws[f"p{k}"])
    return out


@pytest.mark.parametrize("op", sorted(TF_BINARY))
@pytest.mark.parametrize("layout", range(len(LAYOUTS)))
def test_binary_matches_tensorflow(op, layout):
    letters, input_shapes, other_shapes = LAYOUTS[layout]
    inputs, arrays = operand_values(op, letters, input_shapes, other_shapes)
    attrs, params = kernel_setup(letters, arrays)
    attrs["op"] = op
    kernel = build_kernel("binary", "k1", attrs, [a.shape[1:] for a in inputs])
    differentiable = op in ARITHMETIC
    ref, ref_dx, ref_dw = tf_grads(lambda xs, ws: TF_BINARY[op](*tf_operands(arrays, xs, ws)),
                                   inputs, params, None)
    dy = randn(*ref.shape) if differentiable else None
    out, dx, dw = run_kernel("binary", attrs, inputs, params, dy=dy)
    assert kernel.output_shape == ref.shape[1:]
    assert [kernel.input_differentiable(j) for j in range(len(inputs))] == [differentiable] * len(inputs)
    if not differentiable:
        np.testing.assert_array_equal(out, ref)
        return
    ref, ref_dx, ref_dw = tf_grads(lambda xs, ws: TF_BINARY[op](*tf_operands(arrays, xs, ws)),
                                   inputs, params, dy)
    close(out, ref, rtol=2e-6)
    for got, want in zip(dx, ref_dx):
        close(got, want, rtol=4e-6)
    for role, want in ref_dw.items():
        close(dw[role], want, rtol=4e-6)


def test_maximum_and_minimum_send_ties_to_x_as_tensorflow():
    x = np.zeros((BATCH, 3), np.float32)
    dy = np.ones((BATCH, 3), np.float32)
    for op in ("maximum", "minimum"):
        _, (dx, dz), _ = run_kernel("binary", {"op": op, "operands": "ii"}, [x, x.copy()], dy=dy)
        np.testing.assert_array_equal(dx, dy)
        np.testing.assert_array_equal(dz, 0 * dy)


@pytest.mark.parametrize("op", ["logical_and", "logical_or"])
def test_logical_ops_on_bool(op):
    a, b = RNG.random((BATCH, 4)) > 0.5, RNG.random((BATCH, 4)) > 0.5
    out, grads, _ = run_kernel("binary", {"op": op, "operands": "ii"}, [a, b])
    np.testing.assert_array_equal(out, getattr(tf.math, op)(a, b).numpy())
    assert out.dtype == np.bool_


def test_integer_arithmetic_and_comparisons_keep_tensorflows_dtype():
    kernel = build_kernel("binary", "k1", {"op": "add", "operands": "ic",
                                           "c1": np.array(1, np.int64)}, [(3,)])
    assert kernel.output_dtype([np.dtype(np.int64)]) == np.int64
    less = build_kernel("binary", "k2", {"op": "less", "operands": "ii"}, [(3,), (3,)])
    assert less.output_dtype([np.dtype(np.int32)] * 2) == np.bool_
    labels = RNG.integers(0, 5, (BATCH, 3))
    out, _, _ = run_kernel("binary", {"op": "sub", "operands": "ic", "c1": np.array(1, np.int64)},
                           [labels])
    np.testing.assert_array_equal(out, labels - 1)
    assert out.dtype == np.int64


# ---- select ----
@pytest.mark.parametrize("letters, cond_shape, x_shape, y_shape", [
    ("iii", (4, 5), (4, 5), (4, 5)),
    ("iii", (4, 1), (4, 5), (1, 5)),  # broadcast condition and y
    ("ici", (4, 5), (5,), (4, 5)),  # x a constant
    ("iip", (4, 5), (4, 5), (1, 4, 5)),  # y a weight
    ("cip", (1, 5), (4, 5), (5,)),  # a constant condition
])
def test_select_matches_tensorflow(letters, cond_shape, x_shape, y_shape):
    shapes = [cond_shape, x_shape, y_shape]
    inputs, arrays = [], []
    for k, (letter, shape) in enumerate(zip(letters, shapes)):
        full = (BATCH, *shape) if letter == "i" else shape
        value = RNG.random(full) > 0.4 if k == 0 else randn(*full)
        arrays.append((letter, value))
        if letter == "i":
            inputs.append(value)
    attrs, params = kernel_setup(letters, arrays)
    kernel = build_kernel("select", "k1", attrs, [a.shape[1:] for a in inputs])
    ref, _, _ = tf_grads(lambda xs, ws: tf.where(*tf_operands(arrays, xs, ws)), inputs, params, None)
    dy = randn(*ref.shape)
    out, dx, dw = run_kernel("select", attrs, inputs, params, dy=dy)
    ref, ref_dx, ref_dw = tf_grads(lambda xs, ws: tf.where(*tf_operands(arrays, xs, ws)),
                                   inputs, params, dy)
    assert kernel.output_shape == ref.shape[1:]
    close(out, ref)
    for j, (got, want) in enumerate(zip(dx, ref_dx)):
        differentiable = kernel.input_differentiable(j)
        assert differentiable == (inputs[j].dtype != np.bool_)
        if differentiable:
            close(got, want)
        else:
            assert got is None
    for role, want in ref_dw.items():
        close(dw[role], want)


def test_a_weights_condition_is_the_weight_programs_0_or_1_as_tensorflows_bool():
    """A dropout mask drawn once a step for the batch: the weight program's float32 cast of
    uniform >= rate, (1, 5), selects as TF's tf.where(mask, x * scale, 0) does, inf and nan
    of x included, the gradient to x where the mask holds; the condition takes none."""
    mask = RNG.random((1, 5)) > 0.4
    x = randn(BATCH, 4, 5)
    x[0, 0, :2] = [np.inf, np.nan]
    attrs = {"operands": "pic", "p0": [1, 5], "c2": np.array(0, np.float32)}
    dy = randn(BATCH, 4, 5)
    out, (dx,), dw = run_kernel("select", attrs, [x], {"p0": mask.astype(np.float32)}, dy=dy)
    want = tf.where(mask, x, 0.0).numpy()
    np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))
    np.testing.assert_array_equal(dx, np.where(mask, dy, np.float32(0)))
    assert np.isnan(dw["p0"]).all()  # (no gradient written to the accumulator)


def test_where_selects_bit_for_bit_as_numpy_with_inf_nan_and_signed_zeros():
    x = randn(3, 4, 5)
    x[0, 0, :3] = [np.inf, np.nan, -0.0]
    y, cond = randn(4, 1), RNG.random((1, 5)) > 0.5
    for got, want in [(where(cond, x, y), np.where(cond, x, y)),
                      (where(cond, x), np.where(cond, x, np.float32(0))),
                      (where(cond[0], y, x), np.where(cond[0], y, x))]:
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    ints = RNG.integers(0, 9, (3, 4))
    np.testing.assert_array_equal(where(ints > 4, ints, -ints), np.where(ints > 4, ints, -ints))


# ---- cast, stop_gradient, one_hot ----
@pytest.mark.parametrize("source, target", [
    ("int32", "float32"), ("int64", "float32"), ("float32", "int32"), ("float32", "int64"),
    ("float32", "bool"), ("bool", "float32"), ("int64", "int32"), ("float32", "float32")])
def test_cast_matches_tensorflow(source, target):
    x = (randn(BATCH, 7) * 40).astype(source) if source != "bool" else RNG.random((BATCH, 7)) > 0.5
    if source == "float32":
        x[0, :3] = [0.0, -2.7, 2.7]  # truncation toward zero, and zero to False
    kernel = build_kernel("cast", "k1", {"dtype": target}, [(7,)])
    assert kernel.output_dtype([np.dtype(source)]) == np.dtype(target)
    dy = randn(BATCH, 7)
    out, (dx,), _ = run_kernel("cast", {"dtype": target}, [x], dy=dy)
    np.testing.assert_array_equal(out, tf.cast(x, target).numpy())
    assert out.dtype == np.dtype(target)
    if (source, target) == ("float32", "float32"):
        assert kernel.input_differentiable(0)
        close(dx, dy)
    else:  # TF's _CastGrad: no gradient unless both are float types
        assert dx is None


def test_cast_rounds_large_integers_as_tensorflow():
    x = RNG.integers(-2**40, 2**40, (BATCH, 64))
    out, _, _ = run_kernel("cast", {"dtype": "float32"}, [x])
    np.testing.assert_array_equal(out, tf.cast(x, tf.float32).numpy())
    out, _, _ = run_kernel("cast", {"dtype": "int32"}, [x])
    np.testing.assert_array_equal(out, tf.cast(x, tf.int32).numpy())  # wraps around


def test_stop_gradient_passes_values_and_no_gradient():
    x, dy = randn(BATCH, 4), randn(BATCH, 4)
    kernel = build_kernel("stop_gradient", "k1", {}, [(4,)])
    out, (dx,), _ = run_kernel("stop_gradient", {}, [x], dy=dy)
    np.testing.assert_array_equal(out, x)
    assert dx is None and not kernel.input_differentiable(0)
    assert kernel.output_dtype([np.dtype(np.int32)]) == np.int32


def test_one_hot_matches_tensorflow():
    indices = RNG.integers(-1, 6, (BATCH, 3))  # -1 and 5 are outside depth 5: off rows
    attrs = {"depth": 5, "on_value": 0.9, "off_value": 0.025}
    kernel = build_kernel("one_hot", "k1", attrs, [(3,)])
    out, (dx,), _ = run_kernel("one_hot", attrs, [indices], dy=randn(BATCH, 3, 5))
    np.testing.assert_array_equal(out, tf.one_hot(indices, 5, 0.9, 0.025).numpy())
    assert kernel.output_shape == (3, 5) and out.dtype == np.float32
    assert dx is None and not kernel.input_differentiable(0)


# ---- cross entropy and the loss ----
@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("shape", [(7,), (3, 7)])
def test_softmax_cross_entropy_with_logits_matches_tensorflow(sparse, shape):
    logits = randn(BATCH, *shape) * 3
    if sparse:
        labels = RNG.integers(0, shape[-1], (BATCH, *shape[:-1]))
        op = tf.nn.sparse_softmax_cross_entropy_with_logits
    else:
        labels = tf.nn.softmax(randn(BATCH, *shape)).numpy()
        op = tf.nn.softmax_cross_entropy_with_logits
    attrs = {"sparse": sparse}
    kernel = build_kernel("softmax_cross_entropy_with_logits", "k1", attrs, [shape, labels.shape[1:]])
    assert kernel.output_shape == shape[:-1] and not kernel.is_loss
    dy = randn(BATCH, *shape[:-1])
    out, (dlogits, dlabels), _ = run_kernel("softmax_cross_entropy_with_logits", attrs,
                                            [logits, labels], dy=dy)
    ref, (ref_dlogits, ref_dlabels), _ = tf_grads(
        lambda xs, ws: op(labels=xs[1], logits=xs[0]), [logits, labels], {}, dy)
    close(out, ref, rtol=2e-6)
    close(dlogits, ref_dlogits, rtol=2e-6)
    assert kernel.input_differentiable(1) == (not sparse)
    if sparse:
        assert dlabels is None
    else:
        close(dlabels, ref_dlabels, rtol=2e-6)


@pytest.mark.parametrize("sparse", [False, True])
def test_cross_entropy_backprop_is_tensorflows_second_output_and_its_gradient(sparse):
    """The fused op's backprop output (softmax - labels) and TF's registered gradient of it:
    (g - sum(g * softmax)) * softmax to the logits, nothing to the labels."""
    logits = randn(BATCH, 7) * 3
    if sparse:
        labels = RNG.integers(0, 7, (BATCH,))
        op = tf.raw_ops.SparseSoftmaxCrossEntropyWithLogits
    else:
        labels = tf.nn.softmax(randn(BATCH, 7)).numpy()
        op = tf.raw_ops.SoftmaxCrossEntropyWithLogits
    attrs = {"sparse": sparse}
    kernel = build_kernel("softmax_cross_entropy_backprop", "k1", attrs, [(7,), labels.shape[1:]])
    assert kernel.output_shape == (7,) and not kernel.input_differentiable(1)
    dy = randn(BATCH, 7)
    out, (dlogits, dlabels), _ = run_kernel("softmax_cross_entropy_backprop", attrs,
                                            [logits, labels], dy=dy)
    ref, (ref_dlogits, _), _ = tf_grads(
        lambda xs, ws: op(features=xs[0], labels=xs[1])[1], [logits, labels], {}, dy)
    close(out, ref, rtol=2e-6)  # (numpy's exp and Eigen's differ in the last bit)
    close(dlogits, ref_dlogits, rtol=2e-6)
    assert dlabels is None


def test_sparse_labels_outside_the_classes_raise_naming_the_kernel():
    kernel = build_kernel("softmax_cross_entropy_with_logits", "head/xent", {"sparse": True},
                          [(4,), ()])
    ctx = RunContext(training=True, batch_size=2)
    with pytest.raises(ValueError, match=r"head/xent: label 4 is outside the 4 classes"):
        kernel.forward({}, [randn(2, 4), np.array([1, 4])], ctx)


@pytest.mark.parametrize("shape, reduce", [((), tf.reduce_mean), ((3, 4), tf.reduce_mean),
                                           ((5,), tf.reduce_sum)])
def test_loss_is_the_scaled_batch_sum(shape, reduce):
    t = randn(BATCH, *shape)
    scale = 1.0 / t.size if reduce is tf.reduce_mean else 1.0
    kernel = build_kernel("loss", "k1", {"scale": scale}, [shape])
    assert kernel.is_loss and kernel.output_shape == ()
    out, (dt,), _ = run_kernel("loss", {"scale": scale}, [t])
    ref, (ref_dt,), _ = tf_grads(lambda xs, ws: reduce(xs[0]), [t], {}, np.float32(1))
    assert out.shape == (BATCH,)
    # float32 sums in another order: rounding is relative to the summands, not the sum
    np.testing.assert_allclose(np.sum(out, dtype=np.float32), ref, rtol=2e-6,
                               atol=2e-6 * scale * float(np.abs(t).sum()))
    close(dt, ref_dt)


# ---- refusals ----
@pytest.mark.parametrize("kernel_type, attrs, shapes, message", [
    ("binary", {"op": "hypot", "operands": "ii"}, [(3,), (3,)], "unknown op 'hypot'"),
    ("binary", {"op": "add", "operands": "iq"}, [(3,)], "operands must be 2 letters"),
    ("binary", {"op": "add", "operands": "ic"}, [(3,)], "attr 'c1' must hold it as a tensor"),
    ("binary", {"op": "add", "operands": "ip"}, [(3,)], "attr 'p1' must hold its shape"),
    ("binary", {"op": "add", "operands": "ii"}, [(3,)], "take 2 inputs"),
    ("binary", {"op": "add", "operands": "ii"}, [(3,), (4,)], "do not broadcast"),
    ("binary", {"op": "add", "operands": "ii"}, [(3,), (2, 3)], "different ranks"),
    ("binary", {"op": "add", "operands": "ic", "c1": np.ones((2, 3), np.float32)}, [(3,)],
     "would broadcast against the batch axis"),
    ("binary", {"op": "add", "operands": "ip", "p1": [1, 1, 3]}, [(3,)],
     "would broadcast against the batch axis"),
    ("select", {"operands": "ii"}, [(3,), (3,)], "operands must be 3 letters"),
    ("activation", {"function": "pow"}, [(3,)], "needs a number attr 'exponent'"),
    ("activation", {"function": "sinh"}, [(3,)], "unknown activation 'sinh'"),
    ("dense", {"units": 2, "activation": "pow"}, [(3,)], "only an activation kernel"),
    ("cast", {"dtype": "float16"}, [(3,)], "dtype among float32, int32, int64, bool"),
    ("stop_gradient", {}, [(3,), (3,)], "takes 1 input"),
    ("one_hot", {"depth": 0}, [(3,)], "depth > 0"),
    ("one_hot", {"depth": 4, "axis": 0}, [(3,)], "axis -1"),
    ("softmax_cross_entropy_with_logits", {"sparse": True}, [(3, 5), (3, 5)], "labels (3,)"),
    ("softmax_cross_entropy_with_logits", {"sparse": False}, [(5,), ()], "labels (5,)"),
    ("softmax_cross_entropy_with_logits", {"sparse": 1}, [(5,), ()], "bool attr sparse"),
    ("loss", {}, [(3,)], "finite number attr scale"),
    ("loss", {"scale": float("nan")}, [(3,)], "finite number attr scale"),
])
def test_kernels_refuse_what_they_cannot_do_naming_the_kernel(kernel_type, attrs, shapes, message):
    with pytest.raises(KernelError, match="'bad_kernel'") as error:
        build_kernel(kernel_type, "bad_kernel", attrs, shapes)
    assert message in str(error.value)


@pytest.mark.parametrize("kernel_type, attrs, shapes, dtypes, message", [
    ("binary", {"op": "div", "operands": "ii"}, [(3,), (3,)], ["int32", "int32"],
     "int32 and int32; it takes two of one dtype among float32"),
    ("binary", {"op": "add", "operands": "ic", "c1": np.ones(3, np.float64)}, [(3,)],
     ["float32"], "float32 and float64"),
    ("binary", {"op": "logical_or", "operands": "ii"}, [(3,), (3,)], ["float32", "bool"],
     "among bool"),
    ("select", {"operands": "iii"}, [(3,), (3,), (3,)], ["float32"] * 3, "a bool condition"),
    ("activation", {"function": "exp"}, [(3,)], ["int64"], "input 0 is int64, it takes float32"),
    ("dense", {"units": 2}, [(3,)], ["int32"], "input 0 is int32, it takes float32"),
    ("one_hot", {"depth": 3}, [(3,)], ["float32"], "it takes int32 or int64"),
    ("softmax_cross_entropy_with_logits", {"sparse": True}, [(5,), ()], ["float32", "float32"],
     "input 1 is float32, it takes int32 or int64"),
    ("concat", {"axis": 0}, [(3,), (3,)], ["float32", "int32"], "different dtypes"),
])
def test_kernels_refuse_dtypes_they_cannot_take(kernel_type, attrs, shapes, dtypes, message):
    kernel = build_kernel(kernel_type, "bad_kernel", attrs, shapes)
    with pytest.raises(KernelError, match="'bad_kernel'") as error:
        kernel.output_dtype([np.dtype(d) for d in dtypes])
    assert message in str(error.value)


# ---- programs: tensor attrs, dtypes chained, bool and int outputs passed through ----
def program(kernels, inputs=(("features", "float32", (4,)),)):
    message = pb.Program(name="p", batch_size=BATCH, micro_batch_size=MICRO)
    for name, dtype, shape in inputs:
        message.inputs.add(name=name, dtype=dtype_code(np.dtype(dtype)), shape=list(shape))
    for name, kind, sources, attrs, shape in kernels:
        kernel = message.kernels.add(name=name, type=kind, inputs=list(sources),
                                     output_shape=list(shape))
        for key, value in attrs.items():
            kernel.attrs[key].CopyFrom(to_attr(value))
    return message


def test_a_constant_travels_as_a_tensor_attr():
    value = randn(2, 3)
    decoded = from_attr(to_attr(value))
    np.testing.assert_array_equal(decoded, value)
    assert decoded.dtype == np.float32
    np.testing.assert_array_equal(from_attr(to_attr(np.array([1, 2], np.int64))), [1, 2])


def test_program_checks_chain_dtypes_and_run_bool_and_int_values_through():
    threshold = np.zeros(4, np.float32)
    message = program([
        ("positive", "binary", ["features"], {"op": "greater", "operands": "ic", "c1": threshold}, (4,)),
        ("count", "cast", ["positive"], {"dtype": "int32"}, (4,)),
        ("flags", "cast", ["count"], {"dtype": "float32"}, (4,)),
        ("loss", "loss", ["flags"], {"scale": 0.5}, ()),
    ])
    message.loss_kernel = "loss"
    checked = check_program(message)
    pipeline = Pipeline(checked.kernels, checked.sources, checked.variables, {},
                        batch_size=BATCH, micro_batch_size=MICRO, loss_kernel="loss",
                        optimizer=None, seed=0)
    x = randn(BATCH, 4)
    step = pipeline.run({"features": x}, training=False, outputs=["positive", "count"])
    np.testing.assert_array_equal(step.outputs["positive"], x > 0)
    assert step.outputs["positive"].dtype == np.bool_ and step.outputs["count"].dtype == np.int32
    assert step.loss == pytest.approx(0.5 * np.sum(x > 0))


def test_program_checks_refuse_a_dtype_a_kernel_cannot_take():
    message = program([("h", "dense", ["features"], {"units": 2}, (2,))],
                      inputs=(("features", "int64", (4,)),))
    with pytest.raises(CSError, match=r"kernel 'h' \(dense\): input 0 is int64, it takes float32"):
        check_program(message)


def test_program_checks_refuse_a_torn_tensor_attr_naming_kernel_and_attr():
    message = program([("b", "binary", ["features"], {"op": "add", "operands": "ic",
                                                      "c1": np.ones(4, np.float32)}, (4,))])
    message.kernels[0].attrs["c1"].tensor.data = b"\0" * 3
    with pytest.raises(CSError, match=r"kernel 'b' \(binary\): attribute 'c1': .*3 bytes"):
        check_program(message)


def test_weight_operands_train_through_the_pipeline_as_tensorflow():
    """w * x + b (w (4,), b (1, 4)) against labels, squared difference, mean: one SGD step
    of the pipeline (micro-batches accumulated) equals TF's on the whole batch."""
    message = program([
        ("scaled", "binary", ["features"], {"op": "mul", "operands": "ip", "p1": [4]}, (4,)),
        ("shifted", "binary", ["scaled"], {"op": "add", "operands": "ip", "p1": [1, 4]}, (4,)),
        ("error", "binary", ["shifted", "labels"], {"op": "squared_difference", "operands": "ii"}, (4,)),
        ("loss", "loss", ["error"], {"scale": 1.0 / (BATCH * 4)}, ()),
    ], inputs=(("features", "float32", (4,)), ("labels", "float32", (4,))))
    message.kernels[0].params.add(role="p1", variable="w", shape=[4], dtype=pb.FLOAT32)
    message.kernels[1].params.add(role="p1", variable="b", shape=[1, 4], dtype=pb.FLOAT32)
    message.loss_kernel = "loss"
    message.optimizer.CopyFrom(pb.Optimizer(type="sgd", learning_rate=0.1))
    checked = check_program(message)
    w0, b0 = randn(4), randn(1, 4)
    pipeline = Pipeline(checked.kernels, checked.sources, checked.variables, {"w": w0, "b": b0},
                        batch_size=BATCH, micro_batch_size=MICRO, loss_kernel="loss",
                        optimizer=make_optimizer(checked.optimizer), seed=0)
    x, y = randn(BATCH, 4), randn(BATCH, 4)
    step = pipeline.run({"features": x, "labels": y}, training=True)
    w, b = tf.Variable(w0), tf.Variable(b0)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.math.squared_difference(w * x + b, y))
    gw, gb = tape.gradient(loss, [w, b])
    assert step.loss == pytest.approx(float(loss), rel=1e-6)
    state = pipeline.state()
    close(state["w"], w0 - np.float32(0.1) * gw.numpy())
    close(state["b"], b0 - np.float32(0.1) * gb.numpy())


@st.composite
def broadcast_layouts(draw):
    """An op, operand letters with at least one input, and shapes that broadcast to a
    per-sample shape S: inputs of S's rank, constants and weights of any rank up to the
    batch's (then with a leading 1), every dimension S's or 1."""
    sample = tuple(draw(st.lists(st.integers(1, 4), max_size=3)))
    letters = draw(st.lists(st.sampled_from("icp"), min_size=2, max_size=2).filter(lambda chosen: "i" in chosen))
    shapes = []
    for letter in letters:
        rank = len(sample) if letter == "i" else draw(st.integers(0, len(sample) + 1))
        tail = sample[len(sample) - min(rank, len(sample)):]
        dims = tuple(d if draw(st.booleans()) else 1 for d in tail)
        shapes.append(dims if rank <= len(sample) else (1, *dims))
    return draw(st.sampled_from(ARITHMETIC)), "".join(letters), shapes


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(broadcast_layouts())
def test_binary_broadcasting_matches_tensorflow_on_random_layouts(layout):
    op, letters, shapes = layout
    arrays = [(letter, randn(*((BATCH, *s) if letter == "i" else s), low=0.5, high=2.0))
              for letter, s in zip(letters, shapes)]
    inputs = [v for letter, v in arrays if letter == "i"]
    attrs, params = kernel_setup(letters, arrays)
    attrs["op"] = op
    fn = lambda xs, ws: TF_BINARY[op](*tf_operands(arrays, xs, ws))  # noqa: E731
    ref, _, _ = tf_grads(fn, inputs, params, None)
    dy = randn(*ref.shape)
    out, dx, dw = run_kernel("binary", attrs, inputs, params, dy=dy)
    ref, ref_dx, ref_dw = tf_grads(fn, inputs, params, dy)
    close(out, ref, rtol=2e-6)
    for got, want in zip(dx, ref_dx):
        close(got, want, rtol=4e-6)
    for role, want in ref_dw.items():
        # a broadcast weight's gradient sums dy * df/dw over the output: TF and the CS may
        # add the terms in other orders, so the bound is relative to the terms' magnitude
        wide = {**params, role: np.broadcast_to(params[role], ref.shape).copy()}
        terms = tf_grads(fn, inputs, wide, dy)[2][role]
        close(dw[role], want, rtol=4e-6, scale=float(np.abs(terms).sum()))


def test_exact_gelu_composed_of_generic_kernels_trains_as_tf_nn_gelu():
    """GELU as TF writes it, 0.5 * h * (1 + erf(h / sqrt(2))) with h = x * w, in five
    kernels (h feeds two of them): one SGD step equals TF's on tf.nn.gelu."""
    c = lambda v: np.array(v, np.float32)  # noqa: E731
    message = program([
        ("h", "binary", ["features"], {"op": "mul", "operands": "ip", "p1": [4]}, (4,)),
        ("scaled", "binary", ["h"], {"op": "div", "operands": "ic", "c1": c(1.4142135623730951)}, (4,)),
        ("erf", "activation", ["scaled"], {"function": "erf"}, (4,)),
        ("one_plus", "binary", ["erf"], {"op": "add", "operands": "ci", "c0": c(1.0)}, (4,)),
        ("half_h", "binary", ["h"], {"op": "mul", "operands": "ci", "c0": c(0.5)}, (4,)),
        ("gelu", "binary", ["half_h", "one_plus"], {"op": "mul", "operands": "ii"}, (4,)),
        ("loss", "loss", ["gelu"], {"scale": 1.0 / (BATCH * 4)}, ()),
    ])
    message.kernels[0].params.add(role="p1", variable="w", shape=[4], dtype=pb.FLOAT32)
    message.loss_kernel = "loss"
    message.optimizer.CopyFrom(pb.Optimizer(type="sgd", learning_rate=0.5))
    checked = check_program(message)
    w0 = randn(4)
    pipeline = Pipeline(checked.kernels, checked.sources, checked.variables, {"w": w0},
                        batch_size=BATCH, micro_batch_size=MICRO, loss_kernel="loss",
                        optimizer=make_optimizer(checked.optimizer), seed=0)
    x = randn(BATCH, 4) * 2
    step = pipeline.run({"features": x}, training=True)
    w = tf.Variable(w0)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.nn.gelu(x * w, approximate=False))
    assert step.loss == pytest.approx(float(loss), rel=1e-6)
    close(pipeline.state()["w"], w0 - np.float32(0.5) * tape.gradient(loss, w).numpy())


def test_erfc_is_tensorflows_float32_erfc_to_a_few_ulp():
    x = np.linspace(-12, 6, 200_001, dtype=np.float32)  # beyond 6 TF's own error grows
    got, want = erfc(x), tf.math.erfc(x).numpy()
    ulps = np.abs(got.view(np.int32).astype(np.int64) - want.view(np.int32))
    assert ulps.max() <= 8
