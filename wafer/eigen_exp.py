"""exp in float32 as TensorFlow 2.21's CPU kernels compute it (Exp, Elu, Selu, Softmax,
LogSoftmax): Eigen's pexp_float on packets of 8 floats, and libm's expf (std::exp) on the
scalar path, for the elements after a tensor's last whole packet.

The wheel's Eigen is compiled for AVX without FMA, so every pmadd is a multiply and an add,
each rounding; TF's threads flush denormal results (FTZ). Neither depends on the CPU the
wheel runs on. Measured bit-equal to tf.exp on 700,000 float32 arguments of every regime,
both clamps, infinities, nan, and every tail length (tests/wafer/test_eigen_exp.py);
numpy's np.exp agrees on 71 % of them.
"""
from __future__ import annotations

import numpy as np

from wafer.libm import scalar

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
_expf = scalar("expf")


def flush(v: np.ndarray) -> np.ndarray:
    """Denormals to zeros of their sign, in place (FTZ, DAZ)."""
    np.copyto(v, np.copysign(F32(0), v), where=np.abs(v) < TINY)
    return v


def _power_of_two(e: np.ndarray) -> np.ndarray:
    return ((e + 127) << 23).view(F32)


def exp_packet(x: np.ndarray) -> np.ndarray:
    """pexp_float: m = floor(x log2(e) + 1/2), r = x - m ln2 in two parts, a degree-6
    polynomial of r, times 2^m (pldexp: in four factors, flushed), max with x (nan, inf)."""
    x = np.asarray(x, F32)
    with np.errstate(invalid="ignore", over="ignore"):
        clamped = np.minimum(x, _HI)
        m = np.floor(clamped * LOG2E + _HALF)
        r = m * LN2_HI + clamped
        r += m * LN2_LO
        r2 = r * r
        even = r2 * _P6 + _P4
        odd = r2 * _P5 + _P3
        even = r2 * even + _P2
        y = r * odd + even
        y *= r2
        y += r + _ONE
        # pldexp_generic (a packet with |x| > 87; exact, as pldexp_fast, for the others):
        # e = clip(m, +-278), b = e >> 2, ((y 2^b) 2^b) 2^b, times 2^(e - 3b); the product
        # is normal until the last (x >= -104), which is flushed (nan's m: y stays nan)
        e = np.clip(m, -278, 278).astype(np.int32)
        b = e >> 2
        scale = _power_of_two(b)
        y *= scale
        y *= scale
        y *= scale
        y *= _power_of_two(e - 3 * b)
        y[y < TINY] = 0
        np.maximum(y, x, out=y)  # nan for nan; y is inf for +inf
        y[x < _LO] = 0
    return y


def exp_scalar(x: np.ndarray) -> np.ndarray:
    """Eigen's scalar path: libm's expf of each element, flushed."""
    x = np.asarray(x, F32)
    return flush(np.array([_expf(v) for v in x.ravel()], F32)).reshape(x.shape)


def exp(x: np.ndarray, tail: int | None = None) -> np.ndarray:
    """exp of float32 x as TF's CPU kernels: the packet path, and the scalar path for the last
    `tail` elements in C order (None: x is TF's whole tensor, whose last size mod 8 take it)."""
    x = np.asarray(x, F32)
    y = exp_packet(x)
    tail = x.size % PACKET if tail is None else tail
    if tail:
        y.reshape(-1)[-tail:] = exp_scalar(x.reshape(-1)[-tail:])
    return y


def exp_rows(x: np.ndarray) -> np.ndarray:
    """exp of float32 x as an Eigen reduction along the last axis reads it (LogSoftmax's
    sum of exp): packets from each row's start, the scalar path for each row's last
    (length mod 8) elements."""
    y = exp_packet(x)
    tail = x.shape[-1] % PACKET
    if tail and y.size:
        y[..., -tail:] = exp_scalar(x[..., -tail:])
    return y
