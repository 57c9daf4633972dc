"""tf.feature_column's categorical columns of dense integer ids (issue 21).

`input_layer` turns a dense id feature x [B, k] into a SparseTensor (to_sparse_input:
Where(NotEqual(x, ignore)), GatherNd) and then back into fixed-size values; two such round
trips are recognised whole, from the NotEqual to their last op, and lowered per sample:
- an indicator column: SparseToDense(indices, shape, values, default = ignore) is x itself
  (a `cast` to its dtype), then TF's own one_hot and sum;
- an embedding column: embedding_lookup_sparse's prune of negative ids, SparseFillEmptyRows,
  Unique, the table's ResourceGather, SparseSegmentSum/Mean/SqrtN and the Select zeroing
  empty rows are one `embedding_bag` kernel (wafer/kernels/embedding.py: TF's arithmetic and
  IndexedSlices).
categorical_column_with_identity(default_value=d) maps the SparseTensor's values outside
[0, n) to d (Less, GreaterEqual, LogicalOr, SelectV2 of a Fill): the same map is computed on
x's dense ids, the ignored ones kept, and the round trip reads those ids.
Anything else on the way (a hashed, vocabulary, crossed or weighted column, linear_model)
declines, and the Where is refused naming the column (`refusal`)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from coordinator.compiler.operands import static_shape
from coordinator.compiler.rules import Context, fast_path, has_kernel
from wafer.kernels.embedding import MAX_BAG_IDS

KERNEL_ROWS = {
    "embedding_bag": "tf.compat.v1.feature_column.input_layer's embedding_column (combiner sum, "
                     f"mean, sqrtn; up to {MAX_BAG_IDS} ids a sample, -1 pads skipped) and "
                     "indicator_column (a `cast`, then one_hot) of categorical_column_with_identity "
                     "(a default_value too) on dense integer ids: the dense-to-SparseTensor "
                     "round trip, per sample",
}
COMBINERS = {"SparseSegmentSum": "sum", "SparseSegmentMean": "mean", "SparseSegmentSqrtN": "sqrtn"}
# categorical_column_with_identity(default_value=d)'s map of the ids outside [0, n) to d
MAP_OPS = {"Less", "GreaterEqual", "LogicalOr", "Fill", "SelectV2"}
# a feature column's scope in input_layer / linear_model: "<scope>/<column>_<kind>/..."
COLUMN_SCOPE = re.compile(r"(?:^|/)(input_layer|linear_model)(?:_\d+)?/(?:linear_model/)?([^/]+)/")
# the ops between the NotEqual and the round trip's last op
ROUND_TRIP_OPS = {"NotEqual", "Where", "GatherNd", "Cast", "SparseReshape", "GreaterEqual",
                  "Reshape", "GatherV2", "SparseFillEmptyRows", "StridedSlice", "Unique",
                  "ResourceGather", "Identity", "Tile", "ZerosLike", "Pack", "Shape", "Slice",
                  "Prod", "ConcatV2", *COMBINERS, *MAP_OPS}


def _through_identity(t: tf.Tensor) -> tf.Tensor:
    while t.op.type == "Identity":
        t = t.op.inputs[0]
    return t


def _round_trip(m: Context, start: tf.Operation) -> tuple[list[tf.Operation], tf.Operation] | None:
    """The ops downstream of the NotEqual up to the round trip's last op (a SparseToDense, or
    a Select of a SparseSegment reduction), if nothing else reads them; else None."""
    region, stack, ends = [], [start], []
    seen: set[tf.Operation] = set()
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        if op.type == "SparseToDense" or (op.type == "Select" and
                                          _through_identity(op.inputs[2]).op.type in COMBINERS):
            ends.append(op)
            continue
        if op.type not in ROUND_TRIP_OPS or any(t.name in m.protected for t in op.outputs):
            return None
        region.append(op)
        stack.extend(c for t in op.outputs for c in m.consumers(t))
    if len(ends) != 1:
        return None
    return region, ends[0]


def _widened(t: tf.Tensor) -> tf.Tensor:
    """`t` before Identity ops and integer casts to int64 (the columns' id type)."""
    while t.op.type == "Identity" or (t.op.type == "Cast" and t.dtype == tf.int64 and
                                      t.op.inputs[0].dtype.is_integer):
        t = t.op.inputs[0]
    return t


def _reads(t: tf.Tensor, source: tf.Tensor) -> bool:
    """Whether `t` is `source` through Reshape, Tile and StridedSlice (the empty-row mask
    tiled to the rows' width; the segment ids, the indices' first column)."""
    while t.name != source.name and t.op.type in ("Reshape", "Tile", "StridedSlice", "Identity"):
        t = t.op.inputs[0]
    return t.name == source.name


@dataclass(frozen=True)
class _DefaultId:
    """SelectV2(Less(v, 0) | GreaterEqual(v, n), Fill(shape, d), v) of the values v."""
    ops: tuple[tf.Operation, ...]
    values: tf.Tensor  # the SelectV2's output
    buckets: np.ndarray
    default: np.ndarray


def _default_id(m: Context, region: list[tf.Operation], values: tf.Tensor) -> _DefaultId | None | bool:
    """The identity column's default-id map of the SparseTensor's values: None if there is
    none, False if the region has map ops of another form."""
    maps = [op for op in region if op.type in MAP_OPS - {"GreaterEqual"}]
    if not maps:
        return None
    select = [op for op in maps if op.type == "SelectV2"]
    if len(select) != 1 or _widened(select[0].inputs[2]).name != values.name:
        return False
    either, fill = select[0].inputs[0].op, select[0].inputs[1].op
    below, above = (sorted(either.inputs, key=lambda t: t.op.type != "Less")
                    if either.type == "LogicalOr" else (None, None))
    if below is None or above is None or below.op.type != "Less" or \
            above.op.type != "GreaterEqual" or fill.type != "Fill" or \
            _widened(below.op.inputs[0]).name != values.name or \
            _widened(above.op.inputs[0]).name != values.name or \
            m.operands.constant(below.op.inputs[1]) != 0:
        return False
    buckets, default = m.operands.constant(above.op.inputs[1]), m.operands.constant(fill.inputs[1])
    if buckets is None or default is None or \
            not set(maps) <= {select[0], either, fill, below.op}:  # (a Fill reads shapes only)
        return False
    return _DefaultId((select[0], either, fill, below.op, above.op), select[0].outputs[0],
                      buckets, default)


def _mapped(m: Context, x: tf.Tensor, ignore: int, found: _DefaultId, at: tf.Operation) -> str:
    """Kernels computing x's ids with the default id put in, the ignored ones kept: the
    dense form of the mapped SparseTensor; the last kernel's name."""
    dtype = x.dtype.as_numpy_dtype
    shape = m.shape(x)

    def binary(name: str, op: str, inputs: list, letters: str, constant=None) -> str:
        attrs: dict[str, Any] = {"op": op, "operands": letters}
        if constant is not None:
            attrs["c1"] = np.asarray(constant, dtype)
        return m.add_kernel(f"{at.name}/{name}", "binary", inputs, attrs, [], [], None,
                            output_shape=shape, source_op=at).name

    below = binary("below", "less", [x], "ic", 0)
    above = binary("above", "greater_equal", [x], "ic", found.buckets)
    outside = binary("outside", "logical_or", [below, above], "ii")
    kept = binary("kept", "not_equal", [x], "ic", ignore)
    ids = m.add_kernel(f"{at.name}/default", "select", [outside, x],
                       {"operands": "ici", "c1": np.asarray(found.default, dtype)}, [], [], None,
                       output_shape=shape, source_op=at).name
    return m.add_kernel(f"{at.name}/ids", "select", [kept, ids],
                        {"operands": "iic", "c2": np.asarray(ignore, dtype)}, [], [], None,
                        output_shape=shape, source_op=at).name


@fast_path
def feature_column(m: Context, op: tf.Operation) -> bool:
    x = op.inputs[0] if op.inputs else None
    if op.type != "NotEqual" or x is None or not m.is_batched(x) or not x.dtype.is_integer:
        return False
    ignore = m.operands.constant(op.inputs[1])
    found = _round_trip(m, op)
    if ignore is None or ignore.size != 1 or found is None:
        return False
    region, end = found
    gathers = [o for o in region if o.type == "GatherNd"]
    if len(gathers) != 1 or gathers[0].inputs[0].name != x.name or \
            gathers[0].inputs[1].op.type != "Where" or gathers[0].inputs[1].op.inputs[0].op is not op:
        return False  # the SparseTensor: x's own entries where x != ignore
    mapped = _default_id(m, region, gathers[0].outputs[0])
    if mapped is False:
        return False
    values = mapped.values if isinstance(mapped, _DefaultId) else gathers[0].outputs[0]
    # the GreaterEqual ops left: embedding_lookup_sparse's prune of negative ids
    prunes = [o for o in region if o.type == "GreaterEqual" and
              not (isinstance(mapped, _DefaultId) and o in mapped.ops)]
    checked = (_indicator(m, x, int(ignore), end, values, gathers[0].inputs[1])
               if not prunes else None) if end.type == "SparseToDense" \
        else _embedding(m, x, int(ignore), end, values, prunes)
    if checked is None:
        return False
    ids = _mapped(m, x, int(ignore), mapped, op) if isinstance(mapped, _DefaultId) else x
    checked(ids, [*region, end])
    return True


Emit = Callable[[tf.Tensor | str, list[tf.Operation]], None]


def _indicator(m: Context, x: tf.Tensor, ignore: int, end: tf.Operation, values: tf.Tensor,
               where: tf.Tensor) -> Emit | None:
    """SparseToDense of x's own non-ignored entries (mapped), the rest filled with the
    ignore value: those ids, dense (a `cast` of them)."""
    given = _widened(end.inputs[2])
    default = m.operands.constant(end.inputs[3])
    if _through_identity(end.inputs[0]).name != where.name or given.name != values.name or \
            default is None or int(default) != ignore or \
            static_shape(end.outputs[0]) != static_shape(x) or not has_kernel("cast"):
        return None

    def emit(ids: tf.Tensor | str, ops: list[tf.Operation]) -> None:
        m.add_kernel(end.name, "cast", [ids], {"dtype": end.outputs[0].dtype.name}, [], ops,
                     end.outputs[0], source_op=end)
    return emit


def _embedding(m: Context, x: tf.Tensor, ignore: int, end: tf.Operation, values: tf.Tensor,
               prune: list[tf.Operation]) -> Emit | None:
    """safe_embedding_lookup_sparse of x's non-ignored (mapped), non-negative ids: an
    embedding_bag."""
    segment = _through_identity(end.inputs[2]).op
    rows, unique = _through_identity(segment.inputs[0]).op, segment.inputs[1].op
    fill = unique.inputs[0].op if unique.type == "Unique" else None
    if rows.type != "ResourceGather" or unique.type != "Unique" or \
            rows.inputs[1].name != unique.outputs[0].name or fill is None or \
            fill.type != "SparseFillEmptyRows" or m.operands.constant(fill.inputs[3]) != 0 or \
            end.inputs[1].op.type != "ZerosLike" or not _reads(end.inputs[0], fill.outputs[2]) or \
            not _reads(segment.inputs[2], fill.outputs[0]) or len(prune) != 1 or \
            _widened(prune[0].inputs[0]).name != values.name or \
            m.operands.constant(prune[0].inputs[1]) != 0 or \
            len(m.shape(x)) != 1 or not 1 <= m.shape(x)[0] <= MAX_BAG_IDS or \
            not has_kernel("embedding_bag"):
        return None
    found = m.operand_list(rows, (rows.inputs[0], x))
    if isinstance(found, str) or found[0] != "pi":
        return None
    letters, _, attrs, params = found
    weight = m.operands.weight(rows.inputs[0])

    def emit(ids: tf.Tensor | str, ops: list[tf.Operation]) -> None:
        out = end.outputs[0]
        reshape = m.sole_consumer(out)  # back to x's leading shape: [B, D] here
        if reshape is not None and reshape.type == "Reshape":
            ops, out = [*ops, reshape], reshape.outputs[0]
        m.add_kernel(m.scope(end, weight.variable if weight else ""), "embedding_bag", [ids],
                     {"operands": letters, **attrs, "combiner": COMBINERS[segment.type],
                      "ignore": ignore}, params, ops, out, output_shape=(attrs["p0"][1],),
                     source_op=end)
    return emit


def refusal(op: tf.Operation) -> str:
    """Why a SparseTensor op (Where, Sparse*) is refused, in the terms of the feature column
    that built it."""
    scope = COLUMN_SCOPE.search(op.name)
    if scope is None:
        return ("builds or reads a SparseTensor (tf.sparse, tf.nn.embedding_lookup_sparse, "
                "tf.where with one argument), whose size depends on the values: the CS computes "
                "fixed-size values; feed integer ids to tf.one_hot or a Keras Embedding (a bag: "
                "the masked tf.reduce_sum or mean of its rows)")
    if scope.group(1) == "linear_model":
        instead = ("write the linear part as input_layer(features, [indicator_column(c), "
                   "numeric columns]) into a Dense(1)")
    else:
        instead = ("map ids to 0..n-1 in input_fn and use categorical_column_with_identity, or "
                   "tf.one_hot / tf.nn.embedding_lookup and tf.reduce_mean of the rows")
    return (f"tf.feature_column column '{scope.group(2)}' builds a SparseTensor the CS cannot "
            f"compute (the CS takes indicator_column and embedding_column (up to {MAX_BAG_IDS} "
            "ids a sample) of categorical_column_with_identity on integer ids, in input_layer; "
            f"not hashed, vocabulary, crossed or weighted columns, linear_model): {instead}")
