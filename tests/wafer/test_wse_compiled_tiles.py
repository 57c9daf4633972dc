"""The compiled affine tiles (wafer.compiled: no GIL) compute what the numpy tiles compute,
bit for bit: forward (GEMM, bias, relu/relu6/linear, float16 rounding) and backward (the
activation's gradient, the bias and weight gradients accumulated over micro-batches, the
input gradient), on shapes that split into several tiles and on ones that do not."""
from __future__ import annotations

import numpy as np
import pytest

from wafer.kernels.affine import Affine
from wafer.kernels.base import RunContext


def run(affine: Affine, x, w, b, dys):
    """Forward, then backward of each upstream gradient into one accumulator."""
    ctx = RunContext(training=True, batch_size=len(x))
    acc = {"kernel": np.full_like(w, np.nan), "bias": np.full_like(b, np.nan)}
    y, cache = affine.forward(x, w, b, ctx)
    outputs = [y.copy()]
    for k, dy in enumerate(dys):
        ctx.accumulate = k > 0
        dx, _ = affine.backward(cache, dy, w, True, acc, ctx, True)
        outputs.append(dx)
    return outputs + [acc["kernel"], acc["bias"]]


@pytest.mark.parametrize("activation", ["relu", "relu6", "linear"])
@pytest.mark.parametrize("half", [False, True])
@pytest.mark.parametrize("shape", [(256, 784, 500), (64, 300, 10), (37, 33, 70)])
def test_compiled_tiles_equal_numpy_tiles_bit_for_bit(activation, half, shape):
    rows, n, units = shape
    rng = np.random.default_rng(rows + n)
    x = (rng.normal(size=(rows, n)) * 4).astype(np.float32)
    x[0, :3] = [np.float32(-0.0), np.float32(6.0), np.float32(7e4)]  # signed zero, relu6's edge
    w = rng.normal(size=(n, units)).astype(np.float32) / np.float32(8)
    b = rng.normal(size=units).astype(np.float32)
    dys = [rng.normal(size=(rows, units)).astype(np.float32) for _ in range(2)]
    compiled = Affine(activation, half)
    numpy_tiles = Affine(activation, half)
    numpy_tiles.code = -1
    got, want = run(compiled, x, w, b, dys), run(numpy_tiles, x, w, b, dys)
    assert compiled.code >= 0  # (it did run compiled)
    for g, h in zip(got, want):
        assert np.array_equal(g.view(np.uint32), h.view(np.uint32))
