"""The weight program: library kernels computing on weights alone, before the weights meet
the samples (a cosine classifier's l2_normalize(w), weight normalization's g * v / ||v||, a
learned temperature's exp(t)).

Each kernel runs on a batch of one (its inputs are weights or earlier kernels' values, each
with a leading axis of 1), with its own forward and backward: the values it computes are the
derived weights other kernels read; the gradients those kernels accumulate for them flow
back through the same kernels, in reverse order, to the weights it reads (a value read by
several kernels sums their gradients), as TensorFlow's gradient graph takes them back through
the same ops. Run once per step before the batch (forward) and once after its backward pass.
A program that draws random numbers (a `random` kernel with no input: Bayes by backprop's
eps in w = mu + softplus(rho) * eps) runs forward before every batch instead, from the
batch's stream: one draw a step (in evaluation and prediction, a batch), which every
micro-batch reads, as TF's graph draws once per session.run.
A float16 kernel (attr `precision`: a custom layer's weight read under Keras' mixed_float16,
cast to float16, and float16 element-wise ops on it) has its value rounded to float16 and the
gradient of that value (its readers', summed) too, as TF's float16 tensors and their gradients
are (wafer.precision).
A loss of the whole batch (wafer.kernels.batch_tail) runs such a program too, its one sample
the whole batch of the values the loss reads.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from wafer.kernels.base import Kernel, RunContext
from wafer.precision import is_half, round_half


@dataclass(frozen=True)
class WeightStep:
    """One kernel of the program and what it reads: source weights or earlier steps."""

    kernel: Kernel
    inputs: tuple[str, ...]


class WeightProgram:
    """Kernels over weights alone, in program order; `sources` the weights they read."""

    def __init__(self, sources: Sequence[str], steps: Sequence[WeightStep]):
        self.sources = tuple(sources)
        self.steps = tuple(steps)
        self._caches: list[object] = []

    @property
    def names(self) -> tuple[str, ...]:
        """The values it computes (each step's kernel's name)."""
        return tuple(step.kernel.name for step in self.steps)

    @property
    def draws(self) -> bool:
        """Whether it draws random numbers (then it runs forward before every batch)."""
        return any(step.kernel.draws_random for step in self.steps)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every step's value's shape (the weight's own)."""
        return {step.kernel.name: tuple(step.kernel.output_shape) for step in self.steps}

    def flops(self) -> float:
        """FLOPs of one forward pass (the kernels' FLOPs for one sample)."""
        return float(sum(step.kernel.flops_per_sample() for step in self.steps))

    def forward(self, weights: Mapping[str, np.ndarray],
                rng: np.random.Generator | None = None) -> dict[str, np.ndarray]:
        """Every step's value (the weight's own shape) from the sources' values (its draws
        from `rng`, in program order); the steps' caches are kept for `backward`."""
        values = {name: _value(weights[name])[None] for name in self.sources}
        ctx = RunContext(training=True, batch_size=1, rng=rng)
        self._caches = []
        for step in self.steps:
            out, cache = step.kernel.forward({}, [values[s] for s in step.inputs], ctx)
            if _rounds(step.kernel):
                out = round_half(out)
            values[step.kernel.name] = out
            self._caches.append(cache)
        return {step.kernel.name: values[step.kernel.name][0] for step in self.steps}

    def backward(self, grads: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The sources' gradients, given the gradients of (some of) the steps' values, from
        the caches of the last `forward`; a source no gradient reaches is left out."""
        flowing = {name: np.asarray(g, np.float32)[None] for name, g in grads.items()}
        ctx = RunContext(training=True, batch_size=1)
        for step, cache in zip(reversed(self.steps), reversed(self._caches)):
            upstream = flowing.pop(step.kernel.name, None)
            if upstream is None:
                continue
            if is_half(step.kernel.attrs):  # TF's float16 gradient of a float16 value
                upstream = round_half(upstream)
            wanted = [step.kernel.input_differentiable(j) for j in range(len(step.inputs))]
            ctx.input_grads = wanted
            input_grads, _ = step.kernel.backward({}, cache, upstream, ctx)
            for source, grad in zip(step.inputs, input_grads):
                if grad is None:
                    continue
                flowing[source] = grad if source not in flowing else flowing[source] + grad
        return {name: flowing[name][0] for name in self.sources if name in flowing}


def _rounds(kernel: Kernel) -> bool:
    """Whether the program rounds `kernel`'s value to float16 (a float16 kernel's, unless
    it rounds its own)."""
    return is_half(kernel.attrs) and not kernel.rounds_own_output


def _value(source: np.ndarray) -> np.ndarray:
    """A source's value: float32, or the integers a batch tail reads (its labels)."""
    value = np.asarray(source)
    return value if value.dtype.kind in "iu" else value.astype(np.float32, copy=False)
