"""Quantization-aware training's fake quantization (tf.quantization.fake_quant_with_min_max_*),
bit for bit as TF's CPU kernels (fake_quant_ops_functor.h), float32 throughout:

  Nudge: scale = (max - min) / (qmax - qmin), inv = (qmax - qmin) / (max - min),
  zero = qmin - min / scale clamped to [qmin, qmax] and rounded half away from zero
  (std::round), nudged_min = (qmin - zero) * scale, nudged_max = (qmax - zero) * scale;
  quant_zero = floor(-nudged_min * inv + 0.5);
  output = floor(q - quant_zero + 0.5) * scale, q = (clamp(x) - nudged_min) * inv
  (FakeQuantWithMinMaxArgs, ...PerChannel) or (clamp(x) - nudged_min) / scale
  (FakeQuantWithMinMaxVars), with qmin = narrow_range, qmax = 2^num_bits - 1.

Measured bit-equal to TF 2.21 on 11.3 million values (num_bits 2..16, narrow or not,
ranges from 1e-3 to 30, every grid point, every half-step tie and its float neighbours,
the nudged edges, a subnormal read as zero as TF's threads do (DAZ):
tests/wafer/test_wse_kernels_quantization.py keeps a part of it).
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from wafer.kernels.base import KernelError, RunContext, register
from wafer.kernels.elementwise import Broadcasting
from wafer.kernels.operands import Operands

F32 = np.float32
FORMS = ("args", "vars", "per_channel")  # which TF kernel's arithmetic
TINY = np.finfo(F32).tiny


def denormals_as_zero(x: np.ndarray) -> np.ndarray:
    """x as TF's CPU kernels read it (DAZ: a subnormal is a zero of its sign)."""
    return np.where(np.abs(x) < TINY, np.copysign(F32(0), x), x).astype(F32)


def _std_round(z: np.ndarray) -> np.ndarray:
    """std::round of values >= 0 (half away from zero), exactly: z - floor(z) is exact."""
    low = np.floor(z)
    return (low + (z - low >= F32(0.5))).astype(F32)


def nudge(low: np.ndarray, high: np.ndarray, num_bits: int, narrow_range: bool,
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """TF's Nudge of float32 min/max arrays: (nudged_min, nudged_max, scale, inv_scale)."""
    qmin, qmax = F32(1 if narrow_range else 0), F32((1 << num_bits) - 1)
    low, high = np.asarray(low, F32), np.asarray(high, F32)
    with np.errstate(all="ignore"):
        scale = ((high - low) / (qmax - qmin)).astype(F32)
        inv = ((qmax - qmin) / (high - low)).astype(F32)
        zero_from_min = (qmin - (low / scale).astype(F32)).astype(F32)
    zero = np.where(zero_from_min < qmin, qmin, np.where(
        zero_from_min > qmax, qmax, _std_round(np.clip(zero_from_min, qmin, qmax)))).astype(F32)
    return ((qmin - zero) * scale).astype(F32), ((qmax - zero) * scale).astype(F32), scale, inv


def fake_quant(x: np.ndarray, low: np.ndarray, high: np.ndarray, num_bits: int,
               narrow_range: bool, divide: bool) -> np.ndarray:
    """x fake-quantized with min/max broadcast against it; `divide`: FakeQuantWithMinMaxVars'
    division by the scale (the others multiply by its inverse)."""
    nudged_min, nudged_max, scale, inv = nudge(low, high, num_bits, narrow_range)
    with np.errstate(all="ignore"):
        quant_zero = np.floor((-nudged_min * inv).astype(F32) + F32(0.5)).astype(F32)
        shifted = (np.maximum(np.minimum(x, nudged_max), nudged_min) - nudged_min).astype(F32)
        q = (shifted / scale if divide else shifted * inv).astype(F32)
        out = (np.floor(((q - quant_zero).astype(F32) + F32(0.5)).astype(F32)) * scale)
    # FakeQuantWithMinMaxVars(PerChannel) of min = max = 0 is zero (its gradient passes through)
    return np.where((low == 0) & (high == 0), F32(0), out).astype(F32)


@register
class FakeQuant(Broadcasting):
    """Operands (attr `operands`, 3 letters) x, min, max: x any per-sample shape (i); min and
    max scalars, or (C,) per channel of x's last axis (attr form per_channel), each an
    input (the weight program's), a constant (fake_quant_with_min_max_args) or a weight
    (learned min/max variables). attrs num_bits (2..16), narrow_range, form (args, vars,
    per_channel: whose arithmetic). Backward: TF's FakeQuant*Gradient: the gradient passes
    where nudged_min <= x <= nudged_max; min takes the sum of the gradient where x is below
    nudged_min, max where it is above nudged_max (per channel for per_channel); min = max
    = 0 passes every gradient to x."""

    type_name = "fake_quant"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]):
        super().__init__(name, attrs, input_shapes)
        self.operands = Operands(self, 3, broadcast=False)
        num_bits, self.form = attrs.get("num_bits"), attrs.get("form")
        x, low, high = self.operands[0], self.operands[1], self.operands[2]
        channels = x.shape[-1:] if self.form == "per_channel" else ()
        if x.letter != "i" or self.form not in FORMS or not isinstance(num_bits, int) or \
                not 2 <= num_bits <= 16 or low.shape != channels or high.shape != channels:
            raise KernelError(f"kernel {name!r} (fake_quant): takes operands x (an input), min "
                              f"and max (shape {channels}), num_bits in 2..16 and a form of "
                              f"{', '.join(FORMS)}; got {self.operands.letters}, shapes "
                              f"{[o.shape for o in self.operands]}, attrs {dict(attrs)}")
        self.num_bits: int = num_bits
        self.narrow_range = bool(attrs.get("narrow_range", False))
        self._shape = x.shape

    def flops_per_sample(self) -> float:
        return 6.0 * math.prod(self._shape)

    def activation_bytes_per_sample(self) -> int:
        return 4 * math.prod(self._shape)

    def input_differentiable(self, index: int) -> bool:
        return True

    def _bounds(self, params, inputs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """x, and min and max shaped to broadcast against it (an input's per sample)."""
        x, low, high = self.operands.arrays(params, inputs)
        x = denormals_as_zero(x)

        def shaped(value: np.ndarray, k: int) -> np.ndarray:
            o = self.operands[k]
            return np.asarray(value, F32).reshape(len(x) if o.letter == "i" else 1,
                                                  *[1] * (x.ndim - 1 - len(o.shape)), *o.shape)
        return x, shaped(low, 1), shaped(high, 2)

    def forward(self, params, inputs, ctx: RunContext):
        x, low, high = self._bounds(params, inputs)
        return fake_quant(x, low, high, self.num_bits, self.narrow_range, self.form == "vars"), \
            (x, low, high)

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        x, low, high = cache
        nudged_min, nudged_max, _, _ = nudge(low, high, self.num_bits, self.narrow_range)
        off = (low == 0) & (high == 0)
        inside = (x >= nudged_min) & (x <= nudged_max) | off
        zero = F32(0)
        grad_x = (grad_output * inside).astype(F32)  # TF: gradients * 0.0 or 1.0 (-0.0 kept)
        kept = tuple(range(1, x.ndim - (self.form == "per_channel")))
        below = np.where((x < nudged_min) & ~off, grad_output, zero).sum(axis=kept, dtype=F32)
        above = np.where((x > nudged_max) & ~off, grad_output, zero).sum(axis=kept, dtype=F32)
        return self.operands.gradients([grad_x, below, above], ctx, param_grads)
