"""The gather kernels: an embedding lookup, rows of a weight table at a sample's integer
indices (tf.gather / tf.nn.embedding_lookup / Keras Embedding on axis 0), and the
per-sample gather, rows of each sample's own value at its own indices
(tf.gather(x, positions, batch_dims=1): BERT's masked positions)."""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from wafer.kernels.base import INTEGER, Kernel, KernelError, RunContext, Shape, check_dtypes, max_cores_for, register
from wafer.kernels.operands import Operands, OperandsKernel
from wafer.precision import is_half, round_half

# Occurrences of an index up to this many are added in passes of distinct rows; a row
# looked up more often (padding) adds the rest in one sequential accumulation.
PASSES = 8


def scatter_add(table: np.ndarray, ids: np.ndarray, values: np.ndarray, half: bool = False) -> None:
    """table[ids[i]] += values[i] in place, for i in order: np.add.at's result bit for bit
    (and TF's UnsortedSegmentSum's, which densifies an IndexedSlices gradient), 2-3x
    faster for rows of values. `ids` 1-D, `values` (len(ids), ...) like table's rows.
    `half`: every sum rounded to float16, as TF's float16 UnsortedSegmentSum adds."""
    order = np.argsort(ids, kind="stable")
    ordered = ids[order]
    starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
    counts = np.diff(np.append(starts, len(ids)))
    for k in range(min(int(counts.max()), PASSES)):  # the k-th lookup of every row: distinct rows
        at = starts[counts > k] + k
        sums = table[ordered[at]] + values[order[at]]
        table[ordered[at]] = round_half(sums) if half else sums
    for start, count in zip(starts[counts > PASSES], counts[counts > PASSES]):
        row = ordered[start]
        rest = values[order[start + PASSES:start + count]]
        if half:
            for value in rest:
                table[row] = round_half(table[row] + value)
        else:
            table[row] = np.add.accumulate(np.concatenate([table[row][None], rest]), axis=0)[-1]


def check_indices(kernel: Kernel, ids: np.ndarray, rows: int, what: str) -> None:
    """ValueError naming the kernel for an index outside [0, rows), as TF's CPU gather."""
    if ids.size and (ids.min() < 0 or ids.max() >= rows):
        bad = ids[(ids < 0) | (ids >= rows)].flat[0]
        raise ValueError(f"{kernel.name}: index {bad} is outside {what}'s {rows} rows "
                         f"[0, {rows})")


class _RowCopyCost:
    """The cost of a gather (either kind): a copy per output value; it holds the indices."""

    _shape: Shape
    ids_shape: Shape

    def flops_per_sample(self) -> float:
        return float(math.prod(self._shape))  # a copy per value

    def max_cores(self) -> int:
        return max_cores_for(self.flops_per_sample())

    def activation_bytes_per_sample(self) -> int:
        return 8 * math.prod(self.ids_shape)  # the indices


class _TableLookup(_RowCopyCost, OperandsKernel):
    """A lookup in the table p0 (or a constant c0): its shapes, no gradient to the ids, and
    the table's gradient added from the micro-batch's IndexedSlices (`table_slices`)."""

    table: Shape

    def input_differentiable(self, index: int) -> bool:
        return False

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        if self.operands.letters == "ci":
            return [None], {}
        if param_grads is None:
            table = np.zeros(self.table, np.float32)
        else:
            table = param_grads["p0"]
            if not ctx.accumulate:  # the batch's first micro-batch overwrites
                table.fill(0)
        ids, values = self.table_slices(cache, grad_output)
        if len(ids):  # (into a view of the table: its indexed axes flattened, gather_nd's)
            rows = table.reshape(-1, *values.shape[1:])
            assert np.shares_memory(rows, table), "the accumulator is contiguous"
            scatter_add(rows, ids, values)
        return [None], {"p0": table}


@register
class Gather(_TableLookup):
    """operands "pi": the table is the weight p0 (V, D...) (attr p0 its shape), the input
    integer indices (int32/int64, any per-sample shape S); output S + (D...). An index
    outside [0, V) raises ValueError naming the kernel, as TF's CPU gather does. The
    table's gradient is TF's IndexedSlices made dense: each row gets the gradients of its
    lookups added in order into the table's accumulator; the indices take none. Operands
    "ci": a constant table c0 (per-class loss weights: tf.gather(class_weights, labels)),
    of any dtype the CS computes in, which takes no gradient. With attr `depth` r > 1 (operands
    "pi") the indices end in an axis of r coordinates into the table's first r axes (S + (r,);
    output S + the table's remaining axes: tf.gather_nd of a weight), its rows those of the
    table's first r axes flattened; the gradient is TF's dense ScatterNd, each element's
    lookups added in order."""

    type_name = "gather"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]):
        super().__init__(name, attrs, input_shapes)
        self.operands = Operands(self, 2, broadcast=False)
        if self.operands.letters not in ("pi", "ci"):
            raise KernelError(f"kernel {name!r} (gather): operands must be 'pi' or 'ci' (a weight "
                              f"or constant table, integer indices from the input), got "
                              f"{self.operands.letters!r}")
        self.table = self.operands[0].shape
        if not self.table or self.table[0] == 0:
            raise KernelError(f"kernel {name!r} (gather): the table {self.table} needs at least "
                              f"one axis with rows")
        self.depth = int(attrs.get("depth", 1))
        self.ids_shape = self.operands[1].shape
        if self.depth > 1 and (self.operands.letters != "pi" or len(self.table) < self.depth
                               or not self.ids_shape or self.ids_shape[-1] != self.depth):
            raise KernelError(f"kernel {name!r} (gather): depth {self.depth} takes a weight table "
                              f"of rank >= {self.depth} and indices ending in {self.depth} "
                              f"coordinates, got {self.table} and {self.ids_shape}")
        self.lengths = self.table[:self.depth]
        self.rows = self.table[self.depth:]
        indexed = self.ids_shape[:-1] if self.depth > 1 else self.ids_shape
        self._shape = (*indexed, *self.rows)

    def output_dtype(self, input_dtypes):
        check_dtypes(self, input_dtypes, [INTEGER])
        return self.operands.dtypes(input_dtypes)[0]

    def forward(self, params, inputs, ctx: RunContext):
        table, ids = self.operands.arrays(params, inputs)
        if self.depth > 1:
            for axis, length in enumerate(self.lengths):
                check_indices(self, ids[..., axis], length, f"the table's axis {axis}")
            ids = np.ravel_multi_index(tuple(np.moveaxis(ids, -1, 0)), self.lengths)
            table = table.reshape(-1, *self.rows)
        else:
            check_indices(self, ids, self.table[0], "the table")
        return np.take(table, ids, axis=0), ids

    def table_slices(self, cache, grad_output: np.ndarray,
                     role: str = "p0") -> tuple[np.ndarray, np.ndarray]:
        """The micro-batch's IndexedSlices of the table: the looked-up ids in order, one row
        of values (the gradient of the looked-up row) per id (rows of the table's first
        `depth` axes flattened)."""
        return cache.reshape(-1).copy(), grad_output.reshape((-1,) + self.rows).copy()


@register
class SampleGather(_RowCopyCost, Kernel):
    """Inputs x (per sample (L, D...); float32, or integers or bools passed through) and
    integer indices (int32/int64, per-sample shape S); output S + (D...): each sample's
    rows of its own x at its own indices (tf.gather(x, ids, axis=1, batch_dims=1)). With attr
    `depth` r > 1 the indices end in an axis of r coordinates into x's first r axes (S + (r,);
    output S + x's remaining axes: tf.gather_nd of each sample's own x). An index outside
    [0, L) raises ValueError naming the kernel, as TF's CPU gather does. Backward: TF's _BatchGatherGrad, an
    UnsortedSegmentSum of the output gradient into each sample's rows (a repeated index
    adds its gradients in order, each sum rounded to float16 in a float16 kernel, as TF's
    float16 kernel adds); the indices take none."""

    type_name = "sample_gather"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]):
        super().__init__(name, attrs, input_shapes)
        if len(self.input_shapes) != 2 or not self.input_shapes[0] or self.input_shapes[0][0] == 0:
            raise KernelError(f"kernel {name!r} (sample_gather): takes a value with rows (L, "
                              f"...) and integer indices, got inputs {self.input_shapes}")
        self.depth = int(attrs.get("depth", 1))
        self.rows, self.ids_shape = self.input_shapes[0], self.input_shapes[1]
        if self.depth > 1 and (len(self.rows) < self.depth or not self.ids_shape
                               or self.ids_shape[-1] != self.depth):
            raise KernelError(f"kernel {name!r} (sample_gather): depth {self.depth} takes a value "
                              f"of rank >= {self.depth} and indices ending in {self.depth} "
                              f"coordinates, got inputs {self.input_shapes}")
        self.lengths = self.rows[:self.depth]
        self.indexed = self.ids_shape[:-1] if self.depth > 1 else self.ids_shape
        self._shape = (*self.indexed, *self.rows[self.depth:])

    @property
    def output_shape(self):
        return self._shape

    def output_dtype(self, input_dtypes):
        check_dtypes(self, input_dtypes, [(np.float32, *INTEGER, np.bool_), INTEGER])
        return np.dtype(input_dtypes[0])

    def input_differentiable(self, index: int) -> bool:
        return index == 0  # (a float32 x: an integer one has no trained weight upstream)

    def forward(self, params, inputs, ctx: RunContext):
        x, ids = inputs
        m, rows = len(x), math.prod(self.lengths)
        if self.depth > 1:
            for axis, length in enumerate(self.lengths):
                check_indices(self, ids[..., axis], length, f"each sample's axis {axis + 1}")
            ids = np.ravel_multi_index(tuple(np.moveaxis(ids, -1, 0)), self.lengths)
        else:
            check_indices(self, ids, rows, "each sample")
        flat = (ids.reshape(m, -1) + np.arange(m)[:, None] * rows).reshape(-1)
        out = np.take(x.reshape(m * rows, *self.rows[self.depth:]), flat, axis=0)
        return out.reshape(m, *self._shape), flat

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        m, tail = len(grad_output), self.rows[self.depth:]
        grad = np.zeros((m * math.prod(self.lengths), *tail), np.float32)
        if len(cache):
            scatter_add(grad, cache, grad_output.reshape(len(cache), *tail), half=is_half(self.attrs))
        return [grad.reshape(m, *self.rows), None], {}


# TF's SparseSegmentReduction adds a segment's first rows one after another; from 10 rows
# on it adds in another order (measured, TF 2.21 CPU), so a bag holds at most this many ids.
MAX_BAG_IDS = 9
COMBINERS = ("sum", "mean", "sqrtn")


@register
class EmbeddingBag(_TableLookup):
    """A feature column's embedding (tf.feature_column.embedding_column of a categorical
    column of dense ids): input integer ids (per-sample shape (k,), k <= MAX_BAG_IDS), param
    p0 the table (V, D); output (D,). Each sample combines the rows of its own ids, skipping
    ids equal to attr `ignore` (to_sparse_input's ignore value) and negative ones
    (safe_embedding_lookup_sparse's prune): the rows added in order, then `combiner` mean
    multiplies by float32(1 / n), sqrtn by float32(1 / sqrtf(n)) (TF's SparseSegmentMean /
    SqrtN, bit for bit); a sample with no id gives zeros. An id >= V raises ValueError
    naming the kernel, as TF's gather does. The table's gradient is TF's IndexedSlices
    (SparseSegment*Grad): per sample, the output gradient times the sample's factor (its
    float64 1 / n or 1 / sqrt(n) rounded to float32: TF's gradient kernel's), summed
    per id in order of first appearance in the micro-batch; an empty sample adds a zero row
    of id 0 (SparseFillEmptyRows' default id)."""

    type_name = "embedding_bag"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]):
        super().__init__(name, attrs, input_shapes)
        self.operands = Operands(self, 2, broadcast=False)
        self.table = self.operands[0].shape if self.operands.letters == "pi" else ()
        self.ids_shape = self.operands[1].shape
        if self.operands.letters != "pi" or len(self.table) != 2 or len(self.ids_shape) != 1 \
                or not 1 <= self.ids_shape[0] <= MAX_BAG_IDS or attrs.get("combiner") not in COMBINERS:
            raise KernelError(f"kernel {name!r} (embedding_bag): takes operands 'pi' (a table "
                              f"(V, D), ids (k,) with k <= {MAX_BAG_IDS}) and a combiner of "
                              f"{COMBINERS}, got {self.operands.letters!r} {self.table} "
                              f"{self.ids_shape} {attrs.get('combiner')!r}")
        self.ignore = int(attrs.get("ignore", -1))
        self._shape = (self.table[1],)

    def output_dtype(self, input_dtypes):
        check_dtypes(self, input_dtypes, [INTEGER])
        return np.dtype(np.float32)

    def _factors(self, counts: np.ndarray, dtype: type) -> np.ndarray:
        """1, 1 / n or 1 / sqrt(n) in `dtype` (the forward's float32, the gradient's float64),
        rounded to float32."""
        n = np.maximum(counts, 1).astype(dtype)
        if self.attrs["combiner"] == "mean":
            return (dtype(1) / n).astype(np.float32)
        if self.attrs["combiner"] == "sqrtn":
            return (dtype(1) / np.sqrt(n)).astype(np.float32)
        return np.ones(len(n), np.float32)

    def forward(self, params, inputs, ctx: RunContext):
        table, ids = self.operands.arrays(params, inputs)
        valid = (ids != self.ignore) & (ids >= 0)
        check_indices(self, ids[valid], self.table[0], "the table")
        out = np.zeros((len(ids), self.table[1]), np.float32)
        for j in range(ids.shape[1]):  # row by row, in order (a skipped id adds nothing)
            rows = np.flatnonzero(valid[:, j])
            out[rows] = out[rows] + table[ids[rows, j]]
        counts = valid.sum(1)
        scaled = np.where(counts[:, None] > 1, out * self._factors(counts, np.float32)[:, None], out)
        return scaled, (ids, valid, self._factors(counts, np.float64))

    def table_slices(self, cache, grad_output: np.ndarray,
                     role: str = "p0") -> tuple[np.ndarray, np.ndarray]:
        """The micro-batch's IndexedSlices of the table (TF's: unique ids in order of first
        appearance, each id's scaled output gradients added in order)."""
        ids, valid, factors = cache
        empty = ~valid.any(1)
        scaled = grad_output * factors[:, None]
        flat_ids = np.where(valid | (empty[:, None] & (np.arange(ids.shape[1]) == 0)),
                            np.where(valid, ids, 0), -1)
        values = np.where(empty[:, None], np.float32(0), scaled)
        taken = flat_ids.reshape(-1) >= 0
        occurrences = flat_ids.reshape(-1)[taken].astype(np.int64)
        rows = np.repeat(values, ids.shape[1], axis=0)[taken]
        unique, first = np.unique(occurrences, return_index=True)
        order = unique[np.argsort(first, kind="stable")]
        slot = np.empty(self.table[0], np.int64)
        slot[order] = np.arange(len(order))
        summed = np.zeros((len(order), self.table[1]), np.float32)
        scatter_add(summed, slot[occurrences], rows)
        return order, summed
