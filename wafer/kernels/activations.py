"""Element-wise activation functions, forward and backward side by side, and the
`activation` kernel. Dense and conv2d kernels fuse the same functions.

Each function's backward reads what TensorFlow's gradient op reads (the input x or the
output y), so the arithmetic follows TF's (e.g. EluGrad and SeluGrad use the output).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from wafer.kernels.base import INTEGER, Kernel, KernelError, RunContext, check_dtypes, max_cores_for, register
from wafer.libm import scalar
from wafer.precision import is_half, round_half, round_half_
from wafer.special_functions import bessel_i0e, bessel_i1e, digamma, lgamma, trigamma

SELU_SCALE = np.float32(1.0507009873554804934193349852946)
SELU_ALPHA = np.float32(1.6732632423543772848170429916717)
_ONE = np.float32(1.0)
_TWO = np.float32(2.0)
_HALF = np.float32(0.5)
TWO_OVER_ROOT_PI = np.float32(2 / np.sqrt(np.pi))


def _relu(x, alpha, out):
    return np.maximum(x, 0, out=out)


def _relu_grad(x, y, alpha, dy, out):
    return np.multiply(dy, y > 0, out=out)


def _relu6(x, alpha, out):
    return np.clip(x, 0, 6, out=out)


def _relu6_grad(x, y, alpha, dy, out):
    return np.multiply(dy, (x > 0) & (x < 6), out=out)


def _leaky(x, alpha, out):
    return _store(np.where(x > 0, x, x * np.float32(alpha)), out)


def _leaky_grad(x, y, alpha, dy, out):
    return _store(np.where(x > 0, dy, dy * np.float32(alpha)), out)


def _elu(x, alpha, out):
    return _store(np.where(x > 0, x, np.expm1(np.minimum(x, 0))), out)


def _elu_grad(x, y, alpha, dy, out):
    return _store(np.where(y < 0, (y + _ONE) * dy, dy), out)


def _selu(x, alpha, out):
    return _store(np.where(x > 0, SELU_SCALE * x, SELU_SCALE * SELU_ALPHA * np.expm1(np.minimum(x, 0))), out)


def _selu_grad(x, y, alpha, dy, out):
    return _store(np.where(y < 0, dy * (y + SELU_SCALE * SELU_ALPHA), dy * SELU_SCALE), out)


def _tanh(x, alpha, out):
    return _store(tanh(x), out)


def _tanh_grad(x, y, alpha, dy, out):
    return _store(dy * (_ONE - y * y), out)


def _sigmoid(x, alpha, out):
    return _store(sigmoid(x), out)


def _sigmoid_grad(x, y, alpha, dy, out):
    return _store(dy * y * (_ONE - y), out)


def _softplus(x, alpha, out):
    return np.logaddexp(np.float32(0), x, out=out)


def _softplus_grad(x, y, alpha, dy, out):
    return _store(dy * _stable_sigmoid(x), out)


def _linear(x, alpha, out):
    if out is None:
        return x
    np.copyto(out, x)
    return out


def _linear_grad(x, y, alpha, dy, out):
    return _linear(dy, alpha, out)


def _neg(x, a, out):
    return np.negative(x, out=out)


def _neg_grad(x, y, a, dy, out):
    return np.negative(dy, out=out)


def _abs(x, a, out):
    return np.abs(x, out=out)


def _abs_grad(x, y, a, dy, out):  # grad * sign(x)
    return np.multiply(dy, np.sign(x), out=out)


def _square(x, a, out):
    return np.multiply(x, x, out=out)


def _square_grad(x, y, a, dy, out):  # grad * (x * 2)
    return np.multiply(dy, x * _TWO, out=out)


def _sqrt(x, a, out):
    return np.sqrt(x, out=out)


def _sqrt_grad(x, y, a, dy, out):  # SqrtGrad(y, dy): mul_no_nan(0.5 / y, dy)
    return _mul_no_nan(_HALF / y, dy, out)


def _rsqrt(x, a, out):
    return _store(_ONE / np.sqrt(x), out)


def _rsqrt_grad(x, y, a, dy, out):  # RsqrtGrad(y, dy): mul_no_nan(-0.5 * (y * y), mul_no_nan(y, dy))
    return _mul_no_nan(-_HALF * (y * y), _mul_no_nan(y, dy, None), out)


def _exp(x, a, out):
    return np.exp(x, out=out)


def _exp_grad(x, y, a, dy, out):  # grad * y
    return np.multiply(dy, y, out=out)


def _expm1(x, a, out):
    return np.expm1(x, out=out)


def _expm1_grad(x, y, a, dy, out):  # grad * exp(x)
    return np.multiply(dy, np.exp(x), out=out)


def _log(x, a, out):
    return np.log(x, out=out)


def _log_grad(x, y, a, dy, out):  # grad * reciprocal(x)
    return np.multiply(dy, _ONE / x, out=out)


def _log1p(x, a, out):
    return np.log1p(x, out=out)


def _log1p_grad(x, y, a, dy, out):  # grad * reciprocal(1 + x)
    return np.multiply(dy, _ONE / (_ONE + x), out=out)


def _reciprocal(x, a, out):
    return np.divide(_ONE, x, out=out)


def _reciprocal_grad(x, y, a, dy, out):  # ReciprocalGrad(y, dy): mul_no_nan(-(y * y), dy)
    return _mul_no_nan(-(y * y), dy, out)


def _erf(x, a, out):
    return _store(erf(x), out)


def _erf_grad(x, y, a, dy, out):  # grad * (2 / sqrt(pi)) * exp(-square(x))
    return np.multiply(dy * TWO_OVER_ROOT_PI, np.exp(-(x * x)), out=out)


def _erfc(x, a, out):  # TF's own approximation, not 1 - erf(x) (that loses GELU's x << 0 tail)
    return _store(erfc(x), out)


def _erfc_grad(x, y, a, dy, out):  # _ErfcGrad: grad * -(2 / sqrt(pi)) * exp(-square(x))
    return np.multiply(dy * -TWO_OVER_ROOT_PI, np.exp(-(x * x)), out=out)


def _sin(x, a, out):
    return np.sin(x, out=out)


def _sin_grad(x, y, a, dy, out):  # grad * cos(x)
    return np.multiply(dy, np.cos(x), out=out)


def _tan(x, a, out):
    return np.tan(x, out=out)


def _tan_grad(x, y, a, dy, out):  # _TanGrad: grad * square(reciprocal(cos(x)))
    return np.multiply(dy, np.square(np.reciprocal(np.cos(x))), out=out)


def _asin(x, a, out):
    return np.arcsin(x, out=out)


def _asin_grad(x, y, a, dy, out):  # _AsinGrad: grad * reciprocal(sqrt(1 - square(x)))
    return np.multiply(dy, np.reciprocal(np.sqrt(1 - np.square(x))), out=out)


def _acos(x, a, out):
    return np.arccos(x, out=out)


def _acos_grad(x, y, a, dy, out):  # _AcosGrad: -grad * reciprocal(sqrt(1 - square(x)))
    return np.multiply(-dy, np.reciprocal(np.sqrt(1 - np.square(x))), out=out)


def _atan(x, a, out):
    return np.arctan(x, out=out)


def _atan_grad(x, y, a, dy, out):  # _AtanGrad: grad * reciprocal(1 + square(x))
    return np.multiply(dy, np.reciprocal(1 + np.square(x)), out=out)


def _cos(x, a, out):
    return np.cos(x, out=out)


def _cos_grad(x, y, a, dy, out):  # -grad * sin(x)
    return np.multiply(-dy, np.sin(x), out=out)


def _lgamma(x, a, out):
    return _store(lgamma(x), out)


def _lgamma_grad(x, y, a, dy, out):  # _LgammaGrad: grad * digamma(x)
    return np.multiply(dy, digamma(x), out=out)


def _digamma(x, a, out):
    return _store(digamma(x), out)


def _digamma_grad(x, y, a, dy, out):  # _DigammaGrad: grad * polygamma(1, x)
    return np.multiply(dy, trigamma(x), out=out)


def _i0e(x, a, out):
    return _store(bessel_i0e(x), out)


def _i0e_grad(x, y, a, dy, out):  # _BesselI0eGrad: grad * (bessel_i1e(x) - sign(x) * y)
    return np.multiply(dy, bessel_i1e(x) - np.sign(x) * y, out=out)


def _sign(x, a, out):
    return np.sign(x, out=out)


def _zero_grad(x, y, a, dy, out):  # zeros: Sign's (TF: 0); Floor, Ceil, Round's (TF: None, no flow)
    return _store(np.zeros_like(dy), out)


def _floor(x, a, out):
    return np.floor(x, out=out)


def _ceil(x, a, out):
    return np.ceil(x, out=out)


def _round(x, a, out):  # half to even, as TF's Round and Rint
    return np.rint(x, out=out)


def _softsign(x, a, out):
    return np.divide(x, np.abs(x) + _ONE, out=out)


def _softsign_grad(x, y, a, dy, out):  # SoftsignGrad: dy / (|x| + 1)^2
    return np.divide(dy, np.square(np.abs(x) + _ONE), out=out)


def _pow(x, a, out):
    return np.power(x, np.float32(a), out=out)


def _pow_grad(x, y, a, dy, out):  # _PowGrad: grad * e * pow(x, e - 1)
    e = np.float32(a)
    return np.multiply(dy * e, np.power(x, e - _ONE), out=out)


def _mul_no_nan(a: np.ndarray, b: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """TF's mul_no_nan(a, b): a * b, and 0 where b is 0 (even if a is inf or nan)."""
    zero = b == 0
    value = np.multiply(a, b, out=out)
    np.copyto(value, np.float32(0), where=zero)  # (cheaper than np.where's branch)
    return value


# erf: Eigen's float rational approximation (the one TensorFlow's Erf runs; an 11/10-degree
# interpolant accurate to 3 ulp), coefficients highest power first, for x^2 clamped to 16.
_ERF_NUMERATOR = np.array([2.123732201653183437883853912353515625e-06,
                           2.861979592125862836837768554687500000e-04,
                           3.658048342913389205932617187500000000e-03,
                           5.243302136659622192382812500000000000e-02,
                           1.874160766601562500000000000000000000e-01,
                           1.128379106521606445312500000000000000e+00], np.float32)
_ERF_DENOMINATOR = np.array([3.89185734093189239501953125000e-05,
                             1.14329601638019084930419921875e-03,
                             1.47520881146192550659179687500e-02,
                             1.12945675849914550781250000000e-01,
                             4.99425798654556274414062500000e-01, 1.0], np.float32)


def erf(x: np.ndarray) -> np.ndarray:
    """The error function in float32, as TensorFlow computes it on CPU."""
    x = np.asarray(x, np.float32)
    x2 = np.minimum(np.float32(16), x * x)
    p = x2 * _ERF_NUMERATOR[0]  # Horner, in place: p = p * x2 + c
    q = x2 * _ERF_DENOMINATOR[0]
    for i in range(1, len(_ERF_NUMERATOR)):
        p += _ERF_NUMERATOR[i]
        q += _ERF_DENOMINATOR[i]
        if i + 1 < len(_ERF_NUMERATOR):
            p *= x2
            q *= x2
    p *= x
    p /= q
    return np.clip(p, -_ONE, _ONE, out=p)


# erfc: Eigen's float approximation (TensorFlow's Erfc on CPU), highest power first:
# 1 + x * S(x^2) for |x| <= 1; exp(-x^2) / x * P(1/x^2) / Q(1/x^2) beyond, x clamped to 11.
_ERFC_SMALL = np.array([5.61802298761904239654541015625e-04, -4.91381669417023658752441406250e-03,
                        2.67075151205062866210937500000e-02, -1.12800106406211853027343750000e-01,
                        3.76122951507568359375000000000e-01, -1.12837910652160644531250000000e+00],
                       np.float32)
_ERFC_NUMERATOR = np.array([1.0208116471767425537109375e-01, 4.2920666933059692382812500e-01,
                            3.2379078865051269531250000e-01, 5.3971976041793823242187500e-02],
                           np.float32)
_ERFC_DENOMINATOR = np.array([1.7251677811145782470703125e-02, 3.9137163758277893066406250e-01,
                              1.0, 6.2173241376876831054687500e-01,
                              9.5662862062454223632812500e-02], np.float32)


def _horner(z: np.ndarray, coefficients: np.ndarray) -> np.ndarray:
    p = z * coefficients[0]
    for c in coefficients[1:-1]:
        p += c
        p *= z
    p += coefficients[-1]
    return p


def erfc(x: np.ndarray) -> np.ndarray:
    """The complementary error function in float32 as TensorFlow computes it on CPU (its
    exp is numpy's: within 8 ulp of TF's for x <= 6, where GELU reads it; beyond, TF's own
    error reaches 65 ulp)."""
    x = np.clip(np.asarray(x, np.float32), np.float32(-11), np.float32(11))
    x2 = x * x
    with np.errstate(all="ignore"):
        small = _horner(x2, _ERFC_SMALL)
        small *= x
        small += _ONE
        x2_lo = (x.astype(np.float64) * x - x2).astype(np.float32)  # x * x - x2, exactly
        z = np.exp(-x2)
        z -= z * x2_lo  # exp(-x^2) ~ exp(-x2) * (1 - x2_lo)
        q2 = _ONE / x2
        r = _horner(q2, _ERFC_NUMERATOR)
        r /= x * _horner(q2, _ERFC_DENOMINATOR)
        r *= z
        r += np.where(x < 0, _TWO, np.float32(0))
    return np.where(x2 > _ONE, r, small)


def _store(value: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    value = value.astype(np.float32, copy=False)
    if out is None:
        return value
    np.copyto(out, value)
    return out


def _stable_sigmoid(x: np.ndarray) -> np.ndarray:
    """Numerically stable logistic function, float32 (softplus's gradient's)."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, _ONE / (_ONE + e), e / (_ONE + e)).astype(np.float32, copy=False)


# sigmoid and tanh: Eigen's float functors as TensorFlow 2.21's CPU kernels run them (the
# wheel's Eigen: AVX without FMA, so every multiply-add rounds twice; packets of 8 floats;
# TF's threads flush denormals, FTZ and DAZ). Measured bit-equal to tf.sigmoid and tf.tanh
# on 11 million float32 arguments of every regime and on every length 1..64
# (tests/wafer/test_eigen_logistic.py).
PACKET = 8
_TINY = np.float32(np.finfo(np.float32).tiny)
_EXP_HI = np.float32(16.6355324)  # the first x where the interpolant is exactly one
_EXP_LO = np.float32(-104)  # below it, the packet path returns 0
_LOG2E = np.float32(1.44269504088896341)
_LN2_HI, _LN2_LO = np.float32(-0.693359375), np.float32(2.12194440e-4)
_EXP_POLY = np.array([8.33471305668354034423828125e-3, 4.1898667812347412109375e-2,
                      0.16666877269744873046875, 0.49999141693115234375], np.float32)
_TANH_CLAMP = np.float32(7.90738964080810547)  # ptanh_float's clamp without FMA
_TANH_NUMERATOR = np.array([1.394553628e-8, 2.102733560e-5, 3.520756727e-3, 1.340216100e-1],
                           np.float32)
_TANH_DENOMINATOR = np.array([8.015776984e-7, 3.326951409e-4, 2.597254514e-2, 4.673548340e-1,
                              1.0], np.float32)
_expf = scalar("expf")


def _flush(v: np.ndarray) -> np.ndarray:
    """Denormals to zeros of their sign, in place (FTZ, DAZ)."""
    np.copyto(v, np.copysign(np.float32(0), v), where=np.abs(v) < _TINY)
    return v


def logistic_packet(x: np.ndarray) -> np.ndarray:
    """scalar_logistic_op<float>::packetOp: exp(x/2) by Cephes' range reduction and a degree-5
    polynomial, squared, then e / (1 + e)."""
    h = np.minimum(x, _EXP_HI) * _HALF
    m = np.floor(h * _LOG2E + _HALF)
    r = m * _LN2_HI + h
    r = m * _LN2_LO + r
    r2 = r * r
    odd = r2 * _EXP_POLY[0] + _EXP_POLY[2]
    even = r2 * _EXP_POLY[1] + _EXP_POLY[3]
    p = r * odd + even
    p = r2 * p + (r + _ONE)
    biased = np.nan_to_num(np.clip(m + np.float32(127), 0, 255))  # pldexp_fast: 2^m
    e = p * (biased.astype(np.int32) << 23).view(np.float32)
    e = _flush(e * e)
    y = e / (_ONE + e)
    y[x < _EXP_LO] = 0
    return y


def logistic_scalar(x: np.ndarray) -> np.ndarray:
    """scalar_logistic_op<float>::operator(): e = libm's expf(min(x, 16.6355324)), e / (1 + e)."""
    x = _flush(np.array(x, np.float32))
    e = _flush(np.array([_expf(v) for v in np.minimum(x, _EXP_HI).ravel()], np.float32))
    return _flush(e / (_ONE + e)).reshape(x.shape)


def sigmoid(x: np.ndarray, tail: int | None = None) -> np.ndarray:
    """The logistic function in float32 as TensorFlow computes it on CPU: Eigen's packet path,
    and its scalar path (libm's expf) for the last `tail` elements in C order (None: x is TF's
    whole tensor, whose last size mod 8 elements take it)."""
    x = np.asarray(x, np.float32)
    with np.errstate(invalid="ignore", over="ignore"):  # -inf's reduction is nan, then 0
        y = logistic_packet(x)
    tail = x.size % PACKET if tail is None else tail
    if tail:
        y.reshape(-1)[-tail:] = logistic_scalar(x.reshape(-1)[-tail:])
    return y


def scalar_tail(ctx: RunContext, shape: Sequence[int]) -> int:
    """How many of a micro-batch's last elements (shape: the micro-batch's, samples first)
    TF's Sigmoid computes on Eigen's scalar path: those of the whole batch's last (batch size
    x elements per sample) mod 8."""
    size = int(np.prod(shape, dtype=np.int64))
    per_sample = size // shape[0] if len(shape) and shape[0] else size
    total = ctx.batch_size * per_sample
    start = total - total % PACKET - ctx.offset * per_sample
    return min(max(size - start, 0), size)


def tanh(x: np.ndarray) -> np.ndarray:
    """tanh in float32 as TensorFlow computes it on CPU: Eigen's ptanh_float, a 9/8-degree
    rational function of x clamped to +-7.90738964 (the same on its scalar path)."""
    x = _flush(np.clip(np.asarray(x, np.float32), -_TANH_CLAMP, _TANH_CLAMP))
    with np.errstate(invalid="ignore"):  # signalling nans
        x2 = x * x
        p = _horner(x2, _TANH_NUMERATOR)
        p = (x2 * x) * p + x
        return p / _horner(x2, _TANH_DENOMINATOR)


Forward = Callable[[np.ndarray, float, "np.ndarray | None"], np.ndarray]
Backward = Callable[[np.ndarray, np.ndarray, float, np.ndarray, "np.ndarray | None"], np.ndarray]

# name -> (forward(x, a, out), backward(x, y, a, dy, out), FLOPs per element), where `a` is
# the function's parameter (leaky_relu's alpha, pow's exponent; ignored by the others)
FUNCTIONS: dict[str, tuple[Forward, Backward, int]] = {
    "relu": (_relu, _relu_grad, 1),
    "relu6": (_relu6, _relu6_grad, 2),
    "leaky_relu": (_leaky, _leaky_grad, 2),
    "elu": (_elu, _elu_grad, 4),
    "selu": (_selu, _selu_grad, 5),
    "tanh": (_tanh, _tanh_grad, 4),
    "sigmoid": (_sigmoid, _sigmoid_grad, 4),
    "softplus": (_softplus, _softplus_grad, 4),
    "linear": (_linear, _linear_grad, 0),
    "identity": (_linear, _linear_grad, 0),
    "neg": (_neg, _neg_grad, 1),
    "abs": (_abs, _abs_grad, 1),
    "square": (_square, _square_grad, 1),
    "sqrt": (_sqrt, _sqrt_grad, 4),
    "rsqrt": (_rsqrt, _rsqrt_grad, 5),
    "exp": (_exp, _exp_grad, 4),
    "expm1": (_expm1, _expm1_grad, 4),
    "log": (_log, _log_grad, 4),
    "log1p": (_log1p, _log1p_grad, 5),
    "reciprocal": (_reciprocal, _reciprocal_grad, 4),
    "erf": (_erf, _erf_grad, 14),
    "erfc": (_erfc, _erfc_grad, 14),
    "lgamma": (_lgamma, _lgamma_grad, 40),
    "digamma": (_digamma, _digamma_grad, 40),
    "bessel_i0e": (_i0e, _i0e_grad, 40),
    "sin": (_sin, _sin_grad, 4),
    "cos": (_cos, _cos_grad, 4),
    "tan": (_tan, _tan_grad, 6),
    "asin": (_asin, _asin_grad, 8),
    "acos": (_acos, _acos_grad, 8),
    "atan": (_atan, _atan_grad, 8),
    "sign": (_sign, _zero_grad, 1),
    "floor": (_floor, _zero_grad, 1),
    "ceil": (_ceil, _zero_grad, 1),
    "round": (_round, _zero_grad, 1),
    "softsign": (_softsign, _softsign_grad, 3),
    "pow": (_pow, _pow_grad, 8),
}
# float16 backwards (docs/design.md, "Mixed precision"): TF's gradient of a float16 function
# is a chain of float16 ops (Python's, or Eigen's *Grad functor on Eigen::half), each rounding
# its result; `_r` rounds as one of them does. x, y and dy are float16-valued.
def _r(value: np.ndarray) -> np.ndarray:
    return round_half(np.asarray(value, np.float32))


_HALF_TWO_OVER_ROOT_PI = np.float32(np.float16(TWO_OVER_ROOT_PI))  # the float16 constant of _ErfGrad/_ErfcGrad


def _where_dy(value: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """0 where dy is 0 (the *Grad functors' `if (output_gradient == T(0)) return T(0)`)."""
    return np.where(dy == 0, np.float32(0), value)


HALF_GRADIENTS: dict[str, Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]] = {
    # TanhGrad: dy * (1 - y * y)
    "tanh": lambda x, y, dy: _r(dy * _r(_ONE - _r(y * y))),
    # SigmoidGrad: dy * (y * (1 - y))
    "sigmoid": lambda x, y, dy: _r(dy * _r(y * _r(_ONE - y))),
    # SqrtGrad: mul_no_nan(0.5 / y, dy)
    "sqrt": lambda x, y, dy: _where_dy(_r(_r(_HALF / y) * dy), dy),
    # RsqrtGrad: mul_no_nan(-0.5 * (y * y), mul_no_nan(y, dy)), as Eigen orders it
    "rsqrt": lambda x, y, dy: _where_dy(_r(_r(-_HALF * _r(dy * y)) * _r(y * y)), dy),
    # ReciprocalGrad: mul_no_nan(-(y * y), dy)
    "reciprocal": lambda x, y, dy: _where_dy(_r(-_r(y * y) * dy), dy),
    # _ExpGrad: grad * y
    "exp": lambda x, y, dy: _r(dy * y),
    # _LogGrad: grad * reciprocal(x)
    "log": lambda x, y, dy: _r(dy * _r(_ONE / x)),
    # _Expm1Grad: grad * exp(x)
    "expm1": lambda x, y, dy: _r(dy * _r(np.exp(x))),
    # _SinGrad: grad * cos(x)
    "sin": lambda x, y, dy: _r(dy * _r(np.cos(x))),
    # _ErfGrad: grad * (2 / sqrt(pi)) * exp(-square(x))
    "erf": lambda x, y, dy: _r(_r(dy * _HALF_TWO_OVER_ROOT_PI) * _r(np.exp(-_r(x * x)))),
    # _ErfcGrad: grad * -(2 / sqrt(pi)) * exp(-square(x))
    "erfc": lambda x, y, dy: _r(_r(dy * -_HALF_TWO_OVER_ROOT_PI) * _r(np.exp(-_r(x * x)))),
    # _TanGrad: square(reciprocal(cos(x))) * grad
    "tan": lambda x, y, dy: _r(_r(np.square(_r(_ONE / _r(np.cos(x))))) * dy),
    # _AsinGrad: grad * reciprocal(sqrt(1 - square(x))); _AcosGrad: -grad * that
    "asin": lambda x, y, dy: _r(dy * _r(_ONE / _r(np.sqrt(_r(_ONE - _r(x * x)))))),
    "acos": lambda x, y, dy: _r(-dy * _r(_ONE / _r(np.sqrt(_r(_ONE - _r(x * x)))))),
    # _AtanGrad: grad * reciprocal(1 + square(x))
    "atan": lambda x, y, dy: _r(dy * _r(_ONE / _r(_ONE + _r(x * x)))),
}


# Functions (and binary ops) proven against TF's float32 kernels only
# (wafer/special_functions.py, xlogy and xlog1py): the compiler refuses them in float16.
# (tan, asin, acos, atan in float16: numpy's float32 function rounded, TF's float16 on all but
# 0-2 of the 63488 finite float16 inputs; their gradients HALF_GRADIENTS, bit-equal.)
FLOAT32_ONLY = ("lgamma", "digamma", "bessel_i0e", "xlogy", "xlog1py", "atan2")
# Functions with a parameter of their own (the `activation` kernel's attr named here):
# fused into dense or conv2d they would run with a default, so only `activation` takes them.
PARAMETERS = {"pow": "exponent"}


def check_function(kernel: str, name: Any, fused: bool = True) -> str:
    """The function's name; KernelError for an unknown one (or, `fused` into dense or
    conv2d, one that needs a parameter of its own)."""
    if name not in FUNCTIONS:
        raise KernelError(f"kernel {kernel!r}: unknown activation {name!r}; "
                          f"the library has {', '.join(FUNCTIONS)}")
    if fused and name in PARAMETERS:
        raise KernelError(f"kernel {kernel!r}: activation {name!r} needs its "
                          f"{PARAMETERS[name]}: only an activation kernel applies it")
    return str(name)


def _half_logistic(x: np.ndarray, a: float, out: np.ndarray | None) -> np.ndarray:
    """scalar_logistic_op<Eigen::half>, TF's float16 Sigmoid: e = exp(x) rounded to float16,
    then e / (1 + e) with the sum and the quotient each rounded to float16, and 1 where e
    overflows (its pselect). Bit-equal to TF's on every finite float16 argument, on Eigen's
    packet and scalar paths (tests/wafer/test_half_parity.py)."""
    with np.errstate(over="ignore", invalid="ignore"):
        e = round_half(np.exp(np.asarray(x, np.float32)))
        y = np.where(np.isinf(e), _ONE, round_half(e / round_half(_ONE + e)))
    return _store(y, out)


# float16 forwards: Eigen's float16 functors where reproduced (sigmoid), else the float32
# function rounded once (tanh: Eigen's float16 tanh differs by path and tensor size)
HALF_FORWARDS: dict[str, Forward] = {
    "tanh": lambda x, a, out: np.tanh(x, out=out),
    "sigmoid": _half_logistic,
}


def apply(name: str, x: np.ndarray, a: float = 0.2, out: np.ndarray | None = None,
          half: bool = False, tail: int | None = None) -> np.ndarray:
    """The function of x; `half`: of a float16 function; `tail`: sigmoid's (`sigmoid`)."""
    if half and name in HALF_FORWARDS:
        return HALF_FORWARDS[name](x, a, out)
    if name == "sigmoid":
        return _store(sigmoid(x, tail), out)
    return FUNCTIONS[name][0](x, a, out)


def gradient(name: str, x: np.ndarray, y: np.ndarray, dy: np.ndarray, a: float = 0.2,
             out: np.ndarray | None = None, half: bool = False) -> np.ndarray:
    """dL/dx from dL/dy, given the function's input x and output y; `half`: of a float16
    function (x, y and dy float16-valued), rounded where TF's float16 gradient ops round."""
    if half and name in HALF_GRADIENTS:
        return _store(HALF_GRADIENTS[name](x, y, dy), out)
    return FUNCTIONS[name][1](x, y, a, dy, out)


# Functions whose TF int32/int64 kernels compute what numpy's do (a sort's negated indices:
# tf.argsort's ascending order of ints).
INTEGER_FUNCTIONS = {"neg": np.negative, "abs": np.abs}


@register
class Activation(Kernel):
    """An element-wise function of one float32 input (leaky_relu carries its `alpha`, pow
    its `exponent`), or neg and abs of int32 and int64 (no gradient). Like TF, it lets inf
    and nan through (log(0), 1/0) without a warning."""

    type_name = "activation"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]):
        super().__init__(name, attrs, input_shapes)
        if len(self.input_shapes) != 1:
            raise KernelError(f"kernel {name!r}: activation takes 1 input, got {len(self.input_shapes)}")
        self.function = check_function(name, self.attrs.get("function"), fused=False)
        if self.function in PARAMETERS:
            key = PARAMETERS[self.function]
            value = self.attrs.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise KernelError(f"kernel {name!r}: activation {self.function} needs a number "
                                  f"attr {key!r}, got {value!r}")
            self.parameter = float(value)
        else:
            self.parameter = float(self.attrs.get("alpha", 0.2))
        self.half = is_half(self.attrs)

    @property
    def output_shape(self):
        return self.input_shapes[0]

    def output_dtype(self, input_dtypes):
        if self.function in INTEGER_FUNCTIONS and np.dtype(input_dtypes[0]) in [np.dtype(d) for d in INTEGER]:
            return np.dtype(input_dtypes[0])
        check_dtypes(self, input_dtypes, [(np.float32,)])
        return np.dtype(np.float32)

    def _elements(self) -> int:
        return int(np.prod(self.input_shapes[0], dtype=np.int64))

    def flops_per_sample(self) -> float:
        return float(max(FUNCTIONS[self.function][2], 1) * self._elements())

    def max_cores(self) -> int:
        return max_cores_for(self.flops_per_sample())

    def activation_bytes_per_sample(self) -> int:
        return 8 * self._elements()  # input and output

    def forward(self, params, inputs, ctx: RunContext):
        x = inputs[0]
        if x.dtype.kind == "i":  # (an int input's output takes no gradient)
            return INTEGER_FUNCTIONS[self.function](x), None
        with np.errstate(all="ignore"):
            y = apply(self.function, x, self.parameter, half=self.half,
                      tail=scalar_tail(ctx, x.shape))
        if self.half and y is not x:  # the float16 output TF's gradient reads
            round_half_(y)
        return y, (x, y)

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        x, y = cache
        with np.errstate(all="ignore"):
            return [gradient(self.function, x, y, grad_output, self.parameter,
                             half=self.half)], {}
