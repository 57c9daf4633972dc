"""Generic kernels that reduce, normalise, contract, rearrange or look up per-sample values:
reduce, softmax, matmul, transpose, slice, pad, gather (embedding lookups) and batch norm
with moving statistics. Each backward is TensorFlow's registered gradient function
(math_grad.py, nn_grad.py, array_grad.py) on the same float32 values.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from wse_sim.kernels.base import (INTEGER, Kernel, KernelError, RunContext, accumulate,
                                  check_dtypes, max_cores_for, register)
from wse_sim.kernels.operands import Operands, reduce_to

Shape = tuple[int, ...]


def _ints(name: str, kind: str, attrs: Mapping[str, Any], key: str) -> list[int]:
    value = attrs.get(key, [])
    if not isinstance(value, list) or any(not isinstance(v, int) for v in value):
        raise KernelError(f"kernel {name!r} ({kind}): attr {key!r} must be a list of ints, got "
                          f"{value!r}")
    return value


class SampleKernel(Kernel):
    """One input; cost one operation per element of input and output."""

    def _one_input(self) -> Shape:
        if len(self.input_shapes) != 1:
            raise KernelError(f"kernel {self.name!r} ({self.type_name}): takes 1 input, got "
                              f"{len(self.input_shapes)}")
        return self.input_shapes[0]

    def flops_per_sample(self) -> float:
        return float(math.prod(self.input_shapes[0]) + math.prod(self.output_shape))

    def max_cores(self) -> int:
        return max_cores_for(self.flops_per_sample())

    def activation_bytes_per_sample(self) -> int:
        return 4 * math.prod(self.input_shapes[0])


@register
class Reduce(SampleKernel):
    """sum, mean, max or min over per-sample `axes` (keepdims as attr)."""

    type_name = "reduce"
    OPS = ("sum", "mean", "max", "min")

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]):
        super().__init__(name, attrs, input_shapes)
        shape = self._one_input()
        self.op = self.attrs.get("op")
        axes = _ints(name, "reduce", self.attrs, "axes")
        if self.op not in self.OPS or any(not 0 <= a < len(shape) for a in axes):
            raise KernelError(f"kernel {name!r} (reduce): op in {self.OPS} over per-sample axes "
                              f"of {shape}, got {self.op!r} over {axes}")
        self.axes = tuple(sorted(set(axes)))
        self.keepdims = bool(self.attrs.get("keepdims", False))
        self._kept = tuple(1 if a in self.axes else d for a, d in enumerate(shape))
        self._shape = self._kept if self.keepdims else tuple(
            d for a, d in enumerate(shape) if a not in self.axes)
        self.count = np.float32(math.prod(shape[a] for a in self.axes))

    @property
    def output_shape(self):
        return self._shape

    def forward(self, params, inputs, ctx: RunContext):
        x = inputs[0]
        axes = tuple(a + 1 for a in self.axes)
        y = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}[self.op](
            x, axis=axes, keepdims=True)
        y = y.astype(np.float32, copy=False)
        return y.reshape(x.shape[0], *self._shape), (x, y) if self.op in ("max", "min") else None

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        m = grad_output.shape[0]
        g = grad_output.reshape(m, *self._kept)
        full = (m, *self.input_shapes[0])
        if self.op == "sum":
            return [np.broadcast_to(g, full).copy()], {}
        if self.op == "mean":
            return [np.broadcast_to(g / self.count, full).copy()], {}
        x, y = cache  # _MinOrMaxGrad: split equally among the elements equal to the result
        indicators = (x == y).astype(np.float32)
        selected = indicators.sum(axis=tuple(a + 1 for a in self.axes), keepdims=True)
        return [(indicators / selected) * g], {}


@register
class Softmax(SampleKernel):
    """softmax (or log_softmax with attr log) over the last per-sample axis."""

    type_name = "softmax"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]):
        super().__init__(name, attrs, input_shapes)
        shape = self._one_input()
        if not shape or int(self.attrs.get("axis", -1)) not in (-1, len(shape) - 1):
            raise KernelError(f"kernel {name!r} (softmax): over the last axis of a per-sample "
                              f"value, got axis {self.attrs.get('axis')} of {shape}")
        self.log = bool(self.attrs.get("log", False))

    @property
    def output_shape(self):
        return self.input_shapes[0]

    def flops_per_sample(self) -> float:
        return 5.0 * math.prod(self.input_shapes[0])

    def forward(self, params, inputs, ctx: RunContext):
        x = inputs[0]
        shifted = x - x.max(axis=-1, keepdims=True)
        e = np.exp(shifted)
        total = e.sum(axis=-1, keepdims=True)
        y = shifted - np.log(total) if self.log else e / total
        return y, y

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        y, g = cache, grad_output
        if self.log:  # _LogSoftmaxGrad
            return [g - g.sum(axis=-1, keepdims=True) * np.exp(y)], {}
        return [(g - (g * y).sum(axis=-1, keepdims=True)) * y], {}  # _SoftmaxGrad


def _swap(shape: Shape) -> Shape:
    return (*shape[:-2], shape[-1], shape[-2])


@register
class Matmul(Kernel):
    """tf.matmul of two operands (`operands`: i, c, p letters) with BatchMatMulV2's
    broadcasting of leading axes; transpose_a/transpose_b swap an operand's last two axes.
    A per-sample operand needs at least two per-sample axes unless the other operand is a
    weight or constant (x [batch, n] @ w [n, k]), and no weight or constant may have more
    axes than the samples (its leading axis would meet the batch)."""

    type_name = "matmul"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]):
        super().__init__(name, attrs, input_shapes)
        self.operands = Operands(self, 2, broadcast=False)
        self.ta, self.tb = bool(self.attrs.get("transpose_a")), bool(self.attrs.get("transpose_b"))
        full = [(1, *o.shape) if o.letter == "i" else o.shape for o in self.operands]
        data_rank = max(len(f) for f, o in zip(full, self.operands) if o.letter == "i")
        if any(len(f) < 2 for f in full) or any(
                o.letter != "i" and len(f) >= data_rank + (data_rank == 2) for f, o in
                zip(full, self.operands)) or (self.operands.letters == "ii" and data_rank < 3):
            raise KernelError(f"kernel {name!r} (matmul): operands {self.operands.letters} of "
                              f"shapes {[o.shape for o in self.operands]} would multiply across "
                              "samples")
        a = _swap(full[0]) if self.ta else full[0]
        b = _swap(full[1]) if self.tb else full[1]
        if a[-1] != b[-2]:
            raise KernelError(f"kernel {name!r} (matmul): inner dimensions {a} and {b} differ")
        try:
            lead = np.broadcast_shapes(a[:-2], b[:-2])
        except ValueError:
            raise KernelError(f"kernel {name!r} (matmul): leading axes of {a} and {b} do not "
                              "broadcast") from None
        self._shape = tuple((*lead, a[-2], b[-1])[1:])
        self._inner = a[-1]

    @property
    def output_shape(self):
        return self._shape

    def param_shapes(self):
        return self.operands.param_shapes()

    def flops_per_sample(self) -> float:
        return 2.0 * math.prod(self._shape) * self._inner

    def max_cores(self) -> int:
        return max_cores_for(self.flops_per_sample())

    def activation_bytes_per_sample(self) -> int:
        return 4 * sum(math.prod(o.shape) for o in self.operands if o.letter == "i")

    def forward(self, params, inputs, ctx: RunContext):
        a, b = self.operands.arrays(params, inputs)
        x = np.swapaxes(a, -1, -2) if self.ta else a
        y = np.swapaxes(b, -1, -2) if self.tb else b
        return np.matmul(x, y), (a, b)

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        a, b = cache
        g = grad_output
        t = lambda v: np.swapaxes(v, -1, -2)  # noqa: E731
        if not self.ta and not self.tb:  # _BatchMatMulV2's gradient
            ga, gb = g @ t(b), t(a) @ g
        elif self.ta and not self.tb:
            ga, gb = b @ t(g), a @ g
        elif not self.ta and self.tb:
            ga, gb = g @ b, t(g) @ a
        else:
            ga, gb = t(b) @ t(g), t(g) @ t(a)
        shaped = []
        for o, grad in zip(self.operands, (ga, gb)):
            target = (grad.shape[0], *o.shape) if o.letter == "i" else o.shape
            shaped.append(reduce_to(grad, target))
        return self.operands.gradients(shaped, ctx, param_grads)


@register
class Transpose(SampleKernel):
    """tf.transpose of the sample's axes by attr `perm`."""

    type_name = "transpose"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]):
        super().__init__(name, attrs, input_shapes)
        shape = self._one_input()
        self.perm = _ints(name, "transpose", self.attrs, "perm")
        if sorted(self.perm) != list(range(len(shape))):
            raise KernelError(f"kernel {name!r} (transpose): perm {self.perm} is not a "
                              f"permutation of the axes of {shape}")
        self.inverse = list(np.argsort(self.perm))

    @property
    def output_shape(self):
        return tuple(self.input_shapes[0][p] for p in self.perm)

    def output_dtype(self, input_dtypes):
        return np.dtype(input_dtypes[0])

    def forward(self, params, inputs, ctx: RunContext):
        return np.ascontiguousarray(np.transpose(inputs[0], (0, *(p + 1 for p in self.perm)))), None

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        return [np.ascontiguousarray(np.transpose(grad_output, (0, *(p + 1 for p in self.inverse))))], {}


@register
class Slice(SampleKernel):
    """tf.strided_slice of the sample: attrs begin, end, strides (non-negative, one per
    axis) and shrink (axes removed, each sliced to one element)."""

    type_name = "slice"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]):
        super().__init__(name, attrs, input_shapes)
        shape = self._one_input()
        begin, end, strides = (_ints(name, "slice", self.attrs, k) for k in ("begin", "end", "strides"))
        self.shrink = set(_ints(name, "slice", self.attrs, "shrink"))
        if not len(begin) == len(end) == len(strides) == len(shape) or any(
                s <= 0 or not 0 <= b <= e <= d for b, e, s, d in zip(begin, end, strides, shape)) \
                or any(not 0 <= a < len(shape) or end[a] - begin[a] != 1 for a in self.shrink):
            raise KernelError(f"kernel {name!r} (slice): begin {begin}, end {end}, strides "
                              f"{strides}, shrink {sorted(self.shrink)} do not slice {shape}")
        self.index = (slice(None), *(slice(b, e, s) for b, e, s in zip(begin, end, strides)))
        kept = [len(range(b, e, s)) for b, e, s in zip(begin, end, strides)]
        self._full = tuple(kept)
        self._shape = tuple(d for a, d in enumerate(kept) if a not in self.shrink)

    @property
    def output_shape(self):
        return self._shape

    def output_dtype(self, input_dtypes):
        return np.dtype(input_dtypes[0])

    def forward(self, params, inputs, ctx: RunContext):
        x = inputs[0]
        return np.ascontiguousarray(x[self.index]).reshape(x.shape[0], *self._shape), None

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        m = grad_output.shape[0]
        grad = np.zeros((m, *self.input_shapes[0]), np.float32)
        grad[self.index] = grad_output.reshape(m, *self._full)
        return [grad], {}


@register
class Pad(SampleKernel):
    """tf.pad of the sample with a constant: attrs paddings (before, after per axis,
    flattened) and value."""

    type_name = "pad"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]):
        super().__init__(name, attrs, input_shapes)
        shape = self._one_input()
        flat = _ints(name, "pad", self.attrs, "paddings")
        if len(flat) != 2 * len(shape) or any(p < 0 for p in flat):
            raise KernelError(f"kernel {name!r} (pad): paddings {flat} do not fit {shape}")
        self.pads = [(0, 0)] + [(flat[2 * a], flat[2 * a + 1]) for a in range(len(shape))]
        self.value = np.float32(self.attrs.get("value", 0.0))
        self.index = (slice(None), *(slice(b, b + d) for (b, _), d in zip(self.pads[1:], shape)))

    @property
    def output_shape(self):
        return tuple(d + b + a for d, (b, a) in zip(self.input_shapes[0], self.pads[1:]))

    def forward(self, params, inputs, ctx: RunContext):
        return np.pad(inputs[0], self.pads, constant_values=self.value), None

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        return [np.ascontiguousarray(grad_output[self.index])], {}


@register
class Gather(Kernel):
    """An embedding lookup, operands "pi": rows of the weight p0 (V, ...) at the integer
    indices of the input; output indices.shape + table.shape[1:]. The gradient is scattered
    (summed per row) into the table's accumulator, as TF's IndexedSlices are summed."""

    type_name = "gather"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]):
        super().__init__(name, attrs, input_shapes)
        self.operands = Operands(self, 2, broadcast=False)
        if self.operands.letters != "pi" or not self.operands[0].shape:
            raise KernelError(f"kernel {name!r} (gather): operands must be 'pi' (a weight "
                              f"table, integer indices), got {self.operands.letters!r}")
        self.table = self.operands[0].shape
        self._shape = (*self.operands[1].shape, *self.table[1:])

    @property
    def output_shape(self):
        return self._shape

    def param_shapes(self):
        return self.operands.param_shapes()

    def output_dtype(self, input_dtypes):
        check_dtypes(self, input_dtypes, [INTEGER])
        return np.dtype(np.float32)

    def input_differentiable(self, index: int) -> bool:
        return False

    def flops_per_sample(self) -> float:
        return float(math.prod(self._shape))

    def max_cores(self) -> int:
        return max_cores_for(self.flops_per_sample())

    def activation_bytes_per_sample(self) -> int:
        return 8 * math.prod(self.operands[1].shape)

    def forward(self, params, inputs, ctx: RunContext):
        ids = inputs[0]
        rows = self.table[0]
        if ids.size and (ids.min() < 0 or ids.max() >= rows):
            bad = ids[(ids < 0) | (ids >= rows)].flat[0]
            raise ValueError(f"{self.name}: index {bad} is outside the table's {rows} rows "
                             f"[0, {rows})")
        return np.take(params["p0"], ids, axis=0), ids

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        ids = cache.ravel()
        width = math.prod(self.table[1:])
        values = grad_output.reshape(len(ids), width)
        order = np.argsort(ids, kind="stable")
        ordered = ids[order]
        starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]]) if len(ids) else []
        grad = np.zeros((self.table[0], width), np.float32)
        if len(ids):
            grad[ordered[starts]] = np.add.reduceat(values[order], starts, axis=0)
        grads: dict[str, np.ndarray] = {}
        accumulate(param_grads, "p0", grad.reshape(self.table), grads, ctx)
        return [None], grads


@register
class BatchNormInference(SampleKernel):
    """Batch normalisation with moving statistics (Keras BatchNormalization with
    training=False): inv = rsqrt(variance + epsilon) [* scale];
    y = x * inv + ([offset] - mean * inv), over the last axis, in TF's order. Params mean,
    variance (frozen), scale (attr scale), offset (attr center)."""

    type_name = "batch_norm_inference"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]):
        super().__init__(name, attrs, input_shapes)
        shape = self._one_input()
        if not shape:
            raise KernelError(f"kernel {name!r} (batch_norm_inference): needs channels")
        self.channels = shape[-1]
        self.eps = np.float32(self.attrs.get("epsilon", 1e-3))
        self.scale, self.center = bool(self.attrs.get("scale", True)), bool(self.attrs.get("center", True))

    @property
    def output_shape(self):
        return self.input_shapes[0]

    def param_shapes(self):
        roles = ["mean", "variance"] + ["scale"] * self.scale + ["offset"] * self.center
        return {role: (self.channels,) for role in roles}

    def _inv(self, params) -> tuple[np.ndarray, np.ndarray]:
        r = (np.float32(1) / np.sqrt(params["variance"] + self.eps)).astype(np.float32)
        return r, (r * params["scale"] if self.scale else r)

    def forward(self, params, inputs, ctx: RunContext):
        x = inputs[0]
        r, inv = self._inv(params)
        shift = (params["offset"] - params["mean"] * inv) if self.center else -(params["mean"] * inv)
        return x * inv + shift, x

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        x, g = cache, grad_output
        r, inv = self._inv(params)
        axes = tuple(range(g.ndim - 1))
        grads: dict[str, np.ndarray] = {}
        if self.scale:
            d_inv = (g * x).sum(axis=axes) - g.sum(axis=axes) * params["mean"]
            accumulate(param_grads, "scale", (d_inv * r).astype(np.float32), grads, ctx)
        if self.center:
            accumulate(param_grads, "offset", g.sum(axis=axes, dtype=np.float32), grads, ctx)
        return [g * inv], grads
