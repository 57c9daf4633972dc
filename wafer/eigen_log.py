"""log, log1p and expm1 in float32 as TensorFlow 2.21's CPU kernels compute them where the
argument is a sum of exps (LogSoftmax's log of each row's sum) or an exp (Softplus's log1p),
and Expm1: Eigen's plog_float, generic_log1p and generic_expm1 on packets of 8 (the wheel's AVX without FMA: every
multiply-add rounds twice; the same on every CPU), and libm's logf, log1pf, expm1f on the scalar
path for the values after the tensor's last whole packet (tests/wafer/test_eigen_exp.py)."""
from __future__ import annotations

import numpy as np

from wafer.eigen_exp import exp, flush
from wafer.libm import scalar

F32 = np.float32
_ONE = F32(1)
_TINY = F32(np.finfo(np.float32).tiny)
_SQRT_HALF = F32(0.707106781186547524)
_LN2 = F32(0.693147180559945309417232121458176568075500134360255254120680009493393621)
# log(1 + x) ~ x p(x) / q(x) on [sqrt(1/2) - 1, sqrt(2) - 1], highest power first
_P = tuple(F32(c) for c in (0.18256296349849254, 1.0000000190281063, 1.0000000190281136))
_SCALAR = {"logf": scalar("logf"), "log1pf": scalar("log1pf"), "expm1f": scalar("expm1f")}
_Q = tuple(F32(c) for c in (0.049616247954120038, 0.59923249590823520, 1.4999999999999927, 1.0))


def _horner(x: np.ndarray, coefficients: tuple[np.float32, ...]) -> np.ndarray:
    value = np.full_like(x, coefficients[0])
    for c in coefficients[1:]:
        value = value * x + c
    return value


def log_packet(x: np.ndarray) -> np.ndarray:
    """plog_float: x = m 2^e with m in [sqrt(1/2), sqrt(2)), log(m) by a 2/3-degree rational
    function of m - 1, plus e ln2; -inf for 0 (and denormals: DAZ), inf for inf, nan for
    negatives and nan."""
    x = np.asarray(x, F32)
    with np.errstate(all="ignore"):  # (nan, inf, 0: selected below)
        m, e = np.frexp(x)
        low = m < _SQRT_HALF
        e = (e - low).astype(F32)
        r = (m - _ONE) + np.where(low, m, F32(0))
        p = r * _horner(r, _P)
        y = e * _LN2 + p / _horner(r, _Q)
        y = np.where(x == np.inf, x, np.where((x < 0) | np.isnan(x), np.nan, y))
    return np.where(np.abs(x) < _TINY, F32(-np.inf), y).astype(F32)


def log1p_packet(x: np.ndarray) -> np.ndarray:
    """generic_log1p of float32 x: x log(1 + x) / ((1 + x) - 1),
    and x where 1 + x is 1 or inf (denormal x: 0, DAZ)."""
    x = flush(np.array(x, F32))
    with np.errstate(all="ignore"):
        x1 = x + _ONE
        log1 = log_packet(x1)
        large = x * (log1 / (x1 - _ONE))
    return np.where((x1 == _ONE) | (x1 == log1), x, large)


def log(x: np.ndarray, tail: int | None = None) -> np.ndarray:
    """log of float32 x as TF's CPU kernels: the packet path, and libm's logf
    for the last `tail` values in C order (None: x is TF's whole tensor, its last size mod 8)."""
    return _with_tail(log_packet, "logf", x, tail)


def log1p(x: np.ndarray, tail: int | None = None) -> np.ndarray:
    """log1p of float32 x as TF's CPU kernels: the packet path, and
    libm's log1pf for the last `tail` values (None: the last size mod 8)."""
    return _with_tail(log1p_packet, "log1pf", x, tail)


def expm1_packet(x: np.ndarray) -> np.ndarray:
    """generic_expm1 (Kahan's): u = exp(x); x where u is 1, -1 where u - 1 is, u where u is
    inf, else (u - 1) (x / log(u)), Eigen's exp and log."""
    x = np.asarray(x, F32)
    u = exp(x, 0)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        log_u = log_packet(np.where(u > 0, u, _ONE))
        u_minus_one = u - _ONE
        y = u_minus_one * (x / log_u)
    y = np.where(u == log_u, u, y)
    return np.where(u == _ONE, x, np.where(u_minus_one == -_ONE, -_ONE, y))


def expm1(x: np.ndarray, tail: int | None = None) -> np.ndarray:
    """expm1 of float32 x as TF's CPU kernels: the packet path, and libm's expm1f for the last
    `tail` values (None: the last size mod 8)."""
    return _with_tail(expm1_packet, "expm1f", x, tail)


def _with_tail(packet, name: str, x: np.ndarray, tail: int | None) -> np.ndarray:
    x = np.asarray(x, F32)
    y = packet(x)
    tail = x.size % 8 if tail is None else tail
    if tail:
        y.reshape(-1)[-tail:] = [_SCALAR[name](v) for v in x.reshape(-1)[-tail:]]
    return y
