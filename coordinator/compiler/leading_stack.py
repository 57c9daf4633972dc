"""tf.stack(values, axis=0) of per-sample values: a stack axis in front of the batch ([S, B,
...]: two heads' outputs, an ensemble's members, MC-dropout samples), or the same layout made
otherwise: a transpose moving a sample's axis first and the batch second (timm's qkv permute,
`transposed`), a draw of K sets a sample ([K, B, Z]: random_numbers.py), x[None] read by
element-wise ops (a stack of one, `unit_stack`; tf.broadcast_to it to K copies). The CS holds such a
value per sample with the stack axis first ((S, ...): the values, each with a unit axis
added, concatenated), recorded in `Context.leading`, and lowers what reads it only where
that layout is proven: element-wise ops (their other operands such values, per-sample
values of one rank less, which TF broadcasts over the stack axis, and constants or weights
that broadcast over the stack and batch axes), casts, softmax along a sample's last axis, a Keras Dense (Tensordot: each sample's (S, n) rows),
reshapes keeping the stack and batch axes (tf.squeeze(stacked, -1)), reductions over the
stack axis or a sample's own axes (tf.reduce_mean(stacked, 0), tf.math.reduce_std(stacked,
0): axis a >= 2 is the sample's axis a - 1), stacked[i], tf.unstack(stacked), transposes
keeping the batch first or second, and a loss summing or averaging it over the stack and
batch axes. Anything else reading it is refused naming what to write instead. The host
never reads such a value from the CS: it computes it, in TF's layout, from the stacked
values the CS streams (match.Matcher.host_outputs)."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from coordinator.compiler import fast_paths
from coordinator.compiler.operands import static_shape
from coordinator.compiler.rules import GENERIC, Context

REFUSAL = ("reads a value stacked in front of the batch ([S, batch, ...]: tf.stack(values, "
           "axis=0), a transpose putting the batch second, a [K, batch, ...] draw) other than "
           "as the CS holds it per sample: reduce over the stack axis 0 (tf.reduce_mean("
           "stacked, 0)), take stacked[i] or tf.unstack it, apply a Dense to it as it is (not "
           "reshaped to [-1, n]), or stack after the batch (tf.stack(values, axis=1))")
REDUCTIONS = {"Sum": "sum", "Mean": "mean", "Max": "max", "Min": "min", "Prod": "prod"}
# Ops whose TF layout is their input's (the leading value's generic lowering holds)
SAME_LAYOUT = ("Cast", "IsFinite")


def stack(m: Context, op: tf.Operation) -> str:
    """tf.stack of per-sample values along axis 0: a concat along the samples' new axis 0;
    none when only the host reads it (a prediction: it stacks the streamed values)."""
    out, values = op.outputs[0], list(op.inputs)
    if any(t.name in m.leading for t in values):
        return REFUSAL
    if not m.consumers(out):
        return ""
    parts: list[tf.Tensor | str] = []
    for k, t in enumerate(values):
        shape = (1, *m.shape(t))
        parts.append(m.add_kernel(f"{op.name}/expand_{k}", "reshape", [t], {"shape": list(shape)},
                                  [], [], None, output_shape=shape, source_op=op).name)
    m.leading.add(out.name)
    m.add_kernel(op.name, "concat", parts, {"axis": 0}, [], [op], out,
                 output_shape=(len(values), *m.shape(values[0])))
    return ""


def transposed(m: Context, op: tf.Operation, order: list[int]) -> str:
    """A transpose of a per-sample value moving one of a sample's axes in front of the batch,
    the batch next (timm's attention: q, k, v = tf.unstack(tf.transpose(qkv, [2, 0, 3, 1, 4]))):
    the stack-first layout, each sample's axes in the transpose's order."""
    own = [p - 1 for p in order if p != 0]
    shape = m.shape(op.inputs[0])
    m.leading.add(op.outputs[0].name)
    m.add_kernel(op.name, "transpose", [op.inputs[0]], {"perm": own}, [], [op], op.outputs[0],
                 output_shape=tuple(shape[p] for p in own))
    return ""


def unit_stack(m: Context, op: tf.Operation) -> bool:
    """A per-sample value given a unit axis in front of the batch (mu[None], tf.expand_dims(
    mu, 0)) read by element-wise ops alone, directly or through unary ops and a broadcast of
    the unit axis (a VIB's mu[None] + sigma[None] * eps, eps [K, B, Z]; an IWAE's
    tf.exp(logvar[None]), tf.broadcast_to(x[None], tf.shape(logits))): a stack of one, its
    readers lowered as any stack-first value's."""
    from coordinator.compiler.in_batch import row_shape
    if op.type not in ("StridedSlice", "ExpandDims", "Reshape") or row_shape(m, op) is None:
        return False  # (x whole, each value in place: not x[None, :, ::-1])
    x, out = op.inputs[0], op.outputs[0]
    if m.axis_shift(x) != 1 or tuple(static_shape(out)) != (1, *static_shape(x)):
        return False
    readers = _binary_readers(m, out)
    if not readers or _pairs_samples(readers):
        return False
    m.leading.add(out.name)
    m.add_kernel(op.name, "reshape", [x], {"shape": [1, *m.shape(x)]}, [], [op], out,
                 output_shape=(1, *m.shape(x)))
    return True


def _binary_readers(m: Context, out: tf.Tensor) -> list[tuple[tf.Operation, tf.Tensor]] | None:
    """The binary element-wise ops reading `out` (x[None]), each with the value of it they
    read, directly or through unary ops and broadcasts of the unit axis; None when another op
    reads it or any of those values."""
    from coordinator.compiler.lowering import BINARY, UNARY
    readers, pending = [], [out]
    while pending:
        value = pending.pop()
        consumers = m.consumers(value)
        if not consumers:
            return None
        for c in consumers:
            if c.type in BINARY:
                readers.append((c, value))
            elif c.type in UNARY or stack_broadcast(c):
                pending.append(c.outputs[0])
            else:
                return None
    return readers


def stack_broadcast(op: tf.Operation) -> bool:
    """tf.broadcast_to of a stack of one to K copies ([1, B, ...] -> [K, B, ...])."""
    if op.type != "BroadcastTo":
        return False
    source, out = static_shape(op.inputs[0]), static_shape(op.outputs[0])
    return len(source) == len(out) >= 2 and source[0] == 1 and None not in out and \
        tuple(source[1:]) == tuple(out[1:])


def _pairs_samples(readers: list[tuple[tf.Operation, tf.Tensor]]) -> bool:
    """x[None] meets x[:, None]-shaped values ([B, 1, ...]): the in-batch pairing of every
    sample with every other (sq[:, None] + sq[None, :]), not a stack of one."""
    return any(len(static_shape(t)) == len(static_shape(value)) and static_shape(t)[1] == 1
               and static_shape(t)[0] != 1
               for c, value in readers for t in c.inputs if t is not value)


def loss_reduction(m: Context, op: tf.Operation) -> bool:
    """A sum or mean over the stack and batch axes (the loss's, tf.reduce_mean(tf.square(
    stacked - labels))): it enters the loss tail as any batch reduction, which loss_tail.py
    proves a sum of the values times constants, the same sum in either layout (a loss
    that is not one is refused there)."""
    constant = m.operands.constant(op.inputs[1]) if op.type in ("Sum", "Mean") else None
    rank = len(static_shape(op.inputs[0]))
    return constant is not None and {0, 1} <= {int(a) % rank for a in np.atleast_1d(constant)}


def lower(m: Context, op: tf.Operation) -> str:
    """An op reading a value held with its stack axis first: its kernels ("") or why not."""
    from coordinator.compiler.lowering import BINARY, SELECTS, UNARY
    x = op.inputs[0]
    if op.type in ("Identity", "Snapshot"):
        m.leading.add(op.outputs[0].name)
        m.alias(op, x)
        return ""
    if op.type == "StopGradient":
        m.leading.add(op.outputs[0].name)
        m.add_kernel(op.name, "stop_gradient", [x], {}, [], [op], op.outputs[0], output_shape=m.shape(x))
        return ""
    if op.type in UNARY or op.type in SAME_LAYOUT or (op.type in (*BINARY, *SELECTS) and _operands_align(m, op)):
        m.leading.add(op.outputs[0].name)
        return GENERIC[op.type](m, op)
    if stack_broadcast(op):  # (K copies of a stack of one: each sample's, tiled)
        copies = static_shape(op.outputs[0])[0]
        m.leading.add(op.outputs[0].name)
        m.add_kernel(op.name, "tile", [x], {"multiples": [copies] + [1] * (len(m.shape(x)) - 1)},
                     [], [op], op.outputs[0], output_shape=(copies, *m.shape(x)[1:]))
        return ""
    if op.type in ("Softmax", "LogSoftmax") and len(static_shape(x)) >= 3:  # (a sample's last axis)
        m.leading.add(op.outputs[0].name)
        return GENERIC[op.type](m, op)
    if op.type == "Reshape" and fast_paths.tensordot(m, op, stacked=True):  # (a Dense)
        return ""
    if op.type in ("Reshape", "Squeeze", "ExpandDims"):
        return _reshape(m, op)
    if op.type in REDUCTIONS:
        return _reduce(m, op)
    if op.type == "Transpose":
        return _transpose(m, op)
    if op.type in ("StridedSlice", "Unpack"):
        return _take(m, op)
    return REFUSAL


def _operands_align(m: Context, op: tf.Operation) -> bool:
    """Every operand of an element-wise op meets the stack and batch axes as the per-sample
    kernel broadcasts it: a leading value, a per-sample value of one rank less (TF broadcasts
    it over the stack axis), or a constant or weight of lower rank whose first axis (if it
    reaches the batch axis) is 1."""
    rank = len(static_shape(op.outputs[0]))
    for t in op.inputs:
        shape = static_shape(t)
        if t.name in m.leading:
            if len(shape) != rank:
                return False
            continue
        if m.is_batched(t):
            if len(shape) != rank - 1:
                return False
        elif batch_constant(m, op, t) is None and (
                len(shape) >= rank or (len(shape) == rank - 1 and shape[0] != 1)):
            return False
    return True


def batch_constant(m: Context, op: tf.Operation, tensor: tf.Tensor) -> np.ndarray | None:
    """A constant of the stack-first layout's full shape read with leading values, the same
    for every sample (tf.zeros_like(stacked) in tf.nn.sigmoid_cross_entropy_with_logits):
    its one sample's (1, S, ...) values, else None."""
    value = m.operands.constant(tensor)
    if value is None or value.ndim != len(static_shape(op.outputs[0])) or value.ndim < 2 or \
            value.shape[1] != m.batch_size or not (value == value[:, :1]).all() or \
            not any(t.name in m.leading for t in op.inputs):
        return None
    return np.moveaxis(value[:, :1], 1, 0)


def _reshape(m: Context, op: tf.Operation) -> str:
    """A reshape keeping the stack and batch axes (tf.squeeze(stacked, -1)): the sample's own,
    each (stack, batch) block's values in the same order."""
    source, out = static_shape(op.inputs[0]), static_shape(op.outputs[0])
    if source[:1] == (1,) and tuple(out) == tuple(source[1:]):  # (a stack of one, unstacked:
        m.add_kernel(op.name, "reshape", [op.inputs[0]], {"shape": list(out[1:])}, [], [op],
                     op.outputs[0])  # tf.reduce_logsumexp's max over the stack, squeezed)
        return ""
    if len(out) < 2 or tuple(out[:2]) != tuple(source[:2]):
        return REFUSAL
    m.leading.add(op.outputs[0].name)
    m.add_kernel(op.name, "reshape", [op.inputs[0]], {"shape": [out[0], *out[2:]]}, [], [op],
                 op.outputs[0])
    return ""


def _reduce(m: Context, op: tf.Operation) -> str:
    """A reduction over the stack axis (0) and sample axes (a >= 2 -> a - 1), never the batch's."""
    x, out = op.inputs[0], op.outputs[0]
    constant = m.operands.constant(op.inputs[1])
    rank = len(static_shape(x))
    axes = None if constant is None else {int(a) % rank for a in np.atleast_1d(constant)}
    if not axes or 1 in axes:
        return ("reduces tf.stack(values, axis=0) over the batch axis but not the stack "
                "axis (or over no constant axes): reduce over the stack axis 0 first "
                "(tf.reduce_mean(stacked, 0)), or over both in the loss")
    own = sorted(0 if a == 0 else a - 1 for a in axes)
    keep = bool(op.get_attr("keep_dims"))
    shape = m.shape(x)
    reduced = tuple(1 if i in own else d for i, d in enumerate(shape) if keep or i not in own)
    if keep or 0 not in own:
        m.leading.add(out.name)
    m.add_kernel(op.name, "reduce", [x], {"op": REDUCTIONS[op.type], "axes": own, "keepdims": keep},
                 [], [op], out, output_shape=reduced)
    return ""


def _transpose(m: Context, op: tf.Operation) -> str:
    """A transpose putting the batch first (a per-sample value again: the stack axis among the
    sample's) or second (still a leading value)."""
    x, out = op.inputs[0], op.outputs[0]
    perm = m.operands.constant(op.inputs[1])
    order = [] if perm is None else [int(p) for p in perm]
    if 1 not in order[:2]:
        return REFUSAL
    own = [0 if p == 0 else p - 1 for p in order if p != 1]
    if order[1] == 1:
        m.leading.add(out.name)
    shape = m.shape(x)
    m.add_kernel(op.name, "transpose", [x], {"perm": own}, [], [op], out,
                 output_shape=tuple(shape[p] for p in own))
    return ""


def _take(m: Context, op: tf.Operation) -> str:
    """stacked[i] and tf.unstack(stacked): the sample's slices along its axis 0."""
    from coordinator.compiler.sequences import step_index, take
    x = op.inputs[0]
    steps = m.shape(x)[0]
    if op.type == "Unpack":
        if op.get_attr("axis") != 0:
            return REFUSAL
        for i, out in enumerate(op.outputs):
            take(m, op, x, out, 0, i, i + 1, True, [op])
        return ""
    index = step_index(m, op, steps)
    if index is None:
        return REFUSAL
    take(m, op, x, op.outputs[0], 0, index, index + 1, True, [op])
    return ""
