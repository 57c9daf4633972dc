"""The simulator's hot loops compiled (numba, `nogil`): an affine kernel's tiles (GEMM, bias,
activation, float16 rounding; their backward), SGD's dense update and float16 rounding,
loops of glibc's float32 functions (lgammaf_r, logf, tanf, powf: wafer/special_functions.py),
each one call that holds no GIL, so the executor's threads compute at once. The arithmetic
is numpy's, bit for bit: the GEMM is numpy's own `cblas_sgemm` called with the arguments
numpy's matmul passes (`wafer.blas`), and every element-wise step is the same float32
operation in the same order (no fast-math: no reassociation, no fused multiply-add).

Compiled code is cached on disk (`cache=True`): beside this file when it is writable (a
venv: `make venv` compiles it, `python -m wafer.compiled`), else (a read-only image) in a
directory of the user's under the temporary directory, unless NUMBA_CACHE_DIR says where;
`wse_sim serve` loads it in the background at start (`warm_up`), before a program arrives.
"""
from __future__ import annotations

import os
import tempfile

import numba
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from wafer.blas import NO_TRANS, ROW_MAJOR, SGEMM, TRANS
from wafer.libm import external
from wafer.precision import EXPONENT_BITS, LARGEST_BINADE, OVERFLOW_SCALE, SHIFT_FACTOR, SMALLEST_NORMAL

# activation codes of the affine tiles, whose result of a float16 value is a float16 value
# (the others' tiles run in numpy)
LINEAR, RELU, RELU6 = 0, 1, 2
CODES = {"linear": LINEAR, "relu": RELU, "relu6": RELU6}


def _in_tree_cache_writable() -> bool:
    """Whether numba can keep its cache in `__pycache__` beside this file (it creates the
    folder when Python has not: PYTHONDONTWRITEBYTECODE)."""
    here = os.path.dirname(os.path.abspath(__file__))
    pycache = os.path.join(here, "__pycache__")
    return os.access(pycache, os.W_OK) if os.path.isdir(pycache) else os.access(here, os.W_OK)


if not numba.config.CACHE_DIR and not _in_tree_cache_writable():
    numba.config.CACHE_DIR = os.path.join(tempfile.gettempdir(), f"csrun-numba-{os.getuid()}")

_MAGNITUDE = np.uint32(0x7FFFFFFF)
_SIGN = np.uint32(0x80000000)
_UNDERFLOW_SCALE = np.float32(1.0) / OVERFLOW_SCALE
_ZERO = np.float32(0.0)
_ONE = np.float32(1.0)
_SIX = np.float32(6.0)


@intrinsic
def _bits(typingctx, x):
    """A float32's bits as a uint32."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.uint32(types.float32), codegen


@intrinsic
def _float(typingctx, x):
    """A uint32's bits as a float32."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.uint32), codegen


@njit(nogil=True, cache=True, inline="always")
def round_value(x):
    """wafer.precision.round_half's arithmetic on one float32 (see its docstring)."""
    shift = _float(_bits(x) & EXPONENT_BITS)
    shift = min(max(shift, SMALLEST_NORMAL), LARGEST_BINADE) * SHIFT_FACTOR
    rounded = x + shift
    rounded = rounded - shift
    rounded = rounded * OVERFLOW_SCALE
    rounded = rounded * _UNDERFLOW_SCALE
    return _float((_bits(rounded) & _MAGNITUDE) | (_bits(x) & _SIGN))


@njit(nogil=True, cache=True)
def round_flat(x, out):
    """out[k] = x[k] rounded to float16 (1-D float32 arrays apart: `round_in_place` for
    one, whose loop is vectorised without a check of the two overlapping)."""
    for k in range(x.size):
        out[k] = round_value(x[k])


@njit(nogil=True, cache=True)
def round_in_place(x):
    """x[k] rounded to float16 in place (a 1-D float32 array)."""
    for k in range(x.size):
        x[k] = round_value(x[k])


@njit(nogil=True, cache=True)
def round_rows(x):
    """A 2-D float32 array (any strides) rounded to float16 in place."""
    rows, cols = x.shape
    for i in range(rows):
        for j in range(cols):
            x[i, j] = round_value(x[i, j])


@njit(nogil=True, cache=True, inline="always")
def _bias_row(z, b, has_bias, half):
    """z (one row's columns) + b, rounding the GEMM's and the sum's results when `half`.
    (Each case its own loop without branches: it vectorises.)"""
    if half and has_bias:
        for j in range(z.size):
            z[j] = round_value(round_value(z[j]) + b[j])
    elif half:
        for j in range(z.size):
            z[j] = round_value(z[j])
    elif has_bias:
        for j in range(z.size):
            z[j] = z[j] + b[j]


@njit(nogil=True, cache=True, inline="always")
def _activate_row(z, y, code):
    """y = activation(z) for one row's columns (y may be z)."""
    if code == RELU:  # np.maximum(z, 0): nan stays, -0 becomes 0
        for j in range(z.size):
            v = z[j]
            y[j] = v if (v > _ZERO or v != v) else _ZERO
    elif code == RELU6:  # np.clip(z, 0, 6): nan and -0 stay
        for j in range(z.size):
            v = z[j]
            y[j] = _ZERO if v < _ZERO else (_SIX if v > _SIX else v)
    else:
        for j in range(z.size):
            y[j] = z[j]


@njit(nogil=True, cache=True)
def affine_forward(x, w, b, z, y, c0, c1, has_bias, code, half):
    """Columns c0:c1 of z = x @ w (+ b), each op's result rounded to float16 when `half`,
    and of y = activation(z) (y may be z: then z holds the activation). x (rows, n) and
    w (n, units) C-contiguous; z and y (rows, units)."""
    rows, n = x.shape
    units = w.shape[1]
    SGEMM(ROW_MAJOR, NO_TRANS, NO_TRANS, rows, c1 - c0, n, _ONE, x.ctypes.data, n,
          w.ctypes.data + 4 * c0, units, _ZERO, z.ctypes.data + 4 * c0, units)
    bias = b[c0:c1] if has_bias else b
    for i in range(rows):
        zi = z[i, c0:c1]
        _bias_row(zi, bias, has_bias, half)
        _activate_row(zi, y[i, c0:c1], code)


@njit(nogil=True, cache=True)
def affine_gradient(dy, z, y, dz, bias_sum, has_bias, code):
    """dz = dy x activation'(z or y), and when `has_bias` bias_sum = dz summed over rows
    in row order (numpy's dz.sum(axis=0)). (The coded activations' gradients of float16
    values are float16 values: no rounding.)"""
    rows, units = dy.shape
    for i in range(rows):
        d, out = dy[i], dz[i]
        if code == RELU:  # np.multiply(dy, y > 0)
            yi = y[i]
            for j in range(units):
                out[j] = d[j] * (_ONE if yi[j] > _ZERO else _ZERO)
        elif code == RELU6:  # np.multiply(dy, (z > 0) & (z < 6))
            zi = z[i]
            for j in range(units):
                out[j] = d[j] * (_ONE if (zi[j] > _ZERO and zi[j] < _SIX) else _ZERO)
        else:
            for j in range(units):
                out[j] = d[j]
    if has_bias:
        bias_sum[:] = dz[0]
        for i in range(1, rows):
            row = dz[i]
            for j in range(units):
                bias_sum[j] = bias_sum[j] + row[j]


@njit(nogil=True, cache=True)
def weight_gradient(x, dz, grad, scratch, r0, r1, add):
    """Rows r0:r1 of x.T @ dz, into grad (or, when `add`, into scratch then added to grad).
    x (rows, n), dz (rows, units), grad and scratch (n, units): C-contiguous."""
    rows, n = x.shape
    units = dz.shape[1]
    out = scratch if add else grad
    SGEMM(ROW_MAJOR, TRANS, NO_TRANS, r1 - r0, units, rows, _ONE, x.ctypes.data + 4 * r0, n,
          dz.ctypes.data, units, _ZERO, out.ctypes.data + 4 * r0 * units, units)
    if add:
        for i in range(r0, r1):
            for j in range(units):
                grad[i, j] = grad[i, j] + scratch[i, j]


@njit(nogil=True, cache=True)
def input_gradient(dz, w, dx, c0, c1):
    """Columns c0:c1 of dx = dz @ w.T. dz (rows, units), w (n, units), dx (rows, n):
    C-contiguous."""
    rows, units = dz.shape
    n = w.shape[0]
    SGEMM(ROW_MAJOR, NO_TRANS, TRANS, rows, c1 - c0, units, _ONE, dz.ctypes.data, units,
          w.ctypes.data + 4 * c0 * units, units, _ZERO, dx.ctypes.data + 4 * c0, n)


@njit(nogil=True, cache=True)
def sgd_update(var, grad, lr, half, round_gradient, round_var):
    """SGD's update var -= g * lr (wafer.optimizers.SGD: the product rounded to float32,
    then the difference) of 1-D float32 arrays in one pass; g is the gradient rounded to
    float16 when `round_gradient` (grad itself is left as it is), and when `round_var`
    half = the new var rounded to float16 (a float16 layer's operands for the next batch).
    (Each case its own loop without branches: it vectorises.)"""
    if round_gradient and round_var:
        for k in range(var.size):
            v = var[k] - round_value(grad[k]) * lr
            var[k] = v
            half[k] = round_value(v)
    elif round_var:
        for k in range(var.size):
            v = var[k] - grad[k] * lr
            var[k] = v
            half[k] = round_value(v)
    elif round_gradient:
        for k in range(var.size):
            var[k] = var[k] - round_value(grad[k]) * lr
    else:
        for k in range(var.size):
            var[k] = var[k] - grad[k] * lr


# glibc's functions the special functions call (wafer/special_functions.py): lgammaf_r (what
# Eigen's lgamma calls; the sign through a pointer), logf, tanf, powf
_LGAMMAF_R = external("lgammaf_r", types.float32(types.float32, types.intp))
_LOGF = external("logf", types.float32(types.float32))
_TANF = external("tanf", types.float32(types.float32))
_POWF = external("powf", types.float32(types.float32, types.float32))
LIBM_UNARY = {"lgammaf": 0, "logf": 1, "tanf": 2}  # libm_unary's codes


@njit(nogil=True, cache=True)
def libm_unary(code, x, out):
    """out = glibc's lgammaf (code 0), logf (1) or tanf (2) of every element of 1-D x."""
    sign = np.zeros(1, np.int32)
    for k in range(x.size):
        if code == 0:
            out[k] = _LGAMMAF_R(x[k], sign.ctypes.data)
        elif code == 1:
            out[k] = _LOGF(x[k])
        else:
            out[k] = _TANF(x[k])


@njit(nogil=True, cache=True)
def libm_pow(x, y, out):
    """out = glibc's powf(x, y) of every element of 1-D x."""
    for k in range(x.size):
        out[k] = _POWF(x[k], y)


def libm(name: str, x: np.ndarray, y: float | None = None) -> np.ndarray:
    """glibc's float32 `name` (lgammaf, logf, tanf; powf with its exponent y) of every element
    of x, compiled."""
    flat = np.ascontiguousarray(x, np.float32).reshape(-1)
    out = np.empty_like(flat)
    if name == "powf":
        libm_pow(flat, np.float32(y), out)
    else:
        libm_unary(LIBM_UNARY[name], flat, out)
    return out.reshape(np.shape(x))


def warm_up() -> None:
    """Load (the first time: compile) every function for the arrays the simulator passes."""
    x, w = np.ones((32, 32), np.float32), np.ones((32, 32), np.float32)
    z, dz, grad, scratch = (np.zeros((32, 32), np.float32) for _ in range(4))
    bias = np.ones(32, np.float32)
    for half in (False, True):
        affine_forward(x, w, bias, z, z, 0, 32, True, RELU, half)
    affine_gradient(x, z, z, dz, bias, True, RELU)
    affine_gradient(x[:, :16], z[:, :16], z[:, :16], dz[:, :16], bias[:16], True, RELU)
    for add in (False, True):
        weight_gradient(x, dz, grad, scratch, 0, 32, add)
    input_gradient(dz, w, grad, 0, 32)
    for rounding in ((False, False), (True, True), (False, True), (True, False)):
        sgd_update(x.reshape(-1), z.reshape(-1), np.float32(0.5), dz.reshape(-1), *rounding)
    round_flat(x.reshape(-1), z.reshape(-1))
    round_in_place(x.reshape(-1))
    round_rows(x[:, :16])
    for name in LIBM_UNARY:
        libm(name, bias)
    libm("powf", bias, -2.0)


if __name__ == "__main__":
    warm_up()
