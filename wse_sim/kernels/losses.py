"""Loss kernels. Each outputs one value per sample, scaled so that the batch's values sum
to the loss ("mean" divides by batch size x loss elements per sample, "sum" does not);
backward needs no upstream gradient and returns the gradient of that scaled value."""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from wse_sim.kernels.activations import sigmoid
from wse_sim.kernels.base import (INTEGER, Kernel, KernelError, RunContext, check_dtypes,
                                  max_cores_for, register)


class Loss(Kernel):
    is_loss = True
    label_shape_matches = True  # labels shaped like the predictions (else integer classes)

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]):
        super().__init__(name, attrs, input_shapes)
        self.reduction = self.attrs.get("reduction", "mean")
        if self.reduction not in ("mean", "sum"):
            raise KernelError(f"kernel {name!r}: reduction must be mean or sum, got {self.reduction!r}")
        if len(self.input_shapes) != 2:
            raise KernelError(f"kernel {name!r}: {self.type_name} takes (predictions, labels), "
                              f"got {len(self.input_shapes)} inputs")
        self.check_shapes(*self.input_shapes)

    def check_shapes(self, predictions: tuple[int, ...], labels: tuple[int, ...]) -> None:
        if predictions != labels:
            raise KernelError(f"kernel {self.name!r}: labels {labels} do not match "
                              f"predictions {predictions}")

    @property
    def output_shape(self):
        return ()

    def output_dtype(self, input_dtypes):
        check_dtypes(self, input_dtypes[:1], [(np.float32,)])
        return np.dtype(np.float32)

    def input_differentiable(self, index: int) -> bool:
        return index == 0  # the labels take no gradient

    def elements(self) -> int:
        """Loss elements per sample (what "mean" divides by, besides the batch size)."""
        return math.prod(self.input_shapes[0])

    def scale(self, ctx: RunContext) -> np.float32:
        if self.reduction == "sum":
            return np.float32(1)
        return np.float32(1.0 / (ctx.batch_size * self.elements()))

    def flops_per_sample(self) -> float:
        return float(4 * math.prod(self.input_shapes[0]))

    def max_cores(self) -> int:
        return max_cores_for(self.flops_per_sample())

    def activation_bytes_per_sample(self) -> int:
        return 4 * math.prod(self.input_shapes[0])


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


@register
class SparseSoftmaxCrossEntropy(Loss):
    type_name = "sparse_softmax_cross_entropy"

    def check_shapes(self, predictions, labels):
        if len(predictions) != 1 or labels != ():
            raise KernelError(f"kernel {self.name!r}: needs logits (k,) and integer labels (), "
                              f"got {predictions} and {labels}")

    def elements(self) -> int:
        return 1

    def output_dtype(self, input_dtypes):
        check_dtypes(self, input_dtypes, [(np.float32,), INTEGER])
        return np.dtype(np.float32)

    def forward(self, params, inputs, ctx: RunContext):
        logits, labels = inputs
        k = logits.shape[-1]
        labels = labels.astype(np.int64, copy=False)
        if labels.size and (labels.min() < 0 or labels.max() >= k):
            bad = labels[(labels < 0) | (labels >= k)][0]
            raise ValueError(f"{self.name}: label {bad} is outside the {k} classes [0, {k})")
        logp = log_softmax(logits)
        rows = np.arange(len(labels))
        scale = self.scale(ctx)
        return -logp[rows, labels] * scale, (logp, labels, scale)

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        logp, labels, scale = cache
        grad = np.exp(logp)
        grad[np.arange(len(labels)), labels] -= np.float32(1)
        return [grad * scale, None], {}


@register
class SoftmaxCrossEntropy(Loss):
    type_name = "softmax_cross_entropy"

    def check_shapes(self, predictions, labels):
        super().check_shapes(predictions, labels)
        if len(predictions) != 1:
            raise KernelError(f"kernel {self.name!r}: needs logits (k,), got {predictions}")

    def elements(self) -> int:
        return 1

    def forward(self, params, inputs, ctx: RunContext):
        logits, labels = inputs
        logp = log_softmax(logits)
        scale = self.scale(ctx)
        return -(labels * logp).sum(axis=-1) * scale, (logp, labels, scale)

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        logp, labels, scale = cache
        return [(np.exp(logp) - labels) * scale, None], {}


def _per_sample(values: np.ndarray) -> np.ndarray:
    return values.reshape(values.shape[0], -1).sum(axis=1)


@register
class SigmoidCrossEntropy(Loss):
    type_name = "sigmoid_cross_entropy"

    def forward(self, params, inputs, ctx: RunContext):
        x, z = inputs
        values = np.maximum(x, 0) - x * z + np.log1p(np.exp(-np.abs(x)))
        scale = self.scale(ctx)
        return _per_sample(values) * scale, (x, z, scale)

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        x, z, scale = cache
        return [(sigmoid(x) - z) * scale, None], {}


@register
class MeanSquaredError(Loss):
    type_name = "mean_squared_error"

    def forward(self, params, inputs, ctx: RunContext):
        p, z = inputs
        diff = p - z
        scale = self.scale(ctx)
        return _per_sample(diff * diff) * scale, (diff, scale)

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        diff, scale = cache
        return [diff * (np.float32(2) * scale), None], {}
