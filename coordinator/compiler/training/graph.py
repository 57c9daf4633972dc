"""What the training pass reads off the graph: constants, the variable behind a read, and a
problem as the line the user reads."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from coordinator.compiler.extract import (
    ExtractedGraph,
    data_upstream,
    op_closure,
    user_name,
    user_source,
)

_READ_OPS = {"Identity", "ReadVariableOp", "Snapshot"}


class Refused(Exception):
    """One problem, as the line the user reads; `hint`: what to do, when the training
    analysis' general hint does not say it."""

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.hint = hint


def fail(op: tf.Operation, what: str, hint: str = "") -> Refused:
    """A problem: what is wrong in the user's terms, then the op and its source line."""
    return Refused(f"{what} ({op.type} '{user_name(op)}' at {user_source(op)})", hint)


def variable_op(tensor: tf.Tensor) -> tf.Operation:
    """The VarHandleOp/VariableV2 a handle, ref or read of a variable comes from."""
    op = tensor.op
    while op.type in _READ_OPS and op.inputs:
        op = op.inputs[0].op
    return op


def step_runs(extracted: ExtractedGraph) -> set[tf.Operation]:
    """The ops a training step runs: the train_op's, the loss's and the summaries' closures
    (TF runs no other op, so a read outside them is never made)."""
    spec, graph = extracted.spec, extracted.graph
    starts = [spec.train_op, spec.loss, *graph.get_collection(tf.compat.v1.GraphKeys.SUMMARIES)]
    return {op for start in starts if start is not None for op in op_closure(start)}


# Arithmetic on constants that tf.get_static_value does not fold (MixedPrecisionLossScale-
# Optimizer's 1 / S of a FixedLossScale; FtrlOptimizer's l2 + beta / (2 * max(lr, 1e-36))):
# evaluated when every op above is one of these.
_FOLDABLE = {"Const", "Identity", "Cast", "RealDiv", "Mul", "Reciprocal", "AddV2", "Sub", "Neg",
             "Maximum"}


def const(tensor: tf.Tensor) -> np.ndarray | None:
    value = tf.get_static_value(tensor)
    upstream = data_upstream(tensor.op)
    if value is None and tensor.shape.rank == 0 and all(op.type in _FOLDABLE for op in upstream):
        value = _folded(tensor, upstream)
    return None if value is None else np.asarray(value)


def _folded(tensor: tf.Tensor, upstream: list[tf.Operation]) -> np.ndarray:
    """`tensor`'s value from its (constant) data inputs alone, in a graph of its own: a control
    input (a hyper-parameter made under tf.control_dependencies(UPDATE_OPS)) would run updates
    that read the batch and the variables."""
    graph_def = tf.compat.v1.GraphDef()
    for op in upstream:
        node = graph_def.node.add()
        node.CopyFrom(op.node_def)
        del node.input[:]
        node.input.extend(i for i in op.node_def.input if not i.startswith("^"))
    with tf.Graph().as_default() as graph:
        tf.graph_util.import_graph_def(graph_def, name="")
        with tf.compat.v1.Session(graph=graph) as session:
            return session.run(tensor.name)


def scalar(tensor: tf.Tensor) -> float | None:
    value = const(tensor)
    return None if value is None or value.size != 1 else float(value.reshape(()))


def uniform(tensor: tf.Tensor) -> float | None:
    """The value of a constant whose elements are all equal (a scalar, tf.ones_like's)."""
    value = const(tensor)
    if value is None or value.size == 0 or np.any(value != value.flat[0]):
        return None
    return float(value.flat[0])


def skip_identity(tensor: tf.Tensor) -> tf.Tensor:
    while tensor.op.type in ("Identity", "Snapshot") or (
            tensor.op.type == "Cast" and tensor.op.inputs[0].dtype == tensor.dtype):
        tensor = tensor.op.inputs[0]
    return tensor


def variables_under(tensor: tf.Tensor) -> list[tf.Operation]:
    """The variables `tensor` is computed from."""
    return [op for op in data_upstream(tensor.op) if op.type in ("VarHandleOp", "VariableV2")]
