"""Spatial kernels on NHWC samples: conv2d (im2col + one matmul; grouped: a block-diagonal
filter matrix) and max/avg pooling, with TensorFlow's SAME/VALID padding arithmetic."""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from wafer.kernels import activations
from wafer.kernels.affine import Affine
from wafer.kernels.base import Kernel, KernelError, RunContext, accumulate, max_cores_for, register, run_in_order
from wafer.precision import is_half, round_half


def pair(name: str, attrs: Mapping[str, Any], key: str) -> tuple[int, int]:
    value = attrs.get(key)
    if isinstance(value, int):
        value = [value, value]
    if not isinstance(value, (list, tuple)) or len(value) != 2 or min(value) <= 0:
        raise KernelError(f"kernel {name!r}: {key} must be two positive integers, got {value!r}")
    return int(value[0]), int(value[1])


def output_size(size: int, window: int, stride: int, padding: str) -> tuple[int, int]:
    """(output size, padding before) of one spatial axis, as TensorFlow computes them."""
    if padding == "VALID":
        return (size - window) // stride + 1, 0
    out = -(-size // stride)
    total = max((out - 1) * stride + window - size, 0)
    return out, total // 2


def explicit_pads(name: str, padding: Any) -> tuple[int, int, int, int] | None:
    """[top, bottom, left, right] of explicit padding (None for SAME or VALID)."""
    if padding in ("SAME", "VALID"):
        return None
    if not isinstance(padding, (list, tuple)) or len(padding) != 4 or \
            not all(isinstance(p, int) and p >= 0 for p in padding):
        raise KernelError(f"kernel {name!r}: padding must be SAME, VALID or four non-negative "
                          f"integers [top, bottom, left, right], got {padding!r}")
    return tuple(padding)


def frames_of(shape: tuple[int, ...], rank: int = 3) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """((k,), (H, W, C)) of a per-sample (k, H, W, C) input: k images a sample (a clip's
    frames folded into the batch by the user, tf.reshape(x, [-1, H, W, C]): the compiler's
    folded_batch.py), each computed on its own; ((), shape) of one (H, W, C) image. `rank`
    4: (D, H, W, C) volumes."""
    return (tuple(shape[:1]), tuple(shape[1:])) if len(shape) == rank + 1 else ((), tuple(shape))


def as_images(x: np.ndarray, rank: int = 3) -> np.ndarray:
    """(m * k, H, W, C) of a batch's (m, [k,] H, W, C): a sample's frames in TF's row order."""
    return x.reshape(-1, *x.shape[x.ndim - rank:])


def as_samples(images: np.ndarray, frames: tuple[int, ...]) -> np.ndarray:
    """(m, *frames, H, W, C) of (m * k, H, W, C) `images`: `as_images`' inverse."""
    return images.reshape(-1, *frames, *images.shape[1:])


def held_filter(kernel: Kernel, shape: tuple[int, ...]) -> np.ndarray | None:
    """A convolution's constant filter (attr `filter`: tf.constant, a Gaussian window), held
    in place of its `kernel` weight: frozen, no gradient into it (None: a weight)."""
    value = kernel.attrs.get("filter")
    if value is None:
        return None
    value = np.ascontiguousarray(value, np.float32)
    if value.shape != shape:
        raise KernelError(f"kernel {kernel.name!r}: filter {value.shape} must be {shape}")
    return value


def filter_of(params: Mapping[str, np.ndarray], held: np.ndarray | None) -> np.ndarray:
    """The filter a convolution computes with: its constant one, else its weight."""
    return params["kernel"] if held is None else held


class Windows:
    """The sliding windows of one kernel's input: padding, output size, im2col and col2im.

    `dilations` spread a window's taps apart (TF's dilations: tap i reads row i * d);
    `padding` is SAME, VALID or explicit [top, bottom, left, right] zeros."""

    def __init__(self, name: str, shape: tuple[int, ...], window: tuple[int, int],
                 strides: tuple[int, int], padding: Any, dilations: tuple[int, int] = (1, 1)):
        if len(shape) != 3:
            raise KernelError(f"kernel {name!r}: input must be (H, W, C) per sample, got {shape}")
        pads = explicit_pads(name, padding)
        (h, w, _), (kh, kw), (sh, sw), (dh, dw) = shape, window, strides, dilations
        ekh, ekw = (kh - 1) * dh + 1, (kw - 1) * dw + 1  # the dilated window's extent
        if pads is None:
            self.oh, self.top = output_size(h, ekh, sh, padding)
            self.ow, self.left = output_size(w, ekw, sw, padding)
        else:
            self.top, self.left = pads[0], pads[2]
            self.oh = (h + pads[0] + pads[1] - ekh) // sh + 1
            self.ow = (w + pads[2] + pads[3] - ekw) // sw + 1
        if self.oh <= 0 or self.ow <= 0:
            raise KernelError(f"kernel {name!r}: window {window} does not fit input {shape} "
                              f"with {padding} padding")
        self.shape, self.window, self.strides, self.dilations = shape, window, strides, dilations
        # Padded extent: every window of every output position lies inside it.
        self.ph = max((self.oh - 1) * sh + ekh, h + self.top)
        self.pw = max((self.ow - 1) * sw + ekw, w + self.left)

    def pad(self, x: np.ndarray, fill: float) -> np.ndarray:
        h, w, _ = self.shape
        if (self.ph, self.pw) == (h, w):
            return x
        padded = np.full((x.shape[0], self.ph, self.pw, x.shape[3]), fill, np.float32)
        padded[:, self.top:self.top + h, self.left:self.left + w] = x
        return padded

    def view(self, padded: np.ndarray) -> np.ndarray:
        """(m, oh, ow, C, kh, kw) windows of a padded batch (a view, no copy)."""
        (kh, kw), (sh, sw), (dh, dw) = self.window, self.strides, self.dilations
        v = sliding_window_view(padded, ((kh - 1) * dh + 1, (kw - 1) * dw + 1), axis=(1, 2))
        return v[:, :(self.oh - 1) * sh + 1:sh, :(self.ow - 1) * sw + 1:sw, :, ::dh, ::dw]

    def at(self, padded: np.ndarray, i: int, j: int) -> np.ndarray:
        """The (m, oh, ow, C) values at tap (i, j) of every window (a strided view)."""
        (sh, sw), (dh, dw) = self.strides, self.dilations
        return padded[:, i * dh:i * dh + (self.oh - 1) * sh + 1:sh,
                      j * dw:j * dw + (self.ow - 1) * sw + 1:sw]

    def offsets(self, padded: np.ndarray):
        """(i, j, `at(padded, i, j)`) per window offset, in row-major window order."""
        kh, kw = self.window
        for i in range(kh):
            for j in range(kw):
                yield i, j, self.at(padded, i, j)

    def columns(self, x: np.ndarray) -> np.ndarray:
        """im2col: (m * oh * ow, kh * kw * C) in a conv kernel's (kh, kw, C) order."""
        kh, kw = self.window
        v = self.view(self.pad(x, 0.0))  # (m, oh, ow, C, kh, kw)
        return np.ascontiguousarray(v.transpose(0, 1, 2, 4, 5, 3)).reshape(-1, kh * kw * self.shape[2])

    def scatter(self, m: int, channels: int, pieces,
                each_sum: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
        """Sum per-window-offset gradients (i, j, (m, oh, ow, C)) back onto the input, in
        their order (`each_sum`: applied to every partial sum, round_half: float16's)."""
        h, w, _ = self.shape
        padded = np.zeros((m, self.ph, self.pw, channels), np.float32)
        for i, j, piece in pieces:
            target = self.at(padded, i, j)
            if each_sum is None:
                target += piece
            else:
                target[...] = each_sum(target + piece)
        return padded[:, self.top:self.top + h, self.left:self.left + w]

    def uncolumns(self, m: int, cols: np.ndarray) -> np.ndarray:
        """col2im: (m * oh * ow, kh * kw * C) columns summed back onto the (m, H, W, C) input."""
        (kh, kw), channels = self.window, self.shape[2]
        cols = cols.reshape(m, self.oh, self.ow, kh, kw, channels)
        return self.scatter(m, channels, ((i, j, cols[:, :, :, i, j])
                                          for i in range(kh) for j in range(kw)))


@register
class Conv2D(Kernel):
    """attr groups (default 1): TF's grouped convolution (Keras Conv2D(groups=)): the
    channels in `groups` equal parts, each convolved with its own filters' share; the
    kernel is (kh, kw, channels / groups, filters), as TF's. A per-sample input (k, H, W, C)
    is k images each convolved on its own (`frames_of`); its output (k, oh, ow, filters).
    A second input is each sample's own filter (`filter_shape`; the weight program's filter,
    a weight or a value of weights, on its batch of one): its gradient is that input's, and
    the kernel holds no weight, bias or activation."""

    type_name = "conv2d"
    rounds_own_output = True

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]):
        super().__init__(name, attrs, input_shapes)
        if len(self.input_shapes) not in (1, 2):
            raise KernelError(f"kernel {name!r}: conv2d takes 1 input (and a filter), got "
                              f"{len(self.input_shapes)}")
        self.filters = int(self.attrs.get("filters", 0))
        if self.filters <= 0:
            raise KernelError(f"kernel {name!r}: conv2d needs filters > 0, got {self.filters}")
        self.ksize = pair(name, self.attrs, "kernel_size")
        shape = self.input_shapes[0]
        self.frames, image = frames_of(shape)
        self.windows = Windows(name, image, self.ksize,
                               pair(name, self.attrs, "strides"), self.attrs.get("padding"),
                               pair(name, {"dilations": [1, 1], **self.attrs}, "dilations"))
        self.channels = shape[-1]
        self.groups = int(self.attrs.get("groups", 1))
        if self.groups <= 0 or self.channels % self.groups or self.filters % self.groups:
            raise KernelError(f"kernel {name!r}: conv2d groups {self.groups} must divide its "
                              f"{self.channels} channels and {self.filters} filters")
        self.use_bias = bool(self.attrs.get("use_bias", True))
        self.activation = activations.check_function(name, self.attrs.get("activation", "linear"))
        self.patch = self.ksize[0] * self.ksize[1] * self.channels
        self.affine = Affine(self.activation, is_half(self.attrs))
        self.held = held_filter(self, self.filter_shape)
        self.filter_input = len(self.input_shapes) == 2
        if self.filter_input and (self.input_shapes[1] != self.filter_shape or self.use_bias
                                  or self.activation != "linear" or self.held is not None):
            raise KernelError(f"kernel {name!r}: conv2d's filter input must be "
                              f"{self.filter_shape}, with no bias, activation or held filter, "
                              f"got {self.input_shapes[1]}")

    @property
    def filter_shape(self) -> tuple[int, ...]:
        return (*self.ksize, self.channels // self.groups, self.filters)

    @property
    def output_shape(self):
        return (*self.frames, self.windows.oh, self.windows.ow, self.filters)

    def param_shapes(self):
        shapes: dict[str, tuple[int, ...]] = {} if self.held is not None or \
            self.filter_input else {"kernel": self.filter_shape}
        if self.use_bias:
            shapes["bias"] = (self.filters,)
        return shapes

    def flops_per_sample(self) -> float:
        positions = math.prod(self.frames) * self.windows.oh * self.windows.ow
        per = 2 * self.patch * self.filters // self.groups + (self.filters if self.use_bias else 0)
        per += activations.FUNCTIONS[self.activation][2] * self.filters
        return float(positions * per)

    def max_cores(self) -> int:
        return max_cores_for(self.flops_per_sample())

    def activation_bytes_per_sample(self) -> int:
        kept = math.prod(self.input_shapes[0])
        if self.activation != "linear":
            kept += math.prod(self.output_shape)
        return 4 * kept

    def _matrix(self, kernel: np.ndarray) -> np.ndarray:
        """The (patch, filters) matrix of im2col rows: with groups, block-diagonal (a
        group's filters read its own channels; the zeros add nothing)."""
        if self.groups == 1:
            return kernel.reshape(self.patch, self.filters)
        taps, part, share = self.ksize[0] * self.ksize[1], self.channels // self.groups, \
            self.filters // self.groups
        w = np.zeros((taps, self.channels, self.filters), kernel.dtype)
        blocks = kernel.reshape(taps, part, self.filters)
        for g in range(self.groups):
            w[:, g * part:(g + 1) * part, g * share:(g + 1) * share] = \
                blocks[:, :, g * share:(g + 1) * share]
        return w.reshape(self.patch, self.filters)

    def _kernel_of(self, matrix: np.ndarray) -> np.ndarray:
        """The grouped kernel's entries of a (patch, filters) matrix (`_matrix`'s inverse)."""
        taps, part, share = self.ksize[0] * self.ksize[1], self.channels // self.groups, \
            self.filters // self.groups
        full = matrix.reshape(taps, self.channels, self.filters)
        kernel = np.empty((taps, part, self.filters), matrix.dtype)
        for g in range(self.groups):
            kernel[:, :, g * share:(g + 1) * share] = \
                full[:, g * part:(g + 1) * part, g * share:(g + 1) * share]
        return kernel.reshape(self.filter_shape)

    def forward(self, params, inputs, ctx: RunContext):
        x = inputs[0]
        if self.filter_input:  # each sample by its own filter
            pieces = [self._convolve(x[s:s + 1], w, params, ctx) for s, w in enumerate(inputs[1])]
            return np.concatenate([y for y, _ in pieces]), \
                [(w, cache) for w, (_, cache) in zip(inputs[1], pieces)]
        return self._convolve(x, filter_of(params, self.held), params, ctx)

    def _convolve(self, x: np.ndarray, kernel: np.ndarray, params, ctx: RunContext):
        """(output, cache) of the samples `x` convolved by the filter `kernel`."""
        images = as_images(x)
        cols = self.windows.columns(images)
        tail = activations.scalar_tail(ctx, (x.shape[0], *self.output_shape))
        y, cache = self.affine.forward(cols, self._matrix(kernel), params.get("bias"), ctx, tail)
        return y.reshape(x.shape[0], *self.output_shape), (len(images), cache)

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        if not self.filter_input:
            return self._gradients(filter_of(params, self.held), cache, grad_output, ctx,
                                   param_grads, self.held is None)
        pieces = [self._gradients(w, sample, grad_output[s:s + 1], ctx, None, ctx.wants_grad(1))
                  for s, (w, sample) in enumerate(cache)]
        dx = None if pieces[0][0][0] is None else np.concatenate([p[0][0] for p in pieces])
        dw = np.stack([p[1]["kernel"] for p in pieces]) if ctx.wants_grad(1) else None
        return [dx, dw], {}

    def _gradients(self, kernel: np.ndarray, cache, grad_output: np.ndarray, ctx: RunContext,
                   param_grads, trained: bool):
        """backward's result for the samples of `cache` convolved by the filter `kernel`
        (`trained`: with its gradient, "kernel")."""
        m, affine_cache = cache
        if self.groups > 1:  # the full matrix's gradient, then its blocks into the accumulators
            dcols, full = self.affine.backward(
                affine_cache, grad_output.reshape(-1, self.filters),
                self._matrix(kernel), self.use_bias, None,
                dataclasses.replace(ctx, run_tiles=run_in_order), ctx.wants_grad(0), trained)
            grads: dict[str, np.ndarray] = {}
            if trained:
                accumulate(param_grads, "kernel", self._kernel_of(full["kernel"]), grads, ctx)
            if self.use_bias:
                accumulate(param_grads, "bias", full["bias"], grads, ctx)
            return [None if dcols is None else self._input_grad(m, dcols)], grads
        w = kernel.reshape(self.patch, self.filters)
        acc = None if param_grads is None else dict(param_grads)
        if acc is not None and trained:
            acc["kernel"] = param_grads["kernel"].reshape(self.patch, self.filters)
        dcols, grads = self.affine.backward(affine_cache, grad_output.reshape(-1, self.filters),
                                             w, self.use_bias, acc, ctx, ctx.wants_grad(0), trained)
        if trained:
            grads["kernel"] = grads["kernel"].reshape(self.filter_shape)
        return [None if dcols is None else self._input_grad(m, dcols)], grads

    def _input_grad(self, images: int, dcols: np.ndarray) -> np.ndarray:
        """The columns' gradient summed back onto the `images` inputs, a sample's frames
        together again."""
        dx = self.windows.uncolumns(images, dcols)
        return as_samples(dx, self.frames)


class Pool(Kernel):
    """Pooling over height and width: pool_size, strides, padding. A per-sample input (k, H,
    W, C) is k images each pooled on its own (`frames_of`); its output (k, oh, ow, C)."""

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]):
        super().__init__(name, attrs, input_shapes)
        if len(self.input_shapes) != 1:
            raise KernelError(f"kernel {name!r}: {self.type_name} takes 1 input, got {len(self.input_shapes)}")
        self.pool = pair(name, self.attrs, "pool_size")
        self.frames, image = frames_of(self.input_shapes[0])
        self.windows = Windows(name, image, self.pool,
                               pair(name, self.attrs, "strides"), self.attrs.get("padding", "VALID"))
        self.channels = image[2]

    @property
    def output_shape(self):
        return (*self.frames, self.windows.oh, self.windows.ow, self.channels)

    def flops_per_sample(self) -> float:
        return float(math.prod(self.output_shape) * self.pool[0] * self.pool[1])

    def max_cores(self) -> int:
        return max_cores_for(self.flops_per_sample())

    def activation_bytes_per_sample(self) -> int:
        return 4 * math.prod(self.input_shapes[0])


@register
class MaxPool(Pool):
    type_name = "max_pool"

    def forward(self, params, inputs, ctx: RunContext):
        """Each window's maximum (a NaN in it is the maximum), one pass per window offset."""
        padded = self.windows.pad(as_images(inputs[0]), -np.inf)
        pieces = (piece for _, _, piece in self.windows.offsets(padded))
        y = next(pieces).copy()
        for piece in pieces:
            np.maximum(y, piece, out=y)
        return as_samples(y, self.frames), (padded, y)

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        """The gradient goes to each window's first maximum in row-major window order, as
        TF's MaxPoolGrad routes it."""
        padded, y = cache
        grad_output = as_images(grad_output)
        nan = np.isnan(y)
        nan = nan if nan.any() else None

        def pieces():
            taken = None
            for i, j, piece in self.windows.offsets(padded):
                hit = piece == y
                if nan is not None:
                    hit |= nan & np.isnan(piece)
                if taken is None:
                    taken = hit
                else:
                    hit &= ~taken
                    taken |= hit
                yield i, j, np.where(hit, grad_output, np.float32(0))

        return [as_samples(self.windows.scatter(len(y), self.channels, pieces()), self.frames)], {}


@register
class AvgPool(Pool):
    """In float16 (attr precision) as TF's CPU kernels compute Eigen::half: each window's
    sum rounded to float16 after every addend in row-major window order, divided by its
    count; the gradient's shares g * (1 / count) (in float16) summed onto each input in the
    windows' row-major order, rounded after every one."""

    type_name = "avg_pool"

    def __init__(self, name, attrs, input_shapes):
        super().__init__(name, attrs, input_shapes)
        # Padded positions do not count (TF divides by the window's valid elements).
        ones = np.ones((1, *self.windows.shape[:2], 1), np.float32)
        self.counts = self.windows.view(self.windows.pad(ones, 0.0)).sum(axis=(-1, -2))
        self.scale = (np.float32(1) / self.counts).astype(np.float32)  # (1, oh, ow, 1)
        self.half = is_half(self.attrs)
        # float16's 1 / count, from the double (TF's T(1.0 / count)), for the gradient
        self.half_scale = (1.0 / self.counts.astype(np.float64)).astype(np.float16).astype(np.float32)

    def forward(self, params, inputs, ctx: RunContext):
        images = as_images(inputs[0])
        padded = self.windows.pad(images, 0.0)
        if self.half:
            y = np.zeros((len(images), self.windows.oh, self.windows.ow, self.channels), np.float32)
            for _, _, piece in self.windows.offsets(padded):
                y = round_half(y + piece)
            y = round_half(y / self.counts)
        else:
            y = self.windows.view(padded).sum(axis=(-1, -2), dtype=np.float32) * self.scale
        return as_samples(y, self.frames), len(images)

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        m, (ph, pw) = cache, self.pool
        taps = [(i, j) for i in range(ph) for j in range(pw)]
        if self.half:  # each input's windows in row-major order (the taps' reverse), rounded
            share, taps, each_sum = round_half(as_images(grad_output) * self.half_scale), taps[::-1], round_half
        else:
            share, each_sum = as_images(grad_output) * self.scale, None
        return [as_samples(self.windows.scatter(m, self.channels, ((i, j, share) for i, j in taps),
                                                each_sum), self.frames)], {}


@register
class AvgPoolGrad(Kernel):
    """TF's AvgPoolGrad of a per-sample gradient as a value (a gradient penalty's
    tf.gradients(d, x) through AveragePooling2D): the avg_pool kernel's input gradient, attr
    input_shape the pooled input's per-sample shape; its own gradient TF's _AvgPoolGradGrad,
    the average pooling of it. float32 only."""

    type_name = "avg_pool_grad"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]):
        super().__init__(name, attrs, input_shapes)
        self.pool = AvgPool(name, attrs, [tuple(self.attrs["input_shape"])])
        if self.pool.half:
            raise KernelError(f"kernel {name!r} (avg_pool_grad): float32 only")
        if len(self.input_shapes) != 1 or tuple(self.input_shapes[0]) != self.pool.output_shape:
            raise KernelError(f"kernel {name!r} (avg_pool_grad): its input must be the pooling's "
                              f"output {self.pool.output_shape}, got {self.input_shapes}")

    @property
    def output_shape(self):
        return tuple(self.attrs["input_shape"])

    def flops_per_sample(self) -> float:
        return self.pool.flops_per_sample()

    def max_cores(self) -> int:
        return self.pool.max_cores()

    def activation_bytes_per_sample(self) -> int:
        return 4 * math.prod(self.output_shape)

    def forward(self, params, inputs, ctx: RunContext):
        images = len(as_images(inputs[0]))
        (dx,), _ = self.pool.backward(params, images, inputs[0], ctx)
        return dx, None

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        pooled, _ = self.pool.forward(params, [grad_output], ctx)
        return [pooled], {}
