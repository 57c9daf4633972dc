"""A weight given to every sample: a value of weights alone tiled over the batch (ViT's class
token `tf.tile(cls, [tf.shape(x)[0], 1, 1])`, a Set Transformer's seed queries, Perceiver
latents by `tf.broadcast_to(w, [batch, ...])`, DETR queries by `tf.repeat(w[None], batch,
0)`, `tf.ones_like(x[:, :1]) * w`, a flow's log-determinant `tf.zeros(tf.shape(z)[:1]) +
tf.reduce_sum(log_s)`). Ones times, or zeros plus, a value with no axis of the batch's length
(absent or 1) are that value in every row along the first axis, whatever that axis means:
TF folds tf.shape to a constant, so the ones or zeros need no provenance. Such an op is a source of the data flow, like an input:
a `broadcast` kernel gives each sample of the micro-batch the weight (or the weight
program's value), a `tile` kernel repeats it within the sample when the tile does too, and
what follows is computed per sample as TF computes it. The weight's
gradient is the sum over the batch of the per-sample gradients (TF's TileGrad: a Sum over
the tiled axis), accumulated as any weight's. A float16 tile (of a Keras mixed_float16
layer's weight) is a float16 kernel reading the weight's float16 copy.

A constant tiled over the batch that meets weights before any sample, on the way to the loss
or outputs (a Kalman filter's initial covariance tf.tile(P0[None], [batch, 1, 1]) carried by
a tf.scan through F P F^T + Q), is a source too: each sample's row (`sample_constant`), and
what follows is computed per sample, as TF computes each row of the batch.
"""
from __future__ import annotations

from typing import AbstractSet

import numpy as np
import tensorflow as tf

from coordinator.compiler.extract import SHAPE_OPS
from coordinator.compiler.ir import ParamRef
from coordinator.compiler.operands import RANDOM_OPS, VARIABLE_OPS, depends_on, static_shape
from coordinator.compiler.rules import Context

SOURCE_OPS = {"Placeholder", "PlaceholderWithDefault"} | RANDOM_OPS


def _static(tensor: tf.Tensor) -> np.ndarray | None:
    value = tf.get_static_value(tensor)
    return None if value is None else np.asarray(value)


def _is_ones(tensor: tf.Tensor) -> bool:
    return _is_filled(tensor, "OnesLike", 1)


def _is_zeros(tensor: tf.Tensor) -> bool:
    return _is_filled(tensor, "ZerosLike", 0)


def _is_filled(tensor: tf.Tensor, like: str, number: int) -> bool:
    if tensor.op.type == like:
        return True
    value = _static(tensor)
    return value is not None and value.size > 0 and bool((value == number).all())


# a value times ones or plus zeros as long as the batch is the value given to every sample
NEUTRAL = {"Mul": _is_ones, "Add": _is_zeros, "AddV2": _is_zeros}


def broadcast_value(op: tf.Operation, batch: int, forward: AbstractSet[tf.Operation] = frozenset(),
                    ) -> tuple[tf.Tensor, tuple[int, ...]] | None:
    """(the value, the shape it is read as) if `op`'s output is a value of weights alone
    given unchanged to each of the batch's samples (or, among the `forward` ops, the loss's and
    outputs' upstream, a constant that meets weights before any sample); None otherwise."""
    if len(op.outputs) != 1 or op.outputs[0].dtype not in (tf.float32, tf.float16) or \
            not op.outputs[0].shape.is_fully_defined():
        return None
    out = static_shape(op.outputs[0])
    if len(out) < 1 or out[0] != batch:
        return None
    found: tuple[tf.Tensor, tuple[int, ...]] | None = None
    if op.type == "Tile" and op.inputs[0].shape.is_fully_defined():
        value = op.inputs[0]  # tiled within the sample too: a `tile` kernel follows
        if len(static_shape(value)) == len(out):
            found = (value, static_shape(value))
    elif op.type == "BroadcastTo" and op.inputs[0].shape.is_fully_defined():
        found = (op.inputs[0], static_shape(op.inputs[0]))
    elif op.type in NEUTRAL:
        ones = [t for t in op.inputs if NEUTRAL[op.type](t)]
        rest = [t for t in op.inputs if not NEUTRAL[op.type](t)]
        if len(ones) == 1 and len(rest) == 1 and rest[0].shape.is_fully_defined() and \
                static_shape(ones[0]) == tuple(out):
            found = (rest[0], static_shape(rest[0]))
    elif op.type == "Reshape" and op.inputs[0].op.type == "Tile":  # tf.repeat over axis 0
        value = op.inputs[0].op.inputs[0]
        if value.shape.is_fully_defined() and static_shape(value) == (1, 1, *out[1:]) and \
                static_shape(op.inputs[0]) == (1, *out):
            found = (value, (1, *out[1:]))
    if found is None:
        return None
    value, shape = found
    if len(shape) > len(out) or (len(shape) == len(out) and shape[0] != 1) or \
            depends_on(value, SOURCE_OPS, SHAPE_OPS) is not None:
        return None
    if depends_on(value, VARIABLE_OPS, SHAPE_OPS) is None and \
            (op.type in NEUTRAL or not _meets_weights(op, batch, forward)):
        return None
    return found


def _meets_weights(op: tf.Operation, batch: int, forward: AbstractSet[tf.Operation]) -> bool:
    """Whether a constant `op` tiles over the batch meets weights before any sample, its
    batch axis kept or folded with the sample's rows ([B*k, ...]: a Dense's Tensordot), on the
    way to the loss or outputs (a Kalman filter's initial covariance tf.tile(P0[None], [batch,
    1, 1]), then F P F^T + Q; IQN's quantile fractions tiled, then a Dense of their cosines):
    each sample's copy then carries the computation per sample, as TF computes each row."""
    seen, stack = {op}, [op]
    while stack:
        for out in stack.pop().outputs:
            for c in out.consumers():
                if c in seen or c not in forward or \
                        depends_on(c.outputs[0] if c.outputs else out, SOURCE_OPS,
                                   SHAPE_OPS) is not None:
                    continue
                if any(depends_on(t, VARIABLE_OPS, SHAPE_OPS) is not None for t in c.inputs):
                    return True
                rows = c.outputs[0].shape[0] if c.outputs and c.outputs[0].shape.rank else None
                if rows is not None and rows % batch == 0:  # the batch, or folded rows of it
                    seen.add(c)
                    stack.append(c)
    return False


def constant_rows(m: Context, op: tf.Operation) -> np.ndarray | None:
    """The value of a constant `op` tiles over the batch (each sample's row), or None if
    its value reads a weight."""
    if op.type not in ("Tile", "BroadcastTo", "Reshape"):  # (ones times, zeros plus a weight)
        return None
    value = op.inputs[0] if op.type != "Reshape" else op.inputs[0].op.inputs[0]
    found = m.operands.constant(value)
    if depends_on(value, VARIABLE_OPS, SHAPE_OPS) is not None or found is None:
        return None
    out = static_shape(op.outputs[0])
    aligned = found.reshape((1,) * (len(out) - found.ndim) + found.shape)
    return np.tile(aligned, [o // a for a, o in zip(aligned.shape, out)]).reshape(out)


def lower(m: Context, op: tf.Operation) -> str:
    """A `broadcast` kernel giving each sample the weight `op` tiles over the batch (or why
    the CS cannot read that value)."""
    rows = constant_rows(m, op)
    if rows is not None:
        m.add_kernel(m.scope(op), "sample_constant", [m.sample_input()],
                     {"value": rows.astype(np.float32)}, [], [op], op.outputs[0])
        return ""
    found = broadcast_value(op, m.batch_size)
    assert found is not None
    value, shape = found
    weight = m.operands.weight(value) or m.operands.view(value) or m.derived_weight(value)
    if weight is None:
        return m.weight_problem(value) or "tiles over the batch a value the CS cannot compute"
    if weight.dtype != "float32":
        return f"weight {weight.variable} is {weight.dtype}: the CS computes in float32"
    view = None if weight.view is None else np.ascontiguousarray(weight.view.reshape(shape))
    param = ParamRef("value", weight.variable, shape, variable_shape=weight.variable_shape, view=view)
    out = static_shape(op.outputs[0])[1:]
    aligned = (1,) * (len(out) + 1 - len(shape)) + shape
    multiples = [n // d if d != 1 else 1 for d, n in zip(aligned[1:], out)]
    if op.type != "Tile" or multiples == [1] * len(out):
        m.add_kernel(m.scope(op), "broadcast", [m.sample_input()],
                     {"shape": list(out), "value": list(shape)}, [param], [op], op.outputs[0])
        return ""
    # tf.tile(w, [batch, k, 1]): every sample's copy of w, then tiled within the sample
    each = [n if d == 1 else d for d, n in zip(aligned[1:], out)]  # unit axes broadcast
    copies = m.add_kernel(m.scope(op), "broadcast", [m.sample_input()],
                          {"shape": each, "value": list(shape)}, [param], [op], None, tuple(each))
    m.add_kernel(m.scope(op), "tile", [copies.name], {"multiples": multiples}, [], [op], op.outputs[0])
    return ""
