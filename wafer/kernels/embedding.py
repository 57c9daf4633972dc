"""The gather kernel: an embedding lookup, rows of a weight table at a sample's integer
indices (tf.gather / tf.nn.embedding_lookup / Keras Embedding on axis 0)."""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from wafer.kernels.base import INTEGER, Kernel, KernelError, RunContext, Shape, check_dtypes, max_cores_for, register
from wafer.kernels.operands import Operands

# Occurrences of an index up to this many are added in passes of distinct rows; a row
# looked up more often (padding) adds the rest in one sequential accumulation.
PASSES = 8


def scatter_add(table: np.ndarray, ids: np.ndarray, values: np.ndarray) -> None:
    """table[ids[i]] += values[i] in place, for i in order: np.add.at's result bit for bit
    (and TF's UnsortedSegmentSum's, which densifies an IndexedSlices gradient), 2-3x
    faster for rows of values. `ids` 1-D, `values` (len(ids), ...) like table's rows."""
    order = np.argsort(ids, kind="stable")
    ordered = ids[order]
    starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
    counts = np.diff(np.append(starts, len(ids)))
    for k in range(min(int(counts.max()), PASSES)):  # the k-th lookup of every row: distinct rows
        at = starts[counts > k] + k
        table[ordered[at]] += values[order[at]]
    for start, count in zip(starts[counts > PASSES], counts[counts > PASSES]):
        row = ordered[start]
        rest = values[order[start + PASSES:start + count]]
        table[row] = np.add.accumulate(np.concatenate([table[row][None], rest]), axis=0)[-1]


@register
class Gather(Kernel):
    """operands "pi": the table is the weight p0 (V, D...) (attr p0 its shape), the input
    integer indices (int32/int64, any per-sample shape S); output S + (D...). An index
    outside [0, V) raises ValueError naming the kernel, as TF's CPU gather does. The
    table's gradient is TF's IndexedSlices made dense: each row gets the gradients of its
    lookups added in order into the table's accumulator; the indices take none."""

    type_name = "gather"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]):
        super().__init__(name, attrs, input_shapes)
        self.operands = Operands(self, 2, broadcast=False)
        if self.operands.letters != "pi":
            raise KernelError(f"kernel {name!r} (gather): operands must be 'pi' (a weight table, "
                              f"integer indices from the input), got {self.operands.letters!r}")
        self.table = self.operands[0].shape
        if not self.table or self.table[0] == 0:
            raise KernelError(f"kernel {name!r} (gather): the table {self.table} needs at least "
                              f"one axis with rows")
        self.ids_shape = self.operands[1].shape
        self._shape = (*self.ids_shape, *self.table[1:])

    @property
    def output_shape(self):
        return self._shape

    def param_shapes(self):
        return self.operands.param_shapes()

    def output_dtype(self, input_dtypes):
        check_dtypes(self, input_dtypes, [INTEGER])
        return np.dtype(np.float32)

    def input_differentiable(self, index: int) -> bool:
        return False

    def flops_per_sample(self) -> float:
        return float(math.prod(self._shape))  # a copy per value

    def max_cores(self) -> int:
        return max_cores_for(self.flops_per_sample())

    def activation_bytes_per_sample(self) -> int:
        return 8 * math.prod(self.ids_shape)  # the indices

    def forward(self, params, inputs, ctx: RunContext):
        ids = inputs[0]
        rows = self.table[0]
        if ids.size and (ids.min() < 0 or ids.max() >= rows):
            bad = ids[(ids < 0) | (ids >= rows)].flat[0]
            raise ValueError(f"{self.name}: index {bad} is outside the table's {rows} rows "
                             f"[0, {rows})")
        return np.take(params["p0"], ids, axis=0), ids

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        if param_grads is None:
            table = np.zeros(self.table, np.float32)
        else:
            table = param_grads["p0"]
            if not ctx.accumulate:  # the batch's first micro-batch overwrites
                table.fill(0)
        ids = cache.reshape(-1)
        if len(ids):
            scatter_add(table, ids, grad_output.reshape(len(ids), *self.table[1:]))
        return [None], {"p0": table}
