"""A convolution's filter: a weight the CS trains (the kernel's `kernel` param), or a
constant (tf.constant, or computed from constants only: tf.image.ssim's Gaussian window,
tf.image.sobel_edges' kernels) the kernel holds as its attr `filter`: frozen, no gradient
into it. Either way the kernel computes the same convolution and TF's gradient into the
samples (Conv2D's, DepthwiseConv2dNative's, Conv3D's backprop of the input by the filter).
A float16 constant (mixed precision: a blur cast to the layer's dtype) is held as the float32
array of its float16 values, which the float16 kernel reads as it reads a weight's rounding."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tensorflow as tf

from coordinator.compiler.ir import ParamRef
from coordinator.compiler.operands import Weight
from coordinator.compiler.rules import Context


@dataclass(frozen=True)
class Filter:
    """The filter operand of one convolution kernel, as its user sees it (`shape`)."""

    shape: tuple[int, ...]
    weight: Weight | None = None
    value: np.ndarray | None = field(default=None, compare=False)  # float32, `shape`

    def params(self) -> list[ParamRef]:
        w = self.weight
        return [] if w is None else [ParamRef("kernel", w.variable, w.shape,
                                              variable_shape=w.variable_shape, view=w.view)]

    def attrs(self) -> dict[str, Any]:
        return {} if self.value is None else {"filter": self.value}

    @property
    def variable(self) -> str:
        """The weight's variable ("" for a constant: the kernel is named for its op)."""
        return "" if self.weight is None else self.weight.variable


def of_weight(weight: Weight) -> Filter:
    return Filter(weight.shape, weight=weight)


def find(m: Context, op: tf.Operation, tensor: tf.Tensor, derived: bool = False) -> Filter | str:
    """`op`'s filter `tensor` as a weight (through views; `derived`: or computed from weights
    by the weight program) or a constant, or why it is neither (one line)."""
    weight = m.operands.weight(tensor) or m.operands.view(tensor) or \
        (m.derived_weight(tensor) if derived else None)
    if weight is not None:
        return of_weight(weight)
    value = m.operands.shaped_constant(tensor)
    if value is not None:
        if tensor.dtype.base_dtype not in (tf.float32, tf.float16):
            return f"a filter of {tensor.dtype.base_dtype.name}: the CS convolves in float32"
        return Filter(tuple(int(d) for d in value.shape),
                      value=np.ascontiguousarray(value, np.float32))
    problem = m.weight_problem(tensor) if derived else ""
    if problem:
        return problem
    if m.is_batched(tensor):
        return (f"{op.type} by a filter computed from the samples (a filter per sample) has no "
                "CS kernel: the CS convolves by a weight or a constant filter")
    random = m.operands.random_source(tensor)
    if random is not None:
        return (f"{op.type} by a filter of random numbers ({random.type}) has no CS kernel: the "
                "CS convolves by a weight or a constant filter")
    return (f"{op.type} by a filter that is neither a weight, a static view of one, nor a "
            "constant has no CS kernel: convolve by a variable or a tf.constant")
