"""What a tensor the samples do not flow through is, to the lowering: a constant (folded to
its value), a weight (a read of a variable, possibly viewed through a reshape), random
numbers, or a computation on weights the CS cannot place."""
from __future__ import annotations

from collections.abc import Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

import numpy as np
import tensorflow as tf

VARIABLE_OPS = {"VarHandleOp", "VariableV2", "Variable"}
# Between a variable and its use: reads, and shape changes that keep its values in order.
VARIABLE_VIEW_OPS = {"ReadVariableOp", "Identity", "Reshape", "Squeeze", "ExpandDims", "Cast"}
# Static views: they pick elements of a weight by constant indices (a slice, a constant
# gather, a transpose); the CS reads the view and scatters its gradient back, as TF's do.
INDEX_VIEW_OPS = {"StridedSlice", "Slice", "GatherV2", "ResourceGather", "Transpose", "Split",
                  "SplitV", "Unpack"}
VIEW_SOURCE = VARIABLE_VIEW_OPS | INDEX_VIEW_OPS | {"AddV2", "Add"}
RANDOM_OPS = {"RandomUniform", "RandomStandardNormal", "TruncatedNormal", "RandomUniformInt",
              "StatelessRandomUniformV2", "StatelessRandomNormalV2", "StatelessRandomUniform",
              "StatelessRandomNormal", "StatelessTruncatedNormalV2", "Multinomial",
              "RandomShuffle", "StatelessRandomGetKeyCounter", "StatelessRandomUniformInt",
              "StatelessRandomUniformIntV2", "StatelessRandomUniformFullIntV2",
              "StatelessMultinomial", "RandomGamma", "RandomPoissonV2"}
# Ops reading only their input's shape (static: a constant of the graph's fixed shapes).
SHAPE_OPS = frozenset({"Shape", "ShapeN"})
# Ops whose value depends on something other than their inputs: never folded to a constant.
STATEFUL_SOURCES = VARIABLE_OPS | RANDOM_OPS | {"Placeholder", "PlaceholderWithDefault"}


@dataclass(frozen=True)
class Weight:
    """A variable read, seen through reshapes: `shape` is the shape its user sees."""

    variable: str
    variable_shape: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: str
    # a static view: the flat index into the variable of each element its user sees
    view: np.ndarray | None = field(default=None, compare=False)


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

    def view(self, tensor: tf.Tensor) -> Weight | None:
        """A static view of a variable (slices, constant gathers and splits, transposes and
        reshapes of its read, pos_table[:n]; a sum with zeros broadcasts it), with its index
        map; None if `tensor` is not one. A view that keeps every element in order is the
        weight itself (tf.gather(w, tf.range(n)))."""
        chain: list[tf.Tensor] = []
        t = tensor
        while t.op not in self.flow and t.op.type in VIEW_SOURCE and t.op.inputs:
            chain.append(t)
            t = self._viewed_input(t)
            if t is None:
                return None
        op = t.op
        if op in self.flow or op.type not in VARIABLE_OPS or \
                not any(c.op.type in INDEX_VIEW_OPS for c in chain):
            return None
        base = self.weight(op.outputs[0])
        if base is None:
            return None
        index: np.ndarray | None = np.arange(int(np.prod(base.variable_shape)),
                                             dtype=np.int64).reshape(base.variable_shape)
        for step in reversed(chain):
            index = self._replay(step, index) if index is not None else None
        shape = static_shape(tensor)
        if index is None or tuple(index.shape) != shape:
            return None
        whole = index.size == int(np.prod(base.variable_shape)) and \
            np.array_equal(index.reshape(-1), np.arange(index.size))
        return Weight(base.variable, base.variable_shape, shape, base.dtype,
                      None if whole else np.array(index, order="C"))  # (ascontiguousarray makes a scalar 1-d)

    def _viewed_input(self, t: tf.Tensor) -> tf.Tensor | None:
        """The tensor a view op reads its values from (None: no single one)."""
        op = t.op
        if op.type == "Split":
            return op.inputs[1]
        if op.type in ("AddV2", "Add"):  # zeros + a view (a recurrent layer's first step)
            rest = [x for x in op.inputs if self.zeros(x) is None]
            return rest[0] if len(rest) == 1 else None
        return op.inputs[0]

    def _replay(self, t: tf.Tensor, index: np.ndarray) -> np.ndarray | None:
        """`t`'s op applied to the index array of its viewed input (None: not a static view)."""
        op = t.op
        kind = op.type
        if kind == "Cast":  # a float16 kernel reads its float32 weight rounded (weight())
            same = op.get_attr("SrcT") == op.get_attr("DstT")
            to_half = (op.get_attr("SrcT"), op.get_attr("DstT")) == (tf.float32, tf.float16)
            return index if same or to_half else None
        if kind in ("ReadVariableOp", "Identity"):
            return index
        if kind in ("Reshape", "Squeeze", "ExpandDims"):
            return index.reshape(static_shape(t))
        if kind in ("AddV2", "Add"):
            return np.broadcast_to(index, static_shape(t))
        if kind == "Unpack":
            return np.take(index, t.value_index, axis=op.get_attr("axis"))
        args_of = {"Split": op.inputs[:1], "SplitV": op.inputs[1:]}.get(kind, op.inputs[1:])
        found = [self.constant(x) for x in args_of]
        args = [a for a in found if a is not None]
        if len(args) != len(found):
            return None
        if kind == "Transpose":
            return np.transpose(index, [int(p) for p in args[0]])
        if kind in ("Split", "SplitV"):
            axis = int(args[0] if kind == "Split" else args[1]) % index.ndim
            sizes = [static_shape(o)[axis] for o in op.outputs]
            lo = sum(sizes[:t.value_index])
            return np.take(index, np.arange(lo, lo + sizes[t.value_index]), axis=axis)
        if kind in ("GatherV2", "ResourceGather"):
            axis = int(args[1]) if kind == "GatherV2" else 0
            if op.get_attr("batch_dims") != 0:
                return None
            return np.take(index, args[0].astype(np.int64), axis=axis)
        if kind == "Slice":
            begin, size = (a.astype(np.int64) for a in args)
            return index[tuple(slice(int(b), None if int(n) < 0 else int(b) + int(n))
                               for b, n in zip(begin, size))]
        return index[strided_index(op, *args)]

    def zeros(self, tensor: tf.Tensor) -> np.ndarray | None:
        """Zeros, if `tensor` is a constant of zeros or a product of one and a weight."""
        value = self.constant(tensor)
        if value is None:
            value = self.zero_product(tensor)
        return value if value is not None and value.size and not value.any() else None

    def depends_on(self, tensor: tf.Tensor, types: set[str]) -> tf.Operation | None:
        """The first op of `types` that `tensor`'s value depends on (None if none)."""
        return depends_on(tensor, types)

    def constant(self, tensor: tf.Tensor) -> np.ndarray | None:
        """The value of `tensor` if it depends on no input, variable or random op."""
        if tensor.name not in self._constants:
            value = None
            if tensor.op not in self.flow and self.depends_on(tensor, STATEFUL_SOURCES) is None:
                value = tf.get_static_value(tensor)
                if value is None:
                    try:
                        value = _evaluate(self.graph, tensor)
                    except (tf.errors.InvalidArgumentError, tf.errors.NotFoundError):
                        pass  # an op TF's CPU has no kernel for (a float16 MaxPool3D under a
                        # shape): not a constant here; that op is refused in its own line
                value = None if value is None else np.asarray(value)
            self._constants[tensor.name] = value
        return self._constants[tensor.name]

    def shaped_constant(self, tensor: tf.Tensor) -> np.ndarray | None:
        """The value of `tensor` if it depends on no input, variable or random op but through
        tf.shape of values of static shape (tf.image.ssim's window tiled to the images'
        channels), each such shape its static value."""
        value = self.constant(tensor)
        if value is not None or tensor.op in self.flow or \
                depends_on(tensor, STATEFUL_SOURCES, not_through=SHAPE_OPS) is not None:
            return value
        ops = list(upstream(tensor, SHAPE_OPS))
        read = {t.name for op in ops if op.type not in SHAPE_OPS for t in op.inputs}
        shapes = {out.name: op.inputs[k] for op in ops if op.type in SHAPE_OPS
                  for k, out in enumerate(op.outputs) if out.name in read}  # (ShapeN: one per input)
        if any(op.control_inputs for op in ops) or \
                not all(x.shape.is_fully_defined() for x in shapes.values()):
            return None
        # the ops computing it, in a graph of their own with each shape a constant (a
        # Session fed the shapes would still run the ops before them)
        kept = {op.name for op in ops if op.type not in SHAPE_OPS}
        graph_def = tf.compat.v1.GraphDef()
        graph_def.node.extend(n for n in self.graph.as_graph_def().node if n.name in kept)
        with tf.Graph().as_default() as graph:
            fed = {name: tf.constant(static_shape(x), tf.as_dtype(self.graph.get_tensor_by_name(name).dtype))
                   for name, x in shapes.items()}
            found = tf.compat.v1.import_graph_def(graph_def, fed, [tensor.name], name="")[0]
            with tf.compat.v1.Session(graph=graph) as session:
                return np.asarray(session.run(found))

    def zero_product(self, tensor: tf.Tensor) -> np.ndarray | None:
        """Zeros, if `tensor` is a product of a weight (or a static view of one) and a constant
        of zeros (a recurrent layer's first step: its zero initial state times the recurrent
        kernel, or Keras GRU's slice of it, or ConvLSTM2D's convolved by its gate's slice), or
        a view of such zeros; TF's gradient of such a product to the weight is zero too."""
        op = tensor.op
        if op not in self.flow and op.type in INDEX_VIEW_OPS | VARIABLE_VIEW_OPS - {"Cast"}:
            inner = self._viewed_input(tensor)
            return None if inner is None or self.zero_product(inner) is None else \
                np.zeros(static_shape(tensor), tensor.dtype.as_numpy_dtype)
        if op in self.flow or op.type not in ("MatMul", "BatchMatMulV2", "BatchMatMulV3", "Mul",
                                                        "Conv2D", "Conv3D"):
            return None
        factors = [self.constant(t) for t in op.inputs]
        if not any(f is not None and f.size and not f.any() for f in factors) or \
                not all(f is not None or self.weight(t) is not None or self.view(t) is not None
                        for f, t in zip(factors, op.inputs)):
            return None
        return np.zeros(static_shape(tensor), tensor.dtype.as_numpy_dtype)

    def random_source(self, tensor: tf.Tensor) -> tf.Operation | None:
        return self.depends_on(tensor, RANDOM_OPS)


def strided_index(op: tf.Operation, begin: np.ndarray, end: np.ndarray,
                   strides: np.ndarray) -> tuple:
    """A StridedSlice's numpy index: TF's strided_slice is Python's slicing, spelt in masks."""
    masks = {k: op.get_attr(k) for k in ("begin_mask", "end_mask", "ellipsis_mask",
                                         "new_axis_mask", "shrink_axis_mask")}
    index: list = []
    for axis, (b, e, s) in enumerate(zip(begin, end, strides)):
        if masks["ellipsis_mask"] >> axis & 1:
            index.append(Ellipsis)
        elif masks["new_axis_mask"] >> axis & 1:
            index.append(np.newaxis)
        elif masks["shrink_axis_mask"] >> axis & 1:
            index.append(int(b))
        else:
            index.append(slice(None if masks["begin_mask"] >> axis & 1 else int(b),
                               None if masks["end_mask"] >> axis & 1 else int(e), int(s)))
    return tuple(index)


def _evaluate(graph: tf.Graph, tensor: tf.Tensor) -> np.ndarray:
    """The value of `tensor`, which depends on no input, variable or random op; computed
    without the control dependencies of the ops it reads (a constant made under
    tf.control_dependencies([a state write]), which would run the write)."""
    ops, stack = {tensor.op}, [tensor.op]
    while stack:
        op = stack.pop()
        for t in op.inputs:
            if t.op not in ops:
                ops.add(t.op)
                stack.append(t.op)
    if not any(op.control_inputs for op in ops):
        with tf.compat.v1.Session(graph=graph) as session:
            return session.run(tensor)
    names = {op.name for op in ops}
    whole = graph.as_graph_def()
    pruned = tf.compat.v1.GraphDef(versions=whole.versions, library=whole.library)
    for node in whole.node:
        if node.name in names:
            kept = pruned.node.add()
            kept.CopyFrom(node)
            del kept.input[:]
            kept.input.extend(i for i in node.input if not i.startswith("^"))
    with tf.Graph().as_default() as alone:
        tf.compat.v1.import_graph_def(pruned, name="")
        with tf.compat.v1.Session(graph=alone) as session:
            return session.run(tensor.name)


def depends_on(tensor: tf.Tensor, types: set[str],
               not_through: AbstractSet[str] = frozenset()) -> tf.Operation | None:
    """The first op of `types` that `tensor`'s value depends on (None if none), not looking
    past ops of `not_through` (e.g. tf.shape: a sample's shape is no data)."""
    return next((op for op in upstream(tensor, not_through) if op.type in types), None)


def upstream(tensor: tf.Tensor, not_through: AbstractSet[str] = frozenset()) -> Iterator[tf.Operation]:
    """The ops `tensor`'s value is computed from (its own first), each once, not looking past
    ops of `not_through`."""
    seen, stack = set(), [tensor.op]
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        yield op
        if op.type not in not_through:
            stack.extend(t.op for t in op.inputs)


def static_shape(tensor: tf.Tensor) -> tuple[int, ...]:
    return tuple(int(d) for d in tensor.shape.as_list())

