"""The einsum kernel: tf.einsum of two operands whose per-sample ones carry the batch letter
first (Keras MultiHeadAttention's query-key and attention-value products)."""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from wafer.kernels.base import KernelError, RunContext, max_cores_for, register
from wafer.kernels.operands import Operands, OperandsKernel


@register
class Einsum(OperandsKernel):
    """attrs: equation "abc,acd->abd" (batch letter first in the output and in every `i`
    operand, absent from `c`/`p` ones), operands (two letters). Each operand's letters must
    appear in the other operand or the output, so each gradient is an einsum too (TF's)."""

    type_name = "einsum"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]):
        super().__init__(name, attrs, input_shapes)
        self.operands = Operands(self, 2, broadcast=False)
        equation = str(self.attrs.get("equation", "")).replace(" ", "")
        lhs, arrow, out = equation.partition("->")
        terms = lhs.split(",")
        if not arrow or len(terms) != 2 or not out or "." in equation:
            raise KernelError(f"kernel {name!r}: einsum needs 'A,B->C' without ellipsis, got "
                              f"{equation!r}")
        batch = out[0]
        sizes: dict[str, int] = {}
        for term, o in zip(terms, self.operands):
            full = (None, *o.shape) if o.letter == "i" else o.shape
            if (o.letter == "i") != (term[:1] == batch) or batch in term[1:] or len(term) != len(full):
                raise KernelError(f"kernel {name!r}: einsum term {term!r} does not fit operand "
                                  f"{o.letter} of shape {o.shape} (batch letter {batch!r} first "
                                  "in per-sample operands only)")
            for letter, size in zip(term, full):
                if size is not None and sizes.setdefault(letter, size) != size:
                    raise KernelError(f"kernel {name!r}: einsum letter {letter!r} is both "
                                      f"{sizes[letter]} and {size}")
        for a, b in ((terms[0], terms[1]), (terms[1], terms[0])):
            if any(letter not in b + out for letter in a):
                raise KernelError(f"kernel {name!r}: einsum {equation!r} sums over a letter of "
                                  "one operand only")
        if any(letter not in sizes and letter != batch for letter in out):
            raise KernelError(f"kernel {name!r}: einsum output letters {out!r} not in the operands")
        self.terms, self.out, self.equation = terms, out, equation
        self.sizes = sizes
        self._shape = tuple(sizes[letter] for letter in out[1:])

    def flops_per_sample(self) -> float:
        return 2.0 * math.prod(size for letter, size in self.sizes.items() if letter != self.out[0])

    def max_cores(self) -> int:
        return max_cores_for(self.flops_per_sample())

    def activation_bytes_per_sample(self) -> int:
        return 4 * sum(math.prod(o.shape) for o in self.operands if o.letter == "i")

    def forward(self, params, inputs, ctx: RunContext):
        a, b = self.operands.arrays(params, inputs)
        return np.einsum(self.equation, a, b, optimize=True).astype(np.float32, copy=False), (a, b)

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        a, b = cache
        (ta, tb), out = self.terms, self.out
        grads = [np.einsum(f"{out},{tb}->{ta}", grad_output, b, optimize=True).astype(np.float32),
                 np.einsum(f"{ta},{out}->{tb}", a, grad_output, optimize=True).astype(np.float32)]
        return self.operands.gradients(grads, ctx, param_grads)
