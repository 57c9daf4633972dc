"""Lowerings of the ops that take sequences apart and put them together per sample: unstack,
split, stack and reverse along a sample's axes, and the time-major round trip of Keras'
unrolled recurrent layers and TimeDistributed (transpose the time axis first, unstack it or
take x[i] of every step; stack the steps, transpose back), which moves the batch axis only
in between. Each becomes slice, reshape and concat
kernels on the samples' own axes; a recurrent cell's weights are read at every step
(shared weights, `wse_sim.shared_weights`)."""
from __future__ import annotations

import tensorflow as tf

from coordinator.compiler import leading_stack
from coordinator.compiler.operands import static_shape
from coordinator.compiler.rules import Context, generic


def take(m: Context, op: tf.Operation, x: tf.Tensor, out: tf.Tensor, axis: int,
          lo: int, hi: int, shrink: bool, ops: list[tf.Operation]) -> None:
    """`out` = x[..., lo:hi, ...] along per-sample axis `axis` (dropped when `shrink`)."""
    shape = m.shape(x)
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
        take(m, op, x, out, axis - 1, i, i + 1, True, [op])
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
        return "splits the batch axis"
    lo = 0
    for out in op.outputs:
        size = static_shape(out)[axis]
        take(m, op, x, out, axis - 1, lo, lo + size, False, [op])
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
    for k, t in enumerate(values):
        shape = list(m.shape(t))
        shape.insert(axis - 1, 1)
        parts.append(m.add_kernel(f"{op.name}/expand_{k}", "reshape", [t], {"shape": shape}, [],
                                  [], None, output_shape=tuple(shape), source_op=op).name)
    m.add_kernel(op.name, "concat", parts, {"axis": axis - 1}, [], ops, out)
    return ""


def step_index(m: Context, op: tf.Operation, steps: int) -> int | None:
    """i if op is x[i] of a time-major x (a StridedSlice of axis 0 alone, shrinking it; x[-1]
    is the last step)."""
    if op.type != "StridedSlice" or any(op.get_attr(k) for k in (
            "begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask")) or \
            op.get_attr("shrink_axis_mask") != 1:
        return None
    begin, end, strides = (m.operands.constant(t) for t in op.inputs[1:])
    if begin is None or end is None or strides is None or \
            not len(begin) == len(end) == len(strides) == 1 or int(strides[0]) != 1:
        return None
    i = int(begin[0])  # (a shrunk axis reads begin alone, from the end when negative: x[-1])
    i = i + steps if -steps <= i < 0 else i
    return i if 0 <= i < steps else None


def time_major_unstack(m: Context, op: tf.Operation) -> str:
    """A transpose moving a time axis first, then taking it apart step by step (Keras'
    unrolled recurrent layers: unstack; Keras' TimeDistributed: x[i] for every i): step i
    is x[:, ..., i, ...], one slice each; or transposed back to batch-major (one per-sample
    transpose); "" if lowered, else why not."""
    x, perm = op.inputs[0], m.operands.constant(op.inputs[1])
    unstack = m.sole_consumer(op.outputs[0])
    rank = len(static_shape(x))
    refusal = "transposes the batch axis away from the first position"
    if perm is None or not m.is_batched(x):
        return refusal
    order = [int(p) for p in perm]
    time = order[0]
    if order[1] != 0 or order[1:] != [a for a in range(rank) if a != time]:
        return refusal
    if unstack is not None and unstack.type == "Unpack" and unstack.get_attr("axis") % rank == 0:
        for i, out in enumerate(unstack.outputs):
            take(m, unstack, x, out, time - 1, i, i + 1, True, [op, unstack])
        return ""
    steps = static_shape(x)[time]
    consumers = op.outputs[0].consumers()
    indices = [step_index(m, c, steps) for c in consumers]
    backs = [_batch_first_again(m, order, c) for c in consumers]
    if not consumers or any(i is None and b is None for i, b in zip(indices, backs)):
        return refusal
    for index, back, c in zip(indices, backs, consumers):
        if index is not None:
            take(m, c, x, c.outputs[0], time - 1, index, index + 1, True, [op, c])
        else:
            m.add_kernel(c.name, "transpose", [x], {"perm": back}, [], [op, c], c.outputs[0])
    return ""


def _batch_first_again(m: Context, order: list[int], op: tf.Operation) -> list[int] | None:
    """The per-sample permutation (of a sample's axes) of x, if op transposes transpose(x,
    order) so that the batch is first again (a time-major sequence of tf.scan's steps, put
    back batch-major by the user): the two transposes as one."""
    perm = m.operands.constant(op.inputs[1]) if op.type == "Transpose" else None
    if perm is None:
        return None
    composed = [order[int(p)] for p in perm]
    return [a - 1 for a in composed[1:]] if composed[0] == 0 else None


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
    flips = [a + 1 in axes for a in range(len(shape))]
    m.add_kernel(op.name, "slice", [x], {"begin": [d - 1 if f else 0 for d, f in zip(shape, flips)],
                                         "end": [-1 if f else d for d, f in zip(shape, flips)],
                                         "strides": [-1 if f else 1 for f in flips], "shrink": []},
                 [], [op], op.outputs[0])
    return ""
