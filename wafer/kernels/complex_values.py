"""Complex values of a sample held as complex64 (pairs of float32 planes: real, imaginary)
inside one kernel: a closed region of TF's complex ops between real operands and one real
output (an FFT convolution irfft(rfft(x) * rfft(k)), an auto-correlation irfft(q * conj(k)),
FNet's real(fft2d(cast(x)))). The complex values never leave the kernel.

Each step of the region rounds to complex64 as TF's op does: element-wise arithmetic in
float32, the transforms exact (float64) rounded once. Gradients are TF's gradient functions
(fft_ops.py, math_grad.py), each the adjoint of its op as a real-linear map under TF's
convention (a complex gradient is dL/dRe + i dL/dIm).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from wafer.kernels.base import KernelError, RunContext, Shape, check_dtypes, max_cores_for, register
from wafer.kernels.operands import Operands, OperandsKernel, reduce_to

C64 = np.complex64
# op -> number of arguments; transforms take attr fft_length (RFFT, IRFFT: the last axis)
OPS = {"RFFT": 1, "IRFFT": 1, "RFFT2D": 1, "IRFFT2D": 1, "FFT": 1, "IFFT": 1, "FFT2D": 1,
       "IFFT2D": 1, "Mul": 2, "AddV2": 2, "Add": 2, "Sub": 2, "RealDiv": 2, "Div": 2,
       "Neg": 1, "Conj": 1, "Complex": 2, "Real": 1, "Imag": 1, "ComplexAbs": 1, "Exp": 1,
       "ToComplex": 1, "ToReal": 1, "Identity": 1, "Sum": 1, "Mean": 1,
       "Pad": 1}
REAL_RESULTS = ("IRFFT", "IRFFT2D", "Real", "Imag", "ComplexAbs", "ToReal")


def _fit(x: np.ndarray, lengths: Sequence[int]) -> np.ndarray:
    """`x` cropped or zero-padded along its last len(lengths) axes to `lengths`."""
    axes = range(x.ndim - len(lengths), x.ndim)
    index: tuple[Any, ...] = (Ellipsis, *(slice(0, n) for n in lengths))
    x = x[index]
    pad = [(0, 0)] * x.ndim
    for axis, n in zip(axes, lengths):
        pad[axis] = (0, n - x.shape[axis])
    return np.pad(x, pad) if any(p for _, p in pad) else x


def _weights(n: int) -> np.ndarray:
    """The Hermitian weights of irfft's n // 2 + 1 bins (1 at 0 and n/2, 2 elsewhere)."""
    w = np.full(n // 2 + 1, 2.0)
    w[0] = 1.0
    if n % 2 == 0:
        w[-1] = 1.0
    return w


@dataclass(frozen=True)
class Step:
    """One op of the region: its TF type, the values it reads and its attributes."""

    op: str
    args: tuple[int, ...]
    fft_length: tuple[int, ...] = ()  # a transform's
    axes: tuple[int, ...] = ()  # a Sum's or Mean's
    keep: bool = False  # a Sum's or Mean's keep_dims
    pad: tuple[tuple[int, int], ...] = ()  # a Pad's (before, after) per axis

    @classmethod
    def decoded(cls, spec: dict) -> Step:
        return cls(spec["op"], tuple(spec["args"]), tuple(int(v) for v in spec.get("fft_length", ())),
                   tuple(int(v) for v in spec.get("axes", ())), bool(spec.get("keep")),
                   tuple((int(p[0]), int(p[1])) for p in spec.get("pad", ())))


def _forward(step: Step, args: list[np.ndarray]) -> np.ndarray:
    op, n, axes, a, b = step.op, list(step.fft_length), step.axes, args[0], args[-1]
    if op == "Pad":
        return np.pad(a, step.pad)
    if op in ("Sum", "Mean"):
        total = a.sum(axis=axes, keepdims=step.keep, dtype=a.dtype)
        return total / a.dtype.type(math.prod(a.shape[k] for k in axes)) if op == "Mean" \
            else total
    if op in ("RFFT", "RFFT2D"):
        return np.fft.rfftn(_fit(a.astype(np.float64), n), axes=range(-len(n), 0)).astype(C64)
    if op in ("IRFFT", "IRFFT2D"):
        bins = [*n[:-1], n[-1] // 2 + 1]
        return np.fft.irfftn(_fit(a.astype(np.complex128), bins), n,
                             axes=range(-len(n), 0)).astype(np.float32)
    if op in ("FFT", "IFFT", "FFT2D", "IFFT2D"):
        f = np.fft.fftn if op.startswith("F") else np.fft.ifftn
        return f(a.astype(np.complex128), axes=_fft_axes(op)).astype(C64)
    results = {
        "Mul": lambda: a * b, "AddV2": lambda: a + b, "Add": lambda: a + b,
        "Sub": lambda: a - b, "RealDiv": lambda: a / b, "Div": lambda: a / b,
        "Neg": lambda: -a, "Conj": lambda: np.conj(a), "Exp": lambda: np.exp(a),
        "Complex": lambda: (a + 1j * b.astype(C64)).astype(C64), "Identity": lambda: a,
        "Real": lambda: a.real, "Imag": lambda: a.imag, "ComplexAbs": lambda: np.abs(a),
        "ToComplex": lambda: a.astype(C64), "ToReal": lambda: a.real}
    return np.asarray(results[op]())


def _fft_axes(op: str) -> tuple[int, ...]:
    return (-1,) if op in ("FFT", "IFFT") else (-2, -1)


def _backward(step: Step, args: list[np.ndarray], out: np.ndarray,
              g: np.ndarray) -> list[np.ndarray]:
    """TF's gradients of the step's arguments from its output's gradient `g`."""
    op, n, axes, a, b = step.op, list(step.fft_length), step.axes, args[0], args[-1]
    if op == "Pad":
        return [g[tuple(slice(p, p + d) for (p, _), d in zip(step.pad, a.shape))]]
    if op in ("Sum", "Mean"):  # g broadcast back along the reduced axes (/ their size)
        g = g if step.keep else np.expand_dims(g, axes)
        g = np.broadcast_to(g, a.shape)
        return [g / g.dtype.type(math.prod(a.shape[k] for k in axes)) if op == "Mean" else g]
    if op in ("RFFT", "RFFT2D"):  # Re of N * ifft of the bins zero-padded to N
        full = np.fft.ifftn(_fit(g.astype(np.complex128), n), axes=range(-len(n), 0))
        return [_fit(full.real * math.prod(n), a.shape[-len(n):]).astype(np.float32)]
    if op in ("IRFFT", "IRFFT2D"):  # rfft of g, the bins weighted as irfft sums them, / N
        spectrum = np.fft.rfftn(g.astype(np.float64), axes=range(-len(n), 0))
        spectrum = spectrum * _weights(n[-1]) / math.prod(n)
        return [_fit(spectrum, a.shape[-len(n):]).astype(C64)]
    if op in ("FFT", "IFFT", "FFT2D", "IFFT2D"):
        size = math.prod(a.shape[k] for k in _fft_axes(op))
        g = g.astype(np.complex128)
        grad = np.fft.ifftn(g, axes=_fft_axes(op)) * size if op.startswith("F") else \
            np.fft.fftn(g, axes=_fft_axes(op)) / size
        return [grad.astype(C64)]
    if op == "Mul":
        return [g * np.conj(b), g * np.conj(a)]
    if op in ("AddV2", "Add", "Identity"):
        return [g, g][:len(args)]
    if op == "Sub":
        return [g, -g]
    if op in ("RealDiv", "Div"):
        return [g / np.conj(b), -g * np.conj(a / b / b)]
    if op == "Neg":
        return [-g]
    if op == "Conj":
        return [np.conj(g)]
    if op == "Exp":
        return [g * np.conj(out)]
    if op == "Complex":
        return [g.real, g.imag]
    if op in ("Real", "ToReal"):
        return [g.astype(C64)]
    if op == "Imag":
        return [(1j * g).astype(C64)]
    if op == "ComplexAbs":  # div_no_nan(complex(g, 0) * z, complex(|z|, 0))
        scale = np.divide(g, out, out=np.zeros_like(g), where=out != 0)
        return [(scale * a).astype(C64)]
    return [g.real.astype(np.float32)]  # ToComplex


@register
class ComplexRegion(OperandsKernel):
    """attrs operands (i, c, p letters of the real operands), program (JSON: a list of steps
    {"op", "args", "fft_length" of a transform, "axes" and "keep" of a Sum or Mean, "pad"
    (before, after per axis) of a Pad}; values
    0..k-1 are the operands, step j is value k + j),
    the last step's real value the output."""

    type_name = "complex_region"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]):
        super().__init__(name, attrs, input_shapes)
        letters = self.attrs.get("operands")
        self.operands = Operands(self, len(letters) if isinstance(letters, str) else 0,
                                 broadcast=False)
        try:
            program = json.loads(self.attrs.get("program", ""))
        except (TypeError, ValueError):
            program = None
        count = len(self.operands.letters)
        if not isinstance(program, list) or not program or any(
                not isinstance(s, dict) or OPS.get(str(s.get("op"))) != len(s.get("args", ())) or
                any(not 0 <= a < count + j for a in s["args"])
                for j, s in enumerate(program)) or program[-1]["op"] not in REAL_RESULTS:
            raise KernelError(f"kernel {name!r} (complex_region): program must be a list of "
                              f"steps of {sorted(OPS)} reading earlier values and ending in "
                              f"a real value ({', '.join(REAL_RESULTS)}), got {program!r}")
        self.program = [Step.decoded(s) for s in program]
        shapes = [(1, *o.shape) if o.letter == "i" else o.shape for o in self.operands]
        probe = self._run([np.zeros(s, np.float32) for s in shapes])[-1]
        if probe.ndim == 0 or probe.shape[0] != 1 or not self.operands.letters.count("i"):
            raise KernelError(f"kernel {name!r} (complex_region): its output {probe.shape} "
                              "is not per sample")
        self._shape = tuple(probe.shape[1:])

    def _run(self, operands: list[np.ndarray]) -> list[np.ndarray]:
        values = list(operands)
        for step in self.program:
            values.append(_forward(step, [values[a] for a in step.args]))
        return values

    def output_dtype(self, input_dtypes):
        check_dtypes(self, self.operands.dtypes(input_dtypes),
                     [(np.float32,)] * len(self.operands.letters))
        return np.dtype(np.float32)

    def flops_per_sample(self) -> float:
        """~5 N log2 N per transform of N points, 6 per complex element-wise product."""
        size = 4.0 * max(math.prod(self._shape), 1)
        return float(len(self.program)) * size * max(math.log2(size), 1.0)

    def max_cores(self) -> int:
        return max_cores_for(self.flops_per_sample())

    def activation_bytes_per_sample(self) -> int:
        return 8 * len(self.program) * max(math.prod(self._shape), 1)

    def forward(self, params, inputs, ctx: RunContext):
        values = self._run([np.asarray(v, np.float32)
                            for v in self.operands.arrays(params, inputs)])
        return values[-1].astype(np.float32), values

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        values = cache
        count = len(self.operands.letters)
        grads: list[np.ndarray | None] = [None] * len(values)
        grads[-1] = np.asarray(grad_output, np.float32)
        for j in range(len(self.program) - 1, -1, -1):
            g = grads[count + j]
            if g is None:
                continue
            step = self.program[j]
            inputs = [values[a] for a in step.args]
            for a, arg, grad in zip(step.args, inputs, _backward(step, inputs, values[count + j], g)):
                grad = reduce_to(np.asarray(grad), arg.shape).astype(arg.dtype)
                grads[a] = grad if grads[a] is None else grads[a] + grad
        return self.operands.gradients(grads[:count], ctx, param_grads)
