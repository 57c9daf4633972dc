"""The structural kernels against TensorFlow: reduce, softmax, matmul, transpose, slice,
pad, gather, batch norm (inference) and cumulative_logsumexp, forward and gradients (tf.GradientTape on the same
float32 values, weights accumulated over micro-batches), broadcasting, transposes,
keepdims, ties, dtypes, and the refusals of what a kernel cannot do (sample mixing above all)."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.wafer.test_wse_kernels_elementwise import (
    BATCH,
    RNG,
    close,
    kernel_setup,
    program,
    randn,
    run_kernel,
    tf_grads,
    tf_operands,
)
from wafer.kernels import KernelError, RunContext, build_kernel
from wafer.kernels.embedding import scatter_add
from wse_sim.pipeline import Pipeline
from wse_sim.program import check_program, check_state


def check_against_tf(kernel_type, attrs, inputs, fn, params=None, rtol=2e-6, grad_rtol=4e-6):
    """Forward and every gradient of the kernel equal TF's; returns the kernel."""
    params = params or {}
    kernel = build_kernel(kernel_type, "k1", attrs, [a.shape[1:] for a in inputs])
    ref, _, _ = tf_grads(fn, inputs, params, None)
    assert kernel.output_shape == ref.shape[1:]
    dy = randn(*ref.shape)
    out, dx, dw = run_kernel(kernel_type, attrs, inputs, params, dy=dy)
    ref, ref_dx, ref_dw = tf_grads(fn, inputs, params, dy)
    close(out, ref, rtol)
    for got, want in zip(dx, ref_dx):
        close(got, want, grad_rtol)
    for role, want in ref_dw.items():
        close(dw[role], want, grad_rtol)
    return kernel


# ---- reduce ----
TF_REDUCE = {"sum": tf.reduce_sum, "mean": tf.reduce_mean, "max": tf.reduce_max,
             "min": tf.reduce_min}


@pytest.mark.parametrize("op", sorted(TF_REDUCE))
@pytest.mark.parametrize("axes, keepdims", [([2], False), ([0, 2], True), ([1], True),
                                            ([0, 1, 2], False), ([], False)])
def test_reduce_matches_tensorflow(op, axes, keepdims):
    x = randn(BATCH, 4, 5, 3)
    if op in ("max", "min"):
        x = np.round(x * 2) / 2  # ties: the gradient is split among them
    check_against_tf("reduce", {"op": op, "axes": axes, "keepdims": keepdims}, [x],
                     lambda xs, ws: TF_REDUCE[op](xs[0], axis=[a + 1 for a in axes],
                                                  keepdims=keepdims))


def test_reduce_max_splits_the_gradient_equally_among_ties():
    x = np.array([[[1, 3, 3, 3], [2, 2, 0, 1]]] * BATCH, np.float32)
    dy = np.ones((BATCH, 2), np.float32)
    _, (dx,), _ = run_kernel("reduce", {"op": "max", "axes": [1]}, [x], dy=dy)
    third = np.float32(1) / np.float32(3)
    np.testing.assert_array_equal(dx[0], [[0, third, third, third], [0.5, 0.5, 0, 0]])


@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_reduce_of_integers_keeps_their_dtype(op):
    x = RNG.integers(-50, 50, (BATCH, 3, 4)).astype(np.int32)
    kernel = build_kernel("reduce", "k1", {"op": op, "axes": [1]}, [(3, 4)])
    assert kernel.output_dtype([np.dtype(np.int32)]) == np.int32
    out, _, _ = run_kernel("reduce", {"op": op, "axes": [1]}, [x])
    np.testing.assert_array_equal(out, TF_REDUCE[op](x, axis=2).numpy())
    assert out.dtype == np.int32


# ---- softmax ----
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax_matches_tensorflow(log, axis):
    x = randn(BATCH, 3, 4, 6) * 3
    op = tf.nn.log_softmax if log else tf.nn.softmax
    check_against_tf("softmax", {"axis": axis, "log": log}, [x],
                     lambda xs, ws: op(xs[0], axis=-1 if axis == -1 else axis + 1))


def test_softmax_of_large_logits_stays_finite():
    x = np.array([[1000.0, 0.0, -1000.0]] * BATCH, np.float32)
    out, _, _ = run_kernel("softmax", {"axis": -1, "log": True}, [x])
    close(out, tf.nn.log_softmax(x).numpy())


# ---- matmul ----
# operands, shape of operand 0, shape of operand 1 (activations per sample), transposes
MATMULS = [
    ("ii", (2, 3, 5), (2, 5, 4), False, False),
    ("ii", (2, 5, 3), (2, 5, 4), True, False),
    ("ii", (3, 5), (4, 5), False, True),  # attention's q k^T
    ("ii", (2, 5, 3), (2, 4, 5), True, True),
    ("ii", (1, 3, 5), (2, 5, 4), False, False),  # leading axes broadcast within the sample
    ("ip", (3, 5), (5, 4), False, False),  # a rank-2 weight on every sample's matrix
    ("ip", (2, 3, 5), (4, 5), False, True),
    ("ip", (5, 3), (5, 4), True, False),
    ("ip", (2, 3, 5), (2, 5, 4), False, False),  # a stacked weight
    ("ip", (3, 5), (1, 5, 4), False, False),  # a weight with a leading 1
    ("ip", (5,), (5, 4), False, False),  # rows are samples: x [batch, n] @ w
    ("ip", (5,), (4, 5), False, True),
    ("pi", (3, 5), (5, 4), False, False),
    ("pi", (5, 3), (2, 4, 5), True, True),
    ("ic", (5,), (5, 4), False, False),
    ("ci", (3, 5), (2, 5, 4), False, False),
    ("ic", (3, 5), (5, 4), False, False),
]


@pytest.mark.parametrize("layout", range(len(MATMULS)),
                         ids=lambda i: "-".join(map(str, MATMULS[i])))
def test_matmul_matches_tensorflow(layout):
    letters, shape_a, shape_b, ta, tb = MATMULS[layout]
    arrays = [(letter, randn(BATCH, *shape) if letter == "i" else randn(*shape))
              for letter, shape in zip(letters, (shape_a, shape_b))]
    inputs = [value for letter, value in arrays if letter == "i"]
    attrs, params = kernel_setup(letters, arrays)
    attrs.update(transpose_a=ta, transpose_b=tb)
    kernel = check_against_tf(
        "matmul", attrs, inputs,
        lambda xs, ws: tf.matmul(*tf_operands(arrays, xs, ws), transpose_a=ta, transpose_b=tb),
        params, rtol=1e-5, grad_rtol=1e-5)
    inner = shape_a[-2] if ta else shape_a[-1]
    assert kernel.flops_per_sample() == 2 * np.prod(kernel.output_shape) * inner
    assert kernel.param_shapes() == {role: v.shape for role, v in params.items()}


@pytest.mark.parametrize("letters, shapes, flags, message", [
    ("ii", [(5,), (5,)], {}, "would contract or transpose the batch axis"),
    ("ii", [(3, 5), (2, 5, 4)], {}, "different ranks would broadcast the batch axis"),
    ("ip", [(5,), (5, 4)], {"transpose_a": True}, "only the rows of the left operand"),
    ("pi", [(3, 5), (5,)], {}, "only the rows of the left operand"),
    ("ip", [(5,), (2, 5, 4)], {}, "only the rows of the left operand"),
    ("ip", [(3, 5), (2, 5, 4)], {}, "would broadcast against the batch axis"),
    ("ip", [(3, 5), (5,)], {}, "the weight needs rank >= 2"),
    ("ip", [(3, 5), (4, 4)], {}, "inner dimensions differ: 5"),
    ("ii", [(2, 3, 5), (3, 5, 4)], {}, "do not broadcast"),
    ("ic", [(3, 5), (5, 4)], {}, "attr 'c1' must hold it as a tensor"),
    ("pp", [(3, 5), (5, 4)], {}, "take 0 inputs"),
    ("ii", [(3, 5), (5, 4)], {"transpose_a": 1}, "bool attrs transpose_a, transpose_b"),
])
def test_matmul_refuses_products_across_samples_and_bad_shapes(letters, shapes, flags, message):
    attrs = {"operands": letters, **flags}
    inputs = []
    for k, (letter, shape) in enumerate(zip(letters, shapes)):
        if letter == "i":
            inputs.append(shape)
        elif letter == "p":
            attrs[f"p{k}"] = list(shape)
    with pytest.raises(KernelError, match="'bad_kernel'") as error:
        build_kernel("matmul", "bad_kernel", attrs, inputs)
    assert message in str(error.value)


def tf_matmul_per_sample(arrays, ta, tb, batch=3):
    """TF's full-batch product of `arrays` ((letter, value), activations batch first) if it
    is computed per sample: batch first, each sample's row equal to that sample alone."""
    def product(values):
        try:
            return tf.matmul(*values, transpose_a=ta, transpose_b=tb).numpy()
        except (tf.errors.InvalidArgumentError, ValueError):
            return None

    whole = product([v[:batch] if letter == "i" else v for letter, v in arrays])
    if whole is None or whole.ndim == 0 or whole.shape[0] != batch:
        return None
    for b in range(batch):
        alone = product([v[b:b + 1] if letter == "i" else v for letter, v in arrays])
        if alone is None or alone.shape != (1, *whole.shape[1:]) or \
                not np.allclose(alone[0], whole[b], rtol=1e-5, atol=1e-5):
            return None
    return whole


def described(arrays) -> str:
    return ", ".join(f"{letter} {v.shape}" for letter, v in arrays)


@st.composite
def matmul_layouts(draw):
    """Operands whose matrices mostly fit (rows r, inner n, columns k), activations of
    per-sample rank 0 to 4 (rank 1: only the matrix's last axis, the rows are samples),
    weights and constants with 0 to 3 leading axes, transposes."""
    letters = draw(st.sampled_from(["ii", "ip", "pi", "ic", "ci"]))
    ta, tb = draw(st.booleans()), draw(st.booleans())
    r, n, k = (draw(st.integers(1, 4)) for _ in range(3))
    arrays = []
    for position, letter in enumerate(letters):
        matrix = [(r, n), (n, k)][position]
        if (ta, tb)[position]:
            matrix = matrix[::-1]
        form = draw(st.sampled_from(["matrix", "matrix", "last axis", "scalar"])) \
            if letter == "i" else "matrix"
        lead = draw(st.lists(st.integers(1, 3), max_size=2 if letter == "i" else 3))
        shape = {"matrix": (*lead, *matrix), "last axis": matrix[-1:], "scalar": ()}[form]
        arrays.append((letter, randn(BATCH, *shape) if letter == "i" else randn(*shape)))
    return letters, arrays, ta, tb


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(matmul_layouts())
# a transposed [batch, r] against a 1-row weight: shapes that fit, samples that would mix
@example(("ip", [("i", randn(BATCH, 2)), ("p", randn(1, 4))], True, False))
@example(("pi", [("p", randn(3, 1)), ("i", randn(BATCH, 4))], False, True))
def test_matmul_accepts_exactly_the_per_sample_products_and_computes_tfs(layout):
    """Sound and general: the kernel builds iff TF's product is computed sample by sample
    (checked on TF itself), and then its values and gradients are TF's."""
    letters, arrays, ta, tb = layout
    attrs, params = kernel_setup(letters, arrays)
    attrs.update(transpose_a=ta, transpose_b=tb)
    inputs = [v for letter, v in arrays if letter == "i"]
    expected = tf_matmul_per_sample(arrays, ta, tb)
    try:
        build_kernel("matmul", "k1", attrs, [a.shape[1:] for a in inputs])
    except KernelError:
        assert expected is None, f"refused a per-sample product of {described(arrays)}"
        return
    assert expected is not None, f"accepted a product mixing samples: {described(arrays)}"
    check_against_tf(
        "matmul", attrs, inputs,
        lambda xs, ws: tf.matmul(*tf_operands(arrays, xs, ws), transpose_a=ta, transpose_b=tb),
        # weight gradients sum over the batch in micro-batches, TF in one GEMM: a sum that
        # cancels is a few float32 ULP of its summands apart (a wrong product is off by O(1))
        params, rtol=1e-5, grad_rtol=1e-4)


# ---- transpose, slice, pad ----
def test_transpose_matches_tensorflow_and_passes_integers_through():
    x = randn(BATCH, 3, 4, 5)
    check_against_tf("transpose", {"perm": [2, 0, 1]}, [x],
                     lambda xs, ws: tf.transpose(xs[0], [0, 3, 1, 2]))
    ids = RNG.integers(0, 9, (BATCH, 2, 3))
    out, _, _ = run_kernel("transpose", {"perm": [1, 0]}, [ids])
    np.testing.assert_array_equal(out, np.swapaxes(ids, 1, 2))
    kernel = build_kernel("transpose", "k1", {"perm": [1, 0]}, [(2, 3)])
    assert kernel.output_dtype([np.dtype(np.int64)]) == np.int64


# attrs (per sample), the same slice written on the batch array as a TF user writes it
SLICES = [
    ({"begin": [1, 0, 0], "end": [3, 4, 5], "strides": [1, 1, 1]}, lambda t: t[:, 1:3]),
    ({"begin": [0, 1, 2], "end": [3, 4, 3], "strides": [2, 2, 1], "shrink": [2]},
     lambda t: t[:, ::2, 1::2, 2]),
    ({"begin": [2, 3, 0], "end": [-1, 0, 5], "strides": [-1, -2, 1]}, lambda t: t[:, ::-1, 3:0:-2]),
    ({"begin": [0, 2, 0], "end": [3, 3, 5], "strides": [1, 1, 2], "shrink": [1]},
     lambda t: t[:, :, 2, ::2]),
    ({"begin": [2, 0, 0], "end": [2, 4, 5], "strides": [1, 1, 1]}, lambda t: t[:, 2:2]),  # empty
]


@pytest.mark.parametrize("case", range(len(SLICES)))
def test_slice_matches_tensorflows_strided_slice(case):
    attrs, tf_slice = SLICES[case]
    check_against_tf("slice", attrs, [randn(BATCH, 3, 4, 5)], lambda xs, ws: tf_slice(xs[0]))


@pytest.mark.parametrize("paddings, value", [([1, 0, 0, 2, 0, 0], 0.0), ([0, 0, 3, 1, 2, 2], -1.5)])
def test_pad_matches_tensorflow(paddings, value):
    pairs = [[0, 0]] + [paddings[i:i + 2] for i in range(0, len(paddings), 2)]
    check_against_tf("pad", {"paddings": paddings, "value": value}, [randn(BATCH, 3, 4, 5)],
                     lambda xs, ws: tf.pad(xs[0], pairs, constant_values=value))


def test_pad_of_integer_ids_keeps_their_dtype():
    ids = RNG.integers(1, 9, (BATCH, 4))
    out, _, _ = run_kernel("pad", {"paddings": [0, 3]}, [ids])
    np.testing.assert_array_equal(out, tf.pad(ids, [[0, 0], [0, 3]]).numpy())
    assert out.dtype == ids.dtype


# ---- top_k ----
@pytest.mark.parametrize("k", [1, 3, 6])
def test_top_k_matches_tensorflow_with_ties_lower_index_first(k):
    x = np.round(randn(BATCH, 4, 6))  # many equal values: TF takes the lower index first
    x[0, 0] = 1.0
    check_against_tf("top_k", {"k": k}, [x], lambda xs, ws: tf.math.top_k(xs[0], k=k).values)
    indices, _, _ = run_kernel("top_k", {"k": k, "indices": True}, [x])
    np.testing.assert_array_equal(indices, tf.math.top_k(x, k=k).indices.numpy())
    assert indices.dtype == np.int32


@pytest.mark.parametrize("k, shape", [(0, (4,)), (5, (4,)), (2, ())])
def test_top_k_refuses_a_k_outside_the_last_axis(k, shape):
    with pytest.raises(KernelError, match="top_k"):
        build_kernel("top_k", "k1", {"k": k}, [shape])


# ---- arg_reduce ----
# Rows where TF's CPU rule shows: ties (the first index), NaN never chosen, all NaN, -inf and
# the dtype's lowest value never beyond the start (index 0), float16's lowest (-65504).
EDGES = [[1, 3, 3, 2], [np.nan, 1, 2, 2], [1, np.nan, 5, 5], [np.nan] * 4, [-np.inf] * 4,
         [np.inf, 1, np.inf, np.nan], [np.nan, -np.inf, -np.inf, -3.4e38],
         [np.nan, -65504, -np.inf, np.nan], [np.nan, 65504, np.inf, np.nan], [2, 2, np.nan, 2]]


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.int64, np.bool_])
@pytest.mark.parametrize("op", ["max", "min"])
def test_arg_reduce_matches_tensorflow_with_ties_and_nan(op, dtype):
    x = np.array(EDGES, np.float32)[:, None, :].repeat(3, 1)  # (10, 3, 4): axes 1 and 2
    x[:, 1] = np.round(randn(10, 4))  # ties
    x[:, 2] = x[:, 2, ::-1]
    if np.dtype(dtype).kind == "i":  # infinities as the dtype's extremes, NaN as 0
        info = np.iinfo(dtype)
        infinite, extremes = np.isinf(x), np.where(x > 0, info.max, info.min)
        x = np.clip(np.nan_to_num(x, nan=0, posinf=0, neginf=0), -1e5, 1e5).astype(dtype)
        x[infinite] = extremes[infinite]
    elif dtype == np.bool_:  # rows of all True and all False too
        x = np.nan_to_num(x, nan=0, posinf=1, neginf=0) > 0
    elif dtype == np.float16:
        with np.errstate(over="ignore"):  # -3.4e38: -inf
            x = x.astype(dtype).astype(np.float32)
    tf_x = x.astype(dtype)
    function = tf.argmax if op == "max" else tf.argmin
    for axis, tf_axis in ((0, 1), (1, 2), (1, -1)):
        for output in ("int32", "int64"):
            attrs = {"op": op, "axis": axis, "output": output, "half": dtype == np.float16}
            kernel = build_kernel("arg_reduce", "k1", attrs, [x.shape[1:]])
            assert kernel.output_dtype([x.dtype]) == np.dtype(output)
            assert not kernel.input_differentiable(0)
            found, _ = kernel.forward({}, [x], RunContext(training=True, batch_size=len(x)))
            want = function(tf_x, tf_axis, output_type=output).numpy()
            np.testing.assert_array_equal(found, want, err_msg=f"axis {axis}, {output}")
            assert found.dtype == want.dtype and kernel.output_shape == want.shape[1:]


@pytest.mark.parametrize("attrs", [{"op": "max", "axis": 2}, {"op": "mean", "axis": 0},
                                   {"op": "min", "axis": 0, "output": "float32"}])
def test_arg_reduce_refuses_an_axis_outside_the_sample_or_another_op(attrs):
    with pytest.raises(KernelError, match="arg_reduce"):
        build_kernel("arg_reduce", "k1", attrs, [(3, 4)])


def test_is_finite_matches_tensorflow_and_takes_no_gradient():
    x = randn(BATCH, 5)
    x[0, :3] = [np.inf, -np.inf, np.nan]
    out, grads, _ = run_kernel("is_finite", {}, [x], dy=np.ones_like(x))
    np.testing.assert_array_equal(out, tf.math.is_finite(x).numpy())
    assert out.dtype == np.bool_ and grads == [None]


# ---- gather ----
@pytest.mark.parametrize("table_shape, ids_shape, dtype", [
    ((10, 4), (3,), np.int32), ((10, 2, 3), (2, 2), np.int64), ((7, 5), (), np.int64)])
def test_gather_matches_tensorflows_lookup_and_sums_repeated_rows(table_shape, ids_shape, dtype):
    table = randn(*table_shape)
    ids = RNG.integers(0, 4, (BATCH, *ids_shape)).astype(dtype)  # rows 0-3, repeated
    ids.flat[0] = table_shape[0] - 1
    attrs = {"operands": "pi", "p0": list(table_shape)}
    kernel = build_kernel("gather", "k1", attrs, [ids_shape])
    assert kernel.output_dtype([np.dtype(dtype)]) == np.float32
    assert not kernel.input_differentiable(0)
    dy = randn(BATCH, *ids_shape, *table_shape[1:])
    out, (dids,), acc = run_kernel("gather", attrs, [ids], {"p0": table}, dy=dy)
    variable = tf.Variable(table)
    with tf.GradientTape() as tape:
        y = tf.nn.embedding_lookup(variable, ids)
    grad = tf.convert_to_tensor(tape.gradient(y, variable, output_gradients=dy)).numpy()
    np.testing.assert_array_equal(out, y.numpy())
    assert dids is None
    # added in order over both micro-batches: TF's UnsortedSegmentSum bit for bit
    np.testing.assert_array_equal(acc["p0"], grad)
    assert not np.any(acc["p0"][4:table_shape[0] - 1])  # untouched rows zero


@pytest.mark.parametrize("vocab, count", [(50, 300), (3, 300), (1000, 40)])
def test_scatter_add_adds_each_lookup_in_order_as_np_add_at(vocab, count):
    ids = RNG.integers(0, vocab, count)
    ids[: count // 3] = 1  # one row looked up far more often than the passes
    values, table = randn(count, 2, 3), randn(vocab, 2, 3)
    expected = table.copy()
    np.add.at(expected, ids, values)
    scatter_add(table, ids, values)
    np.testing.assert_array_equal(table, expected)


@pytest.mark.parametrize("bad", [-1, 10, 2 ** 40])
def test_gather_refuses_indices_outside_the_table_naming_the_kernel(bad):
    kernel = build_kernel("gather", "model/embedding", {"operands": "pi", "p0": [10, 4]}, [(3,)])
    ids = np.array([[1, 2, 3], [4, bad, 0]], np.int64)
    with pytest.raises(ValueError, match=rf"model/embedding: index {bad} is outside the table's "
                                         rf"10 rows \[0, 10\)"):
        kernel.forward({"p0": randn(10, 4)}, [ids], RunContext(training=True, batch_size=2))


@pytest.mark.parametrize("precision", ["float32", "float16"])
@pytest.mark.parametrize("rows, ids_shape, dtype", [
    ((7, 5), (4,), np.int32), ((6, 2, 3), (2, 12), np.int64)])
def test_sample_gather_matches_tensorflows_batch_dims_gather_and_gradient(rows, ids_shape, dtype,
                                                                        precision):
    """Each sample's own rows, bit for bit; the gradient of a repeated position (twice, and
    more often than scatter_add's passes) adds in TF's order, in float16 each sum rounded."""
    half = precision == "float16"
    x, dy = randn(BATCH, *rows), randn(BATCH, *ids_shape, *rows[1:])
    if half:
        x, dy = x.astype(np.float16).astype(np.float32), dy.astype(np.float16).astype(np.float32)
    ids = RNG.integers(0, rows[0], (BATCH, *ids_shape)).astype(dtype)
    ids.reshape(BATCH, -1)[0, :] = rows[0] - 1  # one sample's every index the same row
    ids.reshape(BATCH, -1)[1, 1] = ids.reshape(BATCH, -1)[1, 0]
    attrs = {"precision": "float16"} if half else {}
    kernel = build_kernel("sample_gather", "model/gather", attrs, [rows, ids_shape])
    assert kernel.output_dtype([np.dtype(np.float32), np.dtype(dtype)]) == np.float32
    assert kernel.input_differentiable(0) and not kernel.input_differentiable(1)
    ctx = RunContext(training=True, batch_size=BATCH)
    out, cache = kernel.forward({}, [x, ids], ctx)
    (dx, dids), _ = kernel.backward({}, cache, dy, ctx)
    tf_dtype = tf.float16 if half else tf.float32
    value = tf.constant(x, tf_dtype)
    with tf.GradientTape() as tape:
        tape.watch(value)
        y = tf.gather(value, ids, batch_dims=1)
    grad = tape.gradient(y, value, output_gradients=tf.constant(dy, tf_dtype))
    np.testing.assert_array_equal(out, y.numpy().astype(np.float32))
    np.testing.assert_array_equal(dx, tf.convert_to_tensor(grad).numpy().astype(np.float32))
    assert dids is None and out.shape == (BATCH, *kernel.output_shape)


@pytest.mark.parametrize("bad", [-1, 7])
def test_sample_gather_refuses_positions_outside_the_sample_naming_the_kernel(bad):
    kernel = build_kernel("sample_gather", "model/gather", {}, [(7, 4), (2,)])
    ids = np.array([[1, 2], [bad, 0]], np.int32)
    with pytest.raises(ValueError, match=rf"model/gather: index {bad} is outside each sample's 7 "
                                         rf"rows \[0, 7\)"):
        kernel.forward({}, [randn(2, 7, 4), ids], RunContext(training=True, batch_size=2))


# ---- batch norm with moving statistics ----
@pytest.mark.parametrize("scale, center", [(True, True), (False, False), (True, False)])
def test_batch_norm_inference_matches_keras(scale, center):
    layer = tf.keras.layers.BatchNormalization(epsilon=1e-3, scale=scale, center=center)
    layer.build((None, 3, 6))
    weights = {"mean": randn(6), "variance": randn(6, low=0.2, high=2.0)}
    if scale:
        weights["scale"] = randn(6)
    if center:
        weights["offset"] = randn(6)
    layer.set_weights([weights[k] for k in ("scale", "offset", "mean", "variance") if k in weights])
    x, dy = randn(BATCH, 3, 6), randn(BATCH, 3, 6)
    attrs = {"epsilon": 1e-3, "scale": scale, "center": center}
    kernel = build_kernel("batch_norm_inference", "k1", attrs, [(3, 6)])
    assert kernel.param_shapes() == {role: (6,) for role in weights}
    out, (dx,), acc = run_kernel("batch_norm_inference", attrs, [x], weights, dy=dy)
    xt = tf.constant(x)
    trained = [w for w in (layer.gamma, layer.beta) if w is not None]
    with tf.GradientTape() as tape:
        tape.watch(xt)
        y = layer(xt, training=False)
    grads = tape.gradient(y, [xt, *trained], output_gradients=dy)
    close(out, y.numpy())
    close(dx, grads[0].numpy())
    for role, grad in zip([r for r in ("scale", "offset") if r in weights], grads[1:]):
        close(acc[role], grad.numpy(), rtol=4e-6)
    assert np.isnan(acc["mean"]).all() and np.isnan(acc["variance"]).all()  # never written


def test_batch_norm_inference_fused_matches_fused_batch_norm():
    x, dy = randn(BATCH, 4, 4, 3), randn(BATCH, 4, 4, 3)
    weights = {"mean": randn(3), "variance": randn(3, low=0.2, high=2.0), "scale": randn(3),
               "offset": randn(3)}
    attrs = {"epsilon": 1e-3, "fused": True}
    out, (dx,), acc = run_kernel("batch_norm_inference", attrs, [x], weights, dy=dy)
    xt, gamma, beta = tf.constant(x), tf.Variable(weights["scale"]), tf.Variable(weights["offset"])
    with tf.GradientTape() as tape:
        tape.watch(xt)
        y = tf.compat.v1.nn.fused_batch_norm(xt, gamma, beta, weights["mean"], weights["variance"],
                                             epsilon=1e-3, is_training=False)[0]
    gx, gg, gb = tape.gradient(y, [xt, gamma, beta], output_gradients=dy)
    close(out, y.numpy())
    close(dx, gx.numpy())
    close(acc["scale"], gg.numpy(), rtol=4e-6)
    close(acc["offset"], gb.numpy(), rtol=4e-6)


@pytest.mark.parametrize("exclusive, reverse", [(False, False), (False, True), (True, False),
                                                (True, True)])
def test_cumulative_logsumexp_matches_tensorflow(exclusive, reverse):
    """TF's scan (an exclusive scan's first value -inf) and _CumulativeLogsumexpGrad, on
    values spread wide enough that a naive log(cumsum(exp)) would overflow."""
    x, dy = randn(BATCH, 3, 7) * np.float32(40), randn(BATCH, 3, 7)
    x[:, 0, 2] = x[:, 0, 3]  # a tie
    attrs = {"axis": 1, "exclusive": exclusive, "reverse": reverse}
    out, (dx,), _ = run_kernel("cumulative_logsumexp", attrs, [x], dy=dy)
    ref, (ref_dx,), _ = tf_grads(lambda xs, ws: tf.math.cumulative_logsumexp(
        xs[0], axis=2, exclusive=exclusive, reverse=reverse), [x], {}, dy)
    first = np.isneginf(ref)  # (an exclusive scan's first value)
    assert first.sum() == (BATCH * 3 if exclusive else 0)
    np.testing.assert_array_equal(np.isneginf(out), first)
    close(np.where(first, 0, out), np.where(first, 0, ref), rtol=2e-6)
    close(dx, ref_dx, rtol=4e-6)


# ---- refusals ----
@pytest.mark.parametrize("kernel_type, attrs, shapes, message", [
    ("reduce", {"op": "cumprod", "axes": [0]}, [(3,)], "unknown op 'cumprod'"),
    ("reduce", {"op": "sum", "axes": [1]}, [(3,)], "axes [1] are not distinct per-sample axes"),
    ("reduce", {"op": "sum", "axes": [0, 0]}, [(3,)], "not distinct"),
    ("reduce", {"op": "sum", "axes": 0}, [(3,)], "attr 'axes' must be a list"),
    ("reduce", {"op": "sum", "axes": [0], "keepdims": 1}, [(3,)], "keepdims must be a bool"),
    ("reduce", {"op": "sum", "axes": [0]}, [(3,), (3,)], "takes 1 input"),
    ("softmax", {"axis": 2}, [(3, 4)], "needs a per-sample axis"),
    ("softmax", {"axis": -1}, [()], "needs a per-sample axis"),
    ("softmax", {"axis": -1, "log": "yes"}, [(3,)], "bool attr log"),
    ("transpose", {"perm": [0, 0]}, [(3, 4)], "not a permutation"),
    ("transpose", {"perm": [1, 0]}, [(3, 4, 5)], "not a permutation"),
    ("slice", {"begin": [0], "end": [4], "strides": [1]}, [(3,)], "not resolved bounds"),
    ("slice", {"begin": [0], "end": [2], "strides": [0]}, [(3,)], "not resolved bounds"),
    ("slice", {"begin": [0], "end": [3], "strides": [1], "shrink": [0]}, [(3,)],
     "sliced to one element"),
    ("slice", {"begin": [0, 0], "end": [3], "strides": [1]}, [(3, 4)], "a list of 2 ints"),
    ("pad", {"paddings": [1, 1]}, [(3, 4)], "a list of 4 ints"),
    ("pad", {"paddings": [-1, 0]}, [(3,)], "must be >= 0"),
    ("gather", {"operands": "ip", "p1": [10, 4]}, [(3,)], "operands must be 'pi'"),
    ("gather", {"operands": "pi", "p0": []}, [(3,)], "at least one axis with rows"),
    ("batch_norm_inference", {}, [(3,)], "a number attr epsilon"),
    ("batch_norm_inference", {"epsilon": 1e-3, "scale": 1}, [(3,)], "bool attrs scale"),
    ("batch_norm_inference", {"epsilon": 1e-3}, [()], "channels last"),
])
def test_kernels_refuse_what_they_cannot_do_naming_the_kernel(kernel_type, attrs, shapes, message):
    with pytest.raises(KernelError, match="'bad_kernel'") as error:
        build_kernel(kernel_type, "bad_kernel", attrs, shapes)
    assert message in str(error.value)


@pytest.mark.parametrize("kernel_type, attrs, shapes, dtypes, message", [
    ("reduce", {"op": "mean", "axes": [0]}, [(3,)], ["int32"], "it takes float32"),
    ("softmax", {}, [(3,)], ["int64"], "it takes float32"),
    ("gather", {"operands": "pi", "p0": [4, 2]}, [(3,)], ["float32"], "it takes int32 or int64"),
    ("matmul", {"operands": "ii"}, [(2, 3), (3, 2)], ["int32", "int32"], "it takes float32"),
    ("pad", {"paddings": [0, 1]}, [(3,)], ["bool"], "it takes float32 or int32 or int64"),
])
def test_kernels_refuse_dtypes_they_cannot_take(kernel_type, attrs, shapes, dtypes, message):
    kernel = build_kernel(kernel_type, "bad_kernel", attrs, shapes)
    with pytest.raises(KernelError, match="'bad_kernel'") as error:
        kernel.output_dtype([np.dtype(d) for d in dtypes])
    assert message in str(error.value)


# ---- through the pipeline ----
def train(message, weights, batches):
    """The pipeline's losses and state after one training step per batch."""
    checked = check_program(message)
    pipeline = Pipeline.load(checked, check_state(checked, weights))
    try:
        losses = [pipeline.run(b, training=True, step=s).loss for s, b in enumerate(batches)]
        return losses, pipeline.state()
    finally:
        pipeline.close()


def test_attention_over_an_embedding_trains_through_the_pipeline_as_tensorflow():
    """Token ids -> embedding -> self-attention scores (q k^T) -> softmax -> mixing ->
    projection by a weight -> mean over the sequence -> squared error; one SGD step of the
    pipeline (micro-batches accumulated) equals TF's on the whole batch."""
    seq, vocab, dim = 5, 11, 4
    message = program([
        ("emb", "gather", ["ids"], {"operands": "pi", "p0": [vocab, dim]}, (seq, dim)),
        ("scores", "matmul", ["emb", "emb"], {"operands": "ii", "transpose_b": True}, (seq, seq)),
        ("probs", "softmax", ["scores"], {"axis": -1}, (seq, seq)),
        ("mixed", "matmul", ["probs", "emb"], {"operands": "ii"}, (seq, dim)),
        ("proj", "matmul", ["mixed"], {"operands": "ip", "p1": [dim, 1]}, (seq, 1)),
        ("pooled", "reduce", ["proj"], {"op": "mean", "axes": [0, 1]}, ()),
        ("error", "binary", ["pooled", "labels"],
         {"op": "squared_difference", "operands": "ii"}, ()),
        ("loss", "loss", ["error"], {"scale": 1.0 / BATCH}, ()),
    ], inputs=(("ids", "int32", (seq,)), ("labels", "float32", ())))
    message.kernels[0].params.add(role="p0", variable="table", shape=[vocab, dim], dtype=1)
    message.kernels[4].params.add(role="p1", variable="w", shape=[dim, 1], dtype=1)
    message.loss_kernel = "loss"
    message.optimizer.type, message.optimizer.learning_rate = "sgd", 0.1
    table0, w0 = randn(vocab, dim), randn(dim, 1)
    ids = RNG.integers(0, vocab - 3, (BATCH, seq)).astype(np.int32)
    labels = randn(BATCH)
    (loss_cs,), state = train(message, {"table": table0, "w": w0}, [{"ids": ids, "labels": labels}])
    table, w = tf.Variable(table0), tf.Variable(w0)
    with tf.GradientTape() as tape:
        e = tf.nn.embedding_lookup(table, ids)
        mixed = tf.matmul(tf.nn.softmax(tf.matmul(e, e, transpose_b=True)), e)
        pooled = tf.reduce_mean(tf.matmul(mixed, w), axis=[1, 2])
        loss = tf.reduce_mean(tf.math.squared_difference(pooled, labels))
    g_table, g_w = tape.gradient(loss, [table, w])
    assert loss_cs == pytest.approx(float(loss), rel=1e-5)
    close(state["table"], table0 - np.float32(0.1) * tf.convert_to_tensor(g_table).numpy(), 1e-5)
    close(state["w"], w0 - np.float32(0.1) * g_w.numpy(), 1e-5)
    # rows never looked up do not move
    np.testing.assert_array_equal(state["table"][vocab - 3:], table0[vocab - 3:])


# ---- pooling ----
@pytest.mark.parametrize("kind", ["max_pool", "avg_pool"])
@pytest.mark.parametrize("pool, strides, padding", [((2, 2), (2, 2), "VALID"), ((3, 3), (1, 1), "SAME"),
                                                    ((2, 3), (2, 1), "SAME"), ((3, 2), (2, 2), "VALID")])
def test_pooling_matches_tensorflow_with_ties_and_overlapping_windows(kind, pool, strides, padding):
    """Forward and input gradient as tf.nn.max_pool2d / avg_pool2d; max pooling's values are
    rounded so windows hold ties (TF routes the gradient to the first in row-major order)."""
    x = randn(BATCH, 7, 6, 3)
    if kind == "max_pool":
        x = np.round(x)
    tf_op = tf.nn.max_pool2d if kind == "max_pool" else tf.nn.avg_pool2d
    check_against_tf(kind, {"pool_size": list(pool), "strides": list(strides), "padding": padding},
                     [x], lambda xs, ws: tf_op(xs[0], pool, strides, padding))


def test_cumprod_gradient_is_zero_where_an_input_is_zero_as_tensorflows():
    """TF's _CumprodGrad divides by x with div_no_nan: 0 where x is 0 (a ReLU's zeros into
    tf.math.cumprod); the CS gave NaN there."""
    x, dy = randn(BATCH, 6), randn(BATCH, 6)
    x[:, 2] = 0
    out, (dx,), _ = run_kernel("cumprod", {"axis": 0, "exclusive": False, "reverse": False}, [x], dy=dy)
    ref, (ref_dx,), _ = tf_grads(lambda xs, ws: tf.math.cumprod(xs[0], axis=1), [x], {}, dy)
    close(out, ref, rtol=2e-6)
    assert np.all(dx[:, 2] == 0) and np.all(np.isfinite(dx))
    close(dx, ref_dx, rtol=4e-6)
