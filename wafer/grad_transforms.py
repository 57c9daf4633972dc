"""Gradient transforms between compute_gradients and apply_gradients, with TensorFlow's
formulas in float32 and TF's operation order (tf.clip_by_value, tf.clip_by_norm,
tf.clip_by_global_norm, scaling), and the exact 0 of a gradient that is 0 in exact arithmetic
(coordinator.compiler.training.shift). The CS applies them, in program order, to a batch's
complete gradients (regularizer gradients included) before any weight is updated.

    zero                 g = g * 0: a gradient 0 in exact arithmetic, of which TF computes
                         rounding noise (the compiler emits it last; wse_sim applies it at
                         the update, after the finite test of dynamic loss scaling)
    noise_floor          g = where(|g| <= value * G, 0, g), G the largest magnitude among all
                         the batch's gradients (every trained variable's, not only the
                         named ones), when G is finite and > 0: the elements of a gradient
                         that are rounding noise at that scale (a sum that cancels, 0 in
                         exact arithmetic) get the exact 0 (emitted last, with `zero`;
                         applied after the finite test; coordinator.compiler.training.noise)
    program              g = the last value of `program` (a wafer.weight_programs program of
                         library kernels, the weight program's), computed from g (source
                         "<variable>:grad"), weights (sources named as the variables, their
                         values before the update) and constants: gradient centralization,
                         adaptive clipping, sign(g), masks (coordinator.compiler.training.
                         gradient_program proves it is TF's)
    scale                g = g * value
    clip_by_value        g = maximum(minimum(g, high), low)
    clip_by_norm         l2 = sqrt(sum(g * g)) (0 if the sum is 0)
                         g = g * value / maximum(l2, value)
    clip_by_global_norm  gn = sqrt(sum over the group of sum(g * g) / 2 * 2)
                         g = g * (value * minimum(1 / gn, 1 / value) + (gn - gn))

scale and clip_by_value are elementwise and bit-equal to TF. The norms are sums of squares,
which TF's Eigen reduces in its own blocked order; numpy sums float32 in another, so a norm
may differ from TF's in its last bits. Only the clipping factor depends on it: a gradient
that is not clipped is bit-equal to TF's (the factor is value / value, resp.
value * (1 / value), computed as TF computes it), a clipped one is within a few float32 ULP
(tests/wse_sim/test_wse_training_semantics.py measures it).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from cs_api import cs_api_pb2 as pb
from cs_api.attrs import from_attr
from wafer.kernels import KernelError, build_kernel
from wafer.weight_programs import WeightProgram, WeightStep

F32 = np.float32
KINDS = ("scale", "clip_by_value", "clip_by_norm", "clip_by_global_norm", "zero", "noise_floor",
         "program")
GRADIENT = ":grad"  # a program's source "<variable>:grad" is that variable's gradient


@dataclass(frozen=True)
class GradientTransform:
    """One transform of the program; `variables` are TF variable names (the group of
    clip_by_global_norm, the gradients every other kind applies to one by one)."""

    kind: str
    value: float = 0.0
    low: float = 0.0
    high: float = 0.0
    variables: tuple[str, ...] = ()
    program: pb.WeightProgram | None = field(default=None, compare=False)
    steps: WeightProgram | None = field(default=None, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        problem = self.problem()
        if problem:
            raise ValueError(problem)
        if self.kind == "program":
            object.__setattr__(self, "steps", _steps(self.program, self.variables[0]))

    def problem(self) -> str:
        """Why the transform cannot be applied, or ""."""
        if self.kind not in KINDS:
            return f"unknown gradient transform {self.kind!r}; the CS system has {', '.join(KINDS)}"
        if not self.variables:
            return f"gradient transform {self.kind} names no variables"
        if len(set(self.variables)) != len(self.variables):
            return f"gradient transform {self.kind} names a variable twice"
        if self.kind in ("clip_by_norm", "clip_by_global_norm") and \
                not 0 < self.value < np.inf:
            return f"{self.kind} needs a finite clip norm > 0, got {self.value}"
        if self.kind == "noise_floor" and not 0 < self.value < 1:
            return f"noise_floor needs a fraction of the largest gradient in (0, 1), got {self.value}"
        if (self.kind == "program") != (self.program is not None) or \
                self.kind == "program" and len(self.variables) != 1:
            return "a program (and only it) has kernels, and transforms one variable's gradient"
        return ""

    @property
    def weights(self) -> tuple[str, ...]:
        """The weights a program reads (their values before the update)."""
        return tuple(s for s in self.steps.sources if not s.endswith(GRADIENT)) \
            if self.steps is not None else ()

    def to_message(self) -> pb.GradientTransform:
        return pb.GradientTransform(kind=self.kind, value=self.value, low=self.low,
                                    high=self.high, variables=list(self.variables),
                                    program=self.program)

    @classmethod
    def from_message(cls, message: pb.GradientTransform) -> "GradientTransform":
        return cls(message.kind, message.value, message.low, message.high,
                   tuple(message.variables),
                   message.program if message.HasField("program") else None)


def _steps(message: pb.WeightProgram | None, variable: str) -> WeightProgram:
    """The kernels of a program transforming `variable`'s gradient (ValueError: not one that
    reads it and computes a float32 value of its shape last, from its sources and earlier
    kernels)."""
    assert message is not None
    gradient = variable + GRADIENT
    shapes = {s.variable: tuple(int(d) for d in s.shape) for s in message.sources}
    dtypes = {name: np.dtype(np.float32) for name in shapes}
    steps = []
    for k in message.kernels:
        if k.name in shapes or not k.inputs or any(i not in shapes for i in k.inputs):
            raise ValueError(f"program kernel {k.name!r} must have a new name and inputs "
                             "among the sources and earlier kernels")
        try:
            kernel = build_kernel(k.type, k.name, {key: from_attr(v) for key, v in
                                                   k.attrs.items()},
                                  [shapes[i] for i in k.inputs])
            dtypes[k.name] = kernel.output_dtype([dtypes[i] for i in k.inputs])
        except KernelError as error:
            raise ValueError(str(error)) from None
        if kernel.param_shapes() or kernel.draws_random:
            raise ValueError(f"program kernel {k.name!r} has weights or draws")
        shapes[k.name] = tuple(kernel.output_shape)
        steps.append(WeightStep(kernel, tuple(k.inputs)))
    last = steps[-1].kernel.name if steps else ""
    if gradient not in shapes or not steps or shapes[last] != shapes[gradient] or \
            dtypes[last] != np.float32:
        raise ValueError(f"the program of {variable}'s gradient must read it and compute a "
                         "float32 value of its shape last")
    return WeightProgram(tuple(s.variable for s in message.sources), steps)


def _sum_of_squares(g: np.ndarray) -> np.float32:
    return np.float32(np.sum(np.square(g), dtype=F32))


def _clip_by_norm(g: np.ndarray, clip_norm: np.float32) -> None:
    l2sum = _sum_of_squares(g)
    l2norm = np.sqrt(l2sum) if l2sum > 0 else l2sum
    np.multiply(g, clip_norm, out=g)
    np.divide(g, np.maximum(l2norm, clip_norm), out=g)


def _clip_by_global_norm(grads: Sequence[np.ndarray], clip_norm: np.float32) -> None:
    half_squared = F32(0)
    for g in grads:  # tf.nn.l2_loss per gradient, summed in the group's order
        half_squared = F32(half_squared + _sum_of_squares(g) * F32(0.5))
    norm = np.sqrt(half_squared * F32(2))
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = F32(clip_norm * np.minimum(F32(1) / norm, F32(1) / clip_norm)) + (norm - norm)
    for g in grads:
        np.multiply(g, scale, out=g)


def _noise_floor(group: Sequence[np.ndarray], grads: Mapping[str, np.ndarray],
                 fraction: float) -> None:
    largest = max((float(np.max(np.abs(g), initial=0.0)) for g in grads.values()), default=0.0)
    if not 0 < largest < np.inf:  # (no scale to judge noise by; a NaN compares false)
        return
    threshold = fraction * largest
    for g in group:
        g[np.abs(g) <= threshold] = 0


def _program(t: GradientTransform, g: np.ndarray, weights: Mapping[str, np.ndarray]) -> None:
    assert t.steps is not None
    values = {t.variables[0] + GRADIENT: g, **{w: weights[w] for w in t.weights}}
    g[...] = t.steps.forward(values)[t.steps.names[-1]]


def apply_transforms(transforms: Sequence[GradientTransform], grads: Mapping[str, np.ndarray],
                     weights: Mapping[str, np.ndarray] | None = None) -> None:
    """Apply `transforms` in order to `grads` (float32 arrays by TF variable name, every
    trained variable's: noise_floor's scale is their largest), in place; a program reads
    `weights` (by name, before the update)."""
    for t in transforms:
        missing = [v for v in t.variables if v not in grads]
        if missing:
            raise KeyError(f"gradient transform {t.kind}: no gradient for {missing[0]!r}")
        group = [grads[v] for v in t.variables]
        if t.kind == "program":
            _program(t, group[0], weights or {})
            continue
        if t.kind == "clip_by_global_norm":
            _clip_by_global_norm(group, F32(t.value))
            continue
        if t.kind == "noise_floor":
            _noise_floor(group, grads, t.value)
            continue
        for g in group:
            if t.kind in ("scale", "zero"):
                np.multiply(g, F32(t.value), out=g)
            elif t.kind == "clip_by_value":
                np.minimum(g, F32(t.high), out=g)
                np.maximum(g, F32(t.low), out=g)
            else:
                _clip_by_norm(g, F32(t.value))
