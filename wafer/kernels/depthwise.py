"""depthwise_conv2d: TF's DepthwiseConv2dNative (Keras DepthwiseConv2D, the first half of
SeparableConv2D, and through a unit height their 1-D forms): every input channel c is
convolved with its own depth_multiplier filters, output channel c * multiplier + q, with
strides, dilations and SAME, VALID or explicit padding.

In float16 (attr precision, no dilation) it computes as TF's Eigen float16 kernels do
(bit-equal, docs/design.md "Mixed precision"), each multiply-add rounded to float16: the
output and the input's gradient add the taps in row-major order (the input's gradient per
output channel, then an input channel's depth_multiplier sums one after another); the
filter's gradient adds each sample's output positions in row-major order into that sample's
own sum, and the samples' sums one after another (over the whole batch, micro-batches in
order)."""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from wafer.kernels.base import Kernel, KernelError, RunContext, accumulate, max_cores_for, register
from wafer.kernels.conv import Windows, filter_of, held_filter, pair
from wafer.precision import is_half, round_half


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
        self.half = is_half(self.attrs)
        if self.half and tuple(self.windows.dilations) != (1, 1):
            raise KernelError(f"kernel {name!r}: depthwise_conv2d in float16 takes no dilation, "
                              f"got {self.windows.dilations}")
        self.held = held_filter(self, (*self.ksize, self.channels, self.multiplier))

    @property
    def output_shape(self):
        return (self.windows.oh, self.windows.ow, self.channels * self.multiplier)

    def param_shapes(self):
        return {} if self.held is not None else {"kernel": (*self.ksize, self.channels, self.multiplier)}

    def flops_per_sample(self) -> float:
        return float(2 * math.prod(self.output_shape) * self.ksize[0] * self.ksize[1])

    def max_cores(self) -> int:
        return max_cores_for(self.flops_per_sample())

    def activation_bytes_per_sample(self) -> int:
        return 4 * self.windows.ph * self.windows.pw * self.channels

    def forward(self, params, inputs, ctx: RunContext):
        x, f = inputs[0], filter_of(params, self.held)
        padded = self.windows.pad(x, 0.0)
        y = np.zeros((len(x), self.windows.oh, self.windows.ow, self.channels, self.multiplier),
                     np.float32)
        for i, j, taps in self.windows.offsets(padded):
            if self.half:
                y = round_half(y + taps[..., None] * f[i, j])
            else:
                y += taps[..., None] * f[i, j]
        return y.reshape(len(x), *self.output_shape), padded

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        if self.half:
            return self._half_backward(params, cache, grad_output, ctx, param_grads)
        padded, f = cache, filter_of(params, self.held)
        m = len(padded)
        dy = grad_output.reshape(m, self.windows.oh, self.windows.ow, self.channels, self.multiplier)
        grads: dict[str, np.ndarray] = {}
        if self.held is None:
            df = np.empty(f.shape, np.float32)
            for i, j, taps in self.windows.offsets(padded):
                df[i, j] = np.einsum("nhwc,nhwcq->cq", taps, dy)
            accumulate(param_grads, "kernel", df, grads, ctx)
        dx = None
        if ctx.wants_grad(0):
            dx = self.windows.scatter(m, self.channels, (
                (i, j, np.einsum("nhwcq,cq->nhwc", dy, f[i, j]))
                for i in range(self.ksize[0]) for j in range(self.ksize[1])))
        return [dx], grads

    def _half_backward(self, params, padded, dy, ctx: RunContext, param_grads):
        """TF's float16 DepthwiseConv2dNativeBackpropFilter and BackpropInput (Eigen); no
        filter gradient for a constant filter."""
        f, (kh, kw) = filter_of(params, self.held), self.ksize
        dy = dy.reshape(len(padded), self.windows.oh, self.windows.ow, self.channels, self.multiplier)
        grads = {} if self.held is not None else self._half_filter_gradient(padded, dy, ctx, param_grads)
        dx = None
        if ctx.wants_grad(0):
            into = np.zeros((*padded.shape, self.multiplier), np.float32)
            for i in range(kh):
                for j in range(kw):
                    target = self.windows.at(into, i, j)
                    target[...] = round_half(target + dy * f[i, j])
            total = into[..., 0]
            for q in range(1, self.multiplier):
                total = round_half(total + into[..., q])
            h, w = self.input_shapes[0][:2]
            dx = total[:, self.windows.top:self.windows.top + h, self.windows.left:self.windows.left + w]
        return [dx], grads

    def _half_filter_gradient(self, padded, dy, ctx: RunContext, param_grads):
        """Each sample's float16 sum over its output positions, the samples' sums added in turn."""
        (kh, kw), (sh, sw) = self.ksize, self.windows.strides
        sums = np.zeros((len(padded), kh, kw, self.channels, self.multiplier), np.float32)
        for r in range(self.windows.oh):
            for c in range(self.windows.ow):
                patch = padded[:, r * sh:r * sh + kh, c * sw:c * sw + kw, :, None]
                sums = round_half(sums + patch * dy[:, r, c, None, None])
        start = param_grads is not None and ctx.accumulate
        total = param_grads["kernel"].copy() if start else np.zeros(sums.shape[1:], np.float32)
        for one in sums:
            total = round_half(total + one)
        grads = {"kernel": total}
        if param_grads is not None:  # the batch's sum so far, continued: written over
            np.copyto(param_grads["kernel"], grads["kernel"])
            grads["kernel"] = param_grads["kernel"]
        return grads
