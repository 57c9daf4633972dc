"""Kernels that repeat or interpolate a sample's values: tile (TF's Tile within a sample:
Keras UpSampling1D/2D/3D's nearest repeat is ExpandDims, Tile, Reshape) and resize (TF's
ResizeBilinear and ResizeNearestNeighbor: tf.image.resize, UpSampling2D bilinear)."""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from wafer.kernels.base import INTEGER, Kernel, KernelError, RunContext, check_dtypes, max_cores_for, register
from wafer.kernels.conv import pair
from wafer.precision import is_half, round_half


@register
class Tile(Kernel):
    """attr multiples (per sample): the sample repeated multiples[a] times along axis a
    (float32, integers or bool: a recurrent layer's mask); the gradient of each value is the
    sum over its copies."""

    type_name = "tile"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]):
        super().__init__(name, attrs, input_shapes)
        self.multiples = tuple(int(k) for k in self.attrs.get("multiples", ()))
        if len(self.input_shapes) != 1 or len(self.multiples) != len(self.input_shapes[0]) or \
                min(self.multiples, default=1) < 1:
            raise KernelError(f"kernel {name!r}: tile takes 1 input and a multiple >= 1 per axis, "
                              f"got inputs {self.input_shapes} and multiples {self.multiples}")

    @property
    def output_shape(self):
        return tuple(d * k for d, k in zip(self.input_shapes[0], self.multiples))

    def flops_per_sample(self) -> float:
        return float(math.prod(self.output_shape))

    def max_cores(self) -> int:
        return max_cores_for(self.flops_per_sample())

    def activation_bytes_per_sample(self) -> int:
        return 0

    def output_dtype(self, input_dtypes):
        check_dtypes(self, input_dtypes, [(np.float32, *INTEGER, np.bool_)])  # a mask too
        return np.dtype(input_dtypes[0])

    def forward(self, params, inputs, ctx: RunContext):
        return np.tile(inputs[0], (1, *self.multiples)), len(inputs[0])

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        split = [cache]
        for d, k in zip(self.input_shapes[0], self.multiples):
            split += [k, d]
        copies = tuple(range(1, 2 * len(self.multiples) + 1, 2))
        return [grad_output.reshape(split).sum(axis=copies, dtype=np.float32)], {}


def _scale(size: int, out: int, align_corners: bool) -> np.float32:
    """TF's CalculateResizeScale."""
    if align_corners and out > 1:
        return np.float32((size - 1) / (out - 1))
    return np.float32(size / out)


def bilinear_taps(size: int, out: int, align_corners: bool, half_pixel: bool):
    """(lower, upper, lerp) per output index, as TF's compute_interpolation_weights."""
    scale = _scale(size, out, align_corners)
    i = np.arange(out, dtype=np.float32)
    source = (i + np.float32(0.5)) * scale - np.float32(0.5) if half_pixel else i * scale
    floor = np.floor(source)
    lower = np.maximum(floor.astype(np.int64), 0)
    upper = np.minimum(np.ceil(source).astype(np.int64), size - 1)
    return lower, upper, (source - floor).astype(np.float32)


def nearest_taps(size: int, out: int, align_corners: bool, half_pixel: bool) -> np.ndarray:
    """The source index per output index, as TF's ResizeNearestNeighbor picks it."""
    scale = _scale(size, out, align_corners)
    i = np.arange(out, dtype=np.float32)
    source = (i + np.float32(0.5)) * scale if half_pixel else i * scale
    index = np.floor(source)
    if align_corners:  # TF's roundf: halves away from zero (numpy's round: to even)
        index += source - index >= np.float32(0.5)
    return np.clip(index.astype(np.int64), 0, size - 1)


def _weights(size: int, lower: np.ndarray, upper: np.ndarray, lerp: np.ndarray) -> np.ndarray:
    """The (out, size) matrix of one axis' interpolation: the gradient's linear map."""
    matrix = np.zeros((len(lower), size), np.float32)
    rows = np.arange(len(lower))
    np.add.at(matrix, (rows, lower), np.float32(1) - lerp)
    np.add.at(matrix, (rows, upper), lerp)
    return matrix


@register
class Resize(Kernel):
    """attrs size [OH, OW], method bilinear or nearest, align_corners, half_pixel_centers on
    (H, W, C) samples: forward as TF's kernels compute it (bilinear: top, bottom, then
    across, each a lerp), backward the transposed interpolation (ResizeBilinearGrad,
    ResizeNearestNeighborGrad: each output's gradient added to the inputs it read). In
    float16 (nearest; TF's ResizeBilinear outputs float32 whatever its input) the gradient's
    sums are rounded as TF's float16 kernel rounds them."""

    type_name = "resize"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]):
        super().__init__(name, attrs, input_shapes)
        if len(self.input_shapes) != 1 or len(self.input_shapes[0]) != 3:
            raise KernelError(f"kernel {name!r}: resize takes 1 input (H, W, C), got {self.input_shapes}")
        self.size = pair(name, self.attrs, "size")
        self.method = self.attrs.get("method")
        if self.method not in ("bilinear", "nearest"):
            raise KernelError(f"kernel {name!r}: resize method must be bilinear or nearest, got "
                              f"{self.method!r}")
        align, half = bool(self.attrs.get("align_corners")), bool(self.attrs.get("half_pixel_centers"))
        h, w, _ = self.input_shapes[0]
        if self.method == "bilinear":
            self.rows, self.cols = (bilinear_taps(n, o, align, half) for n, o in zip((h, w), self.size))
            self.matrices = (_weights(h, *self.rows), _weights(w, *self.cols))
        else:
            rows, cols = (nearest_taps(n, o, align, half) for n, o in zip((h, w), self.size))
            self.matrices = (_weights(h, rows, rows, np.zeros(len(rows), np.float32)),
                             _weights(w, cols, cols, np.zeros(len(cols), np.float32)))
            self.nearest = (rows, cols)

    @property
    def output_shape(self):
        return (*self.size, self.input_shapes[0][2])

    def flops_per_sample(self) -> float:
        return float(math.prod(self.output_shape) * (6 if self.method == "bilinear" else 1))

    def max_cores(self) -> int:
        return max_cores_for(self.flops_per_sample())

    def activation_bytes_per_sample(self) -> int:
        return 0

    def forward(self, params, inputs, ctx: RunContext):
        x = inputs[0]
        if self.method == "nearest":
            rows, cols = self.nearest
            return x[:, rows][:, :, cols], None
        (top, bottom, ylerp), (left, right, xlerp) = self.rows, self.cols
        xlerp = xlerp[:, None]
        upper, lower = x[:, top], x[:, bottom]
        top_row = upper[:, :, left] + (upper[:, :, right] - upper[:, :, left]) * xlerp
        bottom_row = lower[:, :, left] + (lower[:, :, right] - lower[:, :, left]) * xlerp
        return top_row + (bottom_row - top_row) * ylerp[:, None, None], None

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        if self.method == "nearest" and is_half(self.attrs):
            return [self._half_nearest_gradient(grad_output)], {}
        along_h, along_w = self.matrices
        dx = np.einsum("ph,nhwc->npwc", along_h.T, grad_output)
        return [np.einsum("qw,npwc->npqc", along_w.T, dx)], {}

    def _half_nearest_gradient(self, dy: np.ndarray) -> np.ndarray:
        """TF's float16 ResizeNearestNeighborGrad: the output positions' gradients added into
        their sources in row-major order, each sum rounded to float16. The k-th copy of an
        input row (column) is output row `k` places into its run, so the (row copy, column
        copy) pairs in lexicographic order are that order for every input at once."""
        rows, cols = self.nearest
        h, w, c = self.input_shapes[0]
        dx = np.zeros((len(dy), h, w, c), np.float32)
        row_copy, col_copy = (np.arange(len(t)) - np.searchsorted(t, t) for t in (rows, cols))
        for i in range(int(row_copy.max()) + 1):
            ys = np.flatnonzero(row_copy == i)
            for j in range(int(col_copy.max()) + 1):
                xs = np.flatnonzero(col_copy == j)
                block = np.ix_(np.arange(len(dy)), rows[ys], cols[xs])
                dx[block] = round_half(dx[block] + dy[np.ix_(np.arange(len(dy)), ys, xs)])
        return dx
