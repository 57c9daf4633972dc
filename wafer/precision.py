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

Rounding is IEEE float16's (round to nearest even, overflow to infinity: what loss scaling
detects), carried out in float32 arithmetic; never a float16 GEMM.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
import numpy.typing as npt

FLOAT16 = "float16"
PRECISIONS = ("float32", FLOAT16)
BYTES = {"float32": 4, FLOAT16: 2}  # bytes of one value on the wafer
EXPONENT_BITS = np.uint32(0x7F800000)  # a float32's exponent field
SMALLEST_NORMAL = np.float32(2.0 ** -14)  # float16's; below it the quantum is 2 ** -24
LARGEST_BINADE = np.float32(2.0 ** 16)  # beyond float16's largest value, 65504
SHIFT_FACTOR = np.float32(1.5 * 2.0 ** 13)  # 1.5 x 2 ** 23 quanta of 2 ** -10 x 2 ** e
OVERFLOW_SCALE = np.float32(2.0 ** 112)  # 2 ** 16 x this overflows float32


def precision_of(attrs: Mapping[str, object]) -> str:
    """A kernel's precision from its attributes ("float32" unless it says float16)."""
    value = attrs.get("precision", "float32")
    return value if isinstance(value, str) else "float32"


def is_half(attrs: Mapping[str, object]) -> bool:
    return precision_of(attrs) == FLOAT16


def round_half(x: np.ndarray) -> np.ndarray:
    """`x` (float32) rounded to float16 values, as a new float32 array: bit-equal to numpy's (IEEE) float16
    conversion and back, in float32 arithmetic (numpy's float16 conversion is not
    vectorised: 3x slower). x is rounded to a multiple of its float16 quantum q (2 ** -24
    below float16's smallest normal) by (x + 1.5 q 2 ** 23) - 1.5 q 2 ** 23, whose sum lies
    in a binade of float32 spacing q: round to nearest, ties to even. Scaling by 2 ** 112 and
    back turns the magnitudes that round to 2 ** 16 or more (float16's overflow: from 65520)
    into infinities and leaves the others exact; the sign is x's (signed zeros). One
    compiled pass without the GIL (`wafer.compiled.round_value`)."""
    from wafer import compiled  # (numba: imported by the simulator's first rounding)

    out = np.empty(x.shape, np.float32)
    compiled.round_flat(np.ascontiguousarray(x).reshape(-1), out.reshape(-1))
    return out


def round_half_into(x: np.ndarray, out: np.ndarray) -> None:
    """Write `x` rounded to float16 values into `out` (float32, x's shape; one pass)."""
    from wafer import compiled

    if x.flags.c_contiguous and out.flags.c_contiguous:
        compiled.round_flat(x.reshape(-1), out.reshape(-1))
    else:
        np.copyto(out, round_half(x))


def round_half_(x: np.ndarray) -> None:
    """Round a float32 array to float16 values in place."""
    from wafer import compiled

    if x.flags.c_contiguous:
        compiled.round_in_place(x.reshape(-1))
    elif x.ndim == 2:
        compiled.round_rows(x)
    else:
        np.copyto(x, round_half(x))


def value_bytes(kernel: object) -> int:
    """Bytes of one of a kernel's weights or activations on the wafer."""
    return BYTES[precision_of(getattr(kernel, "attrs", {}))]


def streamed_bytes(dtype: str) -> int:
    """Bytes one value of a program input streams: a float16 stream's 2, a word (4 B) else."""
    return BYTES[FLOAT16] if dtype == FLOAT16 else BYTES["float32"]


def wafer_dtype(dtype: npt.DTypeLike) -> np.dtype:
    """The dtype a program input's values take on the wafer: a float16 stream's are float32
    arrays holding its values (exactly), as every float16 tensor's; others their own."""
    return np.dtype(np.float32) if np.dtype(dtype) == np.float16 else np.dtype(dtype)


def widened(array: np.ndarray) -> np.ndarray:
    """A streamed batch's array as the wafer holds it (`wafer_dtype`)."""
    return array.astype(np.float32) if array.dtype == np.float16 else array
