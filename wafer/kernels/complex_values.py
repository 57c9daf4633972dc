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
       "ToComplex": 1, "ToReal": 1, "Identity": 1, "Sum": 1, "Mean": 1, "Log": 1, "Sqrt": 1,
       "Square": 1, "Angle": 1, "Einsum": 2, "Take": 0}  # (0: any number)
REAL_RESULTS = ("IRFFT", "IRFFT2D", "Real", "Imag", "ComplexAbs", "ToReal", "Angle")


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
    index: tuple[int, ...] = ()  # a Take's: each output element's element of its args, -1: 0
    shape: tuple[int, ...] = ()  # a Take's output (a sample's if batched)
    batched: bool = False  # a Take's args carry the batch axis first
    equation: str = ""  # an Einsum's, explicit
    conj: tuple[bool, ...] = ()  # an Einsum's operands it conjugates first (adj_x, adj_y),
    # a Take's output (ConjugateTranspose)

    @classmethod
    def decoded(cls, spec: dict) -> Step:
        return cls(spec["op"], tuple(spec["args"]), tuple(int(v) for v in spec.get("fft_length", ())),
                   tuple(int(v) for v in spec.get("axes", ())), bool(spec.get("keep")),
                   tuple(int(v) for v in spec.get("index", ())),
                   tuple(int(v) for v in spec.get("shape", ())), bool(spec.get("batched")),
                   str(spec.get("equation", "")), tuple(bool(c) for c in spec.get("conj", ())))


def _rows(step: Step, args: list[np.ndarray]) -> int:
    return args[0].shape[0] if step.batched else 1


def _take(step: Step, args: list[np.ndarray]) -> np.ndarray:
    """The Take's output: its args' (per-sample) elements at its index, 0 at -1."""
    rows = _rows(step, args)
    flat = np.concatenate([x.reshape(rows, -1) for x in args] + [
        np.zeros((rows, 1), args[0].dtype)], axis=1)
    out = flat[:, list(step.index)].reshape((rows, *step.shape) if step.batched else step.shape)
    return np.conj(out) if any(step.conj) else out


def _take_grads(step: Step, args: list[np.ndarray], g: np.ndarray) -> list[np.ndarray]:
    """g summed back to the elements each output element took (TF's scatter of a slice's,
    a concat's split, a pad's crop; conjugated back for a ConjugateTranspose)."""
    rows = _rows(step, args)
    g = np.conj(g) if any(step.conj) else g
    flat = np.zeros((rows, sum(x[0].size if step.batched else x.size for x in args) + 1),
                    g.dtype)
    np.add.at(flat.T, np.asarray(step.index), g.reshape(rows, -1).T)  # (into flat's columns)
    ends = np.cumsum([x.size // rows for x in args])[:-1]
    return [part.reshape(x.shape) for part, x in zip(np.split(flat[:, :-1], ends, 1), args)]


def _conj_args(step: Step, args: list[np.ndarray]) -> list[np.ndarray]:
    return [np.conj(x) if c else x for x, c in zip(args, step.conj)]


def _einsum_grads(step: Step, args: list[np.ndarray], g: np.ndarray) -> list[np.ndarray]:
    """Each operand's gradient: g contracted with the other's conjugate (TF's
    _MatMulGrad/_EinsumGrad), broadcast along the axes only the operand has."""
    inputs, output = step.equation.split("->")
    subs, values = inputs.split(","), _conj_args(step, args)
    grads = []
    for k in (0, 1):
        own, other = subs[k], subs[1 - k]
        kept = "".join(c for c in own if c in output or c in other)
        grad = np.einsum(f"{output},{other}->{kept}", g, np.conj(values[1 - k]))
        grad = np.expand_dims(grad, [i for i, c in enumerate(own) if c not in kept])
        grad = np.broadcast_to(grad, values[k].shape)
        grads.append(np.conj(grad) if step.conj[k] else grad)
    return grads


def _forward(step: Step, args: list[np.ndarray]) -> np.ndarray:
    op, n, axes, a, b = step.op, list(step.fft_length), step.axes, args[0], args[-1]
    if op == "Take":
        return _take(step, args)
    if op == "Einsum":
        return np.einsum(step.equation, *_conj_args(step, args)).astype(C64)
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
        "ToComplex": lambda: a.astype(C64), "ToReal": lambda: a.real, "Log": lambda: np.log(a),
        "Sqrt": lambda: np.sqrt(a), "Square": lambda: a * a,
        "Angle": lambda: np.arctan2(a.imag, a.real)}
    return np.asarray(results[op]())


def _fft_axes(op: str) -> tuple[int, ...]:
    return (-1,) if op in ("FFT", "IFFT") else (-2, -1)


def _backward(step: Step, args: list[np.ndarray], out: np.ndarray,
              g: np.ndarray) -> list[np.ndarray]:
    """TF's gradients of the step's arguments from its output's gradient `g`."""
    op, n, axes, a, b = step.op, list(step.fft_length), step.axes, args[0], args[-1]
    if op == "Take":
        return _take_grads(step, args, g)
    if op == "Einsum":
        return _einsum_grads(step, args, g)
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
    if op == "Log":
        return [g / np.conj(a)]
    if op == "Sqrt":  # sqrt_grad: 0.5 g / conj(y)
        return [C64(0.5) * g / np.conj(out)]
    if op == "Square":
        return [g * (np.conj(a) * C64(2))]
    if op == "Angle":  # -complex(g, 0) / complex(Im z, Re z)
        return [(-g / (a.imag + 1j * a.real).astype(C64)).astype(C64)]
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
    {"op", "args", "fft_length" of a transform, "axes" and "keep" of a Sum or Mean, "index",
    "shape" and "batched" of a Take, "equation" and "conj" of an Einsum}; values
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
                not isinstance(s, dict) or OPS.get(str(s.get("op"))) not in (len(s.get("args", ())), 0) or
                any(not 0 <= a < count + j for a in s["args"])
                for j, s in enumerate(program)) or program[-1]["op"] not in REAL_RESULTS:
            raise KernelError(f"kernel {name!r} (complex_region): program must be a list of "
                              f"steps of {sorted(OPS)} reading earlier values and ending in "
                              f"a real value ({', '.join(REAL_RESULTS)}), got {program!r}")
        self.program = [Step.decoded(s) for s in program]
        shapes = [(1, *o.shape) if o.letter == "i" else o.shape for o in self.operands]
        with np.errstate(all="ignore"):  # (zeros: a division's, a log's)
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
