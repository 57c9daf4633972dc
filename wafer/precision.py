"""The CS's 16-bit arithmetic (docs/design.md, "Mixed precision").

A kernel whose attr `precision` is "float16" computes a float16 tensor of the user's graph
(a Keras `mixed_float16` layer, or casts written by hand). Its values travel as float32
arrays holding float16 values, and the CS computes as the CS-1 does (16-bit operands,
float32 accumulation) and as TensorFlow's CPU kernels do for Eigen::half:

- operands are float16: the region rounds its float32 master weights to float16 once per
  batch (Keras' AutoCastVariable: weights stored float32, cast for the layer's compute);
- inside one op the arithmetic is float32 (a GEMM's or a reduction's sums, a softmax) and
  the op's result is rounded to float16, once (TF rounds every float16 tensor it makes);
- backward alike: the gradient a region receives for its float16 output is rounded to
  float16 (TF's gradient of a float16 tensor is float16), and a weight's gradient is summed
  over the batch's micro-batches in float32 and rounded to float16 once, at the end of the
  batch (TF computes it as one float16 op over the whole batch), then cast to float32 for
  the float32 optimizer.

Rounding is round-to-nearest-even with float16's overflow to infinity (what loss scaling
detects); numpy's float16 conversion, never a float16 GEMM.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

FLOAT16 = "float16"
PRECISIONS = ("float32", FLOAT16)
BYTES = {"float32": 4, FLOAT16: 2}  # bytes of one value on the wafer


def precision_of(attrs: Mapping[str, object]) -> str:
    """A kernel's precision from its attributes ("float32" unless it says float16)."""
    value = attrs.get("precision", "float32")
    return value if isinstance(value, str) else "float32"


def is_half(attrs: Mapping[str, object]) -> bool:
    return precision_of(attrs) == FLOAT16


def round_half(x: np.ndarray) -> np.ndarray:
    """`x` (float32) rounded to float16 values, as a new float32 array."""
    with np.errstate(over="ignore"):
        return x.astype(np.float16).astype(np.float32)


def round_half_(x: np.ndarray) -> None:
    """Round a float32 array to float16 values in place."""
    with np.errstate(over="ignore"):
        np.copyto(x, x.astype(np.float16))


def value_bytes(kernel: object) -> int:
    """Bytes of one of a kernel's weights or activations on the wafer."""
    return BYTES[precision_of(getattr(kernel, "attrs", {}))]
