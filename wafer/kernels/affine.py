"""act(x @ w + b) on rows of x, forward and backward, the arithmetic dense and conv2d
(on im2col rows) share, in tiles (`wafer.kernels.tiles`) that the executor's threads may
compute at once.

Forward, a tile is a range of the output's columns: its GEMM, bias and activation in one
pass. Backward, the activation's derivative and the bias gradient come first (untiled,
cheap), then the weight gradient in ranges of the weight's rows (contiguous, so adding it
into the accumulator is one pass) and the input gradient in ranges of the input's
columns, all tiles of one batch of work.
"""
from __future__ import annotations

from functools import partial
from typing import Mapping

import numpy as np

from wafer.kernels import activations
from wafer.kernels.base import RunContext, accumulate
from wafer.kernels.tiles import tiles
from wafer.precision import round_half_

# Activations whose gradient reads only the output: applied in place on the pre-activation.
OUTPUT_GRADIENT = {"relu", "elu", "selu", "tanh", "sigmoid", "linear"}
# Activations whose result of a float16 value is a float16 value (no rounding needed).
EXACT_IN_HALF = {"relu", "relu6", "linear"}


class Affine:
    """One kernel's x @ w (+ b) then `activation`, with its scratch for the weight
    gradient of micro-batches after the batch's first. `half`: a float16 layer (TF's
    MatMul, BiasAdd and activation each round their result to float16; wafer.precision),
    whose output is therefore float16-valued already."""

    def __init__(self, activation: str, half: bool = False):
        self.activation = activation
        self.half = half
        self._scratch: np.ndarray | None = None

    def forward(self, x2d: np.ndarray, w: np.ndarray, b: np.ndarray | None,
                ctx: RunContext) -> tuple[np.ndarray, tuple]:
        """(rows, units) outputs and the cache for backward."""
        (rows, n), units = x2d.shape, w.shape[1]
        z = np.empty((rows, units), np.float32)
        y = z if self.activation in OUTPUT_GRADIENT else np.empty_like(z)
        ctx.run_tiles([partial(self._forward_tile, x2d, w, b, z, y, cols)
                       for cols in tiles(rows, n, units)])
        return y, (x2d, None if y is z else z, y)

    def _forward_tile(self, x2d, w, b, z, y, cols: slice) -> None:
        zc = z[:, cols]
        np.matmul(x2d, w[:, cols], out=zc)
        if self.half:
            round_half_(zc)
        if b is not None:
            np.add(zc, b[cols], out=zc)
            if self.half:
                round_half_(zc)
        if self.activation != "linear":
            activations.apply(self.activation, zc, out=y[:, cols])
            if self.half and self.activation not in EXACT_IN_HALF:
                round_half_(y[:, cols])

    def backward(self, cache: tuple, dy: np.ndarray, w: np.ndarray, has_bias: bool,
                 acc: Mapping[str, np.ndarray] | None, ctx: RunContext, input_grad: bool,
                 ) -> tuple[np.ndarray | None, dict[str, np.ndarray]]:
        """The input gradient (None unless `input_grad`) and the weight gradients ("kernel"
        shaped like w, "bias"): added into `acc` (overwriting it for the batch's first
        micro-batch) and returned, or new arrays without accumulators."""
        x2d, z, y = cache
        (rows, units), n = dy.shape, w.shape[0]
        dz = dy
        if self.activation != "linear":
            dz = activations.gradient(self.activation, z, y, dy)
            if self.half and self.activation not in EXACT_IN_HALF:
                round_half_(dz)
        grads: dict[str, np.ndarray] = {}
        if has_bias:
            accumulate(acc, "bias", dz.sum(axis=0), grads, ctx)
        grads["kernel"] = np.empty(w.shape, np.float32) if acc is None else acc["kernel"]
        scratch = None  # micro-batches after the batch's first: their gradient, then added
        if acc is not None and ctx.accumulate:
            if self._scratch is None or self._scratch.shape != w.shape:
                self._scratch = np.empty(w.shape, np.float32)
            scratch = self._scratch
        work = [partial(_weight_tile, x2d, dz, grads["kernel"], scratch, part)
                for part in tiles(n, rows, units, axis=0)]
        dx = None
        if input_grad:
            dx = np.empty((rows, n), np.float32)
            work += [partial(_input_tile, dz, w, dx, cols) for cols in tiles(rows, units, n)]
        ctx.run_tiles(work)
        return dx, grads



def _weight_tile(x2d: np.ndarray, dz: np.ndarray, grad: np.ndarray, scratch: np.ndarray | None,
                 part: slice) -> None:
    if scratch is None:
        np.matmul(x2d[:, part].T, dz, out=grad[part])
    else:
        np.matmul(x2d[:, part].T, dz, out=scratch[part])
        np.add(grad[part], scratch[part], out=grad[part])


def _input_tile(dz: np.ndarray, w: np.ndarray, dx: np.ndarray, cols: slice) -> None:
    np.matmul(dz, w[cols].T, out=dx[:, cols])
