"""exp in float32 as TensorFlow 2.21's CPU kernels compute it (Exp, Elu, Selu, Softmax,
LogSoftmax): Eigen's pexp_float on packets of 8 floats, and libm's expf (std::exp) on the
scalar path, for the elements after a tensor's last whole packet.

The wheel's Eigen is compiled for AVX without FMA, so every pmadd is a multiply and an add,
each rounding; TF's threads flush denormal results (FTZ). Neither depends on the CPU the
wheel runs on. Measured bit-equal to tf.exp on 700,000 float32 arguments of every regime,
both clamps, infinities, nan, and every tail length (tests/wafer/test_eigen_exp.py);
numpy's np.exp agrees on 71 % of them. Compiled (numba, no fast-math): about as fast as np.exp.
"""
from __future__ import annotations

import numpy as np
from numba import njit, types

from wafer.compiled import _float
from wafer.libm import external

F32 = np.float32
PACKET = 8  # floats in one of the wheel's packets (AVX's Packet8f)
TINY = F32(np.finfo(np.float32).tiny)
LOG2E = F32(1.44269504088896341)
LN2_HI, LN2_LO = F32(-0.693359375), F32(2.12194440e-4)  # Cephes' C1, C2: m*ln2 in two parts
_ONE, _HALF = F32(1.0), F32(0.5)
_HI, _LO = F32(88.723), F32(-104.0)  # x clamped to _HI; below _LO, zero
# exp(r) ~ 1 + r + r^2 (p2 + r p3 + r^2 p4 + r^3 p5 + r^4 p6), Eigen's minimax polynomial
_P2, _P3, _P4, _P5, _P6 = (F32(0.49999988079071044921875), F32(0.16666518151760101318359375),
                           F32(4.166965186595916748046875e-2), F32(8.36894474923610687255859375e-3),
                           F32(1.37449637986719608306884765625e-3))
_ZERO = F32(0)
_EXPF = external("expf", types.float32(types.float32))


def flush(v: np.ndarray) -> np.ndarray:
    """Denormals to zeros of their sign, in place (FTZ, DAZ)."""
    np.copyto(v, np.copysign(F32(0), v), where=np.abs(v) < TINY)
    return v


@njit(nogil=True, cache=True, inline="always")
def _packet_exp(v):
    """pexp_float of one value: m = floor(x log2(e) + 1/2), r = x - m ln2 in two parts, a
    degree-6 polynomial of r, times 2^m (pldexp: three factors 2^b, b = m >> 2, then
    2^(m - 3b); normal up to the last product, which is flushed), max with x; zero below
    -104. Each operation rounds as the unfused AVX code's (numba: no fast-math)."""
    c = v if v < _HI else _HI  # (nan: any c, the result is v)
    c = c if c > _LO else _LO
    m = np.floor(c * LOG2E + _HALF)
    r = m * LN2_HI + c
    r = m * LN2_LO + r
    r2 = r * r
    even = r2 * _P6 + _P4
    odd = r2 * _P5 + _P3
    even = r2 * even + _P2
    y = r * odd + even
    y = r2 * y + (r + _ONE)
    e = np.int32(m)
    b = e >> 2
    scale = _float(np.uint32((b + 127) << 23))
    y = y * scale
    y = y * scale
    y = y * scale
    y = y * _float(np.uint32((e - 3 * b + 127) << 23))
    y = y if y >= TINY else _ZERO
    y = y if y >= v else v  # +inf, nan
    return y if v >= _LO or v != v else _ZERO


@njit(nogil=True, cache=True)
def _exp(x, out, row, tail):
    """out = exp of 1-D float32 x; in each `row` of x its last `tail` values on Eigen's
    scalar path (libm's expf, flushed), the others on its packet path."""
    for start in range(0, x.size, row):
        for k in range(start, start + row - tail):
            out[k] = _packet_exp(x[k])
        for k in range(start + row - tail, start + row):
            y = _EXPF(x[k])
            out[k] = y if y >= TINY or y != y else _ZERO


def exp(x: np.ndarray, tail: int | None = None) -> np.ndarray:
    """exp of float32 x as TF's CPU kernels: the packet path, and the scalar path for the last
    `tail` elements in C order (None: x is TF's whole tensor, whose last size mod 8 take it)."""
    flat = np.ascontiguousarray(x, F32).reshape(-1)
    out = np.empty_like(flat)
    if flat.size:
        _exp(flat, out, flat.size, flat.size % PACKET if tail is None else tail)
    return out.reshape(np.shape(x))


def exp_rows(x: np.ndarray) -> np.ndarray:
    """exp of float32 x as an Eigen reduction along the last axis reads it (LogSoftmax's
    sum of exp): packets from each row's start, the scalar path for each row's last
    (length mod 8) elements."""
    flat = np.ascontiguousarray(x, F32).reshape(-1)
    out = np.empty_like(flat)
    if flat.size:
        _exp(flat, out, x.shape[-1], x.shape[-1] % PACKET)
    return out.reshape(x.shape)
