"""Gradient transforms between compute_gradients and apply_gradients, with TensorFlow's
formulas in float32 and TF's operation order (tf.clip_by_value, tf.clip_by_norm,
tf.clip_by_global_norm, scaling), and the exact 0 of a gradient that is 0 in exact arithmetic
(coordinator.compiler.training.shift). The CS applies them, in program order, to a batch's
complete gradients (regularizer gradients included) before any weight is updated.

    zero                 g = g * 0: a gradient 0 in exact arithmetic, of which TF computes
                         rounding noise (the compiler emits it last; wse_sim applies it at
                         the update, after the finite test of dynamic loss scaling)
    noise_floor          g = where(|g| <= value * G, 0, g), G the largest magnitude among all
                         the batch's gradients (every trained variable's, not only the
                         named ones), when G is finite and > 0: the elements of a gradient
                         that are rounding noise at that scale (a sum that cancels, 0 in
                         exact arithmetic) get the exact 0 (emitted last, with `zero`;
                         applied after the finite test; coordinator.compiler.training.noise)
    scale                g = g * value
    clip_by_value        g = maximum(minimum(g, high), low)
    clip_by_norm         l2 = sqrt(sum(g * g)) (0 if the sum is 0)
                         g = g * value / maximum(l2, value)
    clip_by_global_norm  gn = sqrt(sum over the group of sum(g * g) / 2 * 2)
                         g = g * (value * minimum(1 / gn, 1 / value) + (gn - gn))

scale and clip_by_value are elementwise and bit-equal to TF. The norms are sums of squares,
which TF's Eigen reduces in its own blocked order; numpy sums float32 in another, so a norm
may differ from TF's in its last bits. Only the clipping factor depends on it: a gradient
that is not clipped is bit-equal to TF's (the factor is value / value, resp.
value * (1 / value), computed as TF computes it), a clipped one is within a few float32 ULP
(tests/wse_sim/test_wse_training_semantics.py measures it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from cs_api import cs_api_pb2 as pb

F32 = np.float32
KINDS = ("scale", "clip_by_value", "clip_by_norm", "clip_by_global_norm", "zero", "noise_floor")


@dataclass(frozen=True)
class GradientTransform:
    """One transform of the program; `variables` are TF variable names (the group of
    clip_by_global_norm, the gradients every other kind applies to one by one)."""

    kind: str
    value: float = 0.0
    low: float = 0.0
    high: float = 0.0
    variables: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        problem = self.problem()
        if problem:
            raise ValueError(problem)

    def problem(self) -> str:
        """Why the transform cannot be applied, or ""."""
        if self.kind not in KINDS:
            return f"unknown gradient transform {self.kind!r}; the CS system has {', '.join(KINDS)}"
        if not self.variables:
            return f"gradient transform {self.kind} names no variables"
        if len(set(self.variables)) != len(self.variables):
            return f"gradient transform {self.kind} names a variable twice"
        if self.kind in ("clip_by_norm", "clip_by_global_norm") and \
                not 0 < self.value < np.inf:
            return f"{self.kind} needs a finite clip norm > 0, got {self.value}"
        if self.kind == "noise_floor" and not 0 < self.value < 1:
            return f"noise_floor needs a fraction of the largest gradient in (0, 1), got {self.value}"
        return ""

    def to_message(self) -> pb.GradientTransform:
        return pb.GradientTransform(kind=self.kind, value=self.value, low=self.low,
                                    high=self.high, variables=list(self.variables))

    @classmethod
    def from_message(cls, message: pb.GradientTransform) -> "GradientTransform":
        return cls(message.kind, message.value, message.low, message.high,
                   tuple(message.variables))


def _sum_of_squares(g: np.ndarray) -> np.float32:
    return np.float32(np.sum(np.square(g), dtype=F32))


def _clip_by_norm(g: np.ndarray, clip_norm: np.float32) -> None:
    l2sum = _sum_of_squares(g)
    l2norm = np.sqrt(l2sum) if l2sum > 0 else l2sum
    np.multiply(g, clip_norm, out=g)
    np.divide(g, np.maximum(l2norm, clip_norm), out=g)


def _clip_by_global_norm(grads: Sequence[np.ndarray], clip_norm: np.float32) -> None:
    half_squared = F32(0)
    for g in grads:  # tf.nn.l2_loss per gradient, summed in the group's order
        half_squared = F32(half_squared + _sum_of_squares(g) * F32(0.5))
    norm = np.sqrt(half_squared * F32(2))
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = F32(clip_norm * np.minimum(F32(1) / norm, F32(1) / clip_norm)) + (norm - norm)
    for g in grads:
        np.multiply(g, scale, out=g)


def _noise_floor(group: Sequence[np.ndarray], grads: Mapping[str, np.ndarray],
                 fraction: float) -> None:
    largest = max((float(np.max(np.abs(g), initial=0.0)) for g in grads.values()), default=0.0)
    if not 0 < largest < np.inf:  # (no scale to judge noise by; a NaN compares false)
        return
    threshold = fraction * largest
    for g in group:
        g[np.abs(g) <= threshold] = 0


def apply_transforms(transforms: Sequence[GradientTransform],
                     grads: Mapping[str, np.ndarray]) -> None:
    """Apply `transforms` in order to `grads` (float32 arrays by TF variable name, every
    trained variable's: noise_floor's scale is their largest), in place."""
    for t in transforms:
        missing = [v for v in t.variables if v not in grads]
        if missing:
            raise KeyError(f"gradient transform {t.kind}: no gradient for {missing[0]!r}")
        group = [grads[v] for v in t.variables]
        if t.kind == "clip_by_global_norm":
            _clip_by_global_norm(group, F32(t.value))
            continue
        if t.kind == "noise_floor":
            _noise_floor(group, grads, t.value)
            continue
        for g in group:
            if t.kind in ("scale", "zero"):
                np.multiply(g, F32(t.value), out=g)
            elif t.kind == "clip_by_value":
                np.minimum(g, F32(t.high), out=g)
                np.maximum(g, F32(t.low), out=g)
            else:
                _clip_by_norm(g, F32(t.value))
