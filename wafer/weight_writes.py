"""Weight writes: the train_op's own writes of a trained weight besides the optimizer's
update, such as decoupled weight decay written by hand after the optimizer (AdamW by hand,
the modelzoo style): `v.assign_sub(wd * lr * v)` or `v.assign(v * (1 - wd))` under
tf.control_dependencies([the optimizer's op]), or before the update with the dependencies
the other way round.

A write is an element-wise expression of the weight and scalar factors (constants or
schedules, wafer.schedules, evaluated at the global step + `step_offset`): steps in TF's
operation order, each one float32 numpy operation as TF's CPU kernel computes it (a scalar
times a tensor, a difference, ...), so the written value is TF's bit for bit. The last step's
value is written (an assign_sub's `v - value` is its last step).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wafer.schedules import Schedule, render, schedule_problem

FACTOR = "weight_write"  # the factor schedules' hyper_parameter
OPS = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}
WEIGHT = "w"  # an input naming the weight's value; "f<k>": factor k; "s<k>": step k's value


@dataclass(frozen=True)
class WriteStep:
    op: str  # a key of OPS
    inputs: tuple[str, str]


@dataclass(frozen=True)
class WeightWrite:
    variable: str  # the written weight's TF name
    steps: tuple[WriteStep, ...]
    factors: tuple[Schedule, ...]
    before_update: bool = False  # False: after the step's update
    step_offset: int = 0  # 1: the factors read the global step after the step's increment
    source: str = ""  # the user's source line of the write

    def to_message(self, pb):
        return pb.WeightWrite(
            variable=self.variable, steps=[pb.WriteStep(op=s.op, inputs=list(s.inputs))
                                           for s in self.steps],
            factors=[f.to_message(pb) for f in self.factors], before_update=self.before_update,
            step_offset=self.step_offset, source=self.source)

    @classmethod
    def from_message(cls, message) -> "WeightWrite":
        return cls(message.variable, tuple(WriteStep(s.op, (s.inputs[0], s.inputs[1]))
                                           for s in message.steps),
                   tuple(Schedule.from_message(f) for f in message.factors),
                   bool(message.before_update), int(message.step_offset), message.source)


def write_problem(write: WeightWrite) -> str:
    """Why the CS cannot carry out `write`, or ""."""
    if not write.steps or write.step_offset not in (0, 1):
        return "it needs steps and a step offset of 0 or 1"
    for index, step in enumerate(write.steps):
        known = {WEIGHT, *(f"f{k}" for k in range(len(write.factors))),
                 *(f"s{k}" for k in range(index))}
        if step.op not in OPS or len(step.inputs) != 2 or not set(step.inputs) <= known:
            return (f"step {index} ({step.op} of {list(step.inputs)}): the CS computes "
                    f"{', '.join(OPS)} of the weight, factors and earlier steps")
    for factor in write.factors:
        problem = schedule_problem(factor)
        if problem or factor.hyper_parameter != FACTOR or factor.variables:
            return f"a factor: {problem or 'a ' + FACTOR + ' schedule of no variable needed'}"
    return ""


def apply(write: WeightWrite, weight: np.ndarray, factors: list[np.float32]) -> None:
    """Writes `weight` (float32, in place) with the steps' last value."""
    values: dict[str, np.ndarray | np.float32] = {
        WEIGHT: weight, **{f"f{k}": np.float32(f) for k, f in enumerate(factors)}}
    for index, step in enumerate(write.steps):
        a, b = (values[name] for name in step.inputs)
        values[f"s{index}"] = OPS[step.op](a, b, dtype=np.float32)
    np.copyto(weight, values[f"s{len(write.steps) - 1}"])


def describe(write: WeightWrite) -> str:
    """The written value as a formula of the weight `w` and the factors (the report's)."""
    symbols = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
    rendered = [render(f) for f in write.factors]
    terms = {WEIGHT: "w", **{f"f{k}": f"({r})" if " " in r else r for k, r in enumerate(rendered)}}
    for index, step in enumerate(write.steps):
        a, b = (terms[name] for name in step.inputs)
        terms[f"s{index}"] = f"({a} {symbols[step.op]} {b})"
    return terms[f"s{len(write.steps) - 1}"].removeprefix("(").removesuffix(")")
