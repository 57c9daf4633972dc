"""log Γ, digamma, trigamma and the exponentially scaled Bessel functions I0e and I1e in
float32 as TensorFlow's CPU kernels compute them.

Lgamma is Eigen's `lgamma`, which calls glibc's `lgammaf_r`: so does the CS
(wafer/compiled.py's `libm`). Digamma is Eigen's `digamma_impl<float>` (Cephes' psi: the reflection
π / tan(πx) for x <= 0, the recurrence ψ(x + 1) = ψ(x) + 1/x up to 10, then the asymptotic
series), and Polygamma(1, x), Digamma's gradient, is Eigen's `polygamma_impl`: exp(lgamma(2))
· (-1)² · `zeta_impl<float>`(2, x) (Cephes' Hurwitz zeta: 10 terms, then Euler-Maclaurin),
= ζ(2, x) exactly. Each float32 operation here is the one Eigen's scalar code does, in its
order, with libm's logf, tanf and powf where Eigen calls them; numpy's masks stand for its
branches and its early exits (an element that left a loop takes no further step).
BesselI0e and BesselI1e are Eigen's generic_i0e/i1e<float> (Cephes' Chebyshev series)."""
from __future__ import annotations

import numpy as np

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


def libm(name: str, x: np.ndarray, y: float | None = None) -> np.ndarray:
    """wafer.compiled.libm, imported on first use (numba's import is the simulator's alone)."""
    from wafer import compiled

    return compiled.libm(name, x, y)


def lgamma(x: np.ndarray) -> np.ndarray:
    """log |Γ(x)| (glibc's lgammaf_r of every element; a subnormal x, which TF's threads read
    as 0 (DAZ) but glibc does not, differs)."""
    with np.errstate(all="ignore"):
        return libm("lgammaf", x)


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
            reflection[tangent] = _PI / libm("tanf", _PI * nz[tangent])
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
        y = libm("logf", s) - _HALF / s - y - w
        y = np.where(negative, y - reflection, y)
        return np.where(pole, F32(np.nan), y).astype(F32)


def trigamma(q: np.ndarray) -> np.ndarray:
    """ψ'(q) = Polygamma(1, q) = ζ(2, q), Eigen's zeta_impl<float>(2, q): inf at 0 and the
    negative integers."""
    q = np.asarray(q, F32)
    x = F32(2)
    with np.errstate(all="ignore"):
        s = libm("powf", q, -2.0)
        a, b = q.copy(), np.zeros_like(q)
        done = np.zeros(q.shape, bool)
        for _ in range(9):  # zeta_impl_series<float>
            a = np.where(done, a, a + _ONE)
            b = np.where(done, b, libm("powf", a, -2.0))
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


# generic_i0e<float> and generic_i1e<float>'s Chebyshev coefficients (Cephes' i0ef, i1ef):
# A for |x| <= 8 at |x| / 2 - 2, B beyond at 32 / |x| - 2
_I0E_A = np.array([-1.30002500998624804212e-8, 6.04699502254191894932e-8, -2.67079385394061173391e-7,
                   1.11738753912010371815e-6, -4.41673835845875056359e-6, 1.64484480707288970893e-5,
                   -5.75419501008210370398e-5, 1.88502885095841655729e-4, -5.76375574538582365885e-4,
                   1.63947561694133579842e-3, -4.32430999505057594430e-3, 1.05464603945949983183e-2,
                   -2.37374148058994688156e-2, 4.93052842396707084878e-2, -9.49010970480476444210e-2,
                   1.71620901522208775349e-1, -3.04682672343198398683e-1, 6.76795274409476084995e-1], F32)
_I0E_B = np.array([3.39623202570838634515e-9, 2.26666899049817806459e-8, 2.04891858946906374183e-7,
                   2.89137052083475648297e-6, 6.88975834691682398426e-5, 3.36911647825569408990e-3,
                   8.04490411014108831608e-1], F32)
_I1E_A = np.array([9.38153738649577178388e-9, -4.44505912879632808065e-8, 2.00329475355213526229e-7,
                   -8.56872026469545474066e-7, 3.47025130813767847674e-6, -1.32731636560394358279e-5,
                   4.78156510755005422638e-5, -1.61760815825896745588e-4, 5.12285956168575772895e-4,
                   -1.51357245063125314899e-3, 4.15642294431288815669e-3, -1.05640848946261981558e-2,
                   2.47264490306265168283e-2, -5.29459812080949914269e-2, 1.02643658689847095384e-1,
                   -1.76416518357834055153e-1, 2.52587186443633654823e-1], F32)
_I1E_B = np.array([-3.83538038596423702205e-9, -2.63146884688951950684e-8, -2.51223623787020892529e-7,
                   -3.88256480887769039346e-6, -1.10588938762623716291e-4, -9.76109749136146840777e-3,
                   7.78576235018280120474e-1], F32)


def _chebyshev(x: np.ndarray, coefficients: np.ndarray) -> np.ndarray:
    """Eigen's pchebevl: b0 = x * b1 + c - b2 (a multiply, then the adds: no FMA), then
    0.5 * (b0 - b2)."""
    b0, b1, b2 = np.full_like(x, coefficients[0]), np.zeros_like(x), np.zeros_like(x)
    for c in coefficients[1:]:
        b2, b1 = b1, b0
        b0 = x * b1 + c - b2
    return _HALF * (b0 - b2)


def _scaled_bessel(x: np.ndarray, small: np.ndarray,
                   large: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(|x|, the series of `small` coefficients to |x| = 8 and of `large` beyond)."""
    y = np.abs(x)
    with np.errstate(all="ignore"):
        near = _chebyshev(_HALF * y + F32(-2), small)
        far = _chebyshev(F32(32) / y - F32(2), large) * (_ONE / np.sqrt(y))
    return y, np.where(y <= F32(8), near, far)


def bessel_i0e(x: np.ndarray) -> np.ndarray:
    """exp(-|x|) I0(x), Eigen's generic_i0e<float> (beyond |x| = 8 TF's vectorised path takes
    Eigen's approximate reciprocal square root: within a few ulp of this exact one)."""
    _, value = _scaled_bessel(np.asarray(x, F32), _I0E_A, _I0E_B)
    return value.astype(F32)


def bessel_i1e(x: np.ndarray) -> np.ndarray:
    """exp(-|x|) I1(x), Eigen's generic_i1e<float> (the same approximation beyond 8)."""
    x = np.asarray(x, F32)
    y, value = _scaled_bessel(x, _I1E_A, _I1E_B)
    with np.errstate(all="ignore"):
        value = np.where(y <= F32(8), y * value, value)
    return np.where(x < _ZERO, -value, value).astype(F32)
