"""Optimizers with the exact `tf.compat.v1.train` update rules, applied in place, float32.

    sgd       var -= lr * g                                  (ApplyGradientDescent)
    momentum  accum = accum * mu + g                          (ApplyMomentum)
              var -= lr * accum, or with nesterov var -= g * lr + accum * mu * lr
    adam      alpha = lr * sqrt(1 - beta2_power) / (1 - beta1_power)   (ApplyAdam)
              m += (g - m) * (1 - beta1); v += (g * g - v) * (1 - beta2)
              var -= m * alpha / (sqrt(v) + epsilon)
              after every variable of the step: beta1_power *= beta1, beta2_power *= beta2

Slots are named as TensorFlow names them: "<var>/Momentum", "<var>/Adam", "<var>/Adam_1";
Adam's step counters are "beta1_power" and "beta2_power" (scalars).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

F32 = np.float32


@dataclass(frozen=True)
class OptimizerConfig:
    """The program's optimizer message, as typed float32 hyper-parameters."""

    type: str
    learning_rate: float
    momentum: float = 0.0
    use_nesterov: bool = False
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-8

    @classmethod
    def from_message(cls, message) -> "OptimizerConfig":
        return cls(message.type, message.learning_rate, message.momentum, message.use_nesterov,
                   message.beta1, message.beta2, message.epsilon)


class Optimizer:
    """Updates one variable at a time in place; `finish_step` runs once per step after all."""

    slot_suffixes: ClassVar[tuple[str, ...]] = ()
    scalar_names: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config: OptimizerConfig):
        self.config = config
        self.lr = F32(config.learning_rate)
        self.scalars: dict[str, np.ndarray] = {}

    def initial_scalars(self) -> dict[str, np.ndarray]:
        return {}

    def apply(self, var: np.ndarray, grad: np.ndarray, slots: list[np.ndarray],
              scratch: np.ndarray) -> None:
        """var -= update(grad); `slots` in slot_suffixes order; scratch shaped like var."""
        raise NotImplementedError

    def finish_step(self) -> None:
        """After every variable of the step was updated."""


class SGD(Optimizer):
    def apply(self, var, grad, slots, scratch):
        np.multiply(grad, self.lr, out=scratch)
        np.subtract(var, scratch, out=var)


class Momentum(Optimizer):
    slot_suffixes = ("Momentum",)

    def __init__(self, config: OptimizerConfig):
        super().__init__(config)
        self.mu = F32(config.momentum)

    def apply(self, var, grad, slots, scratch):
        (accum,) = slots
        np.multiply(accum, self.mu, out=accum)
        np.add(accum, grad, out=accum)
        if self.config.use_nesterov:
            np.multiply(grad, self.lr, out=scratch)
            np.subtract(var, scratch, out=var)  # var -= g * lr + accum * mu * lr, in TF's order
            np.multiply(accum, self.mu, out=scratch)
            np.multiply(scratch, self.lr, out=scratch)
            np.subtract(var, scratch, out=var)
        else:
            np.multiply(accum, self.lr, out=scratch)
            np.subtract(var, scratch, out=var)


class Adam(Optimizer):
    slot_suffixes = ("Adam", "Adam_1")
    scalar_names = ("beta1_power", "beta2_power")

    def __init__(self, config: OptimizerConfig):
        super().__init__(config)
        self.beta1, self.beta2, self.eps = F32(config.beta1), F32(config.beta2), F32(config.epsilon)
        self.one_minus_beta1, self.one_minus_beta2 = F32(1) - self.beta1, F32(1) - self.beta2

    def initial_scalars(self):
        return {"beta1_power": np.asarray(self.beta1, F32), "beta2_power": np.asarray(self.beta2, F32)}

    def alpha(self) -> np.float32:
        b1, b2 = F32(self.scalars["beta1_power"]), F32(self.scalars["beta2_power"])
        return F32(self.lr * np.sqrt(F32(1) - b2) / (F32(1) - b1))

    def apply(self, var, grad, slots, scratch):
        m, v = slots
        alpha = self.alpha()
        np.subtract(grad, m, out=scratch)
        np.multiply(scratch, self.one_minus_beta1, out=scratch)
        np.add(m, scratch, out=m)
        np.multiply(grad, grad, out=scratch)
        np.subtract(scratch, v, out=scratch)
        np.multiply(scratch, self.one_minus_beta2, out=scratch)
        np.add(v, scratch, out=v)
        np.sqrt(v, out=scratch)
        np.add(scratch, self.eps, out=scratch)
        np.divide(m, scratch, out=scratch)
        np.multiply(scratch, alpha, out=scratch)
        np.subtract(var, scratch, out=var)

    def finish_step(self):
        for name, beta in (("beta1_power", self.beta1), ("beta2_power", self.beta2)):
            self.scalars[name] = np.asarray(F32(self.scalars[name]) * beta, F32)


OPTIMIZERS: dict[str, type[Optimizer]] = {"sgd": SGD, "momentum": Momentum, "adam": Adam}


def make_optimizer(config: OptimizerConfig) -> Optimizer:
    try:
        cls = OPTIMIZERS[config.type]
    except KeyError:
        raise ValueError(f"unknown optimizer {config.type!r}; the CS system has "
                         f"{', '.join(OPTIMIZERS)}") from None
    optimizer = cls(config)
    optimizer.scalars = optimizer.initial_scalars()
    return optimizer
