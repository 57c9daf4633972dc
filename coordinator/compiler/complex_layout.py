"""How a complex region moves and contracts its values: a slice, reshape, transpose, concat,
pad (and the other ops that only place elements; tf.linalg.adjoint's ConjugateTranspose
conjugates them too) becomes a `Take` step, an index map measured by running TF's own op on
numbered elements; MatMul, BatchMatMul and Einsum become
an `Einsum` step of an explicit equation. Both are refused, in one line naming the op, when
they would mix the samples (move, cut or contract the batch axis)."""
from __future__ import annotations

import string

import numpy as np
import tensorflow as tf

from coordinator.compiler.operands import static_shape
from coordinator.compiler.rules import Context
from tf_model.model_fn import user_name, user_source

# ops that only place their data inputs' elements (the other inputs constants)
PLACING = ("StridedSlice", "Slice", "Reshape", "Transpose", "ConcatV2", "Pad", "PadV2",
           "MirrorPad", "ExpandDims", "Squeeze", "ReverseV2", "Roll", "Pack", "Tile",
           "GatherV2", "ZerosLike", "ConjugateTranspose")
PRODUCTS = ("MatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum")
EXACT = 2 ** 24  # float32 numbers the elements and samples exactly up to here


def _data_inputs(op: tf.Operation) -> list[tf.Tensor]:
    """The inputs whose elements a placing op places (the rest are its constant arguments)."""
    if op.type == "ConcatV2":
        return list(op.inputs[:-1])
    return list(op.inputs) if op.type == "Pack" else [op.inputs[0]]


def placed_inputs(m: Context, op: tf.Operation) -> list[tf.Tensor]:
    """The data inputs whose elements the Take step reads: all but constant zeros
    (tf.zeros_like of a spectrum's cut-off bins, concatenated back), whose places hold 0."""
    return [t for t in _data_inputs(op) if not _zero(m, t)]


def _zero(m: Context, t: tf.Tensor) -> bool:
    value = m.operands.constant(t)
    return value is not None and not np.any(value)


def _where(op: tf.Operation) -> str:
    return f"{op.type} '{user_name(op)}' at {user_source(op)}"


def _mixes(op: tf.Operation) -> str:
    return (f"{_where(op)} moves, cuts or contracts the batch axis of a complex value (it "
            "mixes the samples): the CS computes each sample on its own; apply it to a "
            "sample's own axes")


def index_map(m: Context, op: tf.Operation, per_sample: list[bool]) -> dict | str:
    """The `Take` step's attributes of a placing op: for each element of a sample's output
    (of the whole output if no data input is `per_sample`), the element of the data inputs'
    concatenated (per-sample) elements it is, -1 for a zero; or why not."""
    data, batched = placed_inputs(m, op), all(per_sample)
    if not data:
        return f"{_where(op)} places constant zeros alone"
    if any(per_sample) and not batched:
        return (f"{_where(op)} places a per-sample complex value with one shared by the "
                "samples: broadcast the shared one by an element-wise op instead")
    if op.type == "PadV2" and m.operands.constant(op.inputs[2]) != 0:
        return f"{_where(op)} pads a complex value with a value other than 0"
    others = {}
    for k, t in enumerate(op.inputs):
        if t not in data:  # (a constant zero data input too: its value zeros)
            value = m.operands.constant(t)
            if value is None:
                return f"{_where(op)} has an argument not known when the graph is built"
            others[k] = value
    shapes = [static_shape(t) for t in data]
    rows = shapes[0][0] if batched and shapes[0] else 1
    sizes = [int(np.prod(s[1:] if batched else s)) for s in shapes]
    if max(rows, sum(sizes)) >= EXACT:
        return f"{_where(op)} places more elements than the compiler numbers exactly"
    # each element numbered by its place in a sample's concatenated inputs, then by its sample
    places = _placed(op, data, others, [
        (np.arange(size) + sum(sizes[:k]) + 1) * np.ones((rows, 1)) for k, size in enumerate(sizes)])
    if not batched:
        return {"index": (places.ravel() - 1).tolist(), "shape": list(places.shape),
                "batched": False, "conj": [op.type == "ConjugateTranspose"]}
    samples = _placed(op, data, others, [np.arange(1, rows + 1)[:, None] * np.ones((1, size))
                                         for size in sizes])
    if places.ndim == 0 or places.shape[0] != rows:
        return _mixes(op)
    shape = list(places.shape[1:])
    places, samples = places.reshape(rows, -1), samples.reshape(rows, -1)
    own = np.where(places[:1] > 0, np.arange(1, rows + 1)[:, None], 0)
    if not (np.array_equal(places, np.broadcast_to(places[:1], places.shape)) and
            np.array_equal(samples, own)):
        return _mixes(op)
    return {"index": (places[0] - 1).tolist(), "shape": shape, "batched": True,
            "conj": [op.type == "ConjugateTranspose"]}


def _placed(op: tf.Operation, data: list[tf.Tensor], others: dict[int, np.ndarray],
            numbers: list[np.ndarray]) -> np.ndarray:
    """TF's `op` run on its data inputs holding `numbers` (each [rows, elements]), its other
    inputs `others`: the numbers it places (0 for a zero)."""
    graph = tf.Graph()
    with graph.as_default():
        inputs = [tf.constant(numbers[data.index(t)].reshape(static_shape(t)).astype(
            t.dtype.as_numpy_dtype) if t in data else others[k], t.dtype)
            for k, t in enumerate(op.inputs)]
        out = graph._create_op_internal(op.type, inputs, [t.dtype for t in op.outputs],
                                        attrs=dict(op.node_def.attr)).outputs[0]
        with tf.compat.v1.Session(graph=graph) as session:
            return np.real(session.run(out)).astype(np.int64)


def _explicit(equation: str, ranks: list[int]) -> tuple[list[str], str] | None:
    """`equation`'s input and output subscripts with its ellipses as letters (right-aligned,
    the output's the longest), or None if it has no output."""
    if "->" not in equation:
        return None
    inputs, output = equation.replace(" ", "").split("->")
    used = set(equation)
    free = [c for c in string.ascii_letters if c not in used]
    longest = max([r - len(s.replace("...", "")) for s, r in zip(inputs.split(","), ranks)
                   if "..." in s] + [0])
    ellipsis = "".join(free[:longest])
    subs = [s.replace("...", ellipsis[longest - (r - len(s.replace("...", ""))):])
            for s, r in zip(inputs.split(","), ranks)]
    return subs, output.replace("...", ellipsis)


def _matmul_subscripts(op: tf.Operation, ranks: list[int]) -> tuple[list[str], str, list[bool]]:
    """A MatMul's or BatchMatMul's subscripts (its batch axes right-aligned) and which of
    its operands it conjugates (adj_x, adj_y)."""
    if op.type == "MatMul":
        flips, conj = [op.get_attr("transpose_a"), op.get_attr("transpose_b")], [False, False]
    else:
        flips = [op.get_attr("adj_x"), op.get_attr("adj_y")]
        conj = list(flips)
    batch = "abcdefgh"[:max(ranks) - 2]
    a = batch[len(batch) - (ranks[0] - 2):] + ("km" if flips[0] else "mk")
    b = batch[len(batch) - (ranks[1] - 2):] + ("nk" if flips[1] else "kn")
    return [a, b], batch + "mn", conj


def product(m: Context, op: tf.Operation, batched: list[bool]) -> dict | str:
    """The `Einsum` step's attributes of a product of two complex values (equation, conj),
    or why not: the batch axis of a per-sample operand must be the output's first."""
    shapes = [static_shape(t) for t in op.inputs]
    ranks = [len(s) for s in shapes]
    conj = [False, False]
    if op.type == "Einsum":
        found = _explicit(op.get_attr("equation").decode(), ranks)
        if found is None or len(op.inputs) != 2:
            return (f"{_where(op)} is not an einsum of two complex values with an explicit "
                    "output")
        subs, output = found
    else:
        subs, output, conj = _matmul_subscripts(op, ranks)
    sizes: dict[str, int] = {}
    for s, shape in zip(subs, shapes):
        if len(set(s)) != len(s) or len(s) != len(shape):
            return f"{_where(op)} takes a diagonal of a complex value"
        for c, d in zip(s, shape):
            if sizes.setdefault(c, d) != d:
                return f"{_where(op)} broadcasts a complex value's axis of size 1"
    if any(b and (not s or output[:1] != s[0]) or any(batched) and not b and output[:1] in s
           for s, b in zip(subs, batched)):
        return _mixes(op)
    return {"equation": f"{subs[0]},{subs[1]}->{output}", "conj": conj}
