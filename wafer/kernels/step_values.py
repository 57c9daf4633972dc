"""The `schedule` kernel: a value the graph computes from the global step and constants (a
loss term's weight: KL annealing's beta = min(1, step / n), an auxiliary loss's
polynomial_decay, a warm-up with tf.where / tf.cond), evaluated at the step being computed
and given to every sample, so that the kernels after it multiply per-sample values by it."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from wafer.kernels.base import KernelError, RunContext, register
from wafer.kernels.structure import Elementwise
from wafer.schedules import attr_programs, evaluate, schedule_problem

STEP_VALUE = "per-step value"  # the hyper_parameter of its Schedule (what errors name)


@register
class StepValue(Elementwise):
    """attr program: one scalar program of wafer.schedules (programs_attr) reading the global
    step and constants only. Its one input is any value of the micro-batch (it reads only its
    number of samples) and takes no gradient; the output is the program's float32 value at
    `RunContext.step` (the global step the batch trains from; in evaluation and prediction
    the checkpoint's), one per sample."""

    type_name = "schedule"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]):
        super().__init__(name, attrs, input_shapes)
        try:
            programs = attr_programs(str(self.attrs.get("program", "")), STEP_VALUE)
        except (ValueError, TypeError):
            programs = []
        problem = "" if len(programs) != 1 else schedule_problem(programs[0]) or next(
            (f"op {o.op} reads more than the global step and constants"
             for o in programs[0].ops if o.op in ("input", "variable")), "")
        if len(self.input_shapes) != 1 or len(programs) != 1 or problem:
            raise KernelError(f"kernel {name!r}: schedule takes 1 input and a program of the "
                              f"global step and constants, got {len(self.input_shapes)} inputs"
                              + (f" ({problem})" if problem else ""))
        self.program = programs[0]

    @property
    def output_shape(self):
        return ()

    def output_dtype(self, input_dtypes):
        return np.dtype(np.float32)  # whatever the input it reads the size of

    def input_differentiable(self, index: int) -> bool:
        return False

    def forward(self, params, inputs, ctx: RunContext):
        return np.full(len(inputs[0]), evaluate(self.program, ctx.step, {}), np.float32), None

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        return [None], {}
