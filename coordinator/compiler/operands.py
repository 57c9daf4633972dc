"""What a tensor the samples do not flow through is, to the lowering: a constant (folded to
its value), a weight (a read of a variable, possibly viewed through a reshape), random
numbers, or a computation on weights the CS cannot place."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tensorflow as tf

VARIABLE_OPS = {"VarHandleOp", "VariableV2", "Variable"}
# Between a variable and its use: reads, and shape changes that keep its values in order.
VARIABLE_VIEW_OPS = {"ReadVariableOp", "Identity", "Reshape", "Squeeze", "ExpandDims", "Cast"}
RANDOM_OPS = {"RandomUniform", "RandomStandardNormal", "TruncatedNormal", "RandomUniformInt",
              "StatelessRandomUniformV2", "StatelessRandomNormalV2", "StatelessRandomUniform",
              "StatelessRandomNormal", "StatelessTruncatedNormalV2", "Multinomial",
              "RandomShuffle", "StatelessRandomGetKeyCounter"}
# Ops whose value depends on something other than their inputs: never folded to a constant.
STATEFUL_SOURCES = VARIABLE_OPS | RANDOM_OPS | {"Placeholder", "PlaceholderWithDefault"}


@dataclass(frozen=True)
class Weight:
    """A variable read, seen through reshapes: `shape` is the shape its user sees."""

    variable: str
    variable_shape: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: str


class Operands:
    """Classifies (and caches) the non-data tensors of one graph."""

    def __init__(self, graph: tf.Graph, flow: set[tf.Operation]):
        self.graph = graph
        self.flow = flow
        self._constants: dict[str, np.ndarray | None] = {}

    def weight(self, tensor: tf.Tensor) -> Weight | None:
        """The variable `tensor` reads (through value-preserving views), or None."""
        op, casts_ok = tensor.op, True
        while op not in self.flow and op.type in VARIABLE_VIEW_OPS and op.inputs:
            if op.type == "Cast" and op.get_attr("SrcT") != op.get_attr("DstT") and not (
                    op.get_attr("SrcT") == tf.float32 and op.get_attr("DstT") == tf.float16
                    and tensor.dtype == tf.float16):  # Keras' AutoCastVariable: the layer's
                casts_ok = False  # float16 kernel reads the float32 weight rounded
            op = op.inputs[0].op
        if op in self.flow or op.type not in VARIABLE_OPS or not casts_ok:
            return None
        shape = op.get_attr("shape") if op.type == "VarHandleOp" else op.outputs[0].shape
        dtype = op.get_attr("dtype") if op.type == "VarHandleOp" else op.outputs[0].dtype
        variable_shape = tuple(int(d) for d in tf.TensorShape(shape).as_list())
        seen = variable_shape if tensor.dtype == tf.resource else \
            tuple(int(d) for d in tensor.shape.as_list())  # a handle: ResourceGather's table
        return Weight(op.name, variable_shape, seen, tf.as_dtype(dtype).base_dtype.name)

    def depends_on(self, tensor: tf.Tensor, types: set[str]) -> tf.Operation | None:
        """The first op of `types` that `tensor`'s value depends on (None if none)."""
        seen, stack = set(), [tensor.op]
        while stack:
            op = stack.pop()
            if op in seen:
                continue
            seen.add(op)
            if op.type in types:
                return op
            stack.extend(t.op for t in op.inputs)
        return None

    def constant(self, tensor: tf.Tensor) -> np.ndarray | None:
        """The value of `tensor` if it depends on no input, variable or random op."""
        if tensor.name not in self._constants:
            value = None
            if tensor.op not in self.flow and self.depends_on(tensor, STATEFUL_SOURCES) is None:
                value = tf.get_static_value(tensor)
                if value is None:
                    with tf.compat.v1.Session(graph=self.graph) as session:
                        value = session.run(tensor)
                value = np.asarray(value)
            self._constants[tensor.name] = value
        return self._constants[tensor.name]

    def random_source(self, tensor: tf.Tensor) -> tf.Operation | None:
        return self.depends_on(tensor, RANDOM_OPS)


def static_shape(tensor: tf.Tensor) -> tuple[int, ...]:
    return tuple(int(d) for d in tensor.shape.as_list())

