"""Lowerings of the ops that take sequences apart and put them together per sample: unstack,
split, stack and reverse along a sample's axes, and the time-major round trip of Keras'
unrolled recurrent layers and TimeDistributed (transpose the time axis first, unstack it or
take x[i] of every step; stack the steps, transpose back), which moves the batch axis only
in between. Each becomes slice, reshape and concat
kernels on the samples' own axes; a recurrent cell's weights are read at every step
(shared weights, `wse_sim.shared_weights`)."""
from __future__ import annotations

import re

import numpy as np
import tensorflow as tf

from coordinator.compiler import leading_stack
from coordinator.compiler.operands import static_shape
from coordinator.compiler.rules import Context, generic

# A slice of the batch axis outside the loss (batch_tail.batch_slice: within it, the tail's).
SLICES_THE_BATCH = (
    "slices the batch axis (some samples against others: a support set and queries, x[:k], "
    "x[1:] - x[:-1], tf.split(z, 2, 0), tf.roll(z, 1, 0)) into values that feed per-sample "
    "layers, weights or predictions: the CS computes each sample on its own and slices the "
    "batch only on the way to the loss; give each sample what it needs in input_fn (an "
    "episode per sample, its own pair), and slice along its own axes (x[:, :k])")


def take(m: Context, op: tf.Operation, x: tf.Tensor | str, out: tf.Tensor, axis: int,
          lo: int, hi: int, shrink: bool, ops: list[tf.Operation]) -> None:
    """`out` = x[..., lo:hi, ...] along per-sample axis `axis` (dropped when `shrink`)."""
    shape = m.kernel_shape(x) if isinstance(x, str) else m.shape(x)
    m.add_kernel(f"{op.name}/{out.value_index}", "slice",
                 [x], {"begin": [lo if a == axis else 0 for a in range(len(shape))],
                       "end": [hi if a == axis else d for a, d in enumerate(shape)],
                       "strides": [1] * len(shape), "shrink": [axis] if shrink else []},
                 [], ops, out, source_op=op)


@generic("Unpack")
def unpack(m: Context, op: tf.Operation) -> str:
    """tf.unstack(x, axis=a) of a per-sample x, a != 0: one slice per step."""
    x = op.inputs[0]
    if not m.is_batched(x):
        return "unstacks a value that is not per-sample"
    axis = op.get_attr("axis") % len(static_shape(x))
    if axis == 0:
        return "unstacks the batch axis"
    for i, out in enumerate(op.outputs):
        take(m, op, x, out, axis - m.axis_shift(x), i, i + 1, True, [op])
    return ""


@generic("Split", "SplitV")
def split(m: Context, op: tf.Operation) -> str:
    """tf.split along a sample's axis (Split: equal parts; SplitV: given sizes)."""
    x, axis_t = (op.inputs[1], op.inputs[0]) if op.type == "Split" else (op.inputs[0], op.inputs[2])
    axis_c = m.operands.constant(axis_t)
    if not m.is_batched(x) or axis_c is None:
        return "splits a value that is not per-sample, or along an axis that is not constant"
    axis = int(axis_c) % len(static_shape(x))
    if axis == 0:
        return SLICES_THE_BATCH
    lo = 0
    for out in op.outputs:
        size = static_shape(out)[axis]
        take(m, op, x, out, axis - m.axis_shift(x), lo, lo + size, False, [op])
        lo += size
    return ""


@generic("Pack")
def pack(m: Context, op: tf.Operation) -> str:
    """tf.stack of per-sample values along a sample's axis, or along axis 0 followed by the
    transpose that puts the batch first again (Keras' return_sequences): a unit axis added
    to each, then one concat; along axis 0 else: a value held with its stack axis first
    (leading_stack.py)."""
    values = list(op.inputs)
    if not all(m.is_batched(t) for t in values):
        return "stacks values that are not all per-sample"
    rank = len(static_shape(op.outputs[0]))
    axis, out, ops = op.get_attr("axis") % rank, op.outputs[0], [op]
    if axis == 0:
        back = m.sole_consumer(out)
        perm = m.operands.constant(back.inputs[1]) if back is not None and back.type == "Transpose" else None
        if back is None or perm is None or [int(p) for p in perm] != [1, 0, *range(2, rank)]:
            return leading_stack.stack(m, op)
        axis, out, ops = 1, back.outputs[0], [op, back]
    parts: list[tf.Tensor | str] = []
    own = axis - m.axis_shift(values[0])  # (folded rows: each sample's k rows its axis 0)
    for k, t in enumerate(values):
        shape = list(m.shape(t))
        shape.insert(own, 1)
        parts.append(m.add_kernel(f"{op.name}/expand_{k}", "reshape", [t], {"shape": shape}, [],
                                  [], None, output_shape=tuple(shape), source_op=op).name)
    stacked = list(m.shape(values[0]))  # (folded: each sample's (k, steps, ...))
    stacked.insert(own, len(values))
    m.add_kernel(op.name, "concat", parts, {"axis": own}, [], ops, out,
                 output_shape=tuple(stacked) if own == axis else None)
    return ""


def _axis0_slice(m: Context, op: tf.Operation) -> tuple[tf.Tensor | None, slice] | None:
    """(the sliced tensor, the slice) if op is x[i] (shrinking axis 0: slice(i, None)), x[lo:hi:s]
    (axis 0 alone, constant bounds) or v[None] (a new axis 0: (None, slice(0, 1))); else None."""
    if op.type != "StridedSlice" or op.get_attr("ellipsis_mask"):
        return None
    begin, end, strides = (m.operands.constant(t) for t in op.inputs[1:])
    if begin is None or end is None or strides is None or \
            not len(begin) == len(end) == len(strides) == 1 or int(strides[0]) == 0:
        return None
    new, shrink = op.get_attr("new_axis_mask"), op.get_attr("shrink_axis_mask")
    masks = op.get_attr("begin_mask"), op.get_attr("end_mask")
    if new == 1 and not shrink:
        return None, slice(0, 1)
    if new or shrink not in (0, 1) or (shrink and (any(masks) or int(strides[0]) != 1)):
        return None
    lo, hi = (None if mask & 1 else int(bound[0]) for mask, bound in zip(masks, (begin, end)))
    return op.inputs[0], slice(lo, None if shrink else hi, int(strides[0]))


def step_index(m: Context, op: tf.Operation, steps: int) -> int | None:
    """i if op is x[i] of a time-major x (a StridedSlice of axis 0 alone, shrinking it; x[-1]
    is the last step)."""
    found = _axis0_slice(m, op)
    if found is None or found[0] is None or not op.get_attr("shrink_axis_mask"):
        return None
    i = found[1].start  # (a shrunk axis reads begin alone, from the end when negative: x[-1])
    i = i + steps if -steps <= i < 0 else i
    return i if 0 <= i < steps else None


FOLDED_STACK = ("moves a sample's axis in front of rows folded into the batch ([B*n, ...]: "
                "windows or patches reshaped into it): the CS holds a stack in front of the "
                "batch only of one row a sample; take the stacked parts along their own axis "
                "first (q, k, v = tf.unstack(qkv, axis=2)), then transpose each keeping the "
                "batch first")


class _TimeMajor:
    """A time-major value transpose(x, order) (its batch axis second, order[0] the time axis of
    x), held on the CS as x: `value` (a tensor or a kernel's name) in x's own layout."""

    REFUSAL = "transposes the batch axis away from the first position"
    USE = ("transposes the batch axis away from the first position, then uses the time-major "
           "value other than by its steps x[i], tf.unstack, slices of steps x[1:], x[::-1], a "
           "concat with single steps, a sum of all of it in the loss or a transpose back: "
           "transpose it back batch-major first (tf.transpose(x, [1, 0, 2]), tf.scan's states "
           "likewise) and reduce or combine that")

    def __init__(self, m: Context, order: list[int], x: tf.Tensor):
        self.m, self.order, self.shift = m, order, m.axis_shift(x)
        self.time = order[0] - self.shift

    def shape(self, value: tf.Tensor | str) -> tuple[int, ...]:
        return self.m.kernel_shape(value) if isinstance(value, str) else self.m.shape(value)

    def lower(self, value: tf.Tensor | str, tensor: tf.Tensor, ops: list[tf.Operation]) -> str:
        """Lower every use of `tensor` (= transpose(value, order), its TF ops `ops`): "" or why
        not."""
        m, steps = self.m, self.shape(value)[self.time]
        consumers = m.consumers(tensor)
        if not consumers:
            return self.USE
        if isinstance(value, tf.Tensor) and all(self._sums_all(c) for c in consumers):
            m.alias(tensor.op, value)  # (the loss tail proves a sum of all the elements)
            return ""
        for c in consumers:
            reason = self._use(value, tensor, c, steps, ops + [c])
            if reason:
                return reason
        return ""

    def _sums_all(self, op: tf.Operation) -> bool:
        """Whether op sums (or averages) every element of its input: the loss's
        tf.reduce_mean(time_major), a sum of the same elements as the batch-major value's."""
        axes = self.m.operands.constant(op.inputs[1]) if op.type in ("Sum", "Mean") else None
        rank = op.inputs[0].shape.rank
        return axes is not None and {int(a) % rank for a in np.atleast_1d(axes)} == \
            set(range(rank))

    def _use(self, value: tf.Tensor | str, tensor: tf.Tensor, c: tf.Operation, steps: int,
             ops: list[tf.Operation]) -> str:
        m, shape, time = self.m, self.shape(value), self.time
        index, back = step_index(m, c, steps), _batch_first_again(m, self.order, c, self.shift)
        taken = _axis0_slice(m, c)
        if index is not None:
            take(m, c, value, c.outputs[0], time, index, index + 1, True, ops)
        elif back is not None:
            m.add_kernel(c.name, "transpose", [value], {"perm": back}, [], ops, c.outputs[0])
        elif c.type == "Unpack" and c.get_attr("axis") == 0:
            for i, out in enumerate(c.outputs):
                take(m, c, value, out, time, i, i + 1, True, ops)
        elif taken is not None and taken[0] is not None:  # x[lo:hi:s]: still time-major
            r = range(*taken[1].indices(steps))
            kept = (*shape[:time], len(r), *shape[time + 1:])
            kernel = m.add_kernel(f"{c.name}/steps", "slice", [value], {
                "begin": [r.start if a == time else 0 for a in range(len(shape))],
                "end": [r.stop if a == time else d for a, d in enumerate(shape)],
                "strides": [r.step if a == time else 1 for a in range(len(shape))],
                "shrink": []}, [], ops, None, output_shape=kept, source_op=c)
            return self.lower(kernel.name, c.outputs[0], ops)
        elif c.type == "ConcatV2":
            return self._concat(value, tensor, c, ops)
        else:
            return self.USE
        return ""

    def _concat(self, value: tf.Tensor | str, tensor: tf.Tensor, c: tf.Operation,
                ops: list[tf.Operation]) -> str:
        """tf.concat along the time axis of this sequence and single steps v[None] (or
        tf.expand_dims(v, 0)) of per-sample values: one concat on x's time axis."""
        m, time = self.m, self.time
        axis = m.operands.constant(c.inputs[-1])
        if axis is None or int(axis) % c.outputs[0].shape.rank != 0:
            return self.USE
        parts: list[tf.Tensor | str] = []
        for k, t in enumerate(c.inputs[:-1]):
            if t is tensor:
                parts.append(value)
                continue
            step = _axis0_slice(m, t.op)
            expand = t.op.type == "ExpandDims" and m.operands.constant(t.op.inputs[1]) == 0
            v = t.op.inputs[0] if expand or (step and step[0] is None) else None
            if v is None or not m.is_batched(v) or len(m.consumers(t)) != 1:
                return self.USE
            shape = list(m.shape(v))
            shape.insert(time, 1)
            parts.append(m.add_kernel(f"{c.name}/step_{k}", "reshape", [v], {"shape": shape}, [],
                                      [t.op], None, output_shape=tuple(shape),
                                      source_op=c).name)
        shapes = [self.shape(p) for p in parts]
        joined = list(shapes[0])
        joined[time] = sum(s[time] for s in shapes)
        kernel = m.add_kernel(f"{c.name}/steps", "concat", parts, {"axis": time}, [], ops, None,
                              output_shape=tuple(joined), source_op=c)
        return self.lower(kernel.name, c.outputs[0], ops)


TENSORDOT = ("contracts the samples of the batch with each other (tf.tensordot of a batched "
             "value moves its batch axis: [B, ..., B, ...] or a sum over the batch): the CS "
             "computes each sample on its own; contract within each sample (tf.einsum("
             "'bij,bkj->bik', x, x), tf.matmul(x, x, transpose_b=True))")


def in_tensordot(op: tf.Operation) -> bool:
    """Whether op is tf.tensordot's transpose of an operand."""
    return re.search(r"(^|/)Tensordot(_\d+)?/transpose(_\d+)?$", op.name) is not None


def time_major_unstack(m: Context, op: tf.Operation) -> str:
    """A transpose moving a time axis first, then taking it apart step by step (Keras'
    unrolled recurrent layers: unstack; Keras' TimeDistributed and tf.scan's steps: x[i] for
    every i), or transposed back to batch-major (one per-sample transpose), or its steps
    sliced (x[1:], x[::-1]) and concatenated with single steps (tf.concat([x, v[None]], 0))
    before either: each a slice, reshape or concat on x's time axis; "" if lowered, else why
    not."""
    x, perm = op.inputs[0], m.operands.constant(op.inputs[1])
    rank = len(static_shape(x))
    if perm is None or not m.is_batched(x):
        return _TimeMajor.REFUSAL
    order = [int(p) for p in perm]
    time = order[0]
    if order[1] == 0 and order[1:] != [a for a in range(rank) if a != time]:
        if m.axis_shift(x) == 1:
            return leading_stack.transposed(m, op, order)
        return _folded_parts(m, op, order)
    if order[1] != 0 or order[1:] != [a for a in range(rank) if a != time]:
        return _TimeMajor.REFUSAL
    return _TimeMajor(m, order, x).lower(x, op.outputs[0], [op])


def _folded_parts(m: Context, op: tf.Operation, order: list[int]) -> str:
    """A transpose of folded rows [B*k, ...] moving one of a row's axes first and the rows
    next (Swin's window attention: q, k, v = tf.unstack(tf.transpose(qkv, [2, 0, 3, 1, 4]))
    of [B*nW, n, 3, heads, d] windows) read only part by part (tf.unstack, x[i]): each part
    a slice of each sample's (k, ...) along that axis, then a per-sample transpose of the
    rest keeping the rows first; FOLDED_STACK for any other reader."""
    x, time = op.inputs[0], order[0]
    shape, steps = m.shape(x), m.shape(x)[order[0]]
    perm = [a - (a > time) for a in order[1:]]
    parts: list[tuple[tf.Operation, int, tf.Tensor]] = []
    for c in m.consumers(op.outputs[0]):
        index = step_index(m, c, steps)
        if index is not None:
            parts.append((c, index, c.outputs[0]))
        elif c.type == "Unpack" and c.get_attr("axis") == 0:
            parts.extend((c, i, out) for i, out in enumerate(c.outputs))
        else:
            return FOLDED_STACK
    sliced = tuple(d for a, d in enumerate(shape) if a != time)
    for c, index, out in parts:
        part = m.add_kernel(f"{c.name}/{out.value_index}/part", "slice", [x], {
            "begin": [index if a == time else 0 for a in range(len(shape))],
            "end": [index + 1 if a == time else d for a, d in enumerate(shape)],
            "strides": [1] * len(shape), "shrink": [time]}, [], [op, c], None,
            output_shape=sliced, source_op=c)
        m.add_kernel(f"{c.name}/{out.value_index}", "transpose", [part.name], {"perm": perm},
                     [], [op, c], out, output_shape=tuple(sliced[p] for p in perm), source_op=c)
    return ""


def _batch_first_again(m: Context, order: list[int], op: tf.Operation,
                       shift: int) -> list[int] | None:
    """The per-sample permutation (of a sample's axes) of x, if op transposes transpose(x,
    order) so that the batch is first again (a time-major sequence of tf.scan's steps, put
    back batch-major by the user): the two transposes as one."""
    perm = m.operands.constant(op.inputs[1]) if op.type == "Transpose" else None
    if perm is None:
        return None
    composed = [order[int(p)] for p in perm]
    return [a - shift for a in composed[shift:]] if composed[0] == 0 else None


@generic("ReverseV2")
def reverse(m: Context, op: tf.Operation) -> str:
    """tf.reverse of a per-sample value along sample axes (Keras' Bidirectional realigns
    its backward layer's sequence): a slice with stride -1 on those axes."""
    x, axes_c = op.inputs[0], m.operands.constant(op.inputs[1])
    rank = len(static_shape(x))
    if not m.is_batched(x) or axes_c is None:
        return "reverses a value that is not per-sample, or along axes that are not constant"
    axes = {int(a) % rank for a in axes_c.ravel()}
    if 0 in axes:
        return "reverses the batch axis"
    shape = m.shape(x)
    flips = [a + m.axis_shift(x) in axes for a in range(len(shape))]
    m.add_kernel(op.name, "slice", [x], {"begin": [d - 1 if f else 0 for d, f in zip(shape, flips)],
                                         "end": [-1 if f else d for d, f in zip(shape, flips)],
                                         "strides": [-1 if f else 1 for f in flips], "shrink": []},
                 [], [op], op.outputs[0])
    return ""
