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
Anything else on the way (a hashed, vocabulary, crossed or weighted column, linear_model)
declines, and the Where is refused naming the column (`refusal`)."""
from __future__ import annotations

import re

import tensorflow as tf

from coordinator.compiler.operands import static_shape
from coordinator.compiler.rules import Context, fast_path, has_kernel
from wafer.kernels.embedding import MAX_BAG_IDS

KERNEL_ROWS = {
    "embedding_bag": "tf.compat.v1.feature_column.input_layer's embedding_column (combiner sum, "
                     f"mean, sqrtn; up to {MAX_BAG_IDS} ids a sample, -1 pads skipped) and "
                     "indicator_column (a `cast`, then one_hot) of categorical_column_with_identity "
                     "on dense integer ids: the dense-to-SparseTensor round trip, per sample",
}
COMBINERS = {"SparseSegmentSum": "sum", "SparseSegmentMean": "mean", "SparseSegmentSqrtN": "sqrtn"}
# a feature column's scope in input_layer / linear_model: "<scope>/<column>_<kind>/..."
COLUMN_SCOPE = re.compile(r"(?:^|/)(input_layer|linear_model)(?:_\d+)?/(?:linear_model/)?([^/]+)/")
# the ops between the NotEqual and the round trip's last op
ROUND_TRIP_OPS = {"NotEqual", "Where", "GatherNd", "Cast", "SparseReshape", "GreaterEqual",
                  "Reshape", "GatherV2", "SparseFillEmptyRows", "StridedSlice", "Unique",
                  "ResourceGather", "Identity", "Tile", "ZerosLike", "Pack", "Shape", "Slice",
                  "Prod", "ConcatV2", *COMBINERS}


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


def _reads(t: tf.Tensor, source: tf.Tensor) -> bool:
    """Whether `t` is `source` through Reshape, Tile and StridedSlice (the empty-row mask
    tiled to the rows' width; the segment ids, the indices' first column)."""
    while t.name != source.name and t.op.type in ("Reshape", "Tile", "StridedSlice", "Identity"):
        t = t.op.inputs[0]
    return t.name == source.name


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
    if any(o.type == "GatherNd" and o.inputs[0].name != x.name for o in region):
        return False  # the SparseTensor's values are x's own
    if end.type == "SparseToDense":
        return _indicator(m, x, int(ignore), region, end)
    return _embedding(m, x, int(ignore), region, end)


def _indicator(m: Context, x: tf.Tensor, ignore: int, region, end: tf.Operation) -> bool:
    """SparseToDense of x's own non-ignored entries, the rest filled with the ignore value: x."""
    indices, values = end.inputs[0].op, _through_identity(end.inputs[2])
    while values.op.type == "Cast":
        values = values.op.inputs[0]
    default = m.operands.constant(end.inputs[3])
    if indices.type != "Where" or indices.inputs[0].op not in region or \
            values.op.type != "GatherNd" or values.op.inputs[0].name != x.name or \
            values.op.inputs[1].name != end.inputs[0].name or default is None or \
            int(default) != ignore or static_shape(end.outputs[0]) != static_shape(x) or \
            not has_kernel("cast"):
        return False
    m.add_kernel(end.name, "cast", [x], {"dtype": end.outputs[0].dtype.name}, [], [*region, end],
                 end.outputs[0], source_op=end)
    return True


def _embedding(m: Context, x: tf.Tensor, ignore: int, region, end: tf.Operation) -> bool:
    """safe_embedding_lookup_sparse of x's non-ignored, non-negative ids: an embedding_bag."""
    segment = _through_identity(end.inputs[2]).op
    rows, unique = _through_identity(segment.inputs[0]).op, segment.inputs[1].op
    fill = unique.inputs[0].op if unique.type == "Unique" else None
    prune = [op for op in region if op.type == "GreaterEqual"]
    if rows.type != "ResourceGather" or unique.type != "Unique" or \
            rows.inputs[1].name != unique.outputs[0].name or fill is None or \
            fill.type != "SparseFillEmptyRows" or m.operands.constant(fill.inputs[3]) != 0 or \
            end.inputs[1].op.type != "ZerosLike" or not _reads(end.inputs[0], fill.outputs[2]) or \
            not _reads(segment.inputs[2], fill.outputs[0]) or len(prune) != 1 or \
            m.operands.constant(prune[0].inputs[1]) != 0 or \
            len(m.shape(x)) != 1 or not 1 <= m.shape(x)[0] <= MAX_BAG_IDS or \
            not has_kernel("embedding_bag"):
        return False
    found = m.operand_list(rows, (rows.inputs[0], x))
    if isinstance(found, str) or found[0] != "pi":
        return False
    letters, inputs, attrs, params = found
    weight = m.operands.weight(rows.inputs[0])
    ops, out = [*region, end], end.outputs[0]
    reshape = m.sole_consumer(out)  # back to x's leading shape: [B, D] here
    if reshape is not None and reshape.type == "Reshape":
        ops, out = [*ops, reshape], reshape.outputs[0]
    m.add_kernel(m.scope(end, weight.variable if weight else ""), "embedding_bag", inputs,
                 {"operands": letters, **attrs, "combiner": COMBINERS[segment.type],
                  "ignore": ignore}, params, ops, out, output_shape=(attrs["p0"][1],),
                 source_op=end)
    return True


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
