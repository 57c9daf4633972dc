"""The batch split into its samples, the same ops on each piece, the pieces put back in order:
tf.split(x, B) or tf.unstack(x) (and each sample's row of another per-sample value, k[i]),
then tf.concat(..., 0) or tf.stack (CondConv: tf.nn.conv2d(x_i, k_i) per sample). During
recurrences' second build of model_fn such a tf.concat or tf.stack returns tf.vectorized_map
of piece 0's ops (per_sample_maps: a convolution by per-sample filters as each sample's
patches times its own), and recurrences proves the batched graph computes the user's loss and
gradients. Only when piece i's ops are piece 0's, reading sample i's rows (of the same
values) and the same other tensors, and piece i is the join's i-th input: pieces put back
in another order, or combined with another sample's, stay the user's split, refused."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
import tensorflow as tf

from coordinator.compiler.per_sample_maps import per_sample_convolutions, stateful
from coordinator.compiler.static_loops import recorded


@dataclass(frozen=True)
class Row:
    """Sample `index`'s row of the batched `source` (`keep`: with its axis of 1, a split's)."""
    source: tf.Tensor
    index: int
    keep: bool


def _row(t: tf.Tensor, batch: int) -> Row | None:
    """The row of the batch `t` is (an Unpack's or Split's i-th output of the batch's B
    samples, x[i] of a per-sample x), else None."""
    op = t.op
    if op.type == "Unpack" and op.get_attr("axis") == 0 and op.get_attr("num") == batch:
        return Row(op.inputs[0], t.value_index, False)
    if op.type == "Split" and op.get_attr("num_split") == batch and \
            tf.get_static_value(op.inputs[0]) == 0 and op.inputs[1].shape.rank and \
            op.inputs[1].shape[0] == batch:
        return Row(op.inputs[1], t.value_index, True)
    if op.type == "StridedSlice" and op.inputs[0].shape.rank and \
            op.inputs[0].shape[0] == batch and op.get_attr("shrink_axis_mask") == 1 and \
            not any(op.get_attr(m) for m in ("begin_mask", "end_mask", "ellipsis_mask",
                                               "new_axis_mask")):
        begin, end, strides = (tf.get_static_value(x) for x in op.inputs[1:])
        if begin is not None and end is not None and strides is not None and \
                len(begin) == 1 and list(strides) == [1] and end[0] == begin[0] + 1:
            return Row(op.inputs[0], int(begin[0]) % batch, False)
    return None


def _batch_major(t: tf.Tensor) -> bool:
    """Whether `t`'s first axis may be the batch: not a transpose moving another axis first
    nor a stack in front (a time-major sequence of as many steps: Keras' TimeDistributed's
    steps x[i], stacked back, are the leading_stack's)."""
    op = t.op
    if op.type == "Transpose":
        perm = tf.get_static_value(op.inputs[1])
        return perm is not None and int(perm[0]) == 0
    return not (op.type == "Pack" and op.get_attr("axis") == 0)


def _attrs(op: tf.Operation) -> bytes:
    return b"".join(k.encode() + v.SerializeToString() for k, v in sorted(op.node_def.attr.items()))


@dataclass(frozen=True)
class Piece:
    """One piece's ops (inputs before their consumers, the piece's output last) and what
    each input of each op is: ("op", position, output), ("row", source, index, keep) or
    ("outside", tensor)."""
    ops: tuple[tf.Operation, ...]
    inputs: tuple[tuple[tuple[Any, ...], ...], ...]


def _piece(t: tf.Tensor, batch: int) -> Piece | None:
    """The ops computing `t` from rows of the batch (None: none, a control input or a
    stateful op: a piece's own random numbers)."""
    order: list[tf.Operation] = []
    inside: dict[tf.Operation, bool] = {}

    def visit(op: tf.Operation) -> bool:
        if op not in inside:
            inside[op] = False
            reads = [_row(x, batch) is not None or visit(x.op) for x in op.inputs]
            inside[op] = any(reads)
            if inside[op]:
                order.append(op)
        return inside[op]

    if _row(t, batch) is not None or not visit(t.op) or \
            any(op.control_inputs or stateful(op) for op in order):
        return None
    position = {op: k for k, op in enumerate(order)}
    inputs = []
    for op in order:
        kinds: list[tuple[Any, ...]] = []
        for x in op.inputs:
            row = _row(x, batch)
            if row is not None:
                kinds.append(("row", row.source, row.index, row.keep))
            elif x.op in position:
                kinds.append(("op", position[x.op], x.value_index))
            else:
                kinds.append(("outside", x))
        inputs.append(tuple(kinds))
    return Piece(tuple(order), tuple(inputs))


def _same_value(a: tf.Tensor, b: tf.Tensor) -> bool:
    """The same tensor, or the same stateless ops of the same values (each piece's slice
    bounds, a Keras layer's reads of its variables on each piece, a reshape of a weight)."""
    if a.name == b.name:
        return True
    x, y = a.op, b.op
    if a.value_index != b.value_index or x.type != y.type or _attrs(x) != _attrs(y) or \
            len(x.inputs) != len(y.inputs) or x.control_inputs or y.control_inputs or \
            stateful(x):
        return False
    return all(_same_value(i, j) for i, j in zip(x.inputs, y.inputs))


def _same_but_row(a: tuple[Any, ...], b: tuple[Any, ...], index: int) -> bool:
    """Piece 0's input `a` and piece `index`'s `b` are the same but for the sample's row."""
    if a[0] != b[0]:
        return False
    if a[0] == "row":
        return a[1].name == b[1].name and a[3] == b[3] and a[2] == 0 and b[2] == index
    return _same_value(a[1], b[1]) if a[0] == "outside" else a == b


def _per_sample(values: list[tf.Tensor], batch: int, stacked: bool) -> Piece | None:
    """Piece 0 when the joined `values` are the batch's samples in order, each the same ops
    on its own rows of batch-major values, else None."""
    if len(values) != batch or batch < 2:
        return None
    pieces = [_piece(v, batch) for v in values]
    first = pieces[0]
    if first is None or (not stacked and values[0].shape[:1] != [1]):
        return None
    if any(kind[0] == "row" and not _batch_major(kind[1])
           for kinds in first.inputs for kind in kinds):
        return None
    for i, piece in enumerate(pieces[1:], 1):
        if piece is None or len(piece.ops) != len(first.ops) or any(
                a.type != b.type or _attrs(a) != _attrs(b) or
                len(ka) != len(kb) or not all(_same_but_row(x, y, i) for x, y in zip(ka, kb))
                for a, b, ka, kb in zip(first.ops, piece.ops, first.inputs, piece.inputs)):
            return None
        if values[i].value_index != values[0].value_index:
            return None
    return first


def _mapped(piece: Piece, output: int) -> tf.Tensor:
    """tf.vectorized_map of the piece's ops over the rows they read."""
    sources: list[tf.Tensor] = []
    for kinds in piece.inputs:
        for kind in kinds:
            if kind[0] == "row" and not any(kind[1].name == s.name for s in sources):
                sources.append(kind[1])

    def fn(rows: list[tf.Tensor]) -> tf.Tensor:
        graph = tf.compat.v1.get_default_graph()
        made: list[tf.Operation] = []
        for op, kinds in zip(piece.ops, piece.inputs):
            inputs = []
            for kind in kinds:
                if kind[0] == "row":
                    row = rows[next(k for k, s in enumerate(sources) if s.name == kind[1].name)]
                    inputs.append(row[None] if kind[3] else row)
                elif kind[0] == "op":
                    inputs.append(made[kind[1]].outputs[kind[2]])
                else:
                    inputs.append(kind[1])
            made.append(graph.create_op(op.type, inputs, [o.dtype for o in op.outputs],
                                        attrs=dict(op.node_def.attr)))
        return made[-1].outputs[output]

    return tf.vectorized_map(fn, sources, fallback_to_while_loop=False)


def _joined(original: Callable, stacked: bool, batch: int, joined: list[str]) -> Callable:
    def join(values: Any, axis: Any = 0, name: Any = None) -> Any:
        if isinstance(values, (list, tuple)) and values and \
                all(isinstance(v, tf.Tensor) for v in values) and \
                np.ndim(axis) == 0 and not isinstance(axis, tf.Tensor) and int(axis) == 0:
            piece = _per_sample(list(values), batch, stacked)
            if piece is not None:
                try:
                    with tf.name_scope(name or ("stack" if stacked else "concat")), \
                            per_sample_convolutions():
                        out = _mapped(piece, values[0].value_index)
                    joined.append(piece.ops[-1].name)
                    return out if stacked else tf.reshape(out, [-1, *out.shape.as_list()[2:]])
                except Exception:  # (pfor cannot batch an op: the user's pieces stay)
                    pass
        return original(values, axis, name) if name is not None else original(values, axis)
    return join


@contextlib.contextmanager
def per_sample_joins(created: set[str], batch: int) -> Iterator[list[str]]:
    """tf.concat(pieces, 0) and tf.stack(pieces) of the `batch` samples in order, each the
    same ops on its own rows, built meanwhile as tf.vectorized_map of those ops; the names of
    the ops they add are added to `created`; yields the names of piece 0's outputs joined."""
    saved = [(tf, "concat", tf.concat, False), (tf, "stack", tf.stack, True)]
    joined: list[str] = []
    for module, name, function, stacked in saved:
        setattr(module, name, recorded(_joined(function, stacked, batch, joined), created))
    try:
        yield joined
    finally:
        for module, name, function, _ in saved:
            setattr(module, name, function)


def has_per_sample_pieces(graph: tf.Graph, batch: int) -> bool:
    """Whether `graph` splits a value of `batch` rows into its rows (tf.split(x, B),
    tf.unstack(x))."""
    return batch >= 2 and any(
        op.type == "Unpack" and op.get_attr("axis") == 0 and op.get_attr("num") == batch or
        op.type == "Split" and op.get_attr("num_split") == batch and
        op.inputs[1].shape.rank and op.inputs[1].shape[0] == batch
        for op in graph.get_operations())
