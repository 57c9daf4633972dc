"""The dense kernel: x @ kernel (+ bias) (+ a fused activation), over the last axis."""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from wafer.kernels import activations
from wafer.kernels.affine import Affine
from wafer.kernels.base import Kernel, KernelError, RunContext, max_cores_for, register
from wafer.precision import is_half


@register
class Dense(Kernel):
    type_name = "dense"
    rounds_own_output = True

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
        self.affine = Affine(self.activation, is_half(self.attrs))

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
        tail = activations.scalar_tail(ctx, (*x.shape[:-1], self.units))
        y, cache = self.affine.forward(x.reshape(-1, self.n), params["kernel"],
                                        params.get("bias"), ctx, tail)
        return y.reshape(*x.shape[:-1], self.units), cache

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        dx, grads = self.affine.backward(cache, grad_output.reshape(-1, self.units),
                                          params["kernel"], self.use_bias, param_grads, ctx,
                                          ctx.wants_grad(0))
        if dx is not None:
            dx = dx.reshape(*grad_output.shape[:-1], self.n)
        return [dx], grads
