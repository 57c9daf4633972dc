"""log in float32 as TensorFlow 2.21's CPU kernels compute it where the argument is a sum of
exps (LogSoftmax's log of each row's sum: positive, normal): Eigen's plog_float on packets of
8 (the wheel's AVX without FMA: every multiply-add rounds twice; the same on every CPU), and
libm's logf on the scalar path for the values after the tensor's last whole packet
(tests/wafer/test_eigen_exp.py)."""
from __future__ import annotations

import numpy as np

from wafer.compiled import libm

F32 = np.float32
_ONE = F32(1)
_SQRT_HALF = F32(0.707106781186547524)
_LN2 = F32(0.693147180559945309417232121458176568075500134360255254120680009493393621)
# log(1 + x) ~ x p(x) / q(x) on [sqrt(1/2) - 1, sqrt(2) - 1], highest power first
_P = tuple(F32(c) for c in (0.18256296349849254, 1.0000000190281063, 1.0000000190281136))
_Q = tuple(F32(c) for c in (0.049616247954120038, 0.59923249590823520, 1.4999999999999927, 1.0))


def _horner(x: np.ndarray, coefficients: tuple[np.float32, ...]) -> np.ndarray:
    value = np.full_like(x, coefficients[0])
    for c in coefficients[1:]:
        value = value * x + c
    return value


def log_packet(x: np.ndarray) -> np.ndarray:
    """plog_float of positive normal float32 x: x = m 2^e with m in [sqrt(1/2), sqrt(2)),
    log(m) by a 2/3-degree rational function of m - 1, plus e ln2."""
    m, e = np.frexp(np.asarray(x, F32))
    low = m < _SQRT_HALF
    e = (e - low).astype(F32)
    r = (m - _ONE) + np.where(low, m, F32(0))
    p = r * _horner(r, _P)
    return e * _LN2 + p / _horner(r, _Q)


def log(x: np.ndarray, tail: int | None = None) -> np.ndarray:
    """log of positive normal float32 x as TF's CPU kernels: the packet path, and libm's logf
    for the last `tail` values in C order (None: x is TF's whole tensor, its last size mod 8)."""
    x = np.asarray(x, F32)
    y = log_packet(x)
    tail = x.size % 8 if tail is None else tail
    if tail:
        y.reshape(-1)[-tail:] = libm("logf", x.reshape(-1)[-tail:])
    return y
