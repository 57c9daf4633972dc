"""sigmoid and tanh against TensorFlow's float32 CPU kernels, bit for bit: every regime of
argument (tiny, |x| < 1, moderate, the clamps' cut-offs, large, infinities, nan, signed
zeros, denormals), every length's scalar tail (Eigen's packets are 8 floats), and the
tail of a micro-batched batch in the activation and dense kernels."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from wafer.kernels import RunContext, build_kernel
from wafer.kernels.activations import logistic_packet, logistic_scalar, sigmoid, tanh

RNG = np.random.default_rng(20261205)
CUT_OFFS = (7.90738964080810547, 8.01773357391357422, 16.6355324, -104.0, -87.3, 88.7, 1.0, 0.0)


def arguments() -> np.ndarray:
    near = [(np.float32(c * s).view(np.int32) + np.arange(-2000, 2000)).astype(np.int32).view(np.float32)
            for c in CUT_OFFS for s in (1, -1)]
    parts = [RNG.uniform(-1, 1, 50_000), RNG.uniform(-20, 20, 100_000), RNG.uniform(-120, 120, 20_000),
             RNG.uniform(-1, 1, 20_000) * 10.0 ** RNG.uniform(-45, -3, 20_000),
             [np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-45, -1e-45, 3.4028235e38, -3.4028235e38]]
    every_bit_pattern = RNG.integers(0, 2**32, 50_000, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([np.asarray(p, np.float32) for p in parts]
                          + [every_bit_pattern.view(np.float32), *near])


def assert_bits_equal(actual: np.ndarray, expected: np.ndarray) -> None:
    """Equal bit patterns (so the sign of a zero), any nan for a nan."""
    same = (actual.view(np.int32) == expected.view(np.int32)) | (np.isnan(actual) & np.isnan(expected))
    assert same.all(), f"{np.count_nonzero(~same)} of {same.size} differ, e.g. x = {np.flatnonzero(~same)[:5]}"


@pytest.mark.parametrize("function, op", [(sigmoid, tf.sigmoid), (tanh, tf.tanh)])
def test_sigmoid_and_tanh_are_tensorflows_bit_for_bit(function, op):
    x = arguments()
    assert_bits_equal(function(x), op(x).numpy())
    for n in range(1, 18):  # all on Eigen's scalar path up to 7, then its tail
        assert_bits_equal(function(x[:n]), op(x[:n]).numpy())


def paths_differ(count: int) -> np.ndarray:
    """Arguments whose sigmoid differs between Eigen's packet and scalar paths."""
    x = RNG.uniform(-10, 10, 20_000).astype(np.float32)
    return x[logistic_packet(x) != logistic_scalar(x)][:count]


@pytest.mark.parametrize("kernel_type, attrs", [("activation", {"function": "sigmoid"}),
                                                ("dense", {"units": 7, "activation": "sigmoid"})])
def test_a_micro_batched_sigmoid_ends_on_tensorflows_scalar_path(kernel_type, attrs):
    """A batch of 6 samples of 5x7 (210 outputs: the last 2 on TF's scalar path) in micro-batches
    of 4 and 2; the arguments there are ones the two paths disagree on."""
    x = RNG.uniform(-10, 10, (6, 5, 7)).astype(np.float32)
    params = {}
    if kernel_type == "dense":
        params = {"kernel": np.eye(7, dtype=np.float32), "bias": np.zeros(7, np.float32)}
    x[-1, -1, -2:] = paths_differ(2)
    kernel = build_kernel(kernel_type, "k", attrs, [x.shape[1:]])
    outs = []
    for start, stop in ((0, 4), (4, 6)):
        ctx = RunContext(training=True, batch_size=6, offset=start)
        outs.append(kernel.forward(params, [x[start:stop]], ctx)[0])
    assert_bits_equal(np.concatenate(outs), tf.sigmoid(x).numpy())
