"""Per-sample axes folded into the batch: tf.reshape(bags, [-1, d]) of a per-sample [B, k, d]
value (a bag's instances, a sequence's steps) is [B*k, d], whose rows b*k .. b*k+k-1 are
sample b's. The CS carries it as the per-sample value (k, d) (`Matcher.folds`: its static
first axis B*k, its per-sample shape (k, ...)); an op that computes row by row keeps that, so
it lowers on (k, ...) as it would on [B, k, ...], and a reshape whose first axis is a multiple
of the batch (back to [B, k, ...], or on to [B*k', ...]) is a per-sample reshape of each
sample's contiguous elements; a Conv2D of folded frames is the conv2d kernel on each
sample's (k, H, W, C), a MaxPool or AvgPool of them the pooling kernel pooling each of the
k images on its own (a Temporal Shift Module's frames), Conv3D, MaxPool3D and AvgPool3D of
folded clips likewise on each sample's (k, D, H, W, C); tf.random.categorical of folded logits [B*k, classes] (ELECTRA's
replacement tokens) is the categorical kernel drawing each of a sample's k rows; an Embedding's lookup of folded ids is the gather kernel on each
sample's (k, ...) ids, and Keras' unrolled recurrent layers per folded row (a hierarchical
attention network's word encoder) lower as on [B, k, ...] with their axes on each sample's
(k, ...) (`Context.axis_shift`), a zero first state's equal rows broadcast along the rows.
An einsum keeping the folded axis a batch letter (Keras MultiHeadAttention over [B*C, P, d])
is the einsum kernel under a fresh batch letter, a batch matmul of two values folded alike
(Swin's window attention, q @ k^T of [B*nW, heads, n, d] windows) the matmul kernel on each
sample's (nW, heads, n, d); argmax, argmin, top_k, one_hot and
constant-index gathers (tf.signal.frame) along a row's own axes, a softmax cross-entropy per
row (its labels a constant of the folded rows' order too: RotNet's tf.tile(tf.range(4), [B]))
and the loss's sum or mean of every folded element (the loss tail's) are row by row too.
Ops that would mix the rows of different samples (a reduction over
the folded batch axis, a batch normalization, a 2-D matmul of two folded values, a weight or
constant laid along the folded axis) are refused naming the op, as are ops not proven row by
row and values the host reads while folded."""
from __future__ import annotations

from typing import Iterator

import numpy as np
import tensorflow as tf

from coordinator.compiler import value_selections
from coordinator.compiler.in_batch import folded_labels
from coordinator.compiler.lowering import BINARY, REDUCTIONS, RESHAPES, UNARY, slice_bounds
from coordinator.compiler.operands import static_shape
from coordinator.compiler.rules import Context, TailContext

# Ops computed row by row (their reductions and the softmax along a row's own axes).
ELEMENT_WISE = {*UNARY, *BINARY, "Select", "SelectV2", "Cast", "Identity", "StopGradient",
                "Snapshot", "Softmax", "LogSoftmax", "AddN", "OneHot"}
PRODUCTS = ("MatMul", "BatchMatMulV2", "BatchMatMulV3")
GATHERS = ("GatherV2", "ResourceGather")
# Pooling within each image or volume (its window never spans the batch axis:
# fast_paths.match_pool, lowering_spatial._volume).
POOLS = ("MaxPool", "AvgPool", "MaxPool3D", "AvgPool3D")
CROSS_ENTROPIES = ("SparseSoftmaxCrossEntropyWithLogits", "SoftmaxCrossEntropyWithLogits")
# Ops along one of a row's own axes (`_own_axis`).
OWN_AXIS = ("ArgMax", "ArgMin", "TopKV2", "GatherV2")
# Ops along a row's own axes (`_batch_axis_kept`: not along the folded rows, which the batch
# tail would take for samples): Keras' unrolled recurrent layers (time-major transpose,
# unstack, the cell's splits and slices, the steps stacked and transposed back,
# Bidirectional's reverse and concat, a mask's step tiled to the units).
ALONG_ROWS = ("Unpack", "Split", "SplitV", "ConcatV2", "ReverseV2", "StridedSlice", "Tile")
# The README's rows (lowering.supported_table).
KERNEL_ROWS = {
    "reshape (a folded batch)": "Reshape of a per-sample [batch, k, ...] value to [batch * k, "
                                "...] (tf.reshape(x, [-1, d]), [tf.shape(x)[0] * k, d]: a bag's "
                                "instances, a sequence's steps), the ops computing row by row on "
                                "it (Dense, Conv2D of folded frames [batch * k, H, W, C], "
                                "MaxPooling2D and AveragePooling2D of them (float16 too: a "
                                "Temporal Shift Module's frames), Conv3D, MaxPooling3D and "
                                "AveragePooling3D of folded clips [batch * k, D, H, W, C], "
                                "Embedding lookups of folded ids, Keras GRU, LSTM and "
                                "SimpleRNN per folded row (Bidirectional too), "
                                "Keras MultiHeadAttention and einsums keeping the folded axis "
                                "a batch letter, Swin's window attention (a batch matmul of "
                                "two values folded alike, q, k, v = tf.unstack(tf.transpose("
                                "qkv, [2, 0, 3, 1, 4])) of folded windows), tf.argmax, argmin, top_k and constant-index "
                                "gathers (tf.signal.frame) along a row's own axes, tf.one_hot, "
                                "softmax cross-entropy per row, "
                                "element-wise ops and activations, Dropout and random numbers "
                                "one per element, tf.random.categorical of folded logits "
                                "[batch * k, classes] (each row's classes from its own logits: "
                                "ELECTRA's replacement tokens), LayerNormalization, reductions and softmax "
                                "along a row's own axes) and the reshape back to [batch, "
                                "k, ...]: each sample's k rows carried as its own (k, ...) value",
}
REFUSED = {
    "ops mixing a folded batch's rows": "a reduction over the folded axis [batch * k, ...] "
                                        "other than the loss's of every element, a cumsum "
                                        "over it (a Switch router's capacity count), "
                                        "BatchNormalization, a matmul of two folded values "
                                        "other than row by row, "
                                        "other ops not listed above on folded rows, and "
                                        "metrics or predictions reading them while folded",
}


def _mixes(op: tf.Operation, what: str, k: int) -> str:
    return (f"{what} while a per-sample axis of {k} is folded into the batch (a reshape to "
            f"[batch * {k}, ...]): the CS keeps each sample's {k} rows its own; reshape back to "
            f"[batch, {k}, ...] before this {op.type}")


def refusal(m: Context, op: tf.Operation) -> str:
    """Why `op`, reading a folded value, would mix the rows of different samples ("" if it
    reads none, or computes row by row)."""
    folds = [m.folds(t) for t in op.inputs if m.is_batched(t)]
    k = max(folds, default=1)
    if k == 1:
        return ""
    if (gather := value_selections.selecting_gather(op)) is not None:
        return value_selections.refusal(gather)
    if any(f != k for f in folds):
        return _mixes(op, "meets a per-sample value folded otherwise", k)
    if op.type in ("Softmax", "LogSoftmax") and len(static_shape(op.inputs[0])) == 1:
        return _mixes(op, "normalizes along the folded batch axis (its only axis)", k)
    if op.type in ELEMENT_WISE or op.type in RESHAPES:
        return _along_rows(m, op, k)
    if op.type in PRODUCTS:
        a, b = op.inputs
        flip = op.get_attr("transpose_a") if op.type == "MatMul" else op.get_attr("adj_x")
        if _row_by_row_product(m, op):
            return ""
        if m.is_batched(b) or not m.is_batched(a) or flip:
            return _mixes(op, "multiplies rows of different samples (a matmul across the folded batch)", k)
        return ""
    if op.type in REDUCTIONS or op.type in ("Any", "All"):
        axes = m.operands.constant(op.inputs[1])
        rank = len(static_shape(op.inputs[0]))
        own = None if axes is None else {int(a) % rank for a in np.atleast_1d(axes)}
        if own is not None and (0 not in own or own == set(range(rank)) and
                                op.type in ("Sum", "Mean")):
            return ""  # along a row's own axes, or the loss's sum or mean of every element
        return _mixes(op, "reduces over the folded batch axis (every sample's rows together)", k)
    if op.type in ("Conv2D", "Conv3D"):  # the kernel's (k, H, W, C): k images a sample
        return "" if m.is_batched(op.inputs[0]) and not m.is_batched(op.inputs[1]) else \
            _mixes(op, "convolves with a folded filter", k)
    if op.type in POOLS:  # the kernel's (k, H, W, C): each image pooled on its own
        return ""
    if op.type in GATHERS and not m.is_batched(op.inputs[0]):  # a weight's rows by each id
        return ""
    if op.type in OWN_AXIS:
        return "" if _own_axis(m, op) else \
            _mixes(op, f"{op.type} along the folded batch axis compares rows of different samples", k)
    if op.type in CROSS_ENTROPIES:  # each row's loss from its own logits and label
        if (m.is_batched(op.inputs[1]) or folded_labels(m, op) is not None) and \
                len(static_shape(op.inputs[0])) >= 2:
            return ""
        logits = op.inputs[0].op
        if logits.type == "Reshape" and m.is_batched(logits.inputs[0]) and \
                m.folds(logits.inputs[0]) == 1:  # TF's own flattening of [batch, ..., n]
            labels = op.inputs[1].op.inputs[0].op if op.inputs[1].op.type == "Reshape" \
                else op.inputs[1].op
            return (f"takes a cross-entropy whose labels ({labels.type} '{labels.name}') are "
                    "neither values of the samples nor a "
                    "constant with the batch's rows: compute the labels from the features or "
                    "labels input_fn gives, or tile a constant over the batch")
        return _mixes(op, "takes a cross-entropy of folded logits without folded labels", k)
    if op.type == "Einsum":
        return "" if _keeps_batch_letter(m, op) else \
            _mixes(op, "einsum does not keep the folded batch axis a batch letter", k)
    if op.type in ALONG_ROWS:
        return "" if _batch_axis_kept(m, op) else \
            _mixes(op, "slices, splits, joins, reverses or tiles the folded batch axis", k)
    if op.type == "Transpose":
        return "" if _keeps_rows(m, op) else \
            _mixes(op, "transposes the folded batch axis other than time-major", k)
    if op.type == "Pack":
        return "" if op.get_attr("axis") != 0 or _stacked_back(m, op) else \
            _mixes(op, "stacks folded values along the batch axis", k)
    if op.type == "Multinomial":  # each row's classes drawn from that row's own logits
        return ""
    if op.type in ("FusedBatchNormV3", "FusedBatchNorm"):
        return _mixes(op, "normalizes over the folded batch (a batch normalization)", k)
    return _mixes(op, f"{op.type} is not lowered on folded rows", k)


def _own_axis(m: Context, op: tf.Operation) -> bool:
    """Whether `op` (of OWN_AXIS) works along a row's own constant axis: tf.argmax/argmin's
    axis, top_k's last, a constant-index gather's axis (tf.signal.frame's windows)."""
    rank = len(static_shape(op.inputs[0]))
    if op.type == "TopKV2":
        return rank >= 2
    axis = m.operands.constant(op.inputs[-1] if op.type != "GatherV2" else op.inputs[2])
    if op.type == "GatherV2" and (op.get_attr("batch_dims") != 0 or
                                  m.operands.constant(op.inputs[1]) is None):
        return False
    return axis is not None and int(axis) % rank != 0


def _row_by_row_product(m: Context, op: tf.Operation) -> bool:
    """Whether batch matmul `op` multiplies two values folded alike row by row: both of the
    same rank >= 3, their rows axis whole (Swin's window attention, q @ k^T of [B*nW, heads,
    n, d] windows: window r's queries by window r's keys)."""
    a, b = op.inputs
    return op.type != "MatMul" and m.is_batched(a) and m.is_batched(b) and \
        len(static_shape(a)) == len(static_shape(b)) >= 3 and \
        static_shape(a)[0] == static_shape(b)[0] == static_shape(op.outputs[0])[0]


def _keeps_batch_letter(m: Context, op: tf.Operation) -> bool:
    """Whether einsum `op` keeps the folded axis a batch letter: first in its output and in
    every folded operand (Keras MultiHeadAttention's 'aecd,abcd->acbe' of [batch * k, ...]
    rows), absent from the others (a weight's 'abc,cd->abd')."""
    lhs, _, out = op.get_attr("equation").decode().replace(" ", "").partition("->")
    return bool(out) and all((term[:1] == out[0]) == m.is_batched(t) and out[0] not in term[1:]
                             for term, t in zip(lhs.split(","), op.inputs))


def _batch_axis_kept(m: Context, op: tf.Operation) -> bool:
    """Whether `op` (of ALONG_ROWS) keeps axis 0 whole, its rows in order: its axis
    arguments constant and other than 0."""
    constant, rank = m.operands.constant, op.outputs[0].shape.rank
    if op.type == "StridedSlice":
        begin, end, strides = (constant(t) for t in op.inputs[1:4])
        return begin is not None and end is not None and strides is not None and not (
            op.get_attr("new_axis_mask") & 1 and not op.get_attr("ellipsis_mask") & 1) and \
            slice_bounds(op, begin, end, strides)[0] == (0, static_shape(op.inputs[0])[0], 1, False)
    if op.type == "Tile":
        multiples = constant(op.inputs[1])
        return multiples is not None and int(multiples[0]) == 1
    axes: np.ndarray | None = None
    if op.type == "Unpack":  # (its outputs one axis fewer)
        axes, rank = np.array(op.get_attr("axis")), rank + 1
    else:  # Split's axis first, SplitV's third; ConcatV2's and ReverseV2's last
        axes = constant(op.inputs[{"Split": 0, "SplitV": 2}.get(op.type, -1)])
    return axes is not None and all(int(a) % rank != 0 for a in np.atleast_1d(axes).ravel())


def _keeps_rows(m: Context, op: tf.Operation) -> bool:
    """Whether transpose `op` keeps the folded rows first, or puts a time axis before them
    (Keras' time-major steps: perm [t, 0, ...] of a rank >= 3 value)."""
    perm = m.operands.constant(op.inputs[1])
    return perm is not None and (int(perm[0]) == 0 or (
        len(perm) >= 3 and int(perm[1]) == 0))


def _stacked_back(m: Context, op: tf.Operation) -> bool:
    """Whether Pack `op` (axis 0) is read only by the transpose putting the rows first again
    (Keras' return_sequences: tf.stack(steps), then perm [1, 0, ...])."""
    readers = [c for c in op.outputs[0].consumers() if c in m.flow]
    perm = m.operands.constant(readers[0].inputs[1]) \
        if len(readers) == 1 and readers[0].type == "Transpose" else None
    return perm is not None and [int(p) for p in perm[:2]] == [1, 0] and \
        [int(p) for p in perm[2:]] == list(range(2, len(perm)))


def _along_rows(m: Context, op: tf.Operation, k: int) -> str:
    """"" if every operand of element-wise `op` other than its folded values is a weight or a
    constant that broadcasts along the folded axis (no axis of its own there)."""
    rank = len(static_shape(op.outputs[0])) if op.outputs else 0
    for t in op.inputs if op.type not in RESHAPES else op.inputs[:1]:
        if m.is_batched(t):
            continue
        shape = static_shape(t)
        view = m.operands.view(t)
        constant = m.operands.constant(t)
        constant = m.operands.zero_product(t) if constant is None else constant
        known = constant is not None or m.operands.weight(t) is not None or \
            view is not None or m.derived_weight(t) is not None
        if not known or (len(shape) == rank and rank and shape[0] != 1 and not _same_rows(
                constant if view is None else view.view)):
            return _mixes(op, f"meets {t.op.type} '{t.op.name}', not a weight or constant "
                              "shared by every row,", k)
    return ""


def _same_rows(value: np.ndarray | None) -> bool:
    """Whether constant `value` (or a view's indices) holds the same row for every row
    (tf.zeros([batch * k, n]): a recurrent layer's first state, and its product with the
    recurrent kernel plus a bias), which broadcasts along the folded rows."""
    return value is not None and value.ndim > 0 and bool((value == value[:1]).all())


def with_unfolds(ops: list[tf.Operation], host_tensors: list[tf.Tensor],
                 batch: int) -> list[tf.Operation]:
    """`ops` (the CS's, in graph order) with the reshapes back to [batch, k, ...] of folded
    rows that only the host reads (a prediction or metric of tf.argmax(tf.reshape(logits,
    [-1, k, n]), -1)): the CS unfolds them, the host reads each sample's rows as TF's."""
    flow, seen, stack, unfolds = set(ops), set(), [t.op for t in host_tensors], set()
    while stack:
        op = stack.pop()
        if op in seen or op in flow:
            continue
        seen.add(op)
        if op.type == "Reshape" and op.inputs[0].op in flow and _unfolds(op, batch):
            unfolds.add(op)
            continue
        stack.extend([*(t.op for t in op.inputs), *op.control_inputs])
    return ops if not unfolds else [op for op in ops[0].graph.get_operations()
                                    if op in flow or op in unfolds]


def _unfolds(op: tf.Operation, batch: int) -> bool:
    """Whether reshape `op` takes [batch * k, ...] rows (k > 1) back to [batch, ...]."""
    rows, out = static_shape(op.inputs[0])[:1], static_shape(op.outputs[0])[:1]
    return bool(rows) and rows[0] > batch and rows[0] % batch == 0 and out == (batch,)


def host_reads(m: TailContext) -> Iterator[tuple[tf.Operation, str]]:
    """The ops whose folded outputs the host reads (a metric or prediction), with why."""
    for name in sorted(m.protected):
        tensor = m.graph.get_tensor_by_name(name)
        if m.folds(tensor) > 1:
            yield tensor.op, host_read(m.folds(tensor))


def host_read(k: int) -> str:
    """Why the host cannot read a value whose per-sample axis of k is folded."""
    return (f"the host reads this value (a metric, prediction or host_call) while a per-sample "
            f"axis of {k} is folded into its batch axis: give the host tf.reshape(x, [-1, {k}, "
            "...]) instead")
