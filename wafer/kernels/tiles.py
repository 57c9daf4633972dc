"""How a kernel's large GEMMs split into tiles that threads can compute at once.

A tile is a range of one of the output's axes (its rows or its columns): it reads the
operands' parts it needs, writes only its part of the output, and sums every output
element over the whole inner axis in one GEMM call. The split depends on the GEMM's shape
alone, never on the threads that run it, so the result is the same whichever thread
computes which tile and however many threads there are. (It may differ in the last bits
from the untiled GEMM: a BLAS blocks its sums by shape.)
"""
from __future__ import annotations

from functools import lru_cache

# A tile needs this much work (a multiply-add counts 2): a smaller one costs more in
# handing it to another thread and in the BLAS's efficiency on a narrower GEMM than it
# saves (bench/wse_sim_throughput.py): FC-MNIST's 784x500 at micro-batches of 64 (50 MFLOP
# forward, and as much for its weight gradient) is 2 tiles.
TILE_FLOPS = 20e6
MAX_TILES = 8
ALIGN = 16  # tile bounds at multiples of 16 elements: a 64-byte cache line of float32


@lru_cache(maxsize=1024)
def tiles(rows: int, inner: int, cols: int, axis: int = 1) -> tuple[slice, ...]:
    """The (rows x inner) @ (inner x cols) GEMM's output rows (axis 0) or columns (axis
    1) as tiles of about equal size."""
    length = cols if axis else rows
    count = int(min(2 * rows * inner * cols // TILE_FLOPS, length // ALIGN, MAX_TILES))
    if count <= 1:
        return (slice(0, length),)
    bounds = [round(k * length / count / ALIGN) * ALIGN for k in range(count)] + [length]
    return tuple(slice(a, b) for a, b in zip(bounds, bounds[1:]))
