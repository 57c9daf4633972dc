"""conv2d_transpose: TF's Conv2DBackpropInput as a layer (Keras Conv2DTranspose and,
through a unit height, Conv1DTranspose). It is the input gradient of a conv2d whose input
is this kernel's output: each input position spreads its values, times the filter, over a
window of the output (col2im of x @ w^T); its own input gradient is that conv2d of the
upstream gradient (im2col, then @ w), its filter gradient the conv2d's filter gradient."""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from wafer.kernels.base import Kernel, KernelError, RunContext, accumulate, max_cores_for, register
from wafer.kernels.conv import Windows, pair


@register
class Conv2DTranspose(Kernel):
    type_name = "conv2d_transpose"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]):
        super().__init__(name, attrs, input_shapes)
        if len(self.input_shapes) != 1 or len(self.input_shapes[0]) != 3:
            raise KernelError(f"kernel {name!r}: conv2d_transpose takes 1 input (H, W, C), got "
                              f"{self.input_shapes}")
        self.filters = int(self.attrs.get("filters", 0))
        if self.filters <= 0:
            raise KernelError(f"kernel {name!r}: conv2d_transpose needs filters > 0, got {self.filters}")
        self.ksize = pair(name, self.attrs, "kernel_size")
        self.size = pair(name, self.attrs, "output_size")
        h, w, self.channels = self.input_shapes[0]
        # The windows of the conv2d this kernel is the input gradient of: over the output.
        self.windows = Windows(name, (*self.size, self.filters), self.ksize,
                               pair(name, self.attrs, "strides"), self.attrs.get("padding"),
                               pair(name, {"dilations": [1, 1], **self.attrs}, "dilations"))
        if (self.windows.oh, self.windows.ow) != (h, w):
            raise KernelError(f"kernel {name!r}: output size {self.size} does not give back the "
                              f"input's {(h, w)} under a conv2d of this window, strides and padding")
        self.patch = self.ksize[0] * self.ksize[1] * self.filters

    @property
    def output_shape(self):
        return (*self.size, self.filters)

    def param_shapes(self):
        return {"kernel": (*self.ksize, self.filters, self.channels)}

    def flops_per_sample(self) -> float:
        h, w, c = self.input_shapes[0]
        return float(2 * h * w * c * self.patch)

    def max_cores(self) -> int:
        return max_cores_for(self.flops_per_sample())

    def activation_bytes_per_sample(self) -> int:
        return 4 * math.prod(self.input_shapes[0])

    def forward(self, params, inputs, ctx: RunContext):
        x = inputs[0]
        x2d = x.reshape(-1, self.channels)
        cols = x2d @ params["kernel"].reshape(self.patch, self.channels).T
        return self.windows.uncolumns(len(x), cols), x2d

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        x2d = cache
        w2d = params["kernel"].reshape(self.patch, self.channels)
        dcols = self.windows.columns(grad_output)  # (m * H * W, kh * kw * filters)
        grads: dict[str, np.ndarray] = {}
        accumulate(param_grads, "kernel", (dcols.T @ x2d).reshape(self.param_shapes()["kernel"]),
                   grads, ctx)
        dx = None
        if ctx.wants_grad(0):
            dx = (dcols @ w2d).reshape(len(grad_output), *self.input_shapes[0])
        return [dx], grads
