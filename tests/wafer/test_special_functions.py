"""log Γ, digamma and BesselI0e (wafer/special_functions.py, the `activation` kernel's lgamma,
digamma and bessel_i0e) against TensorFlow's CPU kernels, forward and gradient (TF's
_LgammaGrad: digamma; _DigammaGrad: polygamma(1, x); _BesselI0eGrad: bessel_i1e), bit for
bit: values of every scale, both signs, the poles, 0, ±inf and nan."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from wafer.kernels import RunContext, build_kernel
from wafer.special_functions import bessel_i0e, bessel_i1e, digamma, lgamma, trigamma

RNG = np.random.default_rng(20261204)
EDGES = [0.0, -0.0, 1.0, 2.0, -1.0, -2.0, -0.5, 0.5, 9.99, 10.0, 1e-30, -1e-30, 1e8, 1.5e8,
         3e38, -3e38, np.inf, -np.inf, np.nan]


def _values(count: int) -> np.ndarray:
    return np.concatenate([RNG.uniform(-20, 20, count), RNG.uniform(0, 3, count),
                           np.exp(RNG.uniform(-30, 30, count)), -np.exp(RNG.uniform(-10, 10, count)),
                           np.arange(-5, 12, 0.25), EDGES]).astype(np.float32)


def _assert_bit_equal(actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.dtype == np.float32
    differ = ~((actual == expected) | (np.isnan(actual) & np.isnan(expected)))
    assert not differ.any(), f"{differ.sum()} differ, e.g. {actual[differ][:4]} vs {expected[differ][:4]}"


def _activation(function: str, x: np.ndarray, dy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The CS's `activation` kernel's output and input gradient on a batch of one."""
    kernel = build_kernel("activation", "k", {"function": function}, [x.shape])
    ctx = RunContext(training=True, batch_size=1)
    y, cache = kernel.forward({}, [x[None]], ctx)
    (dx,), _ = kernel.backward({}, cache, dy[None], ctx)
    return y[0], dx[0]


def _tensorflow(op, x: np.ndarray, dy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    xs = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xs)
        y = op(xs)
    return y.numpy(), tape.gradient(y, xs, output_gradients=tf.constant(dy)).numpy()


@pytest.mark.parametrize("function, op", [("lgamma", tf.math.lgamma), ("digamma", tf.math.digamma)],
                         ids=["lgamma", "digamma"])
def test_the_kernel_is_tensorflows_function_and_gradient_bit_for_bit(function, op):
    x = _values(1000)
    dy = RNG.normal(size=x.shape).astype(np.float32)
    y, dx = _activation(function, x, dy)
    expected_y, expected_dx = _tensorflow(op, x, dy)
    _assert_bit_equal(y, expected_y)
    _assert_bit_equal(dx, expected_dx)


def test_the_functions_are_tensorflows_bit_for_bit():
    x = _values(2500)
    _assert_bit_equal(lgamma(x), tf.math.lgamma(x).numpy())
    _assert_bit_equal(digamma(x), tf.math.digamma(x).numpy())
    _assert_bit_equal(trigamma(x), tf.math.polygamma(np.float32(1), x).numpy())


def test_bessel_i0e_is_tensorflows_to_8_and_within_4_ulp_beyond():
    """Beyond |x| = 8 TF's vectorised path multiplies by Eigen's approximate 1 / sqrt(x) (an
    instruction's estimate and a Newton step), which the CS does not imitate."""
    x = np.concatenate([RNG.uniform(-8, 8, 10_000), [0.0, -0.0, 8.0, -8.0, 1e-30]]).astype(np.float32)
    dy = RNG.normal(size=x.shape).astype(np.float32)
    y, dx = _activation("bessel_i0e", x, dy)
    expected_y, expected_dx = _tensorflow(tf.math.bessel_i0e, x, dy)
    _assert_bit_equal(y, expected_y)
    _assert_bit_equal(dx, expected_dx)
    _assert_bit_equal(bessel_i1e(x), tf.math.bessel_i1e(x).numpy())
    far = np.concatenate([RNG.uniform(8, 40, 5_000), np.exp(RNG.uniform(2, 80, 5_000))])
    far = (far * RNG.choice([-1, 1], far.shape)).astype(np.float32)
    for ours, theirs in ((bessel_i0e(far), tf.math.bessel_i0e(far).numpy()),
                         (bessel_i1e(far), tf.math.bessel_i1e(far).numpy())):
        ulp = np.abs(ours.view(np.int32).astype(np.int64) - theirs.view(np.int32))
        assert ulp.max() <= 4
