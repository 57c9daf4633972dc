"""act(x @ w + b) on rows of x, forward and backward, the arithmetic dense and conv2d
(on im2col rows) share, in tiles (`wafer.kernels.tiles`) that the executor's threads may
compute at once.

Forward, a tile is a range of the output's columns: its GEMM, bias and activation in one
pass. Backward, the activation's derivative and the bias gradient come first (untiled,
cheap), then the input gradient in ranges of the input's columns, which the layer before
waits for, and behind them the weight gradient in ranges of the weight's rows (contiguous,
so adding it into the accumulator is one pass), which the executor lets run on while the
layer before starts its backward pass (`RunContext.run_tiles`' `later`).

A tile whose activation is relu, relu6 or linear, on C-contiguous operands, runs compiled
(`wafer.compiled`: one call holding no GIL, numpy's arithmetic bit for bit); the others
run in numpy.
"""
from __future__ import annotations

from functools import partial
from types import ModuleType
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
_NO_BIAS = np.zeros(0, np.float32)


def compiled() -> ModuleType:
    """wafer.compiled, imported on first use (numba's import is the simulator's alone)."""
    from wafer import compiled as module

    return module


class Affine:
    """One kernel's x @ w (+ b) then `activation`, with its scratch for the weight
    gradient of micro-batches after the batch's first. `half`: a float16 layer (TF's
    MatMul, BiasAdd and activation each round their result to float16; wafer.precision),
    whose output is therefore float16-valued already."""

    def __init__(self, activation: str, half: bool = False):
        self.activation = activation
        self.half = half
        self._scratch: np.ndarray | None = None
        # its activation's code in wafer.compiled (-1: numpy tiles, as for the bench's A/B)
        self.code: int | None = None

    def _compiled(self, x2d: np.ndarray, w: np.ndarray) -> bool:
        """Whether this GEMM's tiles run compiled: a coded activation, C-contiguous float32
        operands, and no dimension of 1 (numpy's matmul calls gemv or dot there)."""
        if self.code is None:
            self.code = compiled().CODES.get(self.activation, -1)
        return self.code >= 0 and x2d.flags.c_contiguous and w.flags.c_contiguous \
            and x2d.dtype == w.dtype == np.float32 and min(*x2d.shape, w.shape[1]) > 1

    def forward(self, x2d: np.ndarray, w: np.ndarray, b: np.ndarray | None,
                ctx: RunContext, tail: int = 0) -> tuple[np.ndarray, tuple]:
        """(rows, units) outputs and the cache for backward; `tail`: how many of the last
        outputs TF's Sigmoid computes on Eigen's scalar path (activations.scalar_tail)."""
        (rows, n), units = x2d.shape, w.shape[1]
        z = np.empty((rows, units), np.float32)
        y = z if self.activation in OUTPUT_GRADIENT else np.empty_like(z)
        if self._compiled(x2d, w):
            bias, run = _NO_BIAS if b is None else b, compiled()
            ctx.run_tiles([partial(run.affine_forward, x2d, w, bias, z, y, cols.start,
                                   cols.stop, b is not None, self.code, self.half)
                           for cols in tiles(rows, n, units)])
            return y, (x2d, None if y is z else z, y)
        ctx.run_tiles([partial(self._forward_tile, x2d, w, b, z, y, cols, tail)
                       for cols in tiles(rows, n, units)])
        return y, (x2d, None if y is z else z, y)

    def _forward_tile(self, x2d, w, b, z, y, cols: slice, tail: int) -> None:
        zc = z[:, cols]
        np.matmul(x2d, w[:, cols], out=zc)
        if self.half:
            round_half_(zc)
        if b is not None:
            np.add(zc, b[cols], out=zc)
            if self.half:
                round_half_(zc)
        if self.activation != "linear":
            scalar = self.activation == "sigmoid" and not self.half and tail
            if scalar:  # the tile's part of the whole output's last `tail`
                row, col = np.divmod(np.arange(z.size - tail, z.size), z.shape[1])
                inside = (col >= cols.start) & (col < cols.stop)
                row, col = row[inside], col[inside]
                last = z[row, col]
            activations.apply(self.activation, zc, out=y[:, cols], half=self.half, tail=0)
            if scalar:
                y[row, col] = activations.sigmoid(last, tail=last.size)
            if self.half and self.activation not in EXACT_IN_HALF:
                round_half_(y[:, cols])

    def backward(self, cache: tuple, dy: np.ndarray, w: np.ndarray, has_bias: bool,
                 acc: Mapping[str, np.ndarray] | None, ctx: RunContext, input_grad: bool,
                 weight_grad: bool = True) -> tuple[np.ndarray | None, dict[str, np.ndarray]]:
        """The input gradient (None unless `input_grad`) and the weight gradients ("kernel"
        shaped like w, "bias"): added into `acc` (overwriting it for the batch's first
        micro-batch) and returned, or new arrays without accumulators. Without
        `weight_grad` (a constant filter) there is no "kernel" gradient."""
        x2d, z, y = cache
        if self._compiled(x2d, w):
            return self._compiled_backward(x2d, z, y, dy, w, has_bias, acc, ctx, input_grad,
                                           weight_grad)
        return self._numpy_backward(x2d, z, y, dy, w, has_bias, acc, ctx, input_grad, weight_grad)

    def _numpy_backward(self, x2d, z, y, dy, w, has_bias, acc, ctx, input_grad, weight_grad):
        (rows, units), n = dy.shape, w.shape[0]
        dz = dy
        if self.activation != "linear":
            dz = activations.gradient(self.activation, z, y, dy, half=self.half)
            if self.half and self.activation not in EXACT_IN_HALF:
                round_half_(dz)
        grads: dict[str, np.ndarray] = {}
        if has_bias:
            accumulate(acc, "bias", dz.sum(axis=0), grads, ctx)
        weight = []
        if weight_grad:
            grads["kernel"] = np.empty(w.shape, np.float32) if acc is None else acc["kernel"]
            scratch = None  # micro-batches after the batch's first: their gradient, then added
            if acc is not None and ctx.accumulate:
                if self._scratch is None or self._scratch.shape != w.shape:
                    self._scratch = np.empty(w.shape, np.float32)
                scratch = self._scratch
            weight = [partial(_weight_tile, x2d, dz, grads["kernel"], scratch, part)
                      for part in tiles(n, rows, units, axis=0)]
        dx, work = None, []
        if input_grad:
            dx = np.empty((rows, n), np.float32)
            work = [partial(_input_tile, dz, w, dx, cols) for cols in tiles(rows, units, n)]
        ctx.run_tiles(work, later=weight)
        return dx, grads

    def _compiled_backward(self, x2d, z, y, dy, w, has_bias, acc, ctx, input_grad, weight_grad):
        (rows, units), n = dy.shape, w.shape[0]
        dz = np.empty((rows, units), np.float32)
        bias_sum = np.empty(units if has_bias else 0, np.float32)
        run = compiled()
        run.affine_gradient(dy, y if z is None else z, y, dz, bias_sum, has_bias,
                                 self.code)
        grads: dict[str, np.ndarray] = {}
        if has_bias:
            accumulate(acc, "bias", bias_sum, grads, ctx)
        weight = []
        if weight_grad:
            grads["kernel"] = np.empty(w.shape, np.float32) if acc is None else acc["kernel"]
            add = acc is not None and ctx.accumulate
            if add and (self._scratch is None or self._scratch.shape != w.shape):
                self._scratch = np.empty(w.shape, np.float32)
            scratch = self._scratch if add else grads["kernel"]
            weight = [partial(run.weight_gradient, x2d, dz, grads["kernel"], scratch,
                              part.start, part.stop, add) for part in tiles(n, rows, units, axis=0)]
        dx, work = None, []
        if input_grad:
            dx = np.empty((rows, n), np.float32)
            work = [partial(run.input_gradient, dz, w, dx, cols.start, cols.stop)
                    for cols in tiles(rows, units, n)]
        ctx.run_tiles(work, later=weight)
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
