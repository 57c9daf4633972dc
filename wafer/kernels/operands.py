"""Operands of the generic kernels (binary, select, matmul, ...): activations, constants and
weights in one list, their arrays for the forward pass and their gradients reduced back to
each operand's shape for the backward pass.

A kernel's attr `operands` has one letter per operand position k:
  `i`  the kernel's next input (an activation or a program input, micro-batch first),
  `c`  a constant: the tensor attr `c<k>`,
  `p`  a weight: the kernel param with role `p<k>`; its TF shape is the ints attr `p<k>`.
Constants and weights keep their TF shape (no batch dimension stripped). The activation
operands, micro-batch first, all have one rank R; a constant or weight of rank R
broadcasts over the batch only when its leading dimension is 1, and one of a higher rank
is refused (TF would broadcast the batch into another axis). Broadcasting is numpy's (=
TF's) on the micro-batch arrays. Gradients to `i` operands are summed over their broadcast
axes; to `p` operands over the micro-batch and their broadcast axes, added into the
kernel's gradient accumulator like dense's.

A kernel uses it as `binary` (elementwise.py) does: an OperandsKernel, in __init__
`self.operands = Operands(self, count)` (refuses bad letters, attrs and shapes naming the
kernel) and `self._shape`; `output_dtype` checks
`self.operands.dtypes(input_dtypes)`; forward takes `self.operands.arrays(params, inputs)`;
backward computes each operand's gradient at the broadcast result's full shape and returns
`self.operands.gradients(grads, ctx, param_grads)`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from wafer.kernels.base import Kernel, KernelError, RunContext, Shape, accumulate

LETTERS = "icp"


@dataclass(frozen=True)
class Operand:
    """One operand position of a generic kernel."""

    letter: str  # i, c or p
    position: int  # k
    input_index: int  # i: its index in the kernel's inputs (-1 otherwise)
    shape: Shape  # i: per sample; c, p: the TF shape
    sample_shape: Shape  # the shape it broadcasts as against one sample
    value: np.ndarray | None = None  # c: the constant (None for i and p)

    @property
    def role(self) -> str:
        """A weight's param role (p<k>)."""
        return f"p{self.position}"


class OperandsKernel(Kernel):
    """A kernel of Operands: its params are theirs (`self.operands`), its per-sample output
    shape the one its __init__ sets (`self._shape`)."""

    operands: Operands
    _shape: Shape

    @property
    def output_shape(self) -> Shape:
        return self._shape

    def param_shapes(self) -> dict[str, Shape]:
        return self.operands.param_shapes()


def reduce_to(grad: np.ndarray, shape: Shape) -> np.ndarray:
    """Sum a gradient of a broadcast result back to `shape` (numpy's right-aligned rules)."""
    lead = grad.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + a for a, d in enumerate(shape) if d == 1 and grad.shape[lead + a] != 1)
    if axes:
        grad = grad.sum(axis=axes, keepdims=True, dtype=grad.dtype)
    return grad.reshape(shape)


class Operands:
    """A kernel's `operands` attr, resolved against its inputs, attrs and params."""

    def __init__(self, kernel: Kernel, count: int, broadcast: bool = True):
        """`broadcast`: the operands broadcast against each other (element-wise kernels);
        False for kernels that contract them by their own rules (einsum)."""
        name, kind = kernel.name, kernel.type_name
        letters = kernel.attrs.get("operands")
        if not isinstance(letters, str) or len(letters) != count or \
                any(c not in LETTERS for c in letters):
            raise KernelError(f"kernel {name!r} ({kind}): operands must be {count} letters of "
                              f"i (input), c (constant), p (weight), got {letters!r}")
        inputs = kernel.input_shapes
        if letters.count("i") != len(inputs) or not inputs:
            raise KernelError(f"kernel {name!r} ({kind}): operands {letters!r} take "
                              f"{letters.count('i')} inputs (at least 1), the kernel has "
                              f"{len(inputs)}")
        ranks = {len(s) for s in inputs}
        if broadcast and len(ranks) != 1:
            raise KernelError(f"kernel {name!r} ({kind}): its inputs {inputs} have different "
                              f"ranks (TF would broadcast the batch into another axis)")
        self.letters = letters
        self.rank = max(ranks) + 1  # R: the activations' rank with the micro-batch
        operands: list[Operand] = []
        for k, letter in enumerate(letters):
            if letter == "i":
                index = letters[:k].count("i")
                operands.append(Operand("i", k, index, inputs[index], inputs[index]))
                continue
            value = None
            if letter == "c":
                value = kernel.attrs.get(f"c{k}")
                if not isinstance(value, np.ndarray):
                    raise KernelError(f"kernel {name!r} ({kind}): operand {k} is a constant; "
                                      f"attr 'c{k}' must hold it as a tensor, got {value!r}")
                shape = tuple(value.shape)
            else:
                dims = kernel.attrs.get(f"p{k}")
                if not isinstance(dims, list) or any(not isinstance(d, int) or d < 0 for d in dims):
                    raise KernelError(f"kernel {name!r} ({kind}): operand {k} is a weight; "
                                      f"attr 'p{k}' must hold its shape, got {dims!r}")
                shape = tuple(dims)
            what = "constant" if letter == "c" else "weight"
            if broadcast and (len(shape) > self.rank or (len(shape) == self.rank and shape[0] != 1)):
                raise KernelError(
                    f"kernel {name!r} ({kind}): the {what} of operand {k} has shape {shape}, "
                    f"which would broadcast against the batch axis of the inputs (rank "
                    f"{self.rank} with the batch); it needs fewer axes or a leading 1")
            sample = shape[1:] if broadcast and len(shape) == self.rank else shape
            operands.append(Operand(letter, k, -1, shape, sample, value))
        self.operands = tuple(operands)

    def __iter__(self):
        return iter(self.operands)

    def __getitem__(self, k: int) -> Operand:
        return self.operands[k]

    def broadcast_shape(self, kernel: Kernel) -> Shape:
        """The per-sample shape of all operands broadcast together (KernelError if they do not)."""
        try:
            return tuple(np.broadcast_shapes(*(o.sample_shape for o in self.operands)))
        except ValueError:
            raise KernelError(f"kernel {kernel.name!r} ({kernel.type_name}): operand shapes "
                              f"{[o.shape for o in self.operands]} ({self.letters}) do not "
                              f"broadcast") from None

    def param_shapes(self) -> dict[str, Shape]:
        return {o.role: o.shape for o in self.operands if o.letter == "p"}

    def dtypes(self, input_dtypes: Sequence[np.dtype]) -> list[np.dtype]:
        """Every operand's dtype (weights are float32)."""
        return [np.dtype(input_dtypes[o.input_index]) if o.letter == "i" else
                o.value.dtype if o.value is not None else np.dtype(np.float32)
                for o in self.operands]

    def arrays(self, params: Mapping[str, np.ndarray], inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The operands' arrays for one micro-batch: inputs batch first, the others as they are."""
        return [inputs[o.input_index] if o.letter == "i" else
                o.value if o.value is not None else params[o.role] for o in self.operands]

    def input_position(self, index: int) -> int:
        """The operand position of the kernel's input `index`."""
        return next(o.position for o in self.operands if o.input_index == index)

    def gradients(self, grads: Sequence[np.ndarray | None], ctx: RunContext,
                  param_grads: Mapping[str, np.ndarray] | None = None,
                  ) -> tuple[list[np.ndarray | None], dict[str, np.ndarray]]:
        """backward's result from each operand's gradient shaped like the broadcast result
        (None: none): inputs' gradients summed to their micro-batch shape (None where
        `ctx` wants none), weights' summed to their shape and accumulated."""
        inputs: list[np.ndarray | None] = [None] * self.letters.count("i")
        params: dict[str, np.ndarray] = {}
        for o, grad in zip(self.operands, grads):
            if grad is None or o.letter == "c":
                continue
            if o.letter == "i":
                if ctx.wants_grad(o.input_index):
                    inputs[o.input_index] = reduce_to(grad, (grad.shape[0], *o.shape))
            else:
                accumulate(param_grads, o.role, reduce_to(grad, o.shape), params, ctx)
        return inputs, params
