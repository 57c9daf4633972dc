"""Shift: a trained variable whose gradient is 0 in exact arithmetic because every path from
it to the loss ends in a softmax that ignores it (softmax(x + c) = softmax(x) for a c shared
along the softmax's axis). Attention pooling's score bias, Dense(1)(h) -> softmax over T, is
the case found: its gradient is rounding noise on both sides, which Adam (dividing by the
gradient's size) turns into steps of the learning rate in directions no two machines share.
The CS applies the exact 0 instead (wafer.grad_transforms' `zero`): the variable's value is
then what exact arithmetic (and float64 TF) gives.

The proof (sufficient, not general): the variable holds one value (shape [], [1], all ones)
and every tensor on a path from one of its reads to the loss is affine in it, x = u + v * d,
with d (which does not depend on it) tracked as the set of axes along which d is constant.
Identity, Snapshot, float Cast, Neg, ExpandDims, Squeeze, Transpose and Reshape move the
axes (a reshape's output axes made of input axes along which d is constant, merged or
split, keep it: a keypoint head's bias per heatmap before a softmax over its S x S pixels); Add,
AddV2, Sub and BiasAdd with a tensor not computed from the variable (a mask) keep d,
broadcasting it along the other side's axes; Mul, and RealDiv by it, with such a tensor k
keep d constant along an axis where k is (k has size 1 there, or is a constant whose values
do not change along it). Each path must end in the logits of Softmax, LogSoftmax or
(Sparse)SoftmaxCrossEntropyWithLogits with d constant along their last axis. An Einsum of
two operands (no ellipsis or repeated letter) with a tensor k not computed from the variable
keeps d constant along an output letter along which both d and k are constant (or that the
operand lacks): Keras MultiHeadAttention's key bias, constant along the key positions, the
softmax's axis; a MatMul or BatchMatMul likewise (rows of its first operand, columns of
its second, batch axes of both: MultiHeadAttention with dropout, tf.matmul(q, k,
transpose_b=True)). A Select (tf.where) of it and a constant of at most -1e4 (Keras' masked
softmax) feeding only softmaxes keeps d: the masked entries' probability underflows to 0
(`_masked`). A path also ends in x − mean(x, axes, keepdims) with d constant along the
axes (tf.math.reduce_variance, reduce_std: `_centred`), where the shift cancels. A path may
also end in
a batch normalization in training (Keras' BatchNormalization, tf.nn.moments feeding
tf.nn.batch_normalization, FusedBatchNormV3: the compiler's batch_norm_training kernels)
of a tensor whose d is constant along every axis but the channels: the normalization
subtracts the batch's mean per channel, so a bias before it (Conv2D(use_bias=True) ->
BatchNormalization, the common case) has the gradient 0; a variable of more than one value
(a bias of C values) is proven component by component, each constant along its read's axes
of size 1. Max and average pools pass d constant along the axes they pool; a convolution by
a filter not computed from v keeps d constant along the batch, and along the pixels where
every window lies inside its input (VALID, or 1 x 1: a GhostNet stem's bias through a
residual sum, a pool and a pointwise convolution into a normalization). A value past the end
of every path (the normalized branch of a residual) is to v's gradient a tensor not computed
from it. Two paths that meet in an Add, Sub or SquaredDifference with opposite signs end
there when both still carry exactly ± the read, broadcast (`_Pure`: moved by views, whole
slices of its axis, means along other axes, shifts): an embedding's bias in the distance
between two embeddings cancels. Sum and Mean pass d on. A path ends where no gradient flows
back: tf.stop_gradient, an op whose outputs the loss reads are integers (tf.argsort). Any other op on a path (a
regularizer's L2Loss, the loss reading it) leaves its gradient real.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np
import tensorflow as tf

from coordinator.compiler.extract import data_upstream
from coordinator.compiler.lowering import slice_bounds

REASON = ("softmax ignores a shift shared along its axis, batch normalization in training "
          "one per channel, a difference of two values that both carry it")

_SAME = {"Identity", "Snapshot", "Neg", "Cast"}
_SHIFTS = {"Add", "AddV2", "Sub", "BiasAdd"}
_SCALES = {"Mul", "RealDiv"}
_SELECTS = {"Select", "SelectV2"}
_CANCELS = {"Add", "AddV2", "Sub", "SquaredDifference"}  # two v-terms that may cancel
_POOLS = {"MaxPool", "AvgPool", "MaxPool3D", "AvgPool3D"}
_CONVOLUTIONS = {"Conv2D", "Conv3D", "DepthwiseConv2dNative"}
_MATMULS = {"MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"}
_MOVES = {"ExpandDims", "Squeeze", "Transpose", "Reshape", "StridedSlice", "Mean"}
_MASKED = -1e4  # a masked logit at most this (Keras: -1e9, float16 -3e4): exp underflows
_SOFTMAX = {"Softmax", "LogSoftmax", "SoftmaxCrossEntropyWithLogits",
            "SparseSoftmaxCrossEntropyWithLogits"}


def zero_gradients(loss: tf.Tensor, variables: list[str],
                   normalized: Mapping[str, frozenset[str]] | None = None) -> tuple[str, ...]:
    """Those of `variables` (TF names of dense-updated variables) whose gradient of `loss`
    is 0 in exact arithmetic, as the module docstring proves it. `normalized`: the batch
    normalizations in training, {the tensor normalized: the names of the ops computing it}."""
    graph, upstream = loss.graph, set(data_upstream(loss.op))
    return tuple(v for v in variables if _shift_only(
        graph.get_operation_by_name(v), loss, upstream, normalized or {}) is not None)


def normalized_ends(loss: tf.Tensor, variable: str,
                    normalized: Mapping[str, frozenset[str]]) -> frozenset[str]:
    """The tensors (keys of `normalized`) whose batch normalization in training ends a path
    of `variable` (proven 0 by zero_gradients): their batch means carry its shift."""
    ends = _shift_only(loss.graph.get_operation_by_name(variable), loss,
                       set(data_upstream(loss.op)), normalized)
    return ends or frozenset()


@dataclass(frozen=True)
class _Pure:
    """A tensor's v-term is exactly scale · (the read of v, broadcast): d one-hot along
    `axis` (a component of a vector variable) or 1 everywhere (axis None)."""

    axis: int | None
    scale: float


def _shift_only(handle: tf.Operation, loss: tf.Tensor, upstream: set[tf.Operation],
                normalized: Mapping[str, frozenset[str]]) -> frozenset[str] | None:
    """The tensors whose batch normalization ends one of the variable's paths when every
    path ends where its shift cancels; None when not proven."""
    shape = tf.TensorShape(handle.get_attr("shape"))
    if not shape.is_fully_defined():
        return None
    reads = [c.outputs[0] for c in handle.outputs[0].consumers() if c in upstream
             and c.type in ("ReadVariableOp", "Identity")]
    reached = _carrying(reads, loss, upstream, normalized)
    if not reads or any(c in upstream and c.type not in ("ReadVariableOp", "Identity")
                        for c in handle.outputs[0].consumers()):
        return None
    varying = [a for a in range(len(shape)) if shape[a] != 1]
    pure = _Pure(varying[0] if varying else None, 1.0) if len(varying) <= 1 else None
    stack: list[tuple[tf.Tensor, frozenset[int], _Pure | None]] = [
        (read, frozenset(a for a in range(read.shape.rank or 0) if read.shape[a] == 1
                         or shape.num_elements() == 1), pure) for read in reads]
    seen: set = set()
    ends: set[str] = set()
    pending: dict[tf.Operation, tuple[int, frozenset[int], _Pure | None]] = {}
    while stack:
        tensor, constant, pure = stack.pop()
        if tensor is loss or tensor.shape.rank is None:
            return None
        for op in tensor.consumers():
            if op not in upstream or (op, tensor.ref()) in seen:
                continue
            seen.add((op, tensor.ref()))
            if op.name in normalized.get(tensor.name, ()):  # the per-channel mean removed
                if not set(range(tensor.shape.rank - 1)) <= constant:
                    return None
                ends.add(tensor.name)
                continue
            if _centred(op, tensor, constant):  # x − mean(x): the shift cancels
                continue
            if not _passes_gradient(op, loss, upstream):  # (stop_gradient, argsort's positions)
                continue
            indices = [i for i, t in enumerate(op.inputs) if t is tensor]
            if len(indices) != 1:
                return None
            if op.type in _SOFTMAX:  # the logits: a shift along the last axis is ignored
                if indices[0] != 0 or tensor.shape.rank - 1 not in constant:
                    return None
                continue
            if op.type in _CANCELS and len(op.inputs) == 2 and op.inputs[1 - indices[0]].op in reached:
                if op not in pending:  # the other operand's v-term is still on its way
                    pending[op] = (indices[0], constant, pure)
                    continue
                combined = _difference(op, pending.pop(op), (indices[0], constant, pure))
                if combined is None:
                    return None
                if combined is not _CANCELLED:
                    stack.append((op.outputs[0], *combined))
                continue
            out = _through(op, indices[0], constant, reached)
            if out is None:
                return None
            stack.append((op.outputs[0], out, _pure_through(op, indices[0], pure)))
    return None if pending else frozenset(ends)  # (pending: a v-term not followed)


_CANCELLED = object()


def _difference(op: tf.Operation, first: tuple[int, frozenset[int], _Pure | None],
                second: tuple[int, frozenset[int], _Pure | None]):
    """Both operands of an Add/AddV2/Sub/SquaredDifference carry v: _CANCELLED when their
    v-terms are the same read with opposite signs (u1 + v·d − (u2 + v·d), an embedding's
    bias in a distance between two embeddings), the sum's (constant, pure) when they add up
    to another multiple of it, None otherwise (not proven)."""
    rank = op.outputs[0].shape.rank
    terms = sorted([first, second], key=lambda t: t[0])
    a, b = terms[0][2], terms[1][2]
    if rank is None or a is None or b is None:
        return None
    axes = [None if p.axis is None else p.axis + rank - (op.inputs[i].shape.rank or 0)
            for i, p in ((0, a), (1, b))]
    if axes[0] != axes[1]:
        return None
    sign = 1.0 if op.type in ("Add", "AddV2") else -1.0
    scale = a.scale + sign * b.scale
    if scale == 0.0:
        return _CANCELLED
    if op.type == "SquaredDifference":
        return None
    constant = _broadcast(op.inputs[0], terms[0][1], rank) & _broadcast(op.inputs[1], terms[1][1], rank)
    return constant, _Pure(axes[0], scale)


def _pure_through(op: tf.Operation, index: int, pure: _Pure | None) -> _Pure | None:
    """Where an op that _through passed puts a pure v-term (None: scaled by a tensor, summed
    along its axis, or moved in a way not followed)."""
    if pure is None:
        return None
    x, out = op.inputs[index], op.outputs[0]
    rank, out_rank = x.shape.rank or 0, out.shape.rank or 0
    axis = pure.axis
    if op.type in ("Identity", "Snapshot", "Cast") or (op.type == "Sub" and index == 0):
        return pure
    if op.type == "Neg" or (op.type == "Sub" and index == 1):
        return _Pure(axis, -pure.scale)
    if op.type in ("Add", "AddV2") or op.type == "BiasAdd" and index == 0:
        return _Pure(None if axis is None else axis + out_rank - rank, pure.scale)
    if op.type == "BiasAdd":
        return _Pure(None if axis is None else out_rank - 1, pure.scale)
    if axis is None:
        return pure if op.type in _MOVES else None
    static = _static(op.inputs[1]) if op.type in ("ExpandDims", "Transpose") else None
    if op.type == "ExpandDims" and static is not None:
        at = int(np.ravel(static)[0]) % out_rank
        return _Pure(axis if axis < at else axis + 1, pure.scale)
    if op.type == "Squeeze":
        return _Pure(_squeezed_kept(op, x).index(axis), pure.scale)
    if op.type == "Transpose" and static is not None:
        return _Pure([int(k) for k in np.ravel(static)].index(axis), pure.scale)
    if op.type == "Reshape":
        groups = _reshape_groups(list(x.shape), list(out.shape)) or []
        return next((_Pure(outs[0], pure.scale) for ins, outs in groups
                     if ins == [axis] and len(outs) == 1), None)
    if op.type in ("Mean", "Sum"):
        reduced = _reduced(op)
        if reduced is None or axis in reduced:
            return None
        scale = pure.scale if op.type == "Mean" else pure.scale * float(
            np.prod([x.shape[a] for a in reduced]))
        return _Pure(axis if op.get_attr("keep_dims") else axis - sum(1 for a in reduced if a < axis), scale)
    if op.type == "StridedSlice":
        mapping = _slice_axes(op)
        whole = mapping is not None and axis in mapping and _whole(op, axis)
        return _Pure(mapping.index(axis), pure.scale) if whole and mapping is not None else None
    return None


def _passes_gradient(op: tf.Operation, loss: tf.Tensor, upstream: set[tf.Operation]) -> bool:
    """Whether a gradient of the loss flows back through `op`: not through tf.stop_gradient,
    nor through an op whose outputs the loss reads are integers (tf.argsort's positions, a
    shape; complex values pass it). The op computing the loss itself passes it."""
    if op.type in ("StopGradient", "PreventGradient"):
        return False
    return any((out.dtype.is_floating or out.dtype.is_complex) and (out is loss or any(c in upstream for c in out.consumers()))
               for out in op.outputs)


def _centred(op: tf.Operation, tensor: tf.Tensor, constant: frozenset[int] | None) -> bool:
    """Whether `op` is, or is the mean of, x − mean(x, axes, keepdims) for x = `tensor`
    whose d is constant along the axes (tf.math.reduce_variance, reduce_std; `constant`
    None: whatever d is): the shift cancels exactly. The mean must feed only such
    differences."""
    if op.type == "Mean":
        mean = op
    elif op.type in ("Sub", "SquaredDifference") and op.inputs[0] is tensor:
        mean = op.inputs[1].op
    else:
        return False
    if mean.type != "Mean" or mean.inputs[0] is not tensor or not mean.get_attr("keep_dims") or \
            tensor.shape.rank is None:
        return False
    axes = _static(mean.inputs[1])
    if axes is None or constant is not None and \
            not {int(a) % tensor.shape.rank for a in np.ravel(axes)} <= constant:
        return False
    return all(c.type in ("Sub", "SquaredDifference") and c.inputs[0] is tensor and
               c.inputs[1] is mean.outputs[0] for c in mean.outputs[0].consumers())


def _carrying(reads: list[tf.Tensor], loss: tf.Tensor, upstream: set[tf.Operation],
              normalized: Mapping[str, frozenset[str]]) -> set[tf.Operation]:
    """The ops downstream of the reads whose gradient may carry v's: not past the ends of
    paths (a batch normalization's ops, x − mean(x), stop_gradient, integer outputs), whose
    conditions the proof checks where it reaches them. A value past them is to v's gradient
    what a tensor not computed from it is (a residual around a normalized branch)."""
    seen = {read.op for read in reads}
    stack = list(seen)
    while stack:
        for t in stack.pop().outputs:
            for c in t.consumers():
                if c in upstream and c not in seen and c.name not in normalized.get(t.name, ()) \
                        and not _centred(c, t, None) and _passes_gradient(c, loss, upstream):
                    seen.add(c)
                    stack.append(c)
    return seen


def _through(op: tf.Operation, index: int, constant: frozenset[int],
             reached: set[tf.Operation]) -> frozenset[int] | None:
    """The axes of op's output along which d is constant, or None (not proven)."""
    x, out = op.inputs[index], op.outputs[0]
    rank, out_rank = x.shape.rank, out.shape.rank
    if rank is None or out_rank is None:
        return None
    if op.type in _SAME:
        floats = x.dtype.is_floating and out.dtype.is_floating
        return constant if floats else None
    if op.type == "ExpandDims" and index == 0:
        axis = _static(op.inputs[1])
        if axis is None:
            return None
        a = int(np.ravel(axis)[0]) % out_rank
        return frozenset({k if k < a else k + 1 for k in constant} | {a})
    if op.type == "Squeeze":
        return frozenset(j for j, k in enumerate(_squeezed_kept(op, x)) if k in constant)
    if op.type in ("Mean", "Sum") and index == 0:
        reduced = _reduced(op)
        if reduced is None:
            return None
        if op.get_attr("keep_dims"):
            return constant | reduced
        return frozenset(j for j, k in enumerate(a for a in range(rank) if a not in reduced)
                         if k in constant)
    if op.type == "StridedSlice" and index == 0:
        mapping = _slice_axes(op)
        return None if mapping is None else frozenset(
            j for j, k in enumerate(mapping) if k is None or k in constant)
    if op.type == "Transpose" and index == 0:
        perm = _static(op.inputs[1])
        return None if perm is None else frozenset(
            j for j, k in enumerate(np.ravel(perm)) if int(k) in constant)
    if op.type == "Reshape" and index == 0:
        if constant == frozenset(range(rank)):
            return frozenset(range(out_rank))
        groups = _reshape_groups(list(x.shape), list(out.shape))
        if groups is None:
            return None
        return frozenset(j for j in range(out_rank) if out.shape[j] == 1) | frozenset(
            j for ins, outs in groups if set(ins) <= constant for j in outs)
    if op.type in _POOLS and index == 0:
        return _pooled(op, constant)
    if op.type in _CONVOLUTIONS and index == 0 and op.inputs[1].op not in reached:
        return _convolved(op, constant)
    if op.type == "Einsum" and len(op.inputs) == 2 and op.inputs[1 - index].op not in reached:
        return _einsum(op, index, constant)
    if op.type in _MATMULS and op.inputs[1 - index].op not in reached:
        return _matmul(op, index, constant)
    if op.type in _SELECTS and index > 0:
        return _masked(op, index, constant, reached)
    if op.type not in _SHIFTS | _SCALES or op.inputs[1 - index].op in reached:
        return None
    if op.type == "BiasAdd":
        if index == 0:
            return constant
        return frozenset(range(out_rank - 1)) | ({out_rank - 1} if 0 in constant else set())
    broadcast = _broadcast(x, constant, out_rank)
    if op.type in _SHIFTS:
        return broadcast
    if op.type == "RealDiv" and index != 0:
        return None
    other = op.inputs[1 - index]
    if other.shape.rank is None:
        return None
    return broadcast & _broadcast(other, _constant_axes(other), out_rank)


def _spatial(op: tf.Operation) -> list[int] | None:
    """A pool's or convolution's spatial axes (NHWC, NWC, NDHWC), None: channels first."""
    rank = op.inputs[0].shape.rank or 0
    layout = op.get_attr("data_format").decode() if "data_format" in op.node_def.attr else "NHWC"
    return list(range(1, rank - 1)) if layout.endswith("C") and rank >= 3 else None


def _pooled(op: tf.Operation, constant: frozenset[int]) -> frozenset[int] | None:
    """A max or average pool of u + d with d constant along every axis it pools over (and
    its padding, which TF's pools leave out): the pool of u, plus d. None otherwise."""
    pooled = {a for a, k in enumerate(op.get_attr("ksize")) if k != 1}
    if _spatial(op) is None or not pooled <= constant:
        return None
    return constant


def _convolved(op: tf.Operation, constant: frozenset[int]) -> frozenset[int] | None:
    """A convolution of u + d by a filter k not computed from v (linear: conv(u) +
    conv(d)): constant along the batch where d is, and along the spatial axes where d is
    constant along all of them and every window lies inside the input (VALID padding, or
    a 1 x 1 filter), as a 1 x 1 convolution after a residual sum is."""
    spatial, window = _spatial(op), op.inputs[1].shape.as_list()[:-2]
    if spatial is None or None in window:
        return None
    inside = op.get_attr("padding") == b"VALID" or all(k == 1 for k in window)
    return frozenset(a for a in constant if a == 0) | (
        frozenset(spatial) if inside and set(spatial) <= constant else frozenset())


def _squeezed_kept(op: tf.Operation, x: tf.Tensor) -> list[int]:
    """A Squeeze's input axes that its output keeps, in order."""
    rank = x.shape.rank or 0
    dropped = {int(d) % rank for d in op.get_attr("squeeze_dims")} or \
        {k for k in range(rank) if x.shape[k] == 1}
    return [k for k in range(rank) if k not in dropped]


def _reduced(op: tf.Operation) -> frozenset[int] | None:
    """The axes a Mean or Sum reduces (None: not static)."""
    rank, axes = op.inputs[0].shape.rank, _static(op.inputs[1])
    if rank is None or axes is None:
        return None
    return frozenset(int(a) % rank for a in np.ravel(axes))


def _slice_axes(op: tf.Operation) -> list[int | None] | None:
    """A StridedSlice's output axes: the input axis each one slices (None: tf.newaxis)."""
    rank, entries = op.inputs[0].shape.rank, op.inputs[1].shape.num_elements()
    if rank is None or entries is None:
        return None
    ellipsis, new, shrink = (op.get_attr(k) for k in ("ellipsis_mask", "new_axis_mask", "shrink_axis_mask"))
    consumed = sum(1 for i in range(entries) if not (ellipsis | new) >> i & 1)
    axes: list[int | None] = []
    k = 0
    for i in range(entries):
        if ellipsis >> i & 1:
            axes += range(k, k + rank - consumed)
            k += rank - consumed
        elif new >> i & 1:
            axes.append(None)
        else:
            if not shrink >> i & 1:
                axes.append(k)
            k += 1
    return axes + list(range(k, rank))


def _whole(op: tf.Operation, axis: int) -> bool:
    """Whether a StridedSlice takes all of the input's `axis`, in order."""
    begin, end, strides = (_static(t) for t in op.inputs[1:4])
    if begin is None or end is None or strides is None:
        return False
    lo, hi, step, shrink = slice_bounds(op, np.ravel(begin), np.ravel(end), np.ravel(strides))[axis]
    return (lo, hi, step, shrink) == (0, op.inputs[0].shape[axis], 1, False)


def _reshape_groups(dims: list, out_dims: list) -> list[tuple[list[int], list[int]]] | None:
    """A reshape's axes (those of size > 1) in groups (input axes, output axes) of equal
    products, as row-major order lays them out: a group's output elements are its input
    elements, the other axes held (split, merged, or kept). None: a size unknown."""
    ins = [k for k, d in enumerate(dims) if d != 1]
    outs = [j for j, d in enumerate(out_dims) if d != 1]
    if None in [dims[k] for k in ins] + [out_dims[j] for j in outs]:
        return None
    groups, i, j = [], 0, 0
    while i < len(ins) and j < len(outs):
        group_in, group_out = [ins[i]], [outs[j]]
        size_in, size_out = dims[ins[i]], out_dims[outs[j]]
        while size_in != size_out:
            if size_in < size_out and i + 1 < len(ins):
                i += 1
                group_in.append(ins[i])
                size_in *= dims[ins[i]]
            elif size_out < size_in and j + 1 < len(outs):
                j += 1
                group_out.append(outs[j])
                size_out *= out_dims[outs[j]]
            else:
                return None
        groups.append((group_in, group_out))
        i, j = i + 1, j + 1
    return groups if i == len(ins) and j == len(outs) else None


def _masked(op: tf.Operation, index: int, constant: frozenset[int],
            reached: set[tf.Operation]) -> frozenset[int] | None:
    """A mask written as tf.where(mask, x, c) straight into softmaxes (Keras 3's masked
    Softmax, MultiHeadAttention's attention_mask and use_causal_mask): the masked entries
    hold c <= _MASKED, not shifted. The softmax's gradient along the shift is its masked
    probability times the shift, below exp(c - the largest logit): 0 in float32 and
    float64 unless every unmasked logit is below c + 745 (a row all masked: 0 exactly)."""
    other = op.inputs[3 - index]
    if op.inputs[0].op in reached or other.op in reached or any(
            c.type not in _SOFTMAX or c.inputs[0] is not op.outputs[0]
            for c in op.outputs[0].consumers()):
        return None
    value = _static(other)
    if value is None or value.size == 0 or not np.all(value <= _MASKED):
        return None
    return _broadcast(op.inputs[index], constant, op.outputs[0].shape.rank or 0)


def _einsum(op: tf.Operation, index: int, constant: frozenset[int]) -> frozenset[int] | None:
    """A product of x (operand `index`) and k, linear in x (Keras MultiHeadAttention's
    scores of the keys, the key bias's shift constant along the key positions): the output
    is constant along a letter that x is constant along (or lacks) and k is too."""
    equation = op.get_attr("equation").decode().replace(" ", "")
    terms, _, result = equation.partition("->")
    letters = terms.split(",")
    if "." in equation or len(letters) != 2 or any(len(set(t)) != len(t) for t in letters):
        return None
    other = op.inputs[1 - index]
    if other.shape.rank is None:
        return None
    kept = [{t[a] for a in axes} | (set(result) - set(t))
            for t, axes in ((letters[index], constant),
                            (letters[1 - index], _constant_axes(other)))]
    return frozenset(j for j, letter in enumerate(result) if letter in kept[0] & kept[1])


def _matmul(op: tf.Operation, index: int, constant: frozenset[int]) -> frozenset[int] | None:
    """A matrix product of x (operand `index`) and k, linear in x (tf.matmul(q, k,
    transpose_b=True), as Keras MultiHeadAttention's einsum of the keys and queries runs
    with dropout, and window attention's scores): the output is constant along its rows
    where operand 0 is, its columns where operand 1 is, and a batch axis where both are
    (or lack it: broadcast)."""
    out_rank = op.outputs[0].shape.rank or 0
    if out_rank < 2:
        return None
    flips = ("transpose_a", "transpose_b") if op.type == "MatMul" else ("adj_x", "adj_y")
    kept = []
    for i, t in enumerate(op.inputs[:2]):
        rank = t.shape.rank
        if rank is None or rank < 2:
            return None
        axes = (constant if i == index else _constant_axes(t)) | frozenset(
            a for a in range(rank) if t.shape[a] == 1)
        outer = rank - 1 if op.get_attr(flips[i]) == (i == 0) else rank - 2  # (the row or column)
        lead = out_rank - rank
        kept.append({a + lead for a in axes if a < rank - 2} | set(range(lead)) |
                    ({out_rank - 2 + i} if outer in axes else set()) | {out_rank - 1 - i})
    return frozenset(kept[0] & kept[1])


def _broadcast(x: tf.Tensor, constant: frozenset[int], out_rank: int) -> frozenset[int]:
    """The output axes along which x, broadcast to rank out_rank, is constant where it is
    constant along `constant`."""
    lead = out_rank - (x.shape.rank or 0)
    return frozenset(j for j in range(out_rank)
                     if j < lead or x.shape[j - lead] == 1 or j - lead in constant)


def _constant_axes(k: tf.Tensor) -> frozenset[int]:
    """The axes along which k is constant: size 1, or a constant's values that repeat."""
    value = _static(k)
    rank = k.shape.rank or 0
    if value is None:
        return frozenset(a for a in range(rank) if k.shape[a] == 1)
    value = np.asarray(value)
    return frozenset(a for a in range(value.ndim)
                     if np.all(value == np.take(value, [0], axis=a)))


def _static(tensor: tf.Tensor) -> np.ndarray | None:
    """The value of a tensor computed from constants alone (tf.nn.softmax's permutation
    along another axis: Range, ConcatV2 of Consts), or None."""
    value = tf.get_static_value(tensor)
    if value is None:
        ops = data_upstream(tensor.op)
        if any(op.op_def.is_stateful or (not op.inputs and op.type != "Const") for op in ops):
            return None
        with tf.compat.v1.Session(graph=tensor.graph) as session:
            value = session.run(tensor)
    return np.asarray(value)
