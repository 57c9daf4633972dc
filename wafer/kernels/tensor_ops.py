"""Weightless kernels that reduce, normalise or rearrange one sample's values: reduce,
cumsum, softmax (and log_softmax), transpose, slice (tf.strided_slice), take (tf.gather at
constant indices) and pad. Attrs name per-sample axes (axis 0 is the sample's first axis, the
micro-batch is never touched). Each backward is TensorFlow's registered gradient function
(math_grad.py, nn_grad.py, array_grad.py) on the same float32 values, so results match
TF's to rounding.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from wafer.kernels.base import (
    INTEGER,
    INTEGER_NAMES,
    Kernel,
    KernelError,
    RunContext,
    Shape,
    check_dtypes,
    is_int,
    register,
)
from wafer.kernels.embedding import scatter_add
from wafer.kernels.structure import Elementwise
from wafer.precision import is_half, round_half

_ONE = np.float32(1)


def int_list(kernel: Kernel, key: str, length: int | None = None) -> list[int]:
    """A list-of-ints attr (KernelError naming the kernel and attr if it is not one)."""
    value = kernel.attrs.get(key)
    if not isinstance(value, list) or not all(is_int(v) for v in value) or \
            (length is not None and len(value) != length):
        size = "" if length is None else f" of {length}"
        raise KernelError(f"kernel {kernel.name!r} ({kernel.type_name}): attr {key!r} must be "
                          f"a list{size} ints, got {value!r}")
    return value


class SampleKernel(Elementwise):
    """One input; a cost of one operation per output element unless it says otherwise."""

    def one_input(self) -> Shape:
        if len(self.input_shapes) != 1:
            raise KernelError(f"kernel {self.name!r} ({self.type_name}): takes 1 input, got "
                              f"{len(self.input_shapes)}")
        return self.input_shapes[0]


class Rearrangement(SampleKernel):
    """Moves values without arithmetic: any dtype passes through; a float32 value carries
    its gradient back."""

    def output_dtype(self, input_dtypes):
        check_dtypes(self, input_dtypes, [(np.float32, *INTEGER, np.bool_)])
        return np.dtype(input_dtypes[0])


REDUCTIONS = ("sum", "mean", "max", "min", "prod", "any", "all")
LOGICAL_REDUCTIONS = ("any", "all")  # of bool values, no gradient


@register
class Reduce(SampleKernel):
    """tf.reduce_{sum, mean, max, min, prod} over per-sample `axes` (attr keepdims), and
    reduce_{any, all} of bool values (no gradient). Gradients: _SumGrad broadcasts, _MeanGrad
    divides by the reduced count, _MinOrMaxGrad splits the gradient equally among the
    elements equal to the result (ties), _ProdGrad multiplies by the product of the other
    elements (exclusive cumulative products from both ends: exact with zeros)."""

    type_name = "reduce"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]):
        super().__init__(name, attrs, input_shapes)
        shape = self.one_input()
        self.op = self.attrs.get("op")
        if self.op not in REDUCTIONS:
            raise KernelError(f"kernel {name!r} (reduce): unknown op {self.op!r}; the library "
                              f"has {', '.join(REDUCTIONS)}")
        axes = int_list(self, "axes")
        if any(not 0 <= a < len(shape) for a in axes) or len(set(axes)) != len(axes):
            raise KernelError(f"kernel {name!r} (reduce): axes {axes} are not distinct "
                              f"per-sample axes of {shape} (0 to {len(shape) - 1}; the batch "
                              f"axis is never reduced here)")
        keepdims = self.attrs.get("keepdims", False)
        if not isinstance(keepdims, bool):
            raise KernelError(f"kernel {name!r} (reduce): keepdims must be a bool, got "
                              f"{keepdims!r}")
        self.axes = tuple(sorted(axes))
        self.batch_axes = tuple(a + 1 for a in self.axes)
        self.kept = tuple(1 if a in self.axes else d for a, d in enumerate(shape))
        self._shape = self.kept if keepdims else tuple(
            d for a, d in enumerate(shape) if a not in self.axes)
        self.count = np.float32(math.prod(shape[a] for a in self.axes))

    @property
    def output_shape(self):
        return self._shape

    def output_dtype(self, input_dtypes):
        if self.op in LOGICAL_REDUCTIONS:
            check_dtypes(self, input_dtypes, [(np.bool_,)])
            return np.dtype(np.bool_)
        integer = () if self.op == "mean" else INTEGER  # TF's integer mean truncates
        check_dtypes(self, input_dtypes, [(np.float32, *integer)])
        return np.dtype(input_dtypes[0])

    def input_differentiable(self, index: int) -> bool:
        return self.op not in LOGICAL_REDUCTIONS

    def flops_per_sample(self) -> float:
        return float(math.prod(self.input_shapes[0]))

    def activation_bytes_per_sample(self) -> int:
        if self.op in ("sum", "mean"):
            return 0
        kept = math.prod(self.kept) if self.op != "prod" else 0
        return 4 * (math.prod(self.input_shapes[0]) + kept)

    def forward(self, params, inputs, ctx: RunContext):
        x = inputs[0]
        if self.op in ("sum", "mean"):
            y = np.sum(x, axis=self.batch_axes, keepdims=True, dtype=x.dtype)
            if self.op == "mean":
                y /= self.count
            cache = None
        elif self.op == "prod":
            y = np.prod(x, axis=self.batch_axes, keepdims=True, dtype=x.dtype)
            cache = (x, y)
        elif self.op in LOGICAL_REDUCTIONS:
            y = (np.any if self.op == "any" else np.all)(x, axis=self.batch_axes, keepdims=True)
            cache = None
        else:
            y = (np.max if self.op == "max" else np.min)(x, axis=self.batch_axes, keepdims=True)
            cache = (x, y)
        return y.reshape(x.shape[0], *self._shape), cache

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        m = grad_output.shape[0]
        g = grad_output.reshape(m, *self.kept)
        full = (m, *self.input_shapes[0])
        if self.op == "sum":
            return [np.broadcast_to(g, full).copy()], {}
        if self.op == "mean":
            return [np.broadcast_to(g / self.count, full).copy()], {}
        x, y = cache
        if self.op == "prod":
            return [np.multiply(self._others_product(x), g, dtype=np.float32)], {}
        indicators = (y == x).astype(np.float32)
        selected = indicators.sum(axis=self.batch_axes, keepdims=True, dtype=np.float32)
        np.divide(indicators, selected, out=indicators)
        return [np.multiply(indicators, g, out=indicators)], {}

    def _others_product(self, x: np.ndarray) -> np.ndarray:
        """For each element, the product of the others it was reduced with (_ProdGrad: the
        reduced axes flattened into one, left and right exclusive cumulative products)."""
        others = tuple(a for a in range(x.ndim) if a not in self.batch_axes)
        perm = (*self.batch_axes, *others)
        permuted = x.transpose(perm)
        flat = permuted.reshape(int(self.count), -1)
        product = scan(flat, 0, True, False, product=True) * scan(flat, 0, True, True, product=True)
        return product.reshape(permuted.shape).transpose(np.argsort(perm))


def scan(x: np.ndarray, axis: int, exclusive: bool, reverse: bool, product: bool = False,
         half: bool = False) -> np.ndarray:
    """tf.cumsum (tf.math.cumprod: `product`) along `axis` of the array: each element added
    (multiplied) in turn from the first (the last: reverse), as TF's CPU scan: in float32, or
    `half`, as its float16 scan, each partial result rounded to float16; exclusive leaves the
    element itself out (starting from 0, or 1)."""
    if reverse:
        x = np.flip(x, axis)
    if half:
        total = np.moveaxis(x, axis, 0).astype(np.float32)
        for i in range(1, len(total)):
            total[i] = round_half(total[i - 1] * total[i] if product else total[i - 1] + total[i])
        total = np.moveaxis(total, 0, axis)
    else:
        total = (np.cumprod if product else np.cumsum)(x, axis=axis, dtype=x.dtype)
    if exclusive:
        total = np.roll(total, 1, axis)
        total[(slice(None),) * axis + (0,)] = 1 if product else 0
    return np.ascontiguousarray(np.flip(total, axis) if reverse else total)


@register
class Cumsum(SampleKernel):
    """tf.cumsum along a per-sample `axis` (attrs exclusive, reverse; float16 too, as TF's
    float16 scan rounds). The gradient is the cumulative sum of the upstream gradient the
    other way (_CumsumGrad)."""

    type_name = "cumsum"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]):
        super().__init__(name, attrs, input_shapes)
        shape = self.one_input()
        axis = self.attrs.get("axis")
        flags = (self.attrs.get("exclusive", False), self.attrs.get("reverse", False))
        if not is_int(axis) or not 0 <= axis < len(shape) or \
                not all(isinstance(f, bool) for f in flags):
            raise KernelError(f"kernel {name!r} (cumsum): needs a per-sample axis of {shape} "
                              f"(0 to {len(shape) - 1}) and bool attrs exclusive and reverse, "
                              f"got axis {axis!r}, exclusive {flags[0]!r}, reverse {flags[1]!r}")
        self.axis = axis + 1  # on the micro-batch array
        self.exclusive, self.reverse = flags
        self.half = is_half(self.attrs)

    @property
    def output_shape(self):
        return self.input_shapes[0]

    def output_dtype(self, input_dtypes):
        check_dtypes(self, input_dtypes, [(np.float32, *INTEGER)])
        return np.dtype(input_dtypes[0])

    def forward(self, params, inputs, ctx: RunContext):
        return scan(inputs[0], self.axis, self.exclusive, self.reverse, half=self.half), None

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        return [scan(grad_output, self.axis, self.exclusive, not self.reverse, half=self.half)], {}


@register
class Cumprod(Cumsum):
    """tf.math.cumprod along a per-sample `axis` (attrs exclusive, reverse; float16 too),
    each element multiplied in turn as TF's CPU scan. The gradient is TF's _CumprodGrad:
    cumsum(cumprod(x) · g) the other way, div_no_nan by x (0 where x is 0), in float16 each
    op's result rounded."""

    type_name = "cumprod"

    def output_dtype(self, input_dtypes):
        check_dtypes(self, input_dtypes, [(np.float32,)])
        return np.dtype(np.float32)

    def forward(self, params, inputs, ctx: RunContext):
        out = scan(inputs[0], self.axis, self.exclusive, self.reverse, True, self.half)
        return out, (inputs[0], out)

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        x, prod = cache
        weighted = prod * grad_output
        summed = scan(round_half(weighted) if self.half else weighted, self.axis, self.exclusive,
                      not self.reverse, half=self.half)
        with np.errstate(divide="ignore", invalid="ignore"):
            grad = np.where(x == 0, np.float32(0), summed / x)
        return [round_half(grad) if self.half else grad], {}


@register
class CumulativeLogsumexp(Cumsum):
    """tf.math.cumulative_logsumexp along a per-sample `axis` (attrs exclusive, reverse),
    float32, as TF's CPU scan: each element in turn into an accumulator that starts at
    -inf (an exclusive scan's first value), a = max + log1p(exp(min - max)) of the two. The gradient is TF's
    _CumulativeLogsumexpGrad: the upstream gradient's positive and negative parts taken back
    as exp(cumulative_logsumexp(log(±g) - out, the other way) + x), subtracted."""

    type_name = "cumulative_logsumexp"

    def output_dtype(self, input_dtypes):
        check_dtypes(self, input_dtypes, [(np.float32,)])
        return np.dtype(np.float32)

    def scan(self, x: np.ndarray, reverse: bool) -> np.ndarray:
        x = np.moveaxis(np.flip(x, self.axis) if reverse else x, self.axis, 0)
        out = np.empty_like(x)
        total = np.full(x.shape[1:], -np.inf, np.float32)
        with np.errstate(over="ignore", invalid="ignore"):
            for i in range(len(x)):
                if self.exclusive:
                    out[i] = total
                low, high = np.minimum(total, x[i]), np.maximum(total, x[i])
                total = np.where(high < np.finfo(np.float32).min, high,
                                 np.log1p(np.exp(low - high)) + high).astype(np.float32)
                if not self.exclusive:
                    out[i] = total
        out = np.moveaxis(out, 0, self.axis)
        return np.ascontiguousarray(np.flip(out, self.axis) if reverse else out)

    def forward(self, params, inputs, ctx: RunContext):
        out = self.scan(inputs[0], self.reverse)
        return out, (inputs[0], out)

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        x, out = cache
        lowest = np.finfo(np.float32).min
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            parts = [np.where(sign * grad_output > 0, np.log(sign * grad_output), lowest)
                     .astype(np.float32) for sign in (_ONE, -_ONE)]
            positive, negative = (np.exp(self.scan(p - out, not self.reverse) + x)
                                  for p in parts)
        return [(positive - negative).astype(np.float32)], {}


HALF_PACKET = 8  # Eigen::half lanes of a packet in TF 2.21's CPU kernels (Packet8h: AVX2)


def eigen_half_sum(e: np.ndarray) -> np.ndarray:
    """The float16 sum of `e`'s last axis (float16 values) as Eigen's inner-most reduction on
    Eigen::half (rows up to 1024 long): packets of 8 added lane by lane, each sum rounded to
    float16: groups of four packets into four accumulators, these added in order, then the
    packets left over; the lanes added in float32 (predux: lanes i and i + 4, then pairs) and rounded; the tail
    added one by one to a float16 sum from 0; the two sums added and rounded."""
    n = e.shape[-1]
    whole = n - n % HALF_PACKET
    tail = np.zeros(e.shape[:-1], np.float32)
    for i in range(whole, n):
        tail = round_half(tail + e[..., i])
    if not whole:
        return tail
    packets = e[..., :whole].reshape(*e.shape[:-1], whole // HALF_PACKET, HALF_PACKET)
    unrolled = whole // (4 * HALF_PACKET) * 4
    lanes = np.zeros(packets[..., 0, :].shape, np.float32)
    if unrolled:
        accumulators = [packets[..., k, :] for k in range(4)]
        for j in range(4, unrolled):
            accumulators[j % 4] = round_half(accumulators[j % 4] + packets[..., j, :])
        lanes = accumulators[0]
        for other in accumulators[1:]:
            lanes = round_half(lanes + other)
    for j in range(unrolled, whole // HALF_PACKET):
        lanes = round_half(lanes + packets[..., j, :])
    quads = lanes[..., :4] + lanes[..., 4:]
    pairs = quads[..., :2] + quads[..., 2:]
    return round_half(tail + round_half(pairs[..., 0] + pairs[..., 1]))


def eigen_half_softmax(x: np.ndarray) -> np.ndarray:
    """TF's float16 Softmax on the CPU (Eigen's SoftmaxEigenImpl on Eigen::half, oneDNN off)
    along the last axis of float16 values: x - max, exp, the sum (`eigen_half_sum`), its
    inverse and the product, each rounded to float16."""
    e = round_half(np.exp(round_half(x - x.max(axis=-1, keepdims=True))))
    inverse = round_half(_ONE / eigen_half_sum(e))
    return round_half(e * inverse[..., None])


@register
class Softmax(SampleKernel):
    """tf.nn.softmax or (attr log) tf.nn.log_softmax along a per-sample `axis` (-1: the
    last), in the order of TF's CPU kernel: shifted = x - max; softmax = exp(shifted) *
    (1 / sum); log_softmax = shifted - log(sum(exp(shifted))). Gradients: _SoftmaxGrad
    (g - sum(g * y)) * y, _LogSoftmaxGrad g - sum(g) * exp(y)."""

    type_name = "softmax"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]):
        super().__init__(name, attrs, input_shapes)
        shape = self.one_input()
        axis, log = self.attrs.get("axis", -1), self.attrs.get("log", False)
        if not shape or not is_int(axis) or not -len(shape) <= axis < len(shape) or \
                not isinstance(log, bool):
            raise KernelError(f"kernel {name!r} (softmax): needs a per-sample axis of {shape} "
                              f"(-1: the last) and a bool attr log, got axis {axis!r}, "
                              f"log {log!r}")
        self.axis = axis % len(shape) + 1  # on the micro-batch array
        self.log = log

    @property
    def output_shape(self):
        return self.input_shapes[0]

    def flops_per_sample(self) -> float:
        return 5.0 * math.prod(self.input_shapes[0])  # max, subtract, exp, sum, scale

    def activation_bytes_per_sample(self) -> int:
        return 4 * math.prod(self.input_shapes[0])

    def forward(self, params, inputs, ctx: RunContext):
        x = inputs[0]
        if is_half(self.attrs) and not self.log:
            y = eigen_half_softmax(np.moveaxis(x, self.axis, -1))
            y = np.ascontiguousarray(np.moveaxis(y, -1, self.axis))
            return y, y
        shifted = x - x.max(axis=self.axis, keepdims=True)
        if self.log:
            total = np.exp(shifted).sum(axis=self.axis, keepdims=True, dtype=np.float32)
            y = np.subtract(shifted, np.log(total), out=shifted)
        else:
            y = np.exp(shifted, out=shifted)
            y *= _ONE / y.sum(axis=self.axis, keepdims=True, dtype=np.float32)
        return y, y

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        y, g = cache, grad_output
        if self.log:
            return [g - g.sum(axis=self.axis, keepdims=True, dtype=np.float32) * np.exp(y)], {}
        if is_half(self.attrs):  # _SoftmaxGrad's float16 ops: Mul, Sum (Eigen's), Sub, Mul
            gy = np.moveaxis(round_half(g * y), self.axis, -1)
            total = np.moveaxis(eigen_half_sum(gy)[..., None], -1, self.axis)
            return [round_half(round_half(g - total) * y)], {}
        dx = g - (g * y).sum(axis=self.axis, keepdims=True, dtype=np.float32)
        return [np.multiply(dx, y, out=dx)], {}


@register
class Transpose(Rearrangement):
    """tf.transpose of the sample's axes by attr `perm` (a permutation of the per-sample
    axes); the gradient is transposed back by the inverse permutation (_TransposeGrad)."""

    type_name = "transpose"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]):
        super().__init__(name, attrs, input_shapes)
        shape = self.one_input()
        perm = int_list(self, "perm")
        if sorted(perm) != list(range(len(shape))):
            raise KernelError(f"kernel {name!r} (transpose): perm {perm} is not a permutation "
                              f"of the per-sample axes of {shape} (0 to {len(shape) - 1})")
        self.perm = (0, *(p + 1 for p in perm))
        self.inverse = tuple(int(p) for p in np.argsort(self.perm))

    @property
    def output_shape(self):
        return tuple(self.input_shapes[0][p - 1] for p in self.perm[1:])

    def forward(self, params, inputs, ctx: RunContext):
        return np.ascontiguousarray(inputs[0].transpose(self.perm)), None

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        return [np.ascontiguousarray(grad_output.transpose(self.inverse))], {}


@register
class Slice(Rearrangement):
    """tf.strided_slice of the sample, its masks resolved: attrs begin, end, strides (one
    per per-sample axis; a positive stride takes 0 <= begin, end <= size; a negative one
    size > begin >= 0 and end >= -1, -1 meaning through the first element) and shrink
    (per-sample axes removed, each sliced to exactly one element). The gradient is
    scattered into zeros (StridedSliceGrad)."""

    type_name = "slice"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]):
        super().__init__(name, attrs, input_shapes)
        shape = self.one_input()
        rank = len(shape)
        begin, end, strides = (int_list(self, key, rank) for key in ("begin", "end", "strides"))
        shrink = int_list(self, "shrink") if "shrink" in self.attrs else []
        index, kept = [slice(None)], []
        for axis, (b, e, s, d) in enumerate(zip(begin, end, strides, shape)):
            inside = (s > 0 and 0 <= b <= d and 0 <= e <= d) or \
                (s < 0 and 0 <= b < d and -1 <= e < d)
            if not inside:
                raise KernelError(f"kernel {name!r} (slice): axis {axis} of {shape}: begin {b}, "
                                  f"end {e}, stride {s} are not resolved bounds of a size-{d} "
                                  f"axis (stride > 0: 0 <= begin, end <= {d}; stride < 0: "
                                  f"0 <= begin < {d}, -1 <= end < {d})")
            index.append(slice(b, None if e == -1 else e, s))
            kept.append(len(range(b, e, s)))
        if any(not 0 <= a < rank or kept[a] != 1 for a in shrink) or \
                len(set(shrink)) != len(shrink):
            raise KernelError(f"kernel {name!r} (slice): shrink axes {shrink} must be distinct "
                              f"per-sample axes sliced to one element, the slice keeps {kept}")
        self.index = tuple(index)
        self.full = tuple(kept)
        self._shape = tuple(d for a, d in enumerate(kept) if a not in shrink)

    @property
    def output_shape(self):
        return self._shape

    def forward(self, params, inputs, ctx: RunContext):
        x = inputs[0]
        return np.ascontiguousarray(x[self.index]).reshape(x.shape[0], *self._shape), None

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        m = grad_output.shape[0]
        grad = np.zeros((m, *self.input_shapes[0]), grad_output.dtype)
        grad[self.index] = grad_output.reshape(m, *self.full)
        return [grad], {}


@register
class Take(Rearrangement):
    """tf.gather of the sample at constant indices along a per-sample axis: attrs axis and
    indices (a list of ints in [0, size)). The gradient is TF's _GatherV2Grad, an
    UnsortedSegmentSum: each index's gradients added into zeros in order (np.add.at's
    result; in a float16 kernel each sum rounded to float16, as TF's float16 kernel adds)."""

    type_name = "take"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]):
        super().__init__(name, attrs, input_shapes)
        shape = self.one_input()
        axis = self.attrs.get("axis")
        indices = int_list(self, "indices")
        if not isinstance(axis, int) or not 0 <= axis < len(shape) or \
                any(not 0 <= i < shape[axis] for i in indices):
            raise KernelError(f"kernel {name!r} (take): axis {axis!r} must be a per-sample "
                              f"axis of {shape} and the indices {indices} within it")
        self.axis = axis
        self.indices = np.asarray(indices, np.int64)

    @property
    def output_shape(self):
        shape = list(self.input_shapes[0])
        shape[self.axis] = len(self.indices)
        return tuple(shape)

    def forward(self, params, inputs, ctx: RunContext):
        return np.take(inputs[0], self.indices, axis=self.axis + 1), None

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        grad = np.zeros((grad_output.shape[0], *self.input_shapes[0]), grad_output.dtype)
        if len(self.indices):
            scatter_add(np.moveaxis(grad, self.axis + 1, 0), self.indices,
                        np.moveaxis(grad_output, self.axis + 1, 0), half=is_half(self.attrs))
        return [grad], {}


@register
class Pad(Rearrangement):
    """tf.pad of the sample: attrs paddings (before and after for each per-sample axis,
    flattened: [b0, a0, b1, a1, ...]), mode (CONSTANT, the default, with value, default 0;
    REFLECT or SYMMETRIC: MirrorPad, pads below an axis's size, or up to it for
    SYMMETRIC). The gradient is the slice of the padded region (_PadGrad); a mirror's
    also adds each mirrored value's gradient onto its source (MirrorPadGrad)."""

    type_name = "pad"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]):
        super().__init__(name, attrs, input_shapes)
        shape = self.one_input()
        flat = int_list(self, "paddings", 2 * len(shape))
        value = self.attrs.get("value", 0.0)
        if any(p < 0 for p in flat) or isinstance(value, bool) or \
                not isinstance(value, (int, float)) or not math.isfinite(value):
            raise KernelError(f"kernel {name!r} (pad): paddings {flat} must be >= 0 and the "
                              f"value a finite number, got value {value!r}")
        self.pads = tuple((flat[2 * a], flat[2 * a + 1]) for a in range(len(shape)))
        self.value = value
        self.mode = self.attrs.get("mode", "CONSTANT")
        limit = {"CONSTANT": None, "REFLECT": 0, "SYMMETRIC": 1}.get(self.mode, -1)
        if limit == -1 or (limit is not None and any(
                max(p) > d - 1 + limit for p, d in zip(self.pads, shape))):
            raise KernelError(f"kernel {name!r} (pad): mode {self.mode!r} must be CONSTANT, "
                              f"REFLECT (paddings below the axis's size) or SYMMETRIC (up to "
                              f"it), got paddings {flat} of a sample {shape}")
        self.inner = (slice(None), *(slice(b, b + d) for (b, _), d in zip(self.pads, shape)))

    @property
    def output_shape(self):
        return tuple(d + b + a for d, (b, a) in zip(self.input_shapes[0], self.pads))

    def output_dtype(self, input_dtypes):
        check_dtypes(self, input_dtypes, [(np.float32, *INTEGER)])
        return np.dtype(input_dtypes[0])

    def forward(self, params, inputs, ctx: RunContext):
        x = inputs[0]
        if self.mode != "CONSTANT":
            return np.pad(x, ((0, 0), *self.pads), mode=self.mode.lower()), None
        out = np.full((x.shape[0], *self.output_shape), self.value, x.dtype)
        out[self.inner] = x
        return out, None

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        if self.mode == "CONSTANT":
            return [np.ascontiguousarray(grad_output[self.inner])], {}
        grad = grad_output
        shift = 1 if self.mode == "REFLECT" else 0  # REFLECT does not repeat the edge
        for axis, ((before, after), size) in enumerate(zip(self.pads, self.input_shapes[0]), 1):
            g = np.moveaxis(grad, axis, 0)
            folded = g[before:before + size].copy()
            folded[shift:shift + before] += g[:before][::-1]
            folded[size - shift - after:size - shift] += g[before + size:][::-1]
            grad = np.moveaxis(folded, 0, axis)
        return [np.ascontiguousarray(grad)], {}


@register
class TopK(SampleKernel):
    """tf.math.top_k along the sample's last axis: attr k, and attr indices (False: the k
    largest values, True: their int32 positions). TF's order: largest first, equal values
    by lower index first. The values' gradient is the upstream gradient scattered into
    zeros at the chosen positions (_TopKGrad); the indices take none, nor do int32 values
    (tf.argsort of ranks: argsort(argsort(x)))."""

    type_name = "top_k"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]):
        super().__init__(name, attrs, input_shapes)
        shape = self.one_input()
        k, indices = self.attrs.get("k"), self.attrs.get("indices", False)
        if not shape or not is_int(k) or not 0 < k <= shape[-1] or not isinstance(indices, bool):
            raise KernelError(f"kernel {name!r} (top_k): takes a sample of rank >= 1, a k in "
                              f"[1, last axis] and a bool indices, got shape {shape}, k "
                              f"{k!r}, indices {indices!r}")
        self.k: int = k
        self.indices: bool = indices

    @property
    def output_shape(self):
        return (*self.input_shapes[0][:-1], self.k)

    def output_dtype(self, input_dtypes):
        check_dtypes(self, input_dtypes, [(np.float32, np.int32)])
        return np.dtype(np.int32 if self.indices else input_dtypes[0])

    def input_differentiable(self, index: int) -> bool:
        return not self.indices

    def flops_per_sample(self) -> float:
        return float(math.prod(self.input_shapes[0]) * max(1, math.ceil(math.log2(self.k + 1))))

    def activation_bytes_per_sample(self) -> int:
        return 0 if self.indices else 4 * math.prod(self.output_shape)  # the positions

    def forward(self, params, inputs, ctx: RunContext):
        x = inputs[0]
        descending = -x.astype(np.int64) if x.dtype.kind == "i" else -x  # (-INT32_MIN fits)
        order = np.argsort(descending, axis=-1, kind="stable")[..., :self.k]
        if self.indices:
            return order.astype(np.int32), None
        return np.take_along_axis(x, order, axis=-1), order

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        if self.indices:
            return [None], {}
        grad = np.zeros((grad_output.shape[0], *self.input_shapes[0]), grad_output.dtype)
        np.put_along_axis(grad, cache, grad_output, axis=-1)
        return [grad], {}



def first_extreme(x: np.ndarray, axis: int, largest: bool, bound: float) -> np.ndarray:
    """tf.argmax (largest) or tf.argmin of `x` along `axis` by TF's CPU kernel (Eigen's
    reducer, starting from index 0 and `bound`, the dtype's lowest value for a max, its
    highest for a min, and taking an element only if it is strictly beyond): the first index
    of the extreme; NaN never taken; 0 if no element passes `bound` (all NaN, or -inf for a
    max)."""
    numbers = np.where(np.isnan(x), bound, x) if x.dtype.kind == "f" else x
    extreme = (np.max if largest else np.min)(numbers, axis=axis, keepdims=True)
    beyond = extreme > bound if largest else extreme < bound
    hit = (numbers == extreme) & beyond
    return np.where(hit.any(axis), hit.argmax(axis), 0)


@register
class ArgReduce(SampleKernel):
    """tf.argmax (attr op "max") and tf.argmin ("min") along per-sample `axis`: the first
    index of the extreme by TF's CPU rule (`first_extreme`: ties to the lower index, NaN
    never chosen), as attr output (int32 or int64). Attr half: the input holds a float16
    tensor's values (its lowest and highest, +-65504, bound the search as Eigen::half's).
    An index takes no gradient, as in TF."""

    type_name = "arg_reduce"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]):
        super().__init__(name, attrs, input_shapes)
        shape = self.one_input()
        op, axis = self.attrs.get("op"), self.attrs.get("axis")
        output, half = self.attrs.get("output", "int64"), self.attrs.get("half", False)
        if op not in ("max", "min") or not is_int(axis) or not 0 <= axis < len(shape) or \
                output not in INTEGER_NAMES or not isinstance(half, bool):
            raise KernelError(f"kernel {name!r} (arg_reduce): takes op max or min, a per-sample "
                              f"axis of {shape}, output {' or '.join(INTEGER_NAMES)} and a bool "
                              f"half, got {op!r}, {axis!r}, {output!r}, {half!r}")
        self.largest, self.axis, self.output, self.half = op == "max", axis, str(output), half

    @property
    def output_shape(self):
        return tuple(d for a, d in enumerate(self.input_shapes[0]) if a != self.axis)

    def output_dtype(self, input_dtypes):
        check_dtypes(self, input_dtypes, [(np.float32, *INTEGER, np.bool_)])
        return np.dtype(self.output)

    def input_differentiable(self, index: int) -> bool:
        return False

    def flops_per_sample(self) -> float:
        return float(math.prod(self.input_shapes[0]))

    def activation_bytes_per_sample(self) -> int:
        return 0

    def forward(self, params, inputs, ctx: RunContext):
        x = inputs[0]
        dtype = np.dtype(np.float16) if self.half else x.dtype
        if dtype.kind == "b":
            bound: Any = not self.largest  # where Eigen's reducer starts: false for a max
        else:
            info = np.finfo(dtype) if dtype.kind == "f" else np.iinfo(dtype)
            bound = info.min if self.largest else info.max
        found = first_extreme(x, self.axis + 1, self.largest, bound)
        return found.astype(self.output), None

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        return [None], {}

