"""The real Fourier transform of a sample's last axis, of which the CS computes one real
part: the magnitude |rfft(x)| (tf.abs(tf.signal.stft(...)), tf.abs(tf.signal.rfft(frames))),
or the real or imaginary part (tf.math.real, tf.math.imag). The complex value itself never
leaves the kernel.

The DFT is two real products of the frames with cosine and sine tables (the CS's matrix
products), accumulated in float64 and rounded to float32 once: the exact transform to float32
rounding. TF's float32 RFFT (ducc/pocketfft) is itself 1.2-1.8e-7 of a frame's largest
magnitude from the exact transform, so the two differ by that (docs/design.md).
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from wafer.kernels.base import KernelError, RunContext, Shape, check_dtypes, is_int, register
from wafer.kernels.structure import Elementwise

PARTS = ("magnitude", "real", "imag")


@register
class Spectrum(Elementwise):
    """attrs fft_length N and part (magnitude, real, imag): of x (..., n), the N // 2 + 1 bins
    y_k = Σ_j x_j e^(−2πi jk/N) over j < min(n, N) (TF's RFFT crops or zero-pads to N).
    Gradients are TF's (_ComplexAbsGrad, the real and imaginary parts' complex(g, 0),
    complex(0, g), then _RFFTGrad), the exact derivative: of the magnitude
    Re Σ_k g_k y_k / |y_k| e^(2πi jk/N), 0 where |y_k| is 0 (div_no_nan), as TF."""

    type_name = "spectrum"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]):
        super().__init__(name, attrs, input_shapes)
        length, self.part = self.attrs.get("fft_length"), self.attrs.get("part", "magnitude")
        if len(self.input_shapes) != 1 or not self.input_shapes[0] or not is_int(length) or \
                length < 1 or self.part not in PARTS:
            raise KernelError(f"kernel {name!r} (spectrum): takes 1 input of rank >= 1, an int "
                              f"fft_length >= 1 and a part in {PARTS}; got {self.input_shapes}, "
                              f"{length!r}, {self.part!r}")
        self.length = length
        size = self.input_shapes[0][-1]
        used = min(size, length)
        angles = 2 * np.pi * np.outer(np.arange(used), np.arange(length // 2 + 1)) / length
        self.cos = np.zeros((size, length // 2 + 1))
        self.sin = np.zeros((size, length // 2 + 1))
        self.cos[:used], self.sin[:used] = np.cos(angles), np.sin(angles)

    @property
    def output_shape(self):
        return (*self.input_shapes[0][:-1], self.length // 2 + 1)

    def flops_per_sample(self) -> float:
        """Two products of the frames with (n, N // 2 + 1) tables."""
        frames = float(np.prod(self.input_shapes[0][:-1]))
        return 4.0 * frames * self.cos.size

    def activation_bytes_per_sample(self) -> int:
        return 4 * 2 * int(np.prod(self.output_shape))  # the real and imaginary parts

    def output_dtype(self, input_dtypes):
        check_dtypes(self, input_dtypes, [(np.float32,)])
        return np.dtype(np.float32)

    def forward(self, params, inputs, ctx: RunContext):
        x = inputs[0].astype(np.float64)
        real, imag = x @ self.cos, -(x @ self.sin)
        if self.part == "real":
            return real.astype(np.float32), None
        if self.part == "imag":
            return imag.astype(np.float32), None
        magnitude = np.hypot(real, imag)
        return magnitude.astype(np.float32), (real, imag, magnitude)

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        g = grad_output.astype(np.float64)
        if self.part == "real":
            grad = g @ self.cos.T
        elif self.part == "imag":
            grad = -(g @ self.sin.T)
        else:
            real, imag, magnitude = cache
            scale = np.divide(g, magnitude, out=np.zeros_like(g), where=magnitude != 0)
            grad = (scale * real) @ self.cos.T - (scale * imag) @ self.sin.T
        return [grad.astype(np.float32)], {}


@register
class ScaledSpectrum(Elementwise):
    """attrs fft_length N, bins (k_1..k_m), scale_real, scale_imag (the constant complex s_i)
    and part (real, imag): Re or Im of y_(k_i) s_i, the RFFT's chosen bins times constants
    (tf.signal.dct: real(rfft(x, [2n])[..., :n] * 2e^(−iπk/2n))). A real linear map of x, the
    product with one table M (x (..., n_in) -> (..., m)) built in float64 from the float32
    constants; the output rounded to float32 once. Its gradient g Mᵀ is TF's (Real's
    complex(g, 0), Mul's g·conj(s), the slice's zero padding, _RFFTGrad): the transposed map."""

    type_name = "scaled_spectrum"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]):
        super().__init__(name, attrs, input_shapes)
        length, bins, part = (self.attrs.get(k) for k in ("fft_length", "bins", "part"))
        real, imag = (np.asarray(self.attrs.get(k, []), np.float64)
                      for k in ("scale_real", "scale_imag"))
        if len(self.input_shapes) != 1 or not self.input_shapes[0] or not is_int(length) or \
                length < 1 or part not in ("real", "imag") or not isinstance(bins, list) or \
                not bins or not all(is_int(k) and 0 <= k <= length // 2 for k in bins) or \
                real.shape != (len(bins),) or imag.shape != (len(bins),):
            raise KernelError(f"kernel {name!r} (scaled_spectrum): takes 1 input of rank >= 1, "
                              "an int fft_length >= 1, bins in [0, fft_length // 2], a real "
                              "and imaginary scale per bin and a part (real, imag); got "
                              f"{self.input_shapes}, {length!r}, {bins!r}, {part!r}")
        size = self.input_shapes[0][-1]
        used = min(size, length)
        # y_k s = Σ_j x_j (cos θ − i sin θ)(a + ib), θ = 2π jk/N
        angles = 2 * np.pi * np.outer(np.arange(used), bins) / length
        cos, sin = np.cos(angles), np.sin(angles)
        self.table = np.zeros((size, len(bins)))
        self.table[:used] = cos * real + sin * imag if part == "real" else cos * imag - sin * real

    @property
    def output_shape(self):
        return (*self.input_shapes[0][:-1], self.table.shape[1])

    def flops_per_sample(self) -> float:
        """One product of the frames with the (n, m) table."""
        return 2.0 * float(np.prod(self.input_shapes[0][:-1])) * self.table.size

    def activation_bytes_per_sample(self) -> int:
        return 4 * int(np.prod(self.output_shape))

    def output_dtype(self, input_dtypes):
        check_dtypes(self, input_dtypes, [(np.float32,)])
        return np.dtype(np.float32)

    def forward(self, params, inputs, ctx: RunContext):
        return (inputs[0].astype(np.float64) @ self.table).astype(np.float32), None

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        return [(grad_output.astype(np.float64) @ self.table.T).astype(np.float32)], {}
