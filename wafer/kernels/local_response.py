"""Local response normalization (tf.nn.local_response_normalization, tf.nn.lrn: AlexNet,
the TF1 CIFAR-10 tutorial's convnet) of each pixel's channels."""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from wafer.kernels.base import KernelError, RunContext, Shape, check_dtypes, register
from wafer.kernels.structure import Elementwise


@register
class LocalResponseNorm(Elementwise):
    """x / (bias + alpha · Σ x²)^beta, the sum over the channels within depth_radius of
    each channel (attrs depth_radius, bias, alpha, beta), as TF's CPU LRN: the window sums
    of squares, times alpha plus bias, then rsqrt (beta 0.5), inverse (beta 1) or
    exp(−beta · log). The gradient is TF's LRNGrad: for the window's channels k of each j,
    g_j · (−2·alpha·beta · x_k · y_j / n_j + [k = j] · n_j^−beta)."""

    type_name = "lrn"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]):
        super().__init__(name, attrs, input_shapes)
        radius = self.attrs.get("depth_radius")
        numbers = [self.attrs.get(k) for k in ("bias", "alpha", "beta")]
        if len(self.input_shapes) != 1 or not self.input_shapes[0] or \
                isinstance(radius, bool) or not isinstance(radius, int) or radius < 0 or \
                any(isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                    for v in numbers):
            raise KernelError(f"kernel {name!r} (lrn): takes 1 input with channels last, an int "
                              f"depth_radius >= 0 and numbers bias, alpha, beta; got "
                              f"{self.input_shapes}, {radius!r}, {numbers!r}")
        self.radius = radius
        self.bias, self.alpha, self.beta = (np.float32(v) for v in numbers)
        depth = self.input_shapes[0][-1]
        offsets = np.arange(depth)
        self.band = (np.abs(offsets[:, None] - offsets[None, :]) <= radius).astype(np.float32)

    @property
    def output_shape(self):
        return self.input_shapes[0]

    def output_dtype(self, input_dtypes):
        check_dtypes(self, input_dtypes, [(np.float32,)])
        return np.dtype(np.float32)

    def _norm(self, x: np.ndarray) -> np.ndarray:
        return np.square(x) @ self.band * self.alpha + self.bias

    def _power(self, norm: np.ndarray) -> np.ndarray:
        """norm^−beta as TF's CPU kernel computes it."""
        if self.beta == 1:
            return np.float32(1) / norm
        if self.beta == np.float32(0.5):
            return np.float32(1) / np.sqrt(norm)
        return np.exp(np.log(norm) * -self.beta)

    def forward(self, params, inputs, ctx: RunContext):
        x = inputs[0]
        y = x * self._power(self._norm(x))
        return y, (x, y)

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        x, y = cache
        norm = self._norm(x)
        scaled = grad_output * y / norm  # g_j · y_j / n_j
        grad = grad_output * norm ** -self.beta - \
            np.float32(2) * self.alpha * self.beta * x * (scaled @ self.band)
        return [grad.astype(np.float32)], {}
