"""Loss terms of a weight alone (weight decay, Keras kernel_regularizer), float32:

    l2  scale * sum(w * w)    gradient w * (2 * scale)   (tf.nn.l2_loss(w) * c: scale c / 2;
                                                          Keras L2(l): scale l)
    l1  scale * sum(|w|)      gradient sign(w) * scale

The CS adds every param's reported terms to the step's reported loss, and their gradients to the
trained params' batch gradients once per batch (TF's loss includes them once, not per
micro-batch), before the gradient transforms. The gradients are bit-equal to TF's
(L2Loss's w * c, Square's grad * (2 * w) and Abs's grad * sign(w) multiply by powers of
two or signs, which round alike); the loss term is a float32 sum in numpy's order.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

F32 = np.float32
KINDS = ("l2", "l1")


@dataclass(frozen=True)
class Regularizer:
    kind: str
    scale: float
    reported: bool = True  # a term of the reported loss (else of the minimized one only)

    def problem(self) -> str:
        """Why the CS cannot compute the term, or ""."""
        if self.kind not in KINDS:
            return f"unknown regularizer {self.kind!r}; the CS system has {', '.join(KINDS)}"
        if not np.isfinite(self.scale):
            return f"regularizer {self.kind} has scale {self.scale}"
        return ""

    def loss(self, w: np.ndarray) -> np.float32:
        values = np.square(w) if self.kind == "l2" else np.abs(w)
        return F32(self.scale) * np.sum(values, dtype=F32)

    def add_gradient(self, w: np.ndarray, grad: np.ndarray) -> None:
        """grad += d(term)/dw, in place."""
        if self.kind == "l2":
            grad += w * F32(2 * self.scale)
        else:
            grad += np.sign(w) * F32(self.scale)
