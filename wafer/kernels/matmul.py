"""The matmul kernel: tf.matmul (BatchMatMulV2) of two operands, activations with each
other (attention's scores and mixing) or with a weight or constant, per sample.

Operands (`wafer.kernels.operands`): "ii", "ip", "pi", "ic" or "ci". On the micro-batch
arrays an activation's batch axis is the first of its leading (stacked) axes, and
BatchMatMulV2 broadcasts the leading axes right-aligned, so a product is per sample when:
- every activation has per-sample rank >= 2, two activations have the same rank, and a
  weight or constant has fewer leading axes than the activations, or as many with a
  leading 1 (e.g. a rank-2 weight applied to every [seq, d] matrix of every sample); or
- an activation of per-sample rank 1 is the rows of the left operand (x [batch, n] @ w
  [n, k], transpose_a false) against a rank-2 weight or constant.
Anything else would contract, transpose or broadcast the batch axis (mix samples) and is
refused. The backward is TF's _BatchMatMulV2 gradient (a product with the other operand,
by the transposes) summed over broadcast axes; a weight's gradient over the micro-batch.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from wafer.kernels.base import KernelError, RunContext, Shape, max_cores_for, register
from wafer.kernels.operands import Operands, OperandsKernel

FORMS = ("ii", "ip", "pi", "ic", "ci")


def _t(x: np.ndarray) -> np.ndarray:
    return np.swapaxes(x, -1, -2)


def _mm(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """x @ y; a stack of matrices times one matrix as a single GEMM."""
    if y.ndim == 2 and x.ndim > 2:
        return (x.reshape(-1, x.shape[-1]) @ y).reshape(*x.shape[:-1], y.shape[-1])
    return np.matmul(x, y)


def _swap(shape: Shape) -> Shape:
    return (*shape[:-2], shape[-1], shape[-2])


@register
class Matmul(OperandsKernel):
    """attrs operands (2 letters, see the module), transpose_a, transpose_b (bools);
    c<k> / p<k> the constant or weight shape of a non-activation operand."""

    type_name = "matmul"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]):
        super().__init__(name, attrs, input_shapes)
        self.operands = Operands(self, 2, broadcast=False)
        letters = self.operands.letters
        flags = [self.attrs.get(k, False) for k in ("transpose_a", "transpose_b")]
        if letters not in FORMS or any(not isinstance(f, bool) for f in flags):
            raise KernelError(f"kernel {name!r} (matmul): operands must be one of "
                              f"{', '.join(FORMS)} with bool attrs transpose_a, transpose_b, "
                              f"got {letters!r}, {flags}")
        self.ta, self.tb = flags
        a, b = self.operands
        problem = self._per_sample_problem()
        if problem:
            raise KernelError(f"kernel {name!r} (matmul): operands {letters} of shapes "
                              f"{a.shape}, {b.shape} (activations per sample): {problem}")
        # full shapes with the micro-batch as 1: the output's per-sample shape follows
        full = [(1, *o.shape) if o.letter == "i" else o.shape for o in self.operands]
        left = _swap(full[0]) if self.ta else full[0]
        right = _swap(full[1]) if self.tb else full[1]
        if left[-1] != right[-2]:
            raise KernelError(f"kernel {name!r} (matmul): inner dimensions differ: {left[-1]} "
                              f"(operand 0 {a.shape}, transpose_a {self.ta}) and {right[-2]} "
                              f"(operand 1 {b.shape}, transpose_b {self.tb})")
        try:
            lead = np.broadcast_shapes(left[:-2], right[:-2])
        except ValueError:
            raise KernelError(f"kernel {name!r} (matmul): the leading axes of {a.shape} and "
                              f"{b.shape} do not broadcast") from None
        out = (*lead, left[-2], right[-1])
        self._shape = tuple(out[1:])  # drop the micro-batch (rank-2 rows: the rows are samples)
        self.inner = left[-1]

    def _per_sample_problem(self) -> str:
        """Why the product would mix samples ("" when it does not)."""
        a, b = self.operands
        ranks = [len(o.shape) for o in self.operands]
        if self.operands.letters == "ii":
            if min(ranks) < 2:
                return ("a product of two activations needs per-sample rank >= 2 (of rank 1 "
                        "it would contract or transpose the batch axis)")
            if ranks[0] != ranks[1]:
                return "two activations of different ranks would broadcast the batch axis"
            return ""
        act, other = (a, b) if a.letter == "i" else (b, a)
        if len(other.shape) < 2:
            return f"the {'weight' if other.letter == 'p' else 'constant'} needs rank >= 2"
        if len(act.shape) == 0:
            return "an activation needs per-sample rank >= 1"
        if len(act.shape) == 1:
            if act is not a or self.ta or len(other.shape) != 2:
                return ("an activation of per-sample rank 1 is only the rows of the left "
                        "operand (transpose_a false) against a rank-2 weight or constant; "
                        "otherwise the batch axis would be contracted or transposed")
            return ""
        stacked, other_stacked = len(act.shape) - 1, len(other.shape) - 2  # leading axes
        if other_stacked > stacked or (other_stacked == stacked and other.shape[0] != 1):
            return ("the weight's or constant's leading axes would broadcast against the "
                    "batch axis (it needs fewer leading axes than the activation has with "
                    "the batch, or a leading 1)")
        return ""

    def flops_per_sample(self) -> float:
        return 2.0 * math.prod(self._shape) * self.inner

    def max_cores(self) -> int:
        return max_cores_for(self.flops_per_sample())

    def activation_bytes_per_sample(self) -> int:
        # kept for the other operand's gradient: none for a constant
        if "c" in self.operands.letters:
            return 0
        return 4 * sum(math.prod(o.shape) for o in self.operands if o.letter == "i")

    def forward(self, params, inputs, ctx: RunContext):
        a, b = self.operands.arrays(params, inputs)
        left = _t(a) if self.ta else a
        right = _t(b) if self.tb else b
        return _mm(left, right), (a, b)

    def _wanted(self, k: int, ctx: RunContext) -> bool:
        o = self.operands[k]
        return o.letter == "p" or (o.letter == "i" and ctx.wants_grad(o.input_index))

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        a, b = cache
        g = grad_output
        ga = gb = None
        if self._wanted(0, ctx):
            if self.operands[0].letter == "p" and a.ndim == 2:
                ga = self._weight_gradient(g, b, left=True)
            elif not self.ta:
                ga = _mm(g, b if self.tb else _t(b))  # g @ b^T, or g @ b
            else:
                ga = np.matmul(_t(b) if self.tb else b, _t(g))  # b^T g^T, or b g^T
        if self._wanted(1, ctx):
            if self.operands[1].letter == "p" and b.ndim == 2:
                gb = self._weight_gradient(g, a, left=False)
            elif not self.tb:
                gb = np.matmul(a if self.ta else _t(a), g)  # a^T g, or a g
            else:
                gb = np.matmul(_t(g), _t(a) if self.ta else a)  # g^T a^T, or g^T a
        return self.operands.gradients([ga, gb], ctx, param_grads)

    def _weight_gradient(self, g: np.ndarray, x: np.ndarray, left: bool) -> np.ndarray:
        """A rank-2 weight's gradient summed over every stacked axis (the micro-batch
        included) as one contraction: for w on the right sum(op(x)^T g), on the left
        sum(g op(x)^T), transposed back when the weight is."""
        stacked = list(range(g.ndim - 2))
        if left:  # g (.., s, e) with op(b) (.., d, e): (s, d)
            other = _t(x) if self.tb else x
            grad = np.tensordot(g, other, axes=(stacked + [g.ndim - 1], stacked + [g.ndim - 1]))
            return grad.T if self.ta else grad
        other = _t(x) if self.ta else x  # op(a) (.., s, d) with g (.., s, e): (d, e)
        if g.ndim == 2:  # rows are samples
            grad = other.T @ g
        else:
            grad = np.tensordot(other, g, axes=(stacked + [g.ndim - 2], stacked + [g.ndim - 2]))
        return grad.T if self.tb else grad
