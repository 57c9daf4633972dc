"""The dense kernel: x @ kernel (+ bias) (+ a fused activation), over the last axis."""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from wafer.kernels import activations
from wafer.kernels.base import Kernel, KernelError, RunContext, accumulate, max_cores_for, register

# Activations whose gradient reads only the output: applied in place on the pre-activation.
OUTPUT_GRADIENT = {"relu", "elu", "selu", "tanh", "sigmoid", "linear"}


class MatmulGradient:
    """Scratch space for x.T @ dy of one weight, reused for every micro-batch."""

    def __init__(self) -> None:
        self._scratch: np.ndarray | None = None

    def __call__(self, x2d: np.ndarray, dy2d: np.ndarray, acc: Mapping[str, np.ndarray] | None,
                 grads: dict[str, np.ndarray], ctx: RunContext, role: str = "kernel") -> None:
        if acc is None:
            grads[role] = x2d.T @ dy2d
            return
        if not ctx.accumulate:  # the batch's first micro-batch: straight into the accumulator
            grads[role] = np.matmul(x2d.T, dy2d, out=acc[role])
            return
        shape = (x2d.shape[1], dy2d.shape[1])
        if self._scratch is None or self._scratch.shape != shape:
            self._scratch = np.empty(shape, np.float32)
        np.matmul(x2d.T, dy2d, out=self._scratch)
        accumulate(acc, role, self._scratch, grads, ctx)


@register
class Dense(Kernel):
    type_name = "dense"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]):
        super().__init__(name, attrs, input_shapes)
        if len(self.input_shapes) != 1 or not self.input_shapes[0]:
            raise KernelError(f"kernel {name!r}: dense takes one input of shape (..., n), "
                              f"got {self.input_shapes}")
        self.units = int(self.attrs.get("units", 0))
        if self.units <= 0:
            raise KernelError(f"kernel {name!r}: dense needs units > 0, got {self.units}")
        self.use_bias = bool(self.attrs.get("use_bias", True))
        self.activation = activations.check_function(name, self.attrs.get("activation", "linear"))
        self.n = self.input_shapes[0][-1]
        self._weight_grad = MatmulGradient()

    @property
    def output_shape(self):
        return (*self.input_shapes[0][:-1], self.units)

    def param_shapes(self):
        shapes: dict[str, tuple[int, ...]] = {"kernel": (self.n, self.units)}
        if self.use_bias:
            shapes["bias"] = (self.units,)
        return shapes

    def _rows(self) -> int:
        return math.prod(self.input_shapes[0][:-1])

    def flops_per_sample(self) -> float:
        per_row = 2 * self.n * self.units + (self.units if self.use_bias else 0)
        per_row += activations.FUNCTIONS[self.activation][2] * self.units
        return float(self._rows() * per_row)

    def max_cores(self) -> int:
        return max_cores_for(self.flops_per_sample())

    def activation_bytes_per_sample(self) -> int:
        kept = self.n + (self.units if self.activation != "linear" else 0)
        return 4 * self._rows() * kept

    def forward(self, params, inputs, ctx: RunContext):
        x = inputs[0]
        x2d = x.reshape(-1, self.n)
        z = x2d @ params["kernel"]
        if self.use_bias:
            np.add(z, params["bias"], out=z)
        if self.activation in OUTPUT_GRADIENT:
            y = activations.apply(self.activation, z, out=z)
            cache = (x2d, None, y)
        else:
            y = activations.apply(self.activation, z)
            cache = (x2d, z, y)
        return y.reshape(*x.shape[:-1], self.units), cache

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        x2d, z, y = cache
        dy = grad_output.reshape(-1, self.units)
        if self.activation != "linear":
            dy = activations.gradient(self.activation, z, y, dy)
        grads: dict[str, np.ndarray] = {}
        self._weight_grad(x2d, dy, param_grads, grads, ctx)
        if self.use_bias:
            accumulate(param_grads, "bias", dy.sum(axis=0), grads, ctx)
        dx = None
        if ctx.wants_grad(0):
            dx = (dy @ params["kernel"].T).reshape(*grad_output.shape[:-1], self.n)
        return [dx], grads
