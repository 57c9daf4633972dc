"""Batch normalisation with moving statistics (inference): a per-channel affine map of the
last axis, so each sample is computed on its own."""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from wafer.kernels.base import Kernel, KernelError, RunContext, Shape, accumulate, max_cores_for, register

_ONE = np.float32(1)


@register
class BatchNormInference(Kernel):
    """x (..., C) with the frozen weights mean and variance (C,), optional scale (attr
    scale) and offset (attr center), attr epsilon, in TF's order:
      tf.nn.batch_normalization (Keras' BatchNormalization):
        inv = rsqrt(variance + epsilon) [* scale];  y = x * inv + (offset - mean * inv)
      FusedBatchNormV3 with is_training false (attr fused):
        y = (x - mean) * (rsqrt(variance + epsilon) [* scale]) + offset
    Gradients (TF's, of the ops above): x gets g * inv; scale
    (sum(g x) - sum(g) mean) rsqrt(...) or, fused, sum(g (x - mean)) rsqrt(...); offset
    sum(g). mean and variance are moving statistics: they take no gradient."""

    type_name = "batch_norm_inference"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]):
        super().__init__(name, attrs, input_shapes)
        flags = {k: self.attrs.get(k, default) for k, default in
                 (("scale", True), ("center", True), ("fused", False))}
        eps = self.attrs.get("epsilon")
        if len(self.input_shapes) != 1 or not self.input_shapes[0] or \
                any(not isinstance(f, bool) for f in flags.values()) or \
                isinstance(eps, bool) or not isinstance(eps, (int, float)) or \
                not (math.isfinite(eps) and eps >= 0):
            raise KernelError(f"kernel {name!r} (batch_norm_inference): takes 1 input with "
                              f"channels last, a number attr epsilon >= 0 and bool attrs scale, "
                              f"center, fused, got inputs {self.input_shapes}, epsilon {eps!r}, "
                              f"{flags}")
        self.scale, self.center, self.fused = flags["scale"], flags["center"], flags["fused"]
        self.eps = np.float32(eps)
        self.channels = self.input_shapes[0][-1]

    @property
    def output_shape(self):
        return self.input_shapes[0]

    def param_shapes(self):
        roles = ["mean", "variance"] + ["scale"] * self.scale + ["offset"] * self.center
        return {role: (self.channels,) for role in roles}

    def flops_per_sample(self) -> float:
        return 2.0 * math.prod(self.input_shapes[0])  # a multiply-add per value

    def max_cores(self) -> int:
        return max_cores_for(self.flops_per_sample())

    def activation_bytes_per_sample(self) -> int:
        return 4 * math.prod(self.input_shapes[0]) if self.scale else 0  # x, for scale's gradient

    def _factors(self, params) -> tuple[np.ndarray, np.ndarray]:
        """(rsqrt(variance + epsilon), inv = that [* scale])."""
        r = _ONE / np.sqrt(params["variance"] + self.eps)
        return r, (r * params["scale"] if self.scale else r)

    def forward(self, params, inputs, ctx: RunContext):
        x = inputs[0]
        r, inv = self._factors(params)
        if self.fused:
            y = (x - params["mean"]) * inv
            if self.center:
                y += params["offset"]
        else:
            shift = -(params["mean"] * inv)
            if self.center:
                shift = params["offset"] - params["mean"] * inv
            y = x * inv + shift
        return y, x if self.scale else None

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        g = grad_output
        r, inv = self._factors(params)
        rows = tuple(range(g.ndim - 1))
        grads: dict[str, np.ndarray] = {}
        g_sum = g.sum(axis=rows, dtype=np.float32)
        if self.scale:
            x = cache
            if self.fused:
                d_inv = (g * (x - params["mean"])).sum(axis=rows, dtype=np.float32)
            else:
                d_inv = (g * x).sum(axis=rows, dtype=np.float32) - g_sum * params["mean"]
            accumulate(param_grads, "scale", d_inv * r, grads, ctx)
        if self.center:
            accumulate(param_grads, "offset", g_sum, grads, ctx)
        dx = g * inv if ctx.wants_grad(0) else None
        return [dx], grads
