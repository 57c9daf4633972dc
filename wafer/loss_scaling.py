"""Dynamic loss scaling: TensorFlow's DynamicLossScale rule, as
`tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer(optimizer, "dynamic")` (or a
`tf.compat.v1.mixed_precision.DynamicLossScale`) runs it on a float16 program.

Every training step seeds the backward with the current scale S (the loss times S; S in
float16 when the loss is float16, `half_seed`: a scale above float16's range seeds
infinities) and multiplies each gradient by 1 / S (float32) before any other transform. If
every gradient the optimizer would apply is finite, the update runs and the good-step
counter counts the step; after `increment_period` such steps in a row S is multiplied by
`multiplier` (kept if the product overflows) and the counter restarts. A step with a
non-finite gradient is skipped (no weight, slot or optimizer bookkeeping update), S is
divided by `multiplier` (not below 1) and the counter restarts. S and the counter are the
graph's variables (`current_loss_scale`, float32; `good_steps`, int64), checkpointed under
TF's names.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np


@dataclass(frozen=True)
class DynamicLossScale:
    scale_variable: str  # TF name of the current scale (float32)
    good_steps_variable: str  # TF name of the finite-steps counter (int64)
    increment_period: int
    multiplier: float
    half_seed: bool = False  # the loss is float16: S seeds the backward as a float16

    def seed(self, scale: np.float32) -> np.float32:
        """The factor the backward's seed carries for a scale S."""
        if not self.half_seed:
            return np.float32(scale)
        with np.errstate(over="ignore"):
            return np.float32(np.float16(scale))

    def next(self, scale: np.float32, good_steps: np.int64,
             finite: bool) -> tuple[np.float32, np.int64]:
        """The scale and counter after a step whose gradients were (not) all finite."""
        scale, multiplier = np.float32(scale), np.float32(self.multiplier)
        if not finite:
            return max(np.float32(scale / multiplier), np.float32(1.0)), np.int64(0)
        if good_steps + 1 >= self.increment_period:
            with np.errstate(over="ignore"):
                grown = np.float32(scale * multiplier)
            return (grown if np.isfinite(grown) else scale), np.int64(0)
        return scale, np.int64(good_steps + 1)

    def to_message(self, pb):
        return pb.DynamicLossScale(scale_variable=self.scale_variable,
                                   good_steps_variable=self.good_steps_variable,
                                   increment_period=self.increment_period,
                                   multiplier=self.multiplier, half_seed=self.half_seed)

    @classmethod
    def from_message(cls, message) -> "DynamicLossScale":
        return cls(message.scale_variable, message.good_steps_variable,
                   int(message.increment_period), float(message.multiplier),
                   bool(message.half_seed))


def problem(scaling: DynamicLossScale) -> str:
    """What is wrong with a program's dynamic loss scale ("" if nothing)."""
    if not scaling.scale_variable or not scaling.good_steps_variable or \
            scaling.scale_variable == scaling.good_steps_variable:
        return "needs two distinct variables (the scale and its good-step counter)"
    if scaling.increment_period < 1:
        return f"increment_period must be at least 1, got {scaling.increment_period}"
    if not (np.isfinite(scaling.multiplier) and scaling.multiplier > 1):
        return f"multiplier must be a finite number above 1, got {scaling.multiplier}"
    return ""


def all_finite(gradients: Iterable[np.ndarray]) -> bool:
    """Whether every gradient is finite (TF's reduce_all of is_finite per gradient)."""
    return all(bool(np.isfinite(g).all()) for g in gradients)
