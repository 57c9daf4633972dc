"""Linear systems of small dense matrices: `cholesky` (tf.linalg.cholesky), `solve`
(tf.linalg.solve, MatrixSolve; tf.linalg.inv as the solve of the identity, and
tf.linalg.triangular_solve, MatrixTriangularSolve, reading one triangle). A sparse GP's
Cholesky factor of its inducing points' kernel matrix and that factor's inverse (weights,
the weight program), a Lagrangian network's per-sample 2x2 Hessian block solved for the
accelerations.

Computed in float64 and rounded to float32, as the `slogdet` kernel: TF's float32 kernels
(Eigen's LLT, partial-pivot LU, triangular substitution) agree with it to their own
rounding, condition number times float32's epsilon; a singular (or, for Cholesky, not
positive definite) matrix gives NaN where TF's CPU kernel stops with an error. The
gradients are TF's:
_CholeskyGrad (Murray 2016: L^-T Φ(L^T g) L^-1, symmetrized), _MatrixSolveGrad and
_MatrixTriangularSolveGrad (the adjoint system's solve of g, minus its product with the
solution; the triangle only for a triangular matrix), summed over broadcast axes.

`solve`'s operands (`wafer.kernels.operands`): the matrix (..., n, n) and the right-hand
sides (..., n, k), "ii", "ic", "ci", "ip" or "pi"; a constant's or weight's leading axes
are no more than the input's per-sample ones (they never meet the batch axis).
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from wafer.kernels.base import Kernel, KernelError, RunContext, Shape, check_dtypes, max_cores_for, register
from wafer.kernels.operands import Operands, OperandsKernel
from wafer.kernels.tensor_ops import SampleKernel

FORMS = ("ii", "ic", "ci", "ip", "pi")
TRIANGLES = ("", "lower", "upper")  # `solve`'s attr triangle: the part of the matrix read


def _t(x: np.ndarray) -> np.ndarray:
    return np.swapaxes(x, -1, -2)


def _float64(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float64)


def solve_or_nan(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a^-1 b, NaN where a is singular (TF's CPU kernel stops with an error there)."""
    try:
        return np.linalg.solve(a, b)
    except np.linalg.LinAlgError:
        shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + b.shape[-2:]
        return np.full(shape, np.nan)


def _square(kernel: Kernel, shape: Shape, what: str) -> int:
    if len(shape) < 2 or shape[-1] != shape[-2]:
        raise KernelError(f"kernel {kernel.name!r} ({kernel.type_name}): takes square "
                          f"matrices (..., n, n) as its {what}, got {shape}")
    return shape[-1]


@register
class Cholesky(SampleKernel):
    """x (..., n, n), symmetric positive definite (its lower triangle is read, as TF's);
    output L (..., n, n), lower triangular with x = L L^T; NaN where x is not positive
    definite (TF's CPU kernel stops with an error)."""

    type_name = "cholesky"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]):
        super().__init__(name, attrs, input_shapes)
        self.n = _square(self, self.one_input(), "input")

    @property
    def output_shape(self):
        return self.input_shapes[0]

    def flops_per_sample(self) -> float:
        return float(self.n ** 3 / 3 * math.prod(self.input_shapes[0][:-2]))

    def forward(self, params, inputs, ctx: RunContext):
        x = _float64(inputs[0])
        try:
            factor = np.linalg.cholesky(x)
        except np.linalg.LinAlgError:
            factor = np.full_like(x, np.nan)
        return factor.astype(np.float32), factor

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        factor = cache
        inverse = solve_or_nan(factor, np.broadcast_to(np.eye(self.n), factor.shape))
        middle = _t(factor) @ _float64(grad_output)
        middle[..., range(self.n), range(self.n)] *= 0.5
        grad = _t(inverse) @ np.tril(middle) @ inverse
        return [(0.5 * (grad + _t(grad))).astype(np.float32)], {}


@register
class Solve(OperandsKernel):
    """attrs operands (see the module), adjoint (bool: solve a^T x = b), triangle ("" the
    whole matrix, "lower" or "upper": a triangular solve reading that triangle only);
    output x (..., n, k)."""

    type_name = "solve"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]):
        super().__init__(name, attrs, input_shapes)
        self.operands = Operands(self, 2, broadcast=False)
        self.adjoint = self.attrs.get("adjoint", False)
        self.triangle = self.attrs.get("triangle", "")
        if self.operands.letters not in FORMS or not isinstance(self.adjoint, bool) or \
                self.triangle not in TRIANGLES:
            raise KernelError(f"kernel {name!r} (solve): operands must be one of "
                              f"{', '.join(FORMS)}, adjoint a bool and triangle one of "
                              f"{TRIANGLES}, got {self.operands.letters!r}, {self.adjoint!r}, "
                              f"{self.triangle!r}")
        a, b = self.operands
        self.n = _square(self, a.shape, "matrix")
        if len(b.shape) < 2 or b.shape[-2] != self.n:
            raise KernelError(f"kernel {name!r} (solve): the right-hand sides {b.shape} need "
                              f"(..., {self.n}, k) against the matrix {a.shape}")
        inner, outer = (a, b) if a.letter == "i" else (b, a)
        if outer.letter != "i" and len(outer.shape) > len(inner.shape) or \
                outer.letter == "i" and len(outer.shape) != len(inner.shape):
            raise KernelError(f"kernel {name!r} (solve): operands {a.shape} and {b.shape} "
                              f"({self.operands.letters}) would broadcast against the batch "
                              "axis")
        try:
            lead = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        except ValueError:
            raise KernelError(f"kernel {name!r} (solve): the leading axes of {a.shape} and "
                              f"{b.shape} do not broadcast") from None
        self._shape = (*lead, self.n, b.shape[-1])

    def output_dtype(self, input_dtypes):
        check_dtypes(self, self.operands.dtypes(input_dtypes), [(np.float32,)] * 2)
        return np.dtype(np.float32)

    def flops_per_sample(self) -> float:
        lead = math.prod(self._shape[:-2])
        return float(lead * (2 * self.n ** 3 / 3 + 2 * self.n ** 2 * self._shape[-1]))

    def max_cores(self) -> int:
        return max_cores_for(self.flops_per_sample())

    def activation_bytes_per_sample(self) -> int:
        return 4 * (math.prod(self.operands[0].shape) + math.prod(self._shape))

    def _matrix(self, a: np.ndarray) -> np.ndarray:
        """The part of `a` the solve reads."""
        return {"": a, "lower": np.tril(a), "upper": np.triu(a)}[self.triangle]

    def forward(self, params, inputs, ctx: RunContext):
        a, b = (_float64(v) for v in self.operands.arrays(params, inputs))
        a = self._matrix(a)
        x = solve_or_nan(_t(a) if self.adjoint else a, b)
        return x.astype(np.float32), (a, x)

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        a, x = cache
        grad_b = solve_or_nan(a if self.adjoint else _t(a), _float64(grad_output))
        grad_a = self._matrix(-(x @ _t(grad_b) if self.adjoint else grad_b @ _t(x)))
        return self.operands.gradients([grad_a.astype(np.float32), grad_b.astype(np.float32)],
                                       ctx, param_grads)
