"""Kernels whose samples meet through a product over the batch (two-tower retrieval with
in-batch negatives, contrastive losses), and the per-sample constants such losses take.

A sample's value is a row of the batch. `in_batch_matmul` is TF's MatMul of two per-sample
matrices: with transpose_b, row i of q [B, n] x d [B, n]^T is q_i against every d_j (its
output per sample is (B,)); without, row i of p [B, B] x v [B, n] mixes every v_j by p_i.
`batch_transpose` is tf.transpose of a [B, B] value (row j of the result is column j: the
other direction of a symmetric loss). Both are batch barriers (`Kernel.batch_barrier`): the
executor hands them the whole batch of every input before any micro-batch's forward, and
every micro-batch's output gradient before any backward, so each micro-batch computes its
rows of TF's result, whatever the micro-batch size. Gradients are TF's (_MatMulGrad):
    transpose_b: dq = g @ d, dd = g^T @ q;   otherwise: dp = g @ v^T, dv = p^T @ g,
the whole batch's g gathered first; a micro-batch takes its rows of dd (dv).

`batch_reduce` is tf.reduce_sum / reduce_mean / reduce_max / reduce_min of a per-sample
value over the batch axis alone (a batch statistic: the batch's mean to centre by, DEC's cluster frequencies), whose
result every sample reads: each sample's output is the whole statistic. Forward it sums the
whole batch in float64 and rounds once to float32 (TF's float32 sum over the batch axis is
blocked, not sequential: both are within TF's own rounding of the exact sum); a mean divides
that by B in float32, as TF's Mean. Backward, TF's gradient of the broadcast is the sum over
the batch of every sample's gradient (BroadcastGradientArgs' Sum), then _SumGrad's tile (a
mean's divided by B): each micro-batch's input gradient is that one value. A max (min) is
exact; its gradient is TF's _MinOrMaxGrad: (x == m) / (the batch's count of x == m) times
that sum, ties sharing it.

`batch_row` is a per-sample value viewed with a leading axis of 1 (`sq[None, :]`,
tf.expand_dims(x, 0), tf.reshape(x, [1, -1]), tf.transpose(x[:, None]), `labels[None, :]`)
and broadcast against per-sample values: every sample's output is the whole batch's values
(row j sample j's), reshaped to the per-sample shape TF broadcasts it as. Backward, TF's
gradient of the broadcast is the sum over the batch of every sample's gradient
(BroadcastGradientArgs' Sum, in float64 rounded once, as `batch_reduce`'s): sample j's is
the sum over every sample i of g_i at j's place, a micro-batch taking its rows.

`sample_constant` is a constant of the user's graph whose first axis is the batch (the
labels of in-batch negatives, tf.range(B) or tf.eye(B)): a micro-batch reads its own rows
(`RunContext.offset`); its one input is any value of the micro-batch, without gradient.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from wafer.kernels.base import INTEGER, Kernel, KernelError, RunContext, Shape, check_dtypes, max_cores_for, register


class _BatchBarrier(Kernel):
    """A batch barrier of the batch's B samples (attr batch_size: `self.batch`)."""

    batch_barrier = True

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]):
        super().__init__(name, attrs, input_shapes)
        size = self.attrs.get("batch_size")
        if not isinstance(size, int) or size < 1:
            raise KernelError(f"kernel {name!r} ({self.type_name}): takes attr batch_size "
                              f"(the batch's samples, >= 1), got {size!r}")
        self.batch = size

    def max_cores(self) -> int:
        return max_cores_for(self.flops_per_sample())


def _rows(x: np.ndarray, offset: int, count: int) -> np.ndarray:
    return np.ascontiguousarray(x[offset:offset + count])


@register
class InBatchMatmul(_BatchBarrier):
    """attrs transpose_b (bool), batch_size B. Inputs q (n,), d (n,) with transpose_b (output
    (B,)); p (B,), v (n,) without (output (n,)). A batch barrier (see the module)."""

    type_name = "in_batch_matmul"
    barrier_holds = "the whole batch's operand"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]):
        super().__init__(name, attrs, input_shapes)
        self.tb = self.attrs.get("transpose_b", False)
        shapes = self.input_shapes
        inner = self.batch if not self.tb else shapes[1][0] if len(shapes) == 2 and \
            len(shapes[1]) == 1 else -1
        if not isinstance(self.tb, bool) or len(shapes) != 2 or \
                any(len(s) != 1 for s in shapes) or shapes[0][0] != inner:
            raise KernelError(f"kernel {name!r} (in_batch_matmul): takes two rank-1 per-sample "
                              "inputs, (n,) and (n,) with transpose_b, (B,) and (n,) without, "
                              f"got {shapes} (transpose_b {self.tb!r}, B {self.batch})")

    @property
    def output_shape(self):
        return (self.batch,) if self.tb else self.input_shapes[1]

    def flops_per_sample(self) -> float:
        return 2.0 * self.input_shapes[0][0] * self.output_shape[0]

    def activation_bytes_per_sample(self) -> int:
        return 4 * sum(s[0] for s in self.input_shapes)  # both rows, until the batch is whole

    def barrier_transfers(self) -> tuple[int, ...]:
        """Values crossing the region in each pass: the whole other operand (forward), the
        whole output gradient (backward)."""
        return self.batch * self.input_shapes[1][0], self.batch * self.output_shape[0]

    # ---- the batch barrier ----
    def batch_statistics(self, params, inputs: Sequence[np.ndarray], ctx: RunContext):
        """The whole batch of both operands."""
        return tuple(np.ascontiguousarray(x, np.float32) for x in inputs)

    def gradient_statistics(self, params, caches: Sequence[Any], grads: Sequence[np.ndarray],
                            ctx: RunContext):
        """The whole batch's gradient of the second operand (TF's matmul of the whole g)."""
        left, _ = ctx.batch[0]
        g = np.concatenate(grads)
        return g.T @ left if self.tb else left.T @ g

    # ---- one micro-batch ----
    def forward(self, params, inputs, ctx: RunContext):
        right = ctx.batch[0][1]
        return inputs[0] @ (right.T if self.tb else right), ctx.offset

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        right, d_right = ctx.batch[0][1], ctx.batch[1]
        d_left = None
        if ctx.wants_grad(0):
            d_left = grad_output @ (right if self.tb else right.T)
        return [d_left, _rows(d_right, cache, len(grad_output))], {}


@register
class BatchTranspose(_BatchBarrier):
    """attr batch_size B; input x (B,): output row j is column j of the batch's [B, B]
    value, its gradient likewise. A batch barrier (see the module)."""

    type_name = "batch_transpose"
    barrier_holds = "the whole batch's value"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]):
        super().__init__(name, attrs, input_shapes)
        if self.input_shapes != [(self.batch,)]:
            raise KernelError(f"kernel {name!r} (batch_transpose): takes one input of per-sample "
                              f"shape (B,) = ({self.batch},), got {self.input_shapes}")

    @property
    def output_shape(self):
        return (self.batch,)

    def flops_per_sample(self) -> float:
        return float(self.batch)  # a move per value

    def activation_bytes_per_sample(self) -> int:
        return 4 * self.batch

    def barrier_transfers(self) -> tuple[int, ...]:
        return (self.batch * self.batch,)  # the whole value (forward), its gradient (backward)

    def batch_statistics(self, params, inputs: Sequence[np.ndarray], ctx: RunContext):
        return np.ascontiguousarray(inputs[0].T)

    def gradient_statistics(self, params, caches: Sequence[Any], grads: Sequence[np.ndarray],
                            ctx: RunContext):
        return np.ascontiguousarray(np.concatenate(grads).T)

    def forward(self, params, inputs, ctx: RunContext):
        return _rows(ctx.batch[0], ctx.offset, len(inputs[0])), ctx.offset

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        return [_rows(ctx.batch[1], cache, len(grad_output))], {}


def batch_sum(x: np.ndarray) -> np.ndarray:
    """The sum over the batch axis (axis 0) in float64, rounded once to float32."""
    return np.asarray(np.sum(x, axis=0, dtype=np.float64), np.float32)


@register
class BatchReduce(_BatchBarrier):
    """attrs op ("sum", "mean", "max" or "min"), batch_size B; input x (S): output (S), the
    whole batch's statistic over the batch axis for every sample. A batch barrier (see the
    module)."""

    type_name = "batch_reduce"
    barrier_holds = "the whole batch's statistic"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]):
        super().__init__(name, attrs, input_shapes)
        self.op = self.attrs.get("op")
        if self.op not in ("sum", "mean", "max", "min") or len(self.input_shapes) != 1:
            raise KernelError(f"kernel {name!r} (batch_reduce): takes one input and attr op "
                              f"'sum', 'mean', 'max' or 'min', got {len(self.input_shapes)} inputs, op {self.op!r}")

    @property
    def output_shape(self):
        return self.input_shapes[0]

    def _size(self) -> int:
        return int(np.prod(self.output_shape, dtype=np.int64))

    def flops_per_sample(self) -> float:
        return float(self._size())  # an add per value

    def activation_bytes_per_sample(self) -> int:
        # a max or min keeps its input for the backward's (x == m)
        return 4 * self._size() if self.op in ("max", "min") else 0

    def barrier_transfers(self) -> tuple[int, ...]:
        return (self._size(),)  # the statistic (forward), its summed gradient (backward)

    def batch_statistics(self, params, inputs: Sequence[np.ndarray], ctx: RunContext):
        """The statistic; for a max or min also the batch's count of samples equal to it."""
        x = inputs[0]
        if self.op in ("max", "min"):
            extreme = (np.max if self.op == "max" else np.min)(x, axis=0)
            return extreme, np.sum(x == extreme, axis=0, dtype=np.float32)
        total = batch_sum(x)
        return (total / np.float32(self.batch) if self.op == "mean" else total), None

    def gradient_statistics(self, params, caches: Sequence[Any], grads: Sequence[np.ndarray],
                            ctx: RunContext):
        total = batch_sum(np.concatenate(grads))
        return total / np.float32(self.batch) if self.op == "mean" else total

    def forward(self, params, inputs, ctx: RunContext):
        cache = inputs[0] if self.op in ("max", "min") else None
        return np.broadcast_to(ctx.batch[0][0], inputs[0].shape).copy(), cache

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        (extreme, count), total = ctx.batch
        if cache is None:
            return [np.broadcast_to(total, grad_output.shape).copy()], {}
        return [((cache == extreme).astype(np.float32) / count) * total], {}


@register
class BatchRow(_BatchBarrier):
    """attrs shape (the per-sample output shape, holding B times the input's values),
    batch_size B; input x (S), float32, int32 or int64: every sample's output is the whole
    batch's x reshaped to `shape`. A batch barrier (see the module)."""

    type_name = "batch_row"
    barrier_holds = "the whole batch's values"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]):
        super().__init__(name, attrs, input_shapes)
        shape = self.attrs.get("shape")
        self.shape = tuple(int(d) for d in shape) if isinstance(shape, (list, tuple)) else ()
        if len(self.input_shapes) != 1 or not self.shape or \
                np.prod(self.shape, dtype=np.int64) != self.batch * self._size():
            raise KernelError(f"kernel {name!r} (batch_row): takes one input and attr shape "
                              f"holding B = {self.batch} times its values, got "
                              f"{self.input_shapes}, shape {shape!r}")

    def _size(self) -> int:
        return int(np.prod(self.input_shapes[0], dtype=np.int64))

    @property
    def output_shape(self):
        return self.shape

    def output_dtype(self, input_dtypes):
        check_dtypes(self, input_dtypes, [(np.float32, *INTEGER)])
        return np.dtype(input_dtypes[0])

    def flops_per_sample(self) -> float:
        return float(self.batch * self._size())  # a move per value

    def activation_bytes_per_sample(self) -> int:
        return 0

    def barrier_transfers(self) -> tuple[int, ...]:
        return (self.batch * self._size(),)  # the batch's values (forward), their gradient

    def batch_statistics(self, params, inputs: Sequence[np.ndarray], ctx: RunContext):
        return np.ascontiguousarray(inputs[0]).reshape(self.shape)

    def gradient_statistics(self, params, caches: Sequence[Any], grads: Sequence[np.ndarray],
                            ctx: RunContext):
        return batch_sum(np.concatenate(grads)).reshape((self.batch, *self.input_shapes[0]))

    def forward(self, params, inputs, ctx: RunContext):
        return np.broadcast_to(ctx.batch[0], (len(inputs[0]), *self.shape)).copy(), ctx.offset

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        return [_rows(ctx.batch[1], cache, len(grad_output))], {}


@register
class SampleConstant(Kernel):
    """attr value (an array whose first axis is the batch, B rows): each micro-batch's rows.
    Its one input is any value of the micro-batch (read for nothing), without gradient."""

    type_name = "sample_constant"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]):
        super().__init__(name, attrs, input_shapes)
        self.value = np.asarray(self.attrs.get("value", np.zeros(0)))
        if len(self.input_shapes) != 1 or self.value.ndim < 1 or \
                self.value.dtype not in [np.dtype(t) for t in (np.float32, *INTEGER, np.bool_)]:
            raise KernelError(f"kernel {name!r} (sample_constant): takes 1 input and attr value "
                              "(float32, int32, int64 or bool, the batch first), got "
                              f"{len(self.input_shapes)} inputs, {self.value.dtype} "
                              f"{self.value.shape}")

    @property
    def output_shape(self):
        return tuple(self.value.shape[1:])

    def flops_per_sample(self) -> float:
        return 0.0

    def max_cores(self) -> int:
        return 1

    def activation_bytes_per_sample(self) -> int:
        return 0

    def output_dtype(self, input_dtypes):
        check_dtypes(self, input_dtypes, [(np.float32, *INTEGER, np.bool_)])
        return self.value.dtype

    def input_differentiable(self, index: int) -> bool:
        return False

    def forward(self, params, inputs, ctx: RunContext):
        count = len(inputs[0])
        if ctx.offset + count > len(self.value):
            raise KernelError(f"kernel {self.name!r} (sample_constant): holds {len(self.value)} "
                              f"samples' rows, the batch has more ({ctx.offset + count})")
        return _rows(self.value, ctx.offset, count), None

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        return [None], {}

