"""The gather kernel: an embedding lookup, rows of a weight table at a sample's integer
indices (tf.gather / tf.nn.embedding_lookup / Keras Embedding on axis 0)."""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from wse_sim.kernels.base import (INTEGER, Kernel, KernelError, RunContext, Shape, check_dtypes,
                                  max_cores_for, register)
from wse_sim.kernels.operands import Operands


def row_sums(ids: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct ids ascending, the sum of the value rows of each), summed in the order the
    rows come: what TF's dense conversion of an IndexedSlices (UnsortedSegmentSum) adds."""
    order = np.argsort(ids, kind="stable")
    ordered = ids[order]
    starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
    return ordered[starts], np.add.reduceat(values[order], starts, axis=0)


@register
class Gather(Kernel):
    """operands "pi": the table is the weight p0 (V, D...) (attr p0 its shape), the input
    integer indices (int32/int64, any per-sample shape S); output S + (D...). An index
    outside [0, V) raises ValueError naming the kernel, as TF's CPU gather does. The
    table's gradient is TF's IndexedSlices made dense: each row gets the sum of the
    gradients of its lookups, added into the table's accumulator; the indices take none."""

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
        self.width = math.prod(self.table[1:])

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
        ids = cache.reshape(-1)
        if param_grads is None:
            table = np.zeros(self.table, np.float32)
        else:
            table = param_grads["p0"]
            if not ctx.accumulate:  # the batch's first micro-batch overwrites
                table.fill(0)
        if len(ids):
            rows, sums = row_sums(ids, grad_output.reshape(len(ids), self.width))
            # rows are distinct: the fancy-indexed += adds each once, in place
            table.reshape(self.table[0], self.width)[rows] += sums
        return [None], {"p0": table}
