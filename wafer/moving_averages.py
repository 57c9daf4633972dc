"""Weight moving averages: tf.compat.v1.train.ExponentialMovingAverage.apply after the
optimizer's updates, kept beside the weight in TensorFlow's shadow variable.

After every training step's updates, in TF's operation order (assign_moving_average without
zero debiasing): shadow -= (shadow - weight) * factor, where factor = 1 - decay is a
schedule (wafer.schedules) evaluated at the global step the graph reads: the step after the
step's increment when the average waits for the optimizer (`step_offset` 1), as
`num_updates=global_step` gives decay = min(decay, (1 + n) / (10 + n)).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wafer.schedules import Schedule

FACTOR = "moving_average"  # the factor schedule's hyper_parameter


@dataclass(frozen=True)
class MovingAverage:
    variable: str  # the averaged weight's TF name
    shadow: str  # its average's TF name (`<variable>/ExponentialMovingAverage`)
    factor: Schedule  # 1 - decay
    step_offset: int = 0  # the factor reads the global step after the step's increment: 1

    def to_message(self, pb):
        return pb.MovingAverage(variable=self.variable, shadow=self.shadow,
                                factor=self.factor.to_message(pb), step_offset=self.step_offset)

    @classmethod
    def from_message(cls, message) -> "MovingAverage":
        return cls(message.variable, message.shadow, Schedule.from_message(message.factor),
                   int(message.step_offset))


def update(shadow: np.ndarray, weight: np.ndarray, factor: np.float32) -> None:
    """shadow -= (shadow - weight) * factor, in place, float32 (TF's AssignSub of a Mul of
    a Sub)."""
    delta = np.subtract(shadow, weight)
    np.multiply(delta, factor, out=delta)
    np.subtract(shadow, delta, out=shadow)
