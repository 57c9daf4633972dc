"""Kernels on (D, H, W, C) samples (Keras Conv3D, MaxPooling3D, AveragePooling3D): conv3d
(im2col over the window's taps + one matmul) and max/avg pooling, with TensorFlow's
SAME/VALID padding arithmetic on each of the three spatial axes. A per-sample (k, D, H, W,
C) input is k volumes each computed on its own (conv.frames_of: folded into the batch)."""
from __future__ import annotations

import itertools
import math
from typing import Any, Mapping, Sequence

import numpy as np

from wafer.kernels.base import Kernel, KernelError, RunContext, accumulate, max_cores_for, register
from wafer.kernels.conv import as_images, as_samples, filter_of, frames_of, held_filter, output_size


def triple(name: str, attrs: Mapping[str, Any], key: str) -> tuple[int, int, int]:
    value = attrs.get(key)
    if not isinstance(value, (list, tuple)) or len(value) != 3 or min(value) <= 0:
        raise KernelError(f"kernel {name!r}: {key} must be three positive integers, got {value!r}")
    return int(value[0]), int(value[1]), int(value[2])


class Volume:
    """The sliding windows of a (D, H, W, C) input: padding, output size, taps, col2im."""

    def __init__(self, name: str, shape: tuple[int, ...], window: tuple[int, ...],
                 strides: tuple[int, ...], padding: Any):
        if len(shape) != 4:
            raise KernelError(f"kernel {name!r}: input must be (D, H, W, C) per sample, got {shape}")
        if padding not in ("SAME", "VALID"):
            raise KernelError(f"kernel {name!r}: padding must be SAME or VALID, got {padding!r}")
        sizes = [output_size(n, k, s, padding) for n, k, s in zip(shape[:3], window, strides)]
        self.out = tuple(o for o, _ in sizes)
        self.before = tuple(b for _, b in sizes)
        if min(self.out) <= 0:
            raise KernelError(f"kernel {name!r}: window {window} does not fit input {shape} "
                              f"with {padding} padding")
        self.shape, self.window, self.strides = shape, window, strides
        self.padded = tuple(max((o - 1) * s + k, n + b) for o, s, k, n, b in
                            zip(self.out, strides, window, shape[:3], self.before))

    def _inside(self) -> tuple[slice, ...]:
        return (slice(None), *(slice(b, b + n) for b, n in zip(self.before, self.shape[:3])))

    def pad(self, x: np.ndarray, fill: float) -> np.ndarray:
        if self.padded == self.shape[:3]:
            return x
        padded = np.full((len(x), *self.padded, x.shape[-1]), fill, np.float32)
        padded[self._inside()] = x
        return padded

    def at(self, padded: np.ndarray, offset: tuple[int, ...]) -> np.ndarray:
        """The (m, od, oh, ow, C) values at tap `offset` of every window (a strided view)."""
        return padded[(slice(None), *(slice(i, i + (o - 1) * s + 1, s)
                                      for i, o, s in zip(offset, self.out, self.strides)))]

    def offsets(self):
        """Every tap of the window, in row-major window order."""
        return itertools.product(*(range(k) for k in self.window))

    def columns(self, x: np.ndarray) -> np.ndarray:
        """im2col: (m * od * oh * ow, kd * kh * kw * C) in a conv kernel's (kd, kh, kw, C) order."""
        padded = self.pad(x, 0.0)
        taps = np.stack([self.at(padded, offset) for offset in self.offsets()], axis=4)
        return taps.reshape(-1, math.prod(self.window) * x.shape[-1])

    def scatter(self, m: int, channels: int, pieces) -> np.ndarray:
        """Sum per-tap gradients (offset, (m, od, oh, ow, C)) back onto the input."""
        padded = np.zeros((m, *self.padded, channels), np.float32)
        for offset, piece in pieces:
            target = self.at(padded, offset)
            target += piece
        return padded[self._inside()]


@register
class Conv3D(Kernel):
    type_name = "conv3d"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]):
        super().__init__(name, attrs, input_shapes)
        if len(self.input_shapes) != 1:
            raise KernelError(f"kernel {name!r}: conv3d takes 1 input, got {len(self.input_shapes)}")
        self.filters = int(self.attrs.get("filters", 0))
        if self.filters <= 0:
            raise KernelError(f"kernel {name!r}: conv3d needs filters > 0, got {self.filters}")
        self.ksize = triple(name, self.attrs, "kernel_size")
        self.frames, volume = frames_of(self.input_shapes[0], 4)
        self.volume = Volume(name, volume, self.ksize, triple(name, self.attrs, "strides"),
                             self.attrs.get("padding"))
        self.channels = volume[3]
        self.patch = math.prod(self.ksize) * self.channels
        self.held = held_filter(self, (*self.ksize, self.channels, self.filters))

    @property
    def output_shape(self):
        return (*self.frames, *self.volume.out, self.filters)

    def param_shapes(self):
        return {} if self.held is not None else {"kernel": (*self.ksize, self.channels, self.filters)}

    def flops_per_sample(self) -> float:
        return float(math.prod(self.frames) * math.prod(self.volume.out) * 2 * self.patch * self.filters)

    def max_cores(self) -> int:
        return max_cores_for(self.flops_per_sample())

    def activation_bytes_per_sample(self) -> int:
        return 4 * math.prod(self.input_shapes[0])

    def forward(self, params, inputs, ctx: RunContext):
        volumes = as_images(inputs[0], 4)
        cols = self.volume.columns(volumes)
        y = cols @ filter_of(params, self.held).reshape(self.patch, self.filters)
        return as_samples(y.reshape(len(volumes), *self.volume.out, self.filters), self.frames), cols

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        cols, m = cache, len(as_images(grad_output, 4))
        w2d = filter_of(params, self.held).reshape(self.patch, self.filters)
        dy = grad_output.reshape(-1, self.filters)
        grads: dict[str, np.ndarray] = {}
        if self.held is None:
            accumulate(param_grads, "kernel", (cols.T @ dy).reshape(self.param_shapes()["kernel"]),
                       grads, ctx)
        dx = None
        if ctx.wants_grad(0):
            dcols = (dy @ w2d.T).reshape(m, *self.volume.out, -1, self.channels)
            dx = as_samples(self.volume.scatter(m, self.channels, (
                (offset, dcols[:, :, :, :, k]) for k, offset in enumerate(self.volume.offsets()))),
                self.frames)
        return [dx], grads


class Pool3D(Kernel):
    """Pooling over depth, height and width: pool_size, strides, padding."""

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]):
        super().__init__(name, attrs, input_shapes)
        if len(self.input_shapes) != 1:
            raise KernelError(f"kernel {name!r}: {self.type_name} takes 1 input, got {len(self.input_shapes)}")
        self.pool = triple(name, self.attrs, "pool_size")
        self.frames, volume = frames_of(self.input_shapes[0], 4)
        self.volume = Volume(name, volume, self.pool, triple(name, self.attrs, "strides"),
                             self.attrs.get("padding", "VALID"))
        self.channels = volume[3]

    @property
    def output_shape(self):
        return (*self.frames, *self.volume.out, self.channels)

    def flops_per_sample(self) -> float:
        return float(math.prod(self.output_shape) * math.prod(self.pool))

    def max_cores(self) -> int:
        return max_cores_for(self.flops_per_sample())

    def activation_bytes_per_sample(self) -> int:
        return 4 * math.prod(self.input_shapes[0])


# TF's CPU MaxPool3DGrad routes a window's gradient by one of two rules, as the host's TF
# runs it: "near" (Eigen's kernel, pooling_ops_3d.cc: every value within this absolute
# distance of the window's maximum takes it whole) or "first" (oneDNN's, on by default on
# CPUs with AVX-512: only the first maximum in window order, by the forward's workspace).
MAX_POOL3D_TIE = np.float32(1e-5)
MAX_POOL3D_TIES = ("first", "near")


@register
class MaxPool3D(Pool3D):
    type_name = "max_pool3d"

    def __init__(self, name, attrs, input_shapes):
        super().__init__(name, attrs, input_shapes)
        self.ties = self.attrs.get("ties")
        if self.ties not in MAX_POOL3D_TIES:
            raise KernelError(f"kernel {name!r}: ties must be one of {MAX_POOL3D_TIES}, got {self.ties!r}")

    def forward(self, params, inputs, ctx: RunContext):
        padded = self.volume.pad(as_images(inputs[0], 4), -np.inf)
        pieces = (self.volume.at(padded, offset) for offset in self.volume.offsets())
        y = next(pieces).copy()
        for piece in pieces:
            np.maximum(y, piece, out=y)
        return as_samples(y, self.frames), (padded, y)

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        """Each window's gradient to its first maximum ("first") or to every value within
        `MAX_POOL3D_TIE` of it ("near"), as the host's TF routes it."""
        padded, y = cache
        grad_output = as_images(grad_output, 4)
        taken = np.zeros(y.shape, bool)

        def pieces():
            for offset in self.volume.offsets():
                values = self.volume.at(padded, offset)
                if self.ties == "near":
                    hit = np.abs(values - y) < MAX_POOL3D_TIE
                else:
                    hit = (values == y) & ~taken
                    taken[...] |= hit
                yield offset, np.where(hit, grad_output, np.float32(0))

        return [as_samples(self.volume.scatter(len(y), self.channels, pieces()), self.frames)], {}


@register
class AvgPool3D(Pool3D):
    type_name = "avg_pool3d"

    def __init__(self, name, attrs, input_shapes):
        super().__init__(name, attrs, input_shapes)
        # Padded positions do not count (TF divides by the window's valid elements).
        ones = self.volume.pad(np.ones((1, *self.volume.shape[:3], 1), np.float32), 0.0)
        counts = sum(self.volume.at(ones, offset) for offset in self.volume.offsets())
        self.scale = (np.float32(1) / counts).astype(np.float32)

    def forward(self, params, inputs, ctx: RunContext):
        volumes = as_images(inputs[0], 4)
        padded = self.volume.pad(volumes, 0.0)
        total = np.zeros((len(volumes), *self.volume.out, self.channels), np.float32)
        for offset in self.volume.offsets():
            total += self.volume.at(padded, offset)
        return as_samples(total * self.scale, self.frames), len(volumes)

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        share = as_images(grad_output, 4) * self.scale
        return [as_samples(self.volume.scatter(cache, self.channels, (
            (offset, share) for offset in self.volume.offsets())), self.frames)], {}
