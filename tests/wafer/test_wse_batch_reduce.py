"""The batch_reduce kernel (wafer/kernels/in_batch.py) against TensorFlow's float32
reduce_sum / reduce_mean over the batch axis and its gradient, at realistic sizes. TF's sum
over axis 0 is blocked (it is neither numpy's sequential nor its pairwise order beyond a few
dozen rows); the kernel sums in float64 and rounds once, so both are within TF's own float32
rounding of the exact sum: measured at most 7.9e-8 of sum(|x|) apart, asserted 1e-6. A max
or min is bit for bit, its gradient TF's _MinOrMaxGrad (ties sharing the gradient's sum)."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from wafer.kernels import RunContext, build_kernel


def statistic_and_gradient(op: str, x: np.ndarray, g: np.ndarray, micro: int):
    kernel = build_kernel("batch_reduce", "s", {"op": op, "batch_size": len(x)}, [x.shape[1:]])
    ctx = RunContext(training=True, batch_size=len(x))
    ctx.batch = (kernel.batch_statistics({}, [x], ctx),)
    passes = [kernel.forward({}, [x[i:i + micro]], ctx) for i in range(0, len(x), micro)]
    grads = [g[i:i + micro] for i in range(0, len(x), micro)]
    caches = [cache for _, cache in passes]
    ctx.batch = (ctx.batch[0], kernel.gradient_statistics({}, caches, grads, ctx))
    dx = [kernel.backward({}, cache, grad, ctx)[0][0] for cache, grad in zip(caches, grads)]
    return np.concatenate([out for out, _ in passes]), np.concatenate(dx)


@pytest.mark.parametrize("op", ["sum", "mean"])
@pytest.mark.parametrize("shape", [(8, 5), (256, 128), (4096, 64), (32, 7, 7, 8)])
def test_batch_statistic_and_its_gradient_are_tensorflows(op, shape):
    """Every sample reads the whole batch's statistic; every sample's input gradient is the
    sum (mean: / B) of every sample's output gradient (y = s broadcast, dy = g)."""
    rng = np.random.default_rng(len(shape) * shape[0])
    x = (rng.normal(size=shape) * rng.uniform(0.1, 10, size=shape[1:])).astype(np.float32)
    g = rng.normal(size=shape).astype(np.float32)
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        s = (tf.reduce_sum if op == "sum" else tf.reduce_mean)(xt, 0)
        y = xt * 0 + s  # the statistic broadcast to every sample, as a reader pairs it
    expected, expected_dx = s.numpy(), tape.gradient(y, xt, output_gradients=tf.constant(g)).numpy()
    scale = np.abs(x).astype(np.float64).sum(0) / (shape[0] if op == "mean" else 1)
    g_scale = np.abs(g).astype(np.float64).sum(0) / (shape[0] if op == "mean" else 1)
    for micro in (shape[0], 1):
        out, dx = statistic_and_gradient(op, x, g, micro)
        assert out.dtype == dx.dtype == np.float32
        assert np.all(np.abs(out - expected) <= 1e-6 * scale)
        assert np.all(np.abs(dx - expected_dx) <= 1e-6 * g_scale)


@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("micro", [16, 4, 1])
def test_batch_max_and_min_and_their_gradients_are_tensorflows(op, micro):
    """The statistic bit for bit; ties (a relu's zeros, repeated values) share the gradient's
    sum over the batch as TF's, the others get exactly 0."""
    rng = np.random.default_rng(7)
    x = np.maximum(np.round(rng.normal(size=(16, 6, 3)), 1), 0).astype(np.float32)
    x = x if op == "max" else -x
    g = rng.normal(size=x.shape).astype(np.float32)
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        s = (tf.reduce_max if op == "max" else tf.reduce_min)(xt, 0)
        y = xt * 0 + s
    expected_dx = tape.gradient(y, xt, output_gradients=tf.constant(g)).numpy()
    out, dx = statistic_and_gradient(op, x, g, micro)
    assert np.array_equal(out, np.broadcast_to(s.numpy(), x.shape))
    assert np.array_equal(dx == 0, expected_dx == 0)
    assert np.all(np.abs(dx - expected_dx) <= 1e-6 * np.abs(g).sum(0))
