"""In-batch products: values of different samples meeting through a matmul over the batch
(two-tower retrieval with in-batch negatives, SimCLR/CLIP's InfoNCE), lowered onto batch
barriers (wafer.kernels.in_batch), and the batch statistics every sample reads (a sum or mean
over the batch axis: `statistic`): tf.matmul(q, d, transpose_b=True) of two per-sample
[B, n] values (a [B, B] value, row i sample i's), tf.matmul(p, v) of a per-sample [B, B]
value by a per-sample [B, n] one, and tf.transpose of a per-sample [B, B] value. Their
results are per-sample values like any other (row i goes with sample i), so what follows
(a temperature, softmax cross entropy against tf.range(B) or tf.eye(B), row reductions, more
layers) lowers as usual; the constants whose first axis is the batch become per-sample
constants (`sample_constant`)."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from coordinator.compiler import precision
from coordinator.compiler.operands import static_shape
from coordinator.compiler.rules import Context, TailContext, fast_path, generic, has_kernel
from wafer.kernels.elementwise import ARITHMETIC
from wafer.precision import widened

# The README's rows: kernel -> the TF ops it starts from.
KERNEL_ROWS = {
    "in_batch_matmul, batch_transpose": "MatMul of two per-sample [batch, n] values with "
                                        "transpose_b (tf.matmul(q, d, transpose_b=True), "
                                        "tf.matmul(q, tf.transpose(d)): in-batch negatives, "
                                        "contrastive losses), or of a per-sample "
                                        "[batch, batch] value by a per-sample [batch, n] one; "
                                        "Transpose of a per-sample [batch, batch] value (the "
                                        "symmetric loss's other direction): batch barriers, TF's "
                                        "numbers whatever the micro-batch size; constants whose "
                                        "first axis is the batch (tf.range(batch), tf.eye(batch) "
                                        "labels) give each sample its row; tf.linalg.diag_part "
                                        "(tensor_diag_part) of "
                                        "a per-sample [batch, batch] value (each sample's own "
                                        "entry: a sample_gather); tf.gather_nd(x, tf.stack("
                                        "[tf.range(batch), ids], 1)) of a per-sample x (each "
                                        "sample's own row: a sample_gather at ids); "
                                        "tf.gather_nd(x, ids, batch_dims=1) of a per-sample x "
                                        "at per-sample coordinates (the ConcatV2 of TF's batch "
                                        "index grid and GatherNd: a sample_gather of depth C)",
    "batch_row": "a per-sample float32 or integer value viewed with a leading axis of 1 "
                 "(sq[None, :], tf.expand_dims(x, 0), tf.reshape(x, [1, -1]), "
                 "tf.transpose(x[:, None]), e[None, :, :]) met, after element-wise ops of it and "
                 "scalar constants, by a per-sample value in an element-wise binary op or "
                 "comparison, or picked by a per-sample mask (tf.where(at_risk, r[None, :], "
                 "-inf): a Cox risk set) (pairwise distances sq[:, None] - 2 e e^T + sq[None, :], "
                 "tf.equal(labels[:, None], labels[None, :]): batch-hard triplet, SupCon, "
                 "contrastive pair losses): a batch barrier giving every sample the whole "
                 "batch's values, its gradient the sum over the batch of every sample's",
    "batch_reduce": "Sum, Mean, Max or Min over the batch axis alone of a per-sample value "
                    "(keepdims or not; tf.math.reduce_std / reduce_variance's and "
                    "tf.nn.moments' means) met, after element-wise ops of it and scalar "
                    "constants (+ eps, tf.sqrt), tf.stop_gradient and squeezes, by a "
                    "per-sample value in Add, Sub, Mul, RealDiv, DivNoNan, Maximum, Minimum or "
                    "SquaredDifference (a max or min only additively; centring "
                    "x - tf.reduce_mean(x, 0), standardising by the batch's std, DEC's target distribution q ** 2 / tf.reduce_sum(q, 0)): a "
                    "batch barrier giving every sample the whole batch's statistic, its "
                    "gradient the batch's sum (a max's or min's shared by ties, as TF's)",
}


def product(m: Context, op: tf.Operation, transpose_a: bool, transpose_b: bool) -> str:
    """MatMul of two per-sample rank-2 values: an in_batch_matmul kernel, or why not; of a
    per-sample [B, n] value by tf.transpose of one (tf.matmul(e, tf.transpose(e))), the
    product with transpose_b."""
    a, b = op.inputs
    ops = [op]
    if not m.is_batched(b) and not transpose_a and not transpose_b:
        ops, b, transpose_b = [b.op, op], b.op.inputs[0], True
    batch = m.batch_size
    shapes = static_shape(a), static_shape(b)
    if transpose_a or len(shapes[0]) != 2 or len(shapes[1]) != 2:
        return ("multiplies two per-sample matrices with the batch axis transposed away: the "
                "CS multiplies over the batch as tf.matmul(q, d, transpose_b=True) ([batch, n] x "
                "[n, batch]) or tf.matmul(p, v) ([batch, batch] x [batch, n])")
    if not transpose_b and shapes[0][1] != batch:
        return (f"multiplies a per-sample {list(shapes[0])} value by a per-sample "
                f"{list(shapes[1])} one: their product contracts a per-sample axis with the batch")
    if precision.tensor_precision(op.outputs[0]):
        return "an in-batch product in float16: the CS multiplies over the batch in float32"
    if not has_kernel("in_batch_matmul"):
        return "the CS has no in-batch product kernel"
    m.add_kernel(op.name, "in_batch_matmul", [a, b],
                 {"transpose_b": transpose_b, "batch_size": batch}, [], ops, op.outputs[0])
    return ""


def transposed_sample(m: Context, tensor: tf.Tensor) -> bool:
    """`tensor` is tf.transpose of a per-sample [B, n] value ([n, B])."""
    op = tensor.op
    perm = m.operands.constant(op.inputs[1]) if op.type == "Transpose" else None
    return perm is not None and [int(p) for p in perm] == [1, 0] and \
        m.is_batched(op.inputs[0]) and len(static_shape(op.inputs[0])) == 2


def transposed_operand(m: Context, op: tf.Operation) -> bool:
    """tf.transpose of a per-sample [B, n] value read only as the second operand of MatMuls
    of per-sample values (tf.matmul(e, tf.transpose(e))): no kernel of its own, each
    product takes the value with transpose_b (`product`; False: not one)."""
    out = op.outputs[0]
    readers = m.consumers(out)
    return transposed_sample(m, out) and bool(readers) and out.name not in m.protected and \
        all(r.type == "MatMul" and r.inputs[0] is not out and r.inputs[0].op in m.flow and
            not r.get_attr("transpose_a") and not r.get_attr("transpose_b") for r in readers)


def transpose(m: Context, op: tf.Operation, perm: np.ndarray | None) -> bool:
    """tf.transpose of a per-sample [B, B] value: a batch_transpose kernel (False: not one)."""
    x = op.inputs[0]
    batch = m.batch_size
    if perm is None or [int(p) for p in perm] != [1, 0] or not m.is_batched(x) or \
            static_shape(x) != (batch, batch) or x.dtype != tf.float32 or \
            not has_kernel("batch_transpose"):
        return False
    m.add_kernel(op.name, "batch_transpose", [x], {"batch_size": batch}, [], [op], op.outputs[0])
    return True


def statistic(m: TailContext, op: tf.Operation, axes: tuple[int, ...]) -> bool:
    """tf.reduce_{sum, mean, max, min} of a per-sample float32 value over the batch axis alone
    (keepdims or not) whose readers, after element-wise ops of it alone and scalar constants
    (+ eps, tf.sqrt), tf.stop_gradient and squeezes of its kept axis (tf.nn.moments'), pair
    it with a per-sample value of the reduced value's rank in an element-wise binary op
    (x - tf.reduce_mean(x, 0), DEC's q ** 2 / tf.reduce_sum(q, 0), (x - mean) / tf.sqrt(var
    + eps)): a batch_reduce barrier giving every sample the statistic, its element-wise ops
    per sample (False: not one; it stays a reduction of the loss, or is refused)."""
    x, out = op.inputs[0], op.outputs[0]
    if op.type not in STATISTICS or axes != (0,) or x.dtype != tf.float32 or m.folds(x) > 1 or \
            precision.tensor_precision(out) or not has_kernel("batch_reduce"):
        return False
    shape = m.shape(x)
    meetings = ADDITIVE if op.type in ("Max", "Min") else BINARY_READERS
    chain = _statistic_ops(m, out, shape, meetings)
    if chain is None:
        return False
    m.add_kernel(op.name, "batch_reduce", [x], {"op": op.type.lower(), "batch_size": m.batch_size},
                 [], [op], out, output_shape=shape)
    for step in sorted(chain, key=m.ops.index):
        _per_sample_step(m, step, shape)
    return True


def _statistic_ops(m: Context, value: tf.Tensor, shape: tuple[int, ...],
                   meetings: tuple[str, ...]) -> set[tf.Operation] | None:
    """The ops of the statistic `value` alone (element-wise with scalar constants,
    stop_gradient, views dropping or adding its kept axis) before it meets per-sample values
    in one of `meetings`, or None if a reader is neither one nor such a meeting."""
    from coordinator.compiler.lowering import BINARY, UNARY
    readers = m.consumers(value)
    if not readers or value.name in m.protected:
        return None
    found: set[tf.Operation] = set()
    for reader in readers:
        result = reader.outputs[0]
        others = [t for t in reader.inputs if t.name != value.name]
        if _meets_samples(m, reader, others, len(shape) + 1, meetings):
            continue
        if reader.type in VIEWS:
            own = static_shape(result) in (shape, (1, *shape))
        elif reader.type in UNARY or reader.type == "StopGradient":
            own = not others and result.shape == value.shape
        else:
            scalar = m.operands.constant(others[0]) if len(others) == 1 else None
            own = reader.type in BINARY and BINARY[reader.type] in ARITHMETIC and \
                scalar is not None and scalar.size == 1 and result.shape == value.shape
        after = _statistic_ops(m, result, shape, meetings) \
            if own and not precision.tensor_precision(result) else None
        if after is None:
            return None
        found |= {reader, *after}
    return found


def _meets_samples(m: Context, reader: tf.Operation, others: list[tf.Tensor], rank: int,
                   meetings: tuple[str, ...]) -> bool:
    """An element-wise binary op (one of `meetings`) of the statistic and a per-sample value
    of `rank`, or tf.where of such a value as the mask, the statistic and a scalar constant."""
    if reader.type not in meetings or len(others) != (2 if reader.type == "SelectV2" else 1):
        return False
    if reader.type == "SelectV2":  # tf.where(a per-sample mask, the row, a scalar constant)
        constant = m.operands.constant(others[1])
        if reader.inputs[0] is not others[0] or constant is None or constant.size != 1:
            return False
    other = others[0]
    return other.op in m.flow and len(static_shape(other)) == rank and \
        static_shape(other)[0] == m.batch_size and \
        static_shape(reader.outputs[0])[:1] == (m.batch_size,)


def _per_sample_step(m: Context, op: tf.Operation, shape: tuple[int, ...]) -> None:
    """An op of a statistic alone (and a scalar constant): every sample's copy."""
    from coordinator.compiler.lowering import BINARY, UNARY
    if op.type in VIEWS:
        m.alias(op, op.inputs[0])
    elif op.type == "StopGradient":
        m.add_kernel(op.name, "stop_gradient", [op.inputs[0]], {}, [], [op], op.outputs[0],
                     output_shape=shape)
    elif op.type in UNARY:
        attrs: dict = {"function": UNARY[op.type]}
        if op.type == "LeakyRelu":
            attrs["alpha"] = float(op.get_attr("alpha"))
        m.add_kernel(op.name, "activation", [op.inputs[0]], attrs, [], [op], op.outputs[0],
                     output_shape=shape)
    else:
        k = 0 if m.is_batched(op.inputs[1]) else 1
        value = np.asarray(m.operands.constant(op.inputs[k]), np.float32).reshape(())
        m.add_kernel(op.name, "binary", [op.inputs[1 - k]],
                     {"op": BINARY[op.type], "operands": "ci" if k == 0 else "ic", f"c{k}": value},
                     [], [op], op.outputs[0], output_shape=shape)


# Views of a statistic that drop or add its kept batch axis (tf.nn.moments' squeeze).
VIEWS = ("Squeeze", "Reshape", "ExpandDims", "Identity")
STATISTICS = ("Sum", "Mean", "Max", "Min")
# The element-wise binary ops a batch statistic may meet a per-sample value in; a max or min
# only additively: h / max(h) is 1 for the sample that is the max whatever it is, so its
# gradient there is a cancellation, g / m - g h / m^2, that TF and the CS both compute as
# rounding noise (and Adam amplifies).
ADDITIVE = ("Add", "AddV2", "Sub", "Maximum", "Minimum", "SquaredDifference")
BINARY_READERS = (*ADDITIVE, "Mul", "RealDiv", "Div", "DivNoNan")
COMPARISONS = ("Equal", "NotEqual", "Greater", "GreaterEqual", "Less", "LessEqual")
ROW_MEETINGS = (*BINARY_READERS, *COMPARISONS, "SelectV2")
# Ops whose second input is the labels of the first's samples (rank one less: sparse).
LABELLED = ("SparseSoftmaxCrossEntropyWithLogits", "SoftmaxCrossEntropyWithLogits")
# Besides the element-wise binary ops: the ops pairing a constant's rows with the samples.
PAIRING = ("Select", "SelectV2", "ConcatV2", *LABELLED)
# A sample_constant's dtypes: a float16 constant (a tiled grid cast to a mixed_float16
# model's activations) is held as every float16 value is, float32 holding its values exactly.
SAMPLE_CONSTANT_DTYPES = (tf.float32, tf.float16, tf.int32, tf.int64, tf.bool)


def folded_labels(m: Context, op: tf.Operation) -> np.ndarray | None:
    """The constant labels [B*k, ...] of a cross-entropy (LABELLED) of logits folded k rows a
    sample, sample-major (RotNet's tf.tile(tf.range(4), [B]) of its stacked rotations) as each
    sample's rows [B, k, ...]: TF pairs row b*k + j with logits row b*k + j, sample b's j-th;
    else None."""
    if op.type not in LABELLED or not m.is_batched(op.inputs[0]) or m.is_batched(op.inputs[1]):
        return None
    k, labels = m.folds(op.inputs[0]), op.inputs[1]
    value = m.operands.constant(labels) if labels.dtype.base_dtype in \
        SAMPLE_CONSTANT_DTYPES else None
    if k == 1 or value is None or value.ndim == 0 or value.shape[0] != k * m.batch_size:
        return None
    return np.asarray(value, labels.dtype.base_dtype.as_numpy_dtype).reshape(
        m.batch_size, k, *value.shape[1:])


def sample_constants(m: Context, op: tf.Operation) -> None:
    """Constants among the inputs of an element-wise op (or one of PAIRING) whose first axis
    is the batch and whose rows differ (tf.range(B), tf.eye(B): the labels of in-batch
    negatives), read with per-sample values of the same rank (or as the labels of a cross
    entropy): each sample's row, as TF pairs them, from a sample_constant kernel. Rows all
    equal stay broadcast constants but in a concat (a hand-written recurrence's zero initial
    state, tf.zeros([tf.shape(x)[0], n]), concatenated with the step's input). The labels of
    folded logits are each sample's k rows (`folded_labels`)."""
    batched = [t for t in op.inputs if m.is_batched(t)]
    if not batched or not has_kernel("sample_constant"):
        return
    folded = folded_labels(m, op)
    if folded is not None:
        labels = op.inputs[1]
        m.add_kernel(f"{labels.op.name}/rows", "sample_constant", [m.sample_input()],
                     {"value": widened(folded)}, [], [labels.op], labels,
                     output_shape=folded.shape[1:])
        return
    rank = len(static_shape(batched[0]))
    for k, t in enumerate(op.inputs):
        if m.is_batched(t) or t.dtype.base_dtype not in SAMPLE_CONSTANT_DTYPES:
            continue
        value = m.operands.constant(t)
        labels = op.type in LABELLED and k == 1 and m.is_batched(op.inputs[0])
        if value is None or value.ndim == 0 or value.shape[0] != m.batch_size or \
                m.batch_size == 1 or (value == value[:1]).all() and op.type != "ConcatV2" or \
                value.ndim != (rank - 1 if labels and op.type.startswith("Sparse") else rank):
            continue
        m.add_kernel(f"{t.op.name}/rows", "sample_constant", [m.sample_input()],
                     {"value": widened(np.asarray(value, t.dtype.base_dtype.as_numpy_dtype))},
                     [], [t.op], t)


@generic("MatrixDiagPartV3", "MatrixDiagPart", "DiagPart")
def diagonal(m: Context, op: tf.Operation) -> str:
    """tf.linalg.diag_part (tf.linalg.tensor_diag_part) of a per-sample [B, B] value (the
    positives of in-batch logits): sample i's entry i, a sample_gather at per-sample indices
    tf.range(B)."""
    x = op.inputs[0]
    batch = m.batch_size
    offset = m.operands.constant(op.inputs[1]) if op.type == "MatrixDiagPartV3" else 0
    if not m.is_batched(x) or static_shape(x) != (batch, batch) or offset is None or \
            np.any(offset != 0):
        return ("takes a diagonal of a value other than the main diagonal of a per-sample "
                "[batch, batch] one (in-batch logits)")
    if not has_kernel("sample_gather"):
        return "the CS has no sample_gather kernel"
    ids = m.add_kernel(f"{op.name}/rows", "sample_constant", [m.sample_input()],
                       {"value": np.arange(batch, dtype=np.int32)}, [], [op], None, output_shape=())
    m.add_kernel(op.name, "sample_gather", [x, ids.name], {}, [], [op], op.outputs[0])
    return ""


def row(m: TailContext, op: tf.Operation) -> bool:
    """A per-sample float32 or integer value viewed with a leading axis of 1 (`sq[None, :]`,
    tf.expand_dims(x, 0), tf.reshape(x, [1, -1]), tf.transpose(x[:, None]), `labels[None,
    :]`) whose readers, after element-wise ops of it alone and scalar constants, meet a
    per-sample value in an element-wise binary op or comparison (sq[:, None] - 2 e e^T +
    sq[None, :], tf.equal(labels[:, None], labels[None, :])) or are picked by a per-sample
    mask against a scalar constant (tf.where(at_risk, r[None, :], -inf)): a batch_row barrier giving
    every sample the whole batch's values (False: not one; it is refused)."""
    shape = row_shape(m, op)
    out = op.outputs[0]
    if shape is None or not has_kernel("batch_row"):
        return False
    floating = out.dtype == tf.float32
    chain = _statistic_ops(m, out, shape, ROW_MEETINGS if floating else COMPARISONS)
    if chain is None or not floating and any(step.type not in VIEWS for step in chain):
        return False
    m.add_kernel(op.name, "batch_row", [op.inputs[0]],
                 {"shape": list(shape), "batch_size": m.batch_size}, [], [op], out,
                 output_shape=shape)
    for step in sorted(chain, key=m.ops.index):
        _per_sample_step(m, step, shape)
    return True


def row_refusal(m: Context, op: tf.Operation) -> str:
    """Why a view of a per-sample value as a row of the batch (`row`'s) is refused ("" if
    `op` is no such view)."""
    if row_shape(m, op) is None:
        return ""
    if op.outputs[0].name in m.protected:
        return ("views a per-sample value as a row of the whole batch (a leading axis of 1) "
                "that the host reads (a metric, prediction or host_call of the row itself): "
                "the CS gives each sample the batch's row; give the host the per-sample value "
                "instead (tf.compat.v1.metrics.mean(x), not of x[None, :])")
    return ("views a per-sample value as a row of the whole batch (a leading axis of 1) that "
            "no element-wise op pairs with per-sample values: the CS gives each sample the "
            "batch's row only to meet the sample's own values, as in sq[:, None] + sq[None, :] "
            "or tf.equal(labels[:, None], labels[None, :]); reduce over the batch in the loss "
            "instead (tf.reduce_sum(x))")


def row_shape(m: Context, op: tf.Operation) -> tuple[int, ...] | None:
    """The per-sample shape of `op`'s output if it is its per-sample input laid out whole with
    a leading axis of 1 ((1, B, ...): a view adding a unit axis before the batch, a reshape,
    a transpose keeping the order of the non-unit axes); else None."""
    from coordinator.compiler.lowering import slice_bounds
    if op.type not in ("StridedSlice", "ExpandDims", "Reshape", "Transpose") or \
            not op.inputs or not m.is_batched(op.inputs[0]):
        return None
    x, out = op.inputs[0], op.outputs[0]
    source, shape = static_shape(x), static_shape(out)
    if out.dtype not in (tf.float32, tf.int32, tf.int64) or len(shape) < 2 or shape[0] != 1 or \
            shape[1] != m.batch_size or np.prod(shape) != np.prod(source) or \
            precision.tensor_precision(out):
        return None
    spec: list[np.ndarray] = []
    for t in op.inputs[1:]:
        value = m.operands.constant(t)
        if value is None:
            return None
        spec.append(value)
    if op.type == "StridedSlice" and (not op.get_attr("new_axis_mask") & 1 or any(
            b != (0, size, 1, False)
            for b, size in zip(slice_bounds(op, spec[0], spec[1], spec[2]), source))):
        return None
    if op.type == "ExpandDims" and int(spec[0]) % len(shape) != 0:
        return None
    if op.type == "Transpose":
        moved = [int(p) for p in spec[0] if source[int(p)] != 1]
        if moved != sorted(moved):
            return None
    return shape[1:]


@fast_path
def own_rows(m: Context, op: tf.Operation) -> bool:
    """tf.gather_nd(x, tf.stack([rows, i1, ..., ir], -1)) of a per-sample x at per-sample
    integer coordinates whose first column `rows` is the constant batch index (tf.range(B),
    tiled along the coordinates' other axes: a DQN's Q(s, a) written the other way, a spatial
    transformer's bilinear sampler): sample b's own x at its own coordinates, tf.gather(x,
    ids, batch_dims=1) for r = 1; the Pack and GatherNd become one sample_gather (attr
    depth r)."""
    gather = m.sole_consumer(op.outputs[0]) if op.type == "Pack" and len(op.inputs) >= 2 \
        and op.get_attr("axis") in (len(static_shape(op.inputs[0])), -1) else None
    if gather is None or gather.type != "GatherNd" or gather.inputs[1] is not op.outputs[0] or \
            not has_kernel("sample_gather"):
        return False
    rows, *ids = op.inputs
    x = gather.inputs[0]
    positions = m.operands.constant(rows)
    own = np.arange(m.batch_size).reshape((-1,) + (1,) * (len(static_shape(rows)) - 1))
    if positions is not None and m.is_batched(x) and (
            positions.shape[:1] != (m.batch_size,) or not np.array_equal(positions, np.broadcast_to(own, positions.shape))):
        m.reject(op, "tf.gather_nd(x, tf.stack([rows, ids], -1)) with constant rows other than "
                     "tf.range(batch) picks other samples' values: the CS computes each sample "
                     "on its own (tf.range(batch) picks each sample's own: tf.gather(x, ids, "
                     "batch_dims=1))")
        return True
    shape = static_shape(rows)
    if positions is None or not m.is_batched(x) or len(static_shape(x)) < 1 + len(ids) \
            or m.value(x) is None or any(not m.is_batched(t) or not t.dtype.is_integer
                                         or static_shape(t) != shape for t in ids):
        return False
    if len(ids) == 1:
        m.add_kernel(gather.name, "sample_gather", [x, ids[0]], {}, [], [op, gather], gather.outputs[0])
        return True
    unit = (*shape[1:], 1)
    columns: list[tf.Tensor | str] = [
        m.add_kernel(f"{op.name}/expand_{k}", "reshape", [t], {"shape": list(unit)}, [], [], None,
                     output_shape=unit, source_op=op).name for k, t in enumerate(ids)]
    coordinates = m.add_kernel(op.name, "concat", columns, {"axis": len(unit) - 1}, [], [], None,
                               output_shape=(*shape[1:], len(ids)), source_op=op)
    m.add_kernel(gather.name, "sample_gather", [x, coordinates.name], {"depth": len(ids)}, [],
                 [op, gather], gather.outputs[0])
    return True


@fast_path
def own_grid(m: Context, op: tf.Operation) -> bool:
    """tf.gather_nd(x, ids, batch_dims=1) of a per-sample x at per-sample coordinates ids
    (..., C) (a QR-DQN's taken action's quantiles, tf.gather_nd(z, actions[:, None],
    batch_dims=1)): TF's batch_gather_nd concatenates the batch index grid (tf.range(B)
    tiled over the ids' axes) before the ids; when the grid is, evaluated, exactly that, the
    ConcatV2 and GatherNd become one sample_gather at the ids (attr depth C; C = 1: the ids'
    last axis reshaped away)."""
    gather = m.sole_consumer(op.outputs[0]) if op.type == "ConcatV2" and len(op.inputs) == 3 else None
    if gather is None or gather.type != "GatherNd" or gather.inputs[1] is not op.outputs[0] or \
            not has_kernel("sample_gather"):
        return False
    grid, ids, x = op.inputs[0], op.inputs[1], gather.inputs[0]
    axis, positions = m.operands.constant(op.inputs[2]), m.operands.constant(grid)
    shape = static_shape(ids)
    if axis is None or int(axis) % len(shape) != len(shape) - 1 or positions is None or \
            not m.is_batched(x) or m.value(x) is None or not m.is_batched(ids) or \
            not ids.dtype.is_integer or len(static_shape(x)) < 1 + shape[-1]:
        return False
    own = np.arange(m.batch_size).reshape((-1,) + (1,) * (len(shape) - 1))
    if positions.shape != (*shape[:-1], 1) or not np.array_equal(positions, np.broadcast_to(own, positions.shape)):
        return False  # (other samples' rows: the GatherNd's refusal)
    depth = shape[-1]
    if depth > 1:
        m.add_kernel(gather.name, "sample_gather", [x, ids], {"depth": depth}, [], [op, gather],
                     gather.outputs[0])
        return True
    column = m.add_kernel(f"{op.name}/squeeze", "reshape", [ids], {"shape": list(shape[1:-1])}, [],
                          [], None, output_shape=shape[1:-1], source_op=op)
    m.add_kernel(gather.name, "sample_gather", [x, column.name], {}, [], [op, gather],
                 gather.outputs[0])
    return True
