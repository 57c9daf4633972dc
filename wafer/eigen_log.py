"""log, log1p and expm1 in float32 as TensorFlow 2.21's CPU kernels compute them (Log,
Log1p, Expm1, LogSoftmax's log of the row sums, Softplus's log1p): Eigen's plog_float,
generic_log1p and generic_expm1 on packets of 8 (the wheel's AVX without FMA: every
multiply-add rounds twice; the same on every CPU), and libm's logf, log1pf, expm1f on the
scalar path for the values after the tensor's last whole packet; denormal arguments are
zeros (DAZ). Bit-equal to TF's on 1.5 million arguments (tests/wafer/test_eigen_exp.py)."""
from __future__ import annotations

import numpy as np
from numba import njit, types

from wafer.compiled import _bits, _float
from wafer.eigen_exp import exp
from wafer.libm import external, scalar

F32 = np.float32
_ZERO, _ONE = F32(0), F32(1)
_INF, _NAN = F32(np.inf), F32(np.nan)
_TINY = F32(np.finfo(np.float32).tiny)
_SQRT_HALF = F32(0.707106781186547524)
_LN2 = F32(0.693147180559945309417232121458176568075500134360255254120680009493393621)
# log(1 + r) ~ r p(r) / q(r) on [sqrt(1/2) - 1, sqrt(2) - 1], highest power first
_P0, _P1, _P2 = F32(0.18256296349849254), F32(1.0000000190281063), F32(1.0000000190281136)
_Q0, _Q1, _Q2, _Q3 = (F32(0.049616247954120038), F32(0.59923249590823520), F32(1.4999999999999927),
                      F32(1.0))
_LOGF = external("logf", types.float32(types.float32))
_LOG1PF = external("log1pf", types.float32(types.float32))
_expm1f = scalar("expm1f")


@njit(nogil=True, cache=True, inline="always", error_model="numpy")
def _log_value(v):
    """plog_float of one value: v = m 2^e with m in [sqrt(1/2), sqrt(2)) (pfrexp's bits),
    log(m) by a 2/3-degree rational function of m - 1, plus e ln2; -inf for 0 and denormals
    (DAZ), inf for inf, nan for negatives and nan. Each operation rounds as the unfused AVX
    code's (numba: no fast-math)."""
    bits = _bits(v)
    m = _float((bits & np.uint32(0x807FFFFF)) | np.uint32(0x3F000000))
    e = F32(np.int32((bits >> np.uint32(23)) & np.uint32(0xFF)) - 126)
    if m < _SQRT_HALF:
        e = e - _ONE
        r = (m - _ONE) + m
    else:
        r = (m - _ONE) + _ZERO
    p = (_P0 * r + _P1) * r + _P2
    p = r * p
    q = ((_Q0 * r + _Q1) * r + _Q2) * r + _Q3
    y = e * _LN2 + p / q
    if v == _INF:
        return v
    if abs(v) < _TINY:  # zeros, denormals (DAZ)
        return -_INF
    return y if v >= _ZERO else _NAN  # (negative, nan)


@njit(nogil=True, cache=True, inline="always")
def _daz(v):
    """A denormal as a zero of its sign (DAZ)."""
    return v if abs(v) >= _TINY or v != v else v * _ZERO


@njit(nogil=True, cache=True, inline="always", error_model="numpy")
def _log1p_value(v):
    """generic_log1p of one value: v log(1 + v) / ((1 + v) - 1), v where 1 + v is 1 or inf."""
    v = _daz(v)
    v1 = v + _ONE
    log1 = _log_value(v1)
    if v1 == _ONE or v1 == log1:
        return v
    return v * (log1 / (v1 - _ONE))


@njit(nogil=True, cache=True, error_model="numpy")
def _apply(x, out, code, start):
    """out = plog_float (code 0) or generic_log1p (1) of 1-D float32 x, and libm's logf or
    log1pf from index `start` on (the scalar path)."""
    for k in range(x.size):
        v = _daz(x[k])
        if k >= start:
            out[k] = _LOGF(v) if code == 0 else _LOG1PF(v)
        else:
            out[k] = _log_value(v) if code == 0 else _log1p_value(v)


def _with_tail(code: int, x: np.ndarray, tail: int | None) -> np.ndarray:
    flat = np.ascontiguousarray(x, F32).reshape(-1)
    out = np.empty_like(flat)
    if flat.size:
        tail = flat.size % 8 if tail is None else tail
        _apply(flat, out, code, flat.size - tail)
    return out.reshape(np.shape(x))


def log(x: np.ndarray, tail: int | None = None) -> np.ndarray:
    """log of float32 x as TF's CPU kernels: the packet path, and libm's logf for the last
    `tail` values in C order (None: x is TF's whole tensor, its last size mod 8)."""
    return _with_tail(0, x, tail)


def log1p(x: np.ndarray, tail: int | None = None) -> np.ndarray:
    """log1p of float32 x as TF's CPU kernels: the packet path, and libm's log1pf for the
    last `tail` values (None: the last size mod 8)."""
    return _with_tail(1, x, tail)


def expm1_packet(x: np.ndarray) -> np.ndarray:
    """generic_expm1 (Kahan's): u = exp(x); x where u is 1, -1 where u - 1 is, u where u is
    inf, else (u - 1) (x / log(u)), Eigen's exp and log."""
    x = np.asarray(x, F32)
    u = exp(x, 0)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        log_u = log(np.where(u > 0, u, _ONE), 0)
        u_minus_one = u - _ONE
        y = u_minus_one * (x / log_u)
    y = np.where(u == log_u, u, y)
    return np.where(u == _ONE, x, np.where(u_minus_one == -_ONE, -_ONE, y))


def expm1(x: np.ndarray, tail: int | None = None) -> np.ndarray:
    """expm1 of float32 x as TF's CPU kernels: the packet path, and libm's expm1f for the last
    `tail` values (None: the last size mod 8)."""
    x = np.asarray(x, F32)
    y = expm1_packet(x)
    tail = x.size % 8 if tail is None else tail
    if tail:
        y.reshape(-1)[-tail:] = [_expm1f(v) for v in x.reshape(-1)[-tail:]]
    return y
