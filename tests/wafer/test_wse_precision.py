"""wafer.precision's float16 rounding is IEEE float16's (numpy's conversion), bit for bit:
every float16 value, the float32 values next to each and halfway between two, the
subnormal range, overflow, infinities, nan and signed zeros."""
from __future__ import annotations

import numpy as np

from wafer.precision import round_half, round_half_


def numpy_half(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return x.astype(np.float16).astype(np.float32)


def test_rounding_is_ieee_float16_bit_for_bit():
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    finite = np.sort(halves[np.isfinite(halves)].astype(np.float32))
    rng = np.random.default_rng(0)
    cases = np.concatenate([
        finite, np.nextafter(finite, np.float32(np.inf)), np.nextafter(finite, np.float32(-np.inf)),
        ((finite[:-1].astype(np.float64) + finite[1:]) / 2).astype(np.float32),  # ties
        rng.normal(size=1 << 16).astype(np.float32) * np.float32(10.0) ** rng.integers(
            -9, 6, size=1 << 16).astype(np.float32),
        np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65519.0, 65520.0, -65520.0, 1e38, 1e-40,
                  -1e-40, 2.0 ** -25, -(2.0 ** -25), 3 * 2.0 ** -26], np.float32)])
    got = round_half(cases)
    want = numpy_half(cases)
    assert np.array_equal(got.view(np.uint32)[~np.isnan(want)], want.view(np.uint32)[~np.isnan(want)])
    assert np.array_equal(np.isnan(got), np.isnan(want))
    view = cases[: 1 << 12].reshape(64, 64).copy()
    round_half_(view[:, 8:40])  # in place, on a strided view
    assert np.array_equal(view[:, 8:40], numpy_half(cases[: 1 << 12].reshape(64, 64)[:, 8:40]))
    assert np.array_equal(view[:, :8], cases[: 1 << 12].reshape(64, 64)[:, :8])
