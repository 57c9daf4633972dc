"""log Γ, digamma and trigamma in float32 as TensorFlow's CPU kernels compute them.

Lgamma is Eigen's `lgamma`, which calls glibc's `lgammaf_r`: the CS calls glibc's `lgammaf`
(wafer/libm.py). Digamma is Eigen's `digamma_impl<float>` (Cephes' psi: the reflection
π / tan(πx) for x <= 0, the recurrence ψ(x + 1) = ψ(x) + 1/x up to 10, then the asymptotic
series), and Polygamma(1, x), Digamma's gradient, is Eigen's `polygamma_impl`: exp(lgamma(2))
· (-1)² · `zeta_impl<float>`(2, x) (Cephes' Hurwitz zeta: 10 terms, then Euler-Maclaurin),
= ζ(2, x) exactly. Each float32 operation here is the one Eigen's scalar code does, in its
order, with libm's logf, tanf and powf where Eigen calls them; numpy's masks stand for its
branches and its early exits (an element that left a loop takes no further step)."""
from __future__ import annotations

import numpy as np

from wafer.libm import elementwise, powf

F32 = np.float32
_ZERO, _HALF, _ONE = F32(0), F32(0.5), F32(1)
_PI = F32(np.pi)
_MACHEP = F32(5.9604644775390625e-8)  # cephes_helper<float>::machep(): epsilon / 2
# digamma_impl_maybe_poly<float>'s A, highest power first
_PSI_SERIES = np.array([-4.16666666666666666667e-3, 3.96825396825396825397e-3,
                        -8.33333333333333333333e-3, 8.33333333333333333333e-2], F32)
# zeta_impl's A: (2j)! / B_2j
_ZETA_SERIES = np.array([12.0, -720.0, 30240.0, -1209600.0, 47900160.0,
                         -1.8924375803183791606e9, 7.47242496e10, -2.950130727918164224e12,
                         1.1646782814350067249e14, -4.5979787224074726105e15,
                         1.8152105401943546773e17, -7.1661652561756670113e18], F32)


def lgamma(x: np.ndarray) -> np.ndarray:
    """log |Γ(x)| (glibc's lgammaf of every element; a subnormal x, which TF's threads read
    as 0 (DAZ) but glibc does not, differs)."""
    with np.errstate(all="ignore"):
        return elementwise("lgammaf", x)


def digamma(x: np.ndarray) -> np.ndarray:
    """ψ(x), Eigen's digamma_impl<float>: nan at 0, the negative integers and -inf."""
    x = np.asarray(x, F32)
    with np.errstate(all="ignore"):
        negative = x <= _ZERO
        p = np.floor(x)
        pole = negative & (p == x)
        nz = x - p
        past_half = negative & (nz != _HALF) & (nz > _HALF)
        p = np.where(past_half, p + _ONE, p)
        nz = np.where(past_half, x - p, nz)
        tangent = negative & ~pole & (nz != _HALF)
        reflection = np.zeros_like(x)
        if tangent.any():
            reflection[tangent] = _PI / elementwise("tanf", _PI * nz[tangent])
        s = np.where(negative, _ONE - x, x)
        w = np.zeros_like(x)
        below = s < F32(10)
        while below.any():
            w = np.where(below, w + _ONE / s, w)
            s = np.where(below, s + _ONE, s)
            below = s < F32(10)
        z = _ONE / (s * s)
        series = np.full_like(x, _PSI_SERIES[0])
        for c in _PSI_SERIES[1:]:
            series = series * z + c
        y = np.where(s < F32(1e8), z * series, _ZERO)
        y = elementwise("logf", s) - _HALF / s - y - w
        y = np.where(negative, y - reflection, y)
        return np.where(pole, F32(np.nan), y).astype(F32)


def trigamma(q: np.ndarray) -> np.ndarray:
    """ψ'(q) = Polygamma(1, q) = ζ(2, q), Eigen's zeta_impl<float>(2, q): inf at 0 and the
    negative integers."""
    q = np.asarray(q, F32)
    x = F32(2)
    with np.errstate(all="ignore"):
        s = powf(q, -2.0)
        a, b = q.copy(), np.zeros_like(q)
        done = np.zeros(q.shape, bool)
        for _ in range(9):  # zeta_impl_series<float>
            a = np.where(done, a, a + _ONE)
            b = np.where(done, b, powf(a, -2.0))
            s = np.where(done, s, s + b)
            done |= np.abs(b / s) < _MACHEP
        done |= b == _ZERO
        w = a
        s = np.where(done, s, s + b * w / (x - _ONE))
        s = np.where(done, s, s - _HALF * b)
        a, k = np.ones_like(q), np.zeros_like(q)
        for coefficient in _ZETA_SERIES:  # Euler-Maclaurin
            a = np.where(done, a, a * (x + k))
            b = np.where(done, b, b / w)
            t = a * b / coefficient
            s = np.where(done, s, s + t)
            done |= np.abs(t / s) < _MACHEP
            k = np.where(done, k, k + _ONE)
            a = np.where(done, a, a * (x + k))
            b = np.where(done, b, b / w)
            k = np.where(done, k, k + _ONE)
        pole = (q <= _ZERO) & (q == np.floor(q))
        return np.where(pole, F32(np.inf), s).astype(F32)
