"""Generic element-wise kernels: binary operations and select over broadcast operands
(activations, constants, weights: `wafer.kernels.operands`), cast, stop_gradient and
one_hot. Each backward is TensorFlow's registered gradient function (math_grad.py,
array_grad.py) on the same float32 values, so results match TF's to rounding.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from wafer.kernels.base import INTEGER, KernelError, RunContext, check_dtypes, is_int, register
from wafer.kernels.operands import Operands, OperandsKernel
from wafer.kernels.structure import Elementwise
from wafer.precision import is_half, round_half

_ZERO = np.float32(0)
_ONE = np.float32(1)
_TWO = np.float32(2)


def where(cond: np.ndarray, x: np.ndarray, y: np.ndarray | None = None) -> np.ndarray:
    """np.where(cond, x, y) (y None: zeros) for a bool `cond` and arrays of one dtype,
    bit for bit (inf and nan included) through masks instead of np.where's per-element
    branch, which costs 5-10x more on random conditions."""
    shape = np.broadcast_shapes(cond.shape, x.shape, () if y is None else y.shape)
    bits = np.dtype(f"u{x.dtype.itemsize}")
    mask = np.broadcast_to(cond, shape).view(np.uint8).astype(bits)
    np.negative(mask, out=mask)  # all ones where cond holds
    out = np.bitwise_and(x.view(bits), mask)
    if y is not None:
        np.invert(mask, out=mask)
        out |= y.view(bits) & mask
    return out.view(x.dtype)


def _selected(x_mask: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """_MaximumMinimumGrad: the gradient to x where the selector holds, to y elsewhere."""
    return where(x_mask, g), where(~x_mask, g)


def _grad_pow(x, y, z, g):  # _PowGrad
    gx = g * y * np.power(x, y - _ONE)
    mask = x > 0
    log_x = np.where(mask, np.log(np.where(mask, x, _ONE)), _ZERO)
    return gx, g * z * log_x


def _floor_div(x, y):  # TF's FloorDiv: floor(x / y) for floats, Python's // for integers
    return np.floor_divide(x, y) if x.dtype.kind in "iu" else np.floor(x / y)


def _floor_mod(x, y):  # TF's FloorMod: the remainder with the divisor's sign (Python's %)
    if x.dtype.kind in "iu":
        return np.mod(x, y)
    r = np.fmod(x, y)
    return np.where((r != 0) & ((y < 0) != (r < 0)), r + y, r)


def _div_no_nan(x, y):  # TF's DivNoNan: x / y, and 0 where y is 0
    return where(np.asarray(y != 0), np.divide(x, y), None)


def _grad_div_no_nan(x, y, z, g):  # _DivNoNanGrad: div_no_nan(g, y), g * div_no_nan(div_no_nan(-x, y), y)
    return _div_no_nan(g, y), g * _div_no_nan(_div_no_nan(-x, y), y)


def _grad_floor_mod(x, y, z, g):  # _FloorModGrad
    return g, g * -np.floor(x / y)


def _x_times(x, fx):  # Eigen's xlogy/xlog1py/xdivy: x where x is 0, else x * f(y) (x / y)
    return np.where(x == 0, x, fx)


def _xlogy(x, y):  # TF's Xlogy: x * log(y), 0 where x is 0
    return _x_times(x, x * np.log(y))


def _xlog1py(x, y):  # TF's Xlog1py: x * log1p(y), 0 where x is 0
    return _x_times(x, x * np.log1p(y))


def _grad_xlogy(x, y, z, g):  # _XLogyGrad: xlogy(x != 0, y) * g, xdivy(x, y) * g
    return _xlogy((x != 0).astype(np.float32), y) * g, _x_times(x, x / y) * g


def _grad_xlog1py(x, y, z, g):  # _XLog1pyGrad: xlog1py(x != 0, y) * g, xdivy(x, y + 1) * g
    return _xlog1py((x != 0).astype(np.float32), y) * g, _x_times(x, x / (y + _ONE)) * g


def _grad_atan2(y, x, z, g):  # _Atan2Grad of atan2(y, x): grad_inv = g / (x² + y²); x * grad_inv, -y * grad_inv
    inverse = g / (np.square(x) + np.square(y))
    return x * inverse, -y * inverse


# op -> (forward(x, y), backward(x, y, z, g) -> (gx, gy) before reduction, FLOPs per element)
ARITHMETIC: dict[str, tuple[Callable[..., np.ndarray], Callable[..., tuple[np.ndarray, np.ndarray]], int]] = {
    "add": (np.add, lambda x, y, z, g: (g, g), 1),
    "sub": (np.subtract, lambda x, y, z, g: (g, -g), 1),
    "mul": (np.multiply, lambda x, y, z, g: (g * y, x * g), 1),
    "div": (np.divide, lambda x, y, z, g: (g / y, g * ((-x / y) / y)), 1),
    "maximum": (np.maximum, lambda x, y, z, g: _selected(x >= y, g), 1),  # ties go to x
    "minimum": (np.minimum, lambda x, y, z, g: _selected(x <= y, g), 1),
    "squared_difference": (lambda x, y: (x - y) * (x - y),
                           lambda x, y, z, g: ((_TWO * g) * (x - y), -((_TWO * g) * (x - y))), 2),
    "pow": (np.power, _grad_pow, 8),
    "div_no_nan": (_div_no_nan, _grad_div_no_nan, 1),
    "floor_mod": (_floor_mod, _grad_floor_mod, 3),
    "floor_div": (_floor_div, lambda x, y, z, g: (np.zeros_like(g), np.zeros_like(g)), 2),  # TF: None
    "xlogy": (_xlogy, _grad_xlogy, 5),
    "xlog1py": (_xlog1py, _grad_xlog1py, 6),
    "atan2": (np.arctan2, _grad_atan2, 10),
}
# float16 ops whose TF kernel or gradient rounds in between (docs/design.md, "Mixed
# precision"): Eigen's SquaredDifference is abs2(x - y) on Eigen::half (x - y rounded);
# _SquaredDifferenceGrad is (2 * g) * (x - y), _RealDivGrad's y gradient g * ((-x / y) / y),
# each a float16 op. (The others round only their result, which the executor does.)
HALF_ARITHMETIC: dict[str, tuple[Callable[..., np.ndarray], Callable[..., tuple[np.ndarray, np.ndarray]]]] = {
    "squared_difference": (lambda x, y: round_half(x - y) ** 2,
                           lambda x, y, z, g: _negated_pair(round_half((_TWO * g) * round_half(x - y)))),
    "div": (np.divide, lambda x, y, z, g: (g / y, g * round_half(round_half(-x / y) / y))),
}


def _negated_pair(gx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return gx, -gx


# TF's int kernels of these compute what numpy's do; the others are float32 only.
INTEGER_ARITHMETIC = {"add", "sub", "mul", "maximum", "minimum", "floor_mod", "floor_div"}
COMPARISONS = {"greater": np.greater, "greater_equal": np.greater_equal, "less": np.less,
               "less_equal": np.less_equal, "equal": np.equal, "not_equal": np.not_equal}
# Equality also of bools (tf.logical_not(x) is x == False).
EQUALITY_BOOL = {"equal": (np.bool_,), "not_equal": (np.bool_,)}
LOGICAL = {"logical_and": np.logical_and, "logical_or": np.logical_or}
BINARY_OPS = (*ARITHMETIC, *COMPARISONS, *LOGICAL)


class Broadcasting(OperandsKernel, Elementwise):
    """An element-wise kernel over operands broadcast together (`self.operands`, set by the
    subclass with its `_shape`): the output is their broadcast shape; weights are params."""


@register
class Binary(Broadcasting):
    """x op y over two broadcast operands. Comparisons and logical ops output bool and
    take no gradient; squared_difference's y gradient is the negated x gradient, as TF's."""

    type_name = "binary"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]):
        super().__init__(name, attrs, input_shapes)
        op = self.attrs.get("op")
        if op not in BINARY_OPS:
            raise KernelError(f"kernel {name!r} (binary): unknown op {op!r}; the library "
                              f"has {', '.join(BINARY_OPS)}")
        self.op: str = op
        self.half = is_half(self.attrs)
        self.operands = Operands(self, 2)
        self._shape = self.operands.broadcast_shape(self)

    def output_dtype(self, input_dtypes):
        dtypes = self.operands.dtypes(input_dtypes)
        if self.op in LOGICAL:
            accepted: tuple[type, ...] = (np.bool_,)
        elif self.op in COMPARISONS or self.op in INTEGER_ARITHMETIC:
            accepted = (np.float32, *INTEGER, *EQUALITY_BOOL.get(self.op, ()))
        else:
            accepted = (np.float32,)
        bad = [d for d in dtypes if d not in [np.dtype(a) for a in accepted]]
        if bad or dtypes[0] != dtypes[1]:
            raise KernelError(f"kernel {self.name!r} (binary {self.op}): operands "
                              f"{self.operands.letters} are {' and '.join(d.name for d in dtypes)}; "
                              f"it takes two of one dtype among "
                              f"{', '.join(np.dtype(a).name for a in accepted)}")
        return np.dtype(np.bool_) if self.op in COMPARISONS or self.op in LOGICAL else dtypes[0]

    def input_differentiable(self, index: int) -> bool:
        return self.op in ARITHMETIC

    def flops_per_sample(self) -> float:
        per_element = ARITHMETIC[self.op][2] if self.op in ARITHMETIC else 1
        return float(per_element * self._elements())

    def activation_bytes_per_sample(self) -> int:
        if self.op not in ARITHMETIC:
            return 0
        kept = sum(math.prod(o.shape) for o in self.operands if o.letter == "i")
        return 4 * (kept + (self._elements() if self.op == "pow" else 0))

    def forward(self, params, inputs, ctx: RunContext):
        x, y = self.operands.arrays(params, inputs)
        if self.op in COMPARISONS:
            return COMPARISONS[self.op](x, y), None
        if self.op in LOGICAL:
            return LOGICAL[self.op](x, y), None
        with np.errstate(all="ignore"):
            z = (HALF_ARITHMETIC if self.half and self.op in HALF_ARITHMETIC else ARITHMETIC)[self.op][0](x, y)
        return z, (x, y, z)

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        if cache is None:
            return [None] * len(self.input_shapes), {}
        x, y, z = cache
        with np.errstate(all="ignore"):
            gx, gy = (HALF_ARITHMETIC if self.half and self.op in HALF_ARITHMETIC
                      else ARITHMETIC)[self.op][1](x, y, z, grad_output)
        return self.operands.gradients([gx, gy], ctx, param_grads)


@register
class Select(Broadcasting):
    """where(cond, x, y) over three broadcast operands (TF's SelectV2): the gradient goes to
    x where cond holds, to y elsewhere; cond takes none. A weight's condition (p) is the
    weight program's float32 0 or 1 (a dropout mask drawn once a step for the batch), held
    where it is not 0."""

    type_name = "select"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]):
        super().__init__(name, attrs, input_shapes)
        self.operands = Operands(self, 3)
        self._shape = self.operands.broadcast_shape(self)

    def output_dtype(self, input_dtypes):
        cond, x, y = self.operands.dtypes(input_dtypes)
        if self.operands.letters[0] == "p":
            cond = np.dtype(np.bool_)  # (its 0/1 values: `forward`)
        if cond != np.bool_ or x != y or x not in [np.dtype(d) for d in (np.float32, *INTEGER)]:
            raise KernelError(f"kernel {self.name!r} (select): operands {self.operands.letters} "
                              f"are {cond.name}, {x.name}, {y.name}; it takes a bool condition "
                              f"and two values of one dtype (float32, int32 or int64)")
        return x

    def input_differentiable(self, index: int) -> bool:
        return self.operands.input_position(index) != 0

    def activation_bytes_per_sample(self) -> int:
        return self._elements()  # the condition, a byte per value

    def forward(self, params, inputs, ctx: RunContext):
        cond, x, y = self.operands.arrays(params, inputs)
        if cond.dtype != np.bool_:  # (a weight's 0/1)
            cond = cond != 0
        return where(cond, x, y), cond

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        gx, gy = where(cache, grad_output), where(~cache, grad_output)
        return self.operands.gradients([None, gx, gy], ctx, param_grads)


CAST_DTYPES = ("float32", "int32", "int64", "bool")


@register
class Cast(Elementwise):
    """tf.cast to attr `dtype` (float32, int32, int64, bool): floats to integers truncate
    toward zero, anything to bool is `!= 0`. Only float32 -> float32 carries a gradient
    (TF's _CastGrad: casts between float types only)."""

    type_name = "cast"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]):
        super().__init__(name, attrs, input_shapes)
        if len(self.input_shapes) != 1 or self.attrs.get("dtype") not in CAST_DTYPES:
            raise KernelError(f"kernel {name!r} (cast): takes 1 input and a dtype among "
                              f"{', '.join(CAST_DTYPES)}, got {len(self.input_shapes)} inputs "
                              f"and dtype {self.attrs.get('dtype')!r}")
        self.dtype = np.dtype(self.attrs["dtype"])

    @property
    def output_shape(self):
        return self.input_shapes[0]

    def output_dtype(self, input_dtypes):
        check_dtypes(self, input_dtypes, [(np.float32, *INTEGER, np.bool_)])
        return self.dtype

    def input_differentiable(self, index: int) -> bool:
        return self.dtype == np.float32  # and the input is float32: checked by backward

    def forward(self, params, inputs, ctx: RunContext):
        x = inputs[0]
        return x.astype(self.dtype, copy=False), x.dtype == np.float32

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        return [grad_output if cache and self.dtype == np.float32 else None], {}


@register
class StopGradient(Elementwise):
    """Passes its input through; no gradient flows back through it."""

    type_name = "stop_gradient"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]):
        super().__init__(name, attrs, input_shapes)
        if len(self.input_shapes) != 1:
            raise KernelError(f"kernel {name!r} (stop_gradient): takes 1 input, got "
                              f"{len(self.input_shapes)}")

    @property
    def output_shape(self):
        return self.input_shapes[0]

    def output_dtype(self, input_dtypes):
        return np.dtype(input_dtypes[0])

    def input_differentiable(self, index: int) -> bool:
        return False

    def flops_per_sample(self) -> float:
        return 0.0

    def forward(self, params, inputs, ctx: RunContext):
        return inputs[0], None

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        return [None], {}


@register
class OneHot(Elementwise):
    """tf.one_hot of integer indices along a new last axis: `on_value` where the index is
    the position, `off_value` elsewhere (an index outside [0, depth) gives a row of
    off_value, as in TF). float32 output, no gradient."""

    type_name = "one_hot"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]):
        super().__init__(name, attrs, input_shapes)
        depth = self.attrs.get("depth")
        axis = self.attrs.get("axis", -1)
        if len(self.input_shapes) != 1 or not is_int(depth) or depth <= 0 or axis != -1:
            raise KernelError(f"kernel {name!r} (one_hot): takes 1 input, a depth > 0 and axis "
                              f"-1, got {len(self.input_shapes)} inputs, depth {depth!r}, "
                              f"axis {axis!r}")
        self.depth = depth
        self.on = np.float32(self.attrs.get("on_value", 1.0))
        self.off = np.float32(self.attrs.get("off_value", 0.0))

    @property
    def output_shape(self):
        return (*self.input_shapes[0], self.depth)

    def output_dtype(self, input_dtypes):
        check_dtypes(self, input_dtypes, [INTEGER])
        return np.dtype(np.float32)

    def input_differentiable(self, index: int) -> bool:
        return False

    def forward(self, params, inputs, ctx: RunContext):
        hot = inputs[0][..., None] == np.arange(self.depth)
        return np.where(hot, self.on, self.off), None

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        return [None], {}



@register
class IsFinite(Elementwise):
    """tf.math.is_finite: True where the value is neither infinite nor NaN; bool output,
    no gradient (tf.reduce_logsumexp guards its maximum with it)."""

    type_name = "is_finite"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]):
        super().__init__(name, attrs, input_shapes)
        if len(self.input_shapes) != 1:
            raise KernelError(f"kernel {name!r} (is_finite): takes 1 input, got "
                              f"{len(self.input_shapes)}")

    @property
    def output_shape(self):
        return self.input_shapes[0]

    def output_dtype(self, input_dtypes):
        check_dtypes(self, input_dtypes, [(np.float32,)])
        return np.dtype(np.bool_)

    def input_differentiable(self, index: int) -> bool:
        return False

    def forward(self, params, inputs, ctx: RunContext):
        return np.isfinite(inputs[0]), None

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        return [None], {}


@register
class Bucketize(Elementwise):
    """tf.raw_ops.Bucketize (Keras Discretization, tf.feature_column.bucketized_column): the
    index of each value's bucket, the count of `boundaries` at or below it (C++'s
    upper_bound, as TF's kernel; NaN past the last); int32 output, no gradient."""

    type_name = "bucketize"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]):
        super().__init__(name, attrs, input_shapes)
        if len(self.input_shapes) != 1:
            raise KernelError(f"kernel {name!r} (bucketize): takes 1 input, got "
                              f"{len(self.input_shapes)}")
        self.boundaries = np.asarray(self.attrs.get("boundaries", ()), np.float32)
        if self.boundaries.ndim != 1 or np.any(np.diff(self.boundaries) < 0):
            raise KernelError(f"kernel {name!r} (bucketize): boundaries must be a sorted list, "
                              f"got {self.attrs.get('boundaries')!r}")

    @property
    def output_shape(self):
        return self.input_shapes[0]

    def output_dtype(self, input_dtypes):
        check_dtypes(self, input_dtypes, [(np.float32,)])
        return np.dtype(np.int32)

    def input_differentiable(self, index: int) -> bool:
        return False

    def forward(self, params, inputs, ctx: RunContext):
        return np.searchsorted(self.boundaries, inputs[0], side="right").astype(np.int32), None

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        return [None], {}
