"""depthwise_conv2d: TF's DepthwiseConv2dNative (Keras DepthwiseConv2D, the first half of
SeparableConv2D, and through a unit height their 1-D forms): every input channel c is
convolved with its own depth_multiplier filters, output channel c * multiplier + q, with
strides, dilations and SAME, VALID or explicit padding."""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from wafer.kernels.base import Kernel, KernelError, RunContext, accumulate, max_cores_for, register
from wafer.kernels.conv import Windows, pair


@register
class DepthwiseConv2D(Kernel):
    type_name = "depthwise_conv2d"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]):
        super().__init__(name, attrs, input_shapes)
        if len(self.input_shapes) != 1:
            raise KernelError(f"kernel {name!r}: depthwise_conv2d takes 1 input, got "
                              f"{len(self.input_shapes)}")
        self.multiplier = int(self.attrs.get("depth_multiplier", 0))
        if self.multiplier <= 0:
            raise KernelError(f"kernel {name!r}: depthwise_conv2d needs depth_multiplier > 0, "
                              f"got {self.multiplier}")
        self.ksize = pair(name, self.attrs, "kernel_size")
        self.windows = Windows(name, self.input_shapes[0], self.ksize,
                               pair(name, self.attrs, "strides"), self.attrs.get("padding"),
                               pair(name, {"dilations": [1, 1], **self.attrs}, "dilations"))
        self.channels = self.input_shapes[0][2]

    @property
    def output_shape(self):
        return (self.windows.oh, self.windows.ow, self.channels * self.multiplier)

    def param_shapes(self):
        return {"kernel": (*self.ksize, self.channels, self.multiplier)}

    def flops_per_sample(self) -> float:
        return float(2 * math.prod(self.output_shape) * self.ksize[0] * self.ksize[1])

    def max_cores(self) -> int:
        return max_cores_for(self.flops_per_sample())

    def activation_bytes_per_sample(self) -> int:
        return 4 * self.windows.ph * self.windows.pw * self.channels

    def forward(self, params, inputs, ctx: RunContext):
        x, f = inputs[0], params["kernel"]
        padded = self.windows.pad(x, 0.0)
        y = np.zeros((len(x), self.windows.oh, self.windows.ow, self.channels, self.multiplier),
                     np.float32)
        for i, j, taps in self.windows.offsets(padded):
            y += taps[..., None] * f[i, j]
        return y.reshape(len(x), *self.output_shape), padded

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        padded, f = cache, params["kernel"]
        m = len(padded)
        dy = grad_output.reshape(m, self.windows.oh, self.windows.ow, self.channels, self.multiplier)
        df = np.empty(f.shape, np.float32)
        for i, j, taps in self.windows.offsets(padded):
            df[i, j] = np.einsum("nhwc,nhwcq->cq", taps, dy)
        grads: dict[str, np.ndarray] = {}
        accumulate(param_grads, "kernel", df, grads, ctx)
        dx = None
        if ctx.wants_grad(0):
            dx = self.windows.scatter(m, self.channels, (
                (i, j, np.einsum("nhwcq,cq->nhwc", dy, f[i, j]))
                for i in range(self.ksize[0]) for j in range(self.ksize[1])))
        return [dx], grads
