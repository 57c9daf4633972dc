"""The fake_quant kernel against TF's CPU kernels: forward bit for bit on values that hit
every grid point, every half-step tie and its float neighbours and the nudged edges; the
gradients to x bit for bit and to min/max (sums) to float32 rounding."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from wafer.kernels import KernelError, RunContext, build_kernel
from wafer.kernels.quantization import nudge

RNG = np.random.default_rng(7)
F32 = np.float32
# (num_bits, narrow_range, min, max): 8-bit activations, 4-bit narrow weights, a range
# that does not hold 0 (min > 0: the zero point clamped), a tiny and a wide range
RANGES = [(8, False, -1.0, 1.0), (8, False, -0.3, 2.7), (4, True, -0.61, 0.49),
          (5, False, 0.25, 3.0), (12, False, -1e-3, 2e-3), (16, True, -6.0, 20.0),
          (2, False, -0.0, 0.92)]


def probe_values(low: float, high: float, num_bits: int, narrow: bool, per_sample: int):
    """(samples, per_sample) values: uniform over the range and beyond it, then the grid
    points, the half-steps between them and their neighbours, and the nudged edges."""
    nudged_min, nudged_max, scale, _ = nudge(F32(low), F32(high), num_bits, narrow)
    steps = np.arange(-3, min(1 << num_bits, 4000) + 3, dtype=F32)
    half = nudged_min + (steps + F32(0.5)) * scale
    edges = [nudged_min, nudged_max, F32(low), F32(high), np.nextafter(nudged_min, F32(-9)),
             np.nextafter(nudged_max, F32(9)), np.nextafter(nudged_min, F32(9))]
    values = np.concatenate([
        RNG.uniform(low - 1, high + 1, 2000).astype(F32), nudged_min + steps * scale, half,
        np.nextafter(half, F32(9)), np.nextafter(half, F32(-9)), edges]).astype(F32)
    values = np.concatenate([values, RNG.permutation(values)[:(-len(values)) % per_sample]])
    return values.reshape(-1, per_sample)


def run(kernel, params, inputs, dy):
    ctx = RunContext(training=True, batch_size=len(inputs[0]))
    out, cache = kernel.forward(params, inputs, ctx)
    grads, param_grads = kernel.backward(params, cache, dy, ctx, None)
    return out, grads, param_grads


@pytest.mark.parametrize("num_bits, narrow, low, high", RANGES)
def test_fake_quant_with_min_max_args_is_tensorflows_bit_for_bit(num_bits, narrow, low, high):
    x = probe_values(low, high, num_bits, narrow, 6)
    dy = RNG.normal(size=x.shape).astype(F32)
    kernel = build_kernel("fake_quant", "q", {
        "operands": "icc", "c1": np.asarray(low, F32), "c2": np.asarray(high, F32),
        "num_bits": num_bits, "narrow_range": narrow, "form": "args"}, [(6,)])
    out, (dx,), _ = run(kernel, {}, [x], dy)
    value = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(value)
        y = tf.quantization.fake_quant_with_min_max_args(value, low, high, num_bits, narrow)
    np.testing.assert_array_equal(out.view(np.int32), y.numpy().view(np.int32))
    np.testing.assert_array_equal(dx, tape.gradient(y, value, dy).numpy())


@pytest.mark.parametrize("num_bits, narrow, low, high", RANGES + [(8, False, 0.0, 0.0)])
@pytest.mark.parametrize("letters", ["ipp", "iii"])
def test_fake_quant_with_min_max_vars_and_its_min_max_gradients_are_tensorflows(
        num_bits, narrow, low, high, letters):
    """min/max as learned weights (params) and as the weight program's inputs (a batch of
    one); min = max = 0 gives zeros and passes the gradient through, as TF."""
    x = probe_values(low, high, num_bits, narrow, 4) if high else RNG.normal(size=(9, 4)).astype(F32)
    dy = RNG.normal(size=x.shape).astype(F32)
    bounds = np.asarray(low, F32), np.asarray(high, F32)
    if letters == "iii":
        x, dy = x.reshape(1, -1), dy.reshape(1, -1)
    kernel = build_kernel("fake_quant", "q", {
        "operands": letters, "p1": [], "p2": [], "num_bits": num_bits, "narrow_range": narrow,
        "form": "vars"}, [x.shape[1:]] + ([()] * 2 if letters == "iii" else []))
    params = {"p1": bounds[0], "p2": bounds[1]} if letters == "ipp" else {}
    inputs = [x] + ([b.reshape(1) for b in bounds] if letters == "iii" else [])
    out, grads, param_grads = run(kernel, params, inputs, dy)
    tensors = [tf.constant(x), tf.constant(bounds[0]), tf.constant(bounds[1])]
    with tf.GradientTape() as tape:
        tape.watch(tensors)
        y = tf.quantization.fake_quant_with_min_max_vars(*tensors, num_bits=num_bits,
                                                         narrow_range=narrow)
    tf_dx, tf_dmin, tf_dmax = (g.numpy() for g in tape.gradient(y, tensors, dy))
    np.testing.assert_array_equal(out.view(np.int32), y.numpy().view(np.int32))
    np.testing.assert_array_equal(grads[0], tf_dx)
    dmin, dmax = (param_grads["p1"], param_grads["p2"]) if letters == "ipp" else grads[1:]
    np.testing.assert_allclose([np.sum(dmin), np.sum(dmax)], [tf_dmin, tf_dmax], rtol=1e-5,
                               atol=1e-5)


def test_fake_quant_per_channel_is_tensorflows():
    """Each channel of the last axis with its own min/max (a conv kernel's output channels)."""
    lows, highs = np.asarray([-1.0, -0.3, 0.25, -6.0], F32), np.asarray([1.0, 2.7, 3.0, 20.0], F32)
    x = np.stack([probe_values(lo, hi, 8, True, 1)[:2000, 0] for lo, hi in zip(lows, highs)], -1)
    x = x.reshape(-1, 5, 4)
    dy = RNG.normal(size=x.shape).astype(F32)
    kernel = build_kernel("fake_quant", "q", {
        "operands": "ipp", "p1": [4], "p2": [4], "num_bits": 8, "narrow_range": True,
        "form": "per_channel"}, [(5, 4)])
    out, (dx,), param_grads = run(kernel, {"p1": lows, "p2": highs}, [x], dy)
    tensors = [tf.constant(x), tf.constant(lows), tf.constant(highs)]
    with tf.GradientTape() as tape:
        tape.watch(tensors)
        y = tf.quantization.fake_quant_with_min_max_vars_per_channel(*tensors, narrow_range=True)
    tf_dx, tf_dmin, tf_dmax = (g.numpy() for g in tape.gradient(y, tensors, dy))
    np.testing.assert_array_equal(out.view(np.int32), y.numpy().view(np.int32))
    np.testing.assert_array_equal(dx, tf_dx)
    np.testing.assert_allclose(param_grads["p1"], tf_dmin, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(param_grads["p2"], tf_dmax, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attrs, shapes", [
    ({"operands": "ipp", "p1": [], "p2": [], "num_bits": 1, "form": "vars"}, [(3,)]),
    ({"operands": "ipp", "p1": [3], "p2": [3], "num_bits": 8, "form": "vars"}, [(3,)]),
    ({"operands": "ipp", "p1": [], "p2": [], "num_bits": 8, "form": "rounded"}, [(3,)]),
])
def test_fake_quant_refuses_bad_bits_shapes_and_forms_naming_the_kernel(attrs, shapes):
    with pytest.raises(KernelError, match=r"kernel 'model/q' \(fake_quant\)"):
        build_kernel("fake_quant", "model/q", attrs, shapes)
