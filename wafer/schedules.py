"""Hyper-parameter schedules: scalar programs the CS evaluates before every training step.

A schedule is a small typed op list (the graph TensorFlow executes for a hyper-parameter
computed from the global step, constants and variables nothing in the train op writes:
tf.compat.v1.train.exponential_decay, piecewise_constant, polynomial_decay, cosine decays,
warmups with tf.where / tf.cond / tf.minimum). Each op reads earlier ops by index; the last
op is the value. Arithmetic is TensorFlow's on the CPU, op by op: float32 rounding after
every op, denormals flushed to zero (TF's kernels run with FTZ/DAZ), and exp, log, cos, sin
log1p, expm1 (Grappler's rewrite of tf.math.log(x + 1), tf.exp(x) - 1)
and pow as C's libm computes them for a scalar (what TF's kernels call for one element; numpy's
vectorised versions differ in the last bit). Conditionals are TF's lowered control flow:
`switch_false`/`switch_true` pass their data on only when the predicate says so, `merge`
takes its one live input, and an op with a dead input (data or control) is dead.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from wafer.libm import scalar

F32 = np.float32
DTYPES = {"float32": np.float32, "int64": np.int64, "int32": np.int32, "bool": np.bool_}
_TINY = np.finfo(np.float32).tiny

UNARY: dict[str, Callable[..., Any]] = {
    "identity": lambda x: x, "neg": np.negative, "abs": np.abs, "floor": np.floor,
    "ceil": np.ceil, "sqrt": np.sqrt, "square": lambda x: x * x,
    "reciprocal": lambda x: np.divide(x.dtype.type(1), x), "rsqrt": lambda x: F32(1) / np.sqrt(x),
    "exp": scalar("expf"), "log": scalar("logf"), "log1p": scalar("log1pf"),
    "expm1": scalar("expm1f"), "cos": scalar("cosf"),
    "sin": scalar("sinf"), "logical_not": np.logical_not,
}
BINARY: dict[str, Callable[..., Any]] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
    "floordiv": lambda x, y: np.floor(x / y) if isinstance(x, np.floating) else x // y,
    "floormod": lambda x, y: _floormod(x, y), "minimum": np.minimum,
    "maximum": np.maximum, "pow": scalar("powf"), "less": np.less,
    "less_equal": np.less_equal, "greater": np.greater, "greater_equal": np.greater_equal,
    "equal": np.equal, "not_equal": np.not_equal, "logical_and": np.logical_and,
    "logical_or": np.logical_or, "squared_difference": lambda x, y: (x - y) * (x - y),
}
def _floormod(x, y):
    """TF's FloorMod: C's fmod, moved into the divisor's sign (integers: Python's %)."""
    if not isinstance(x, np.floating):
        return x % y
    rest = np.fmod(x, y)
    return rest + y if rest != 0 and (y < 0) != (rest < 0) else rest


_FLOAT_ONLY = {"sqrt", "rsqrt", "exp", "log", "log1p", "expm1", "cos", "sin", "div", "pow"}
_COMPARE = {"less", "less_equal", "greater", "greater_equal", "equal", "not_equal"}
_LOGICAL = {"logical_not", "logical_and", "logical_or"}
# op -> number of data inputs (None: one or more)
ARITY = {"const": 0, "step": 0, "variable": 0, "input": 0, "cast": 1, "select": 3, "switch_false": 2,
         "switch_true": 2, "merge": None, "assert": 1,
         **{op: 1 for op in UNARY}, **{op: 2 for op in BINARY}}


class ScheduleError(ValueError):
    """A schedule that cannot run (an assertion of the graph failed at this step)."""


@dataclass(frozen=True)
class ScalarOp:
    op: str  # a key of ARITY
    dtype: str  # of its value: float32, int64, int32, bool
    inputs: tuple[int, ...] = ()  # earlier ops' indices
    controls: tuple[int, ...] = ()  # earlier ops whose deadness it inherits
    value: float = 0.0  # const
    name: str = ""  # variable: its TF name; input: its key in `variables`; assert: its op


@dataclass(frozen=True)
class Schedule:
    """The program computing one optimizer hyper-parameter from the global step."""

    hyper_parameter: str  # an OptimizerConfig field: learning_rate, momentum, ...
    ops: tuple[ScalarOp, ...]  # the last op is the value
    tf_tensor: str = ""  # the tensor in the user's graph
    source: str = ""  # its user source line
    optimizer: int = 0  # whose: 0 the program's optimizer, k its optimizer group k - 1

    @property
    def variables(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(o.name for o in self.ops if o.op == "variable"))

    def to_message(self, pb):
        return pb.Schedule(hyper_parameter=self.hyper_parameter, tf_tensor=self.tf_tensor,
                           source=self.source, optimizer=self.optimizer, ops=[pb.ScalarOp(
                               op=o.op, dtype=o.dtype, inputs=list(o.inputs),
                               controls=list(o.controls), value=o.value, name=o.name)
                               for o in self.ops])

    @classmethod
    def from_message(cls, message) -> "Schedule":
        return cls(message.hyper_parameter, tuple(
            ScalarOp(o.op, o.dtype, tuple(o.inputs), tuple(o.controls), o.value, o.name)
            for o in message.ops), message.tf_tensor, message.source, message.optimizer)


def programs_attr(programs: Sequence[Schedule]) -> str:
    """Scalar programs as a kernel attr: each one's ops (and the TF tensor and source line it
    computes) as JSON."""
    return json.dumps([[[[o.op, o.dtype, list(o.inputs), list(o.controls), o.value, o.name]
                         for o in p.ops], p.tf_tensor, p.source] for p in programs])


def attr_programs(text: str, hyper_parameter: str) -> list[Schedule]:
    """The scalar programs of a programs_attr (ValueError, TypeError: not one); errors name
    each by `hyper_parameter`."""
    return [Schedule(hyper_parameter, tuple(
        ScalarOp(op, dtype, tuple(inputs), tuple(controls), float(value), name)
        for op, dtype, inputs, controls, value, name in ops), str(tensor), str(source))
        for ops, tensor, source in json.loads(text)]


def schedule_problem(schedule: Schedule) -> str:
    """Why the CS cannot evaluate `schedule`, or ""."""
    if not schedule.ops:
        return "it has no ops"
    if schedule.ops[-1].dtype != "float32":
        return f"its value is {schedule.ops[-1].dtype}, not float32"
    for index, o in enumerate(schedule.ops):
        where = f"op {index} ({o.op})"
        if o.op not in ARITY:
            return f"{where}: unknown op; the CS has {', '.join(sorted(ARITY))}"
        if o.dtype not in DTYPES:
            return f"{where}: unknown dtype {o.dtype!r}"
        if any(not 0 <= i < index for i in (*o.inputs, *o.controls)):
            return f"{where}: reads an op that is not an earlier one"
        arity = ARITY[o.op]
        if (arity is None and not o.inputs) or (arity is not None and len(o.inputs) != arity):
            return f"{where}: {len(o.inputs)} inputs"
        ins = [schedule.ops[i].dtype for i in o.inputs]
        problem = _dtype_problem(o, ins)
        if problem:
            return f"{where}: {problem}"
        if o.op == "variable" and (not o.name or o.dtype != "float32"):
            return f"{where}: a variable needs a name and float32"
        if o.op == "input" and not o.name:
            return f"{where}: an input needs a name"
        if o.op == "const" and o.dtype == "float32" and np.float32(o.value) != o.value and \
                np.isfinite(o.value):
            return f"{where}: {o.value!r} is not a float32 value"
    return ""


def _dtype_problem(o: ScalarOp, ins: list[str]) -> str:
    if o.op in ("step",) and o.dtype != "int64":
        return "the global step is int64"
    if o.op in _FLOAT_ONLY and (o.dtype != "float32" or set(ins) != {"float32"}):
        return "computes in float32 only"
    if o.op in _COMPARE and (o.dtype != "bool" or len(set(ins)) != 1):
        return "compares two values of one dtype into a bool"
    if o.op in _LOGICAL and (o.dtype != "bool" or set(ins) != {"bool"}):
        return "takes and gives bools"
    if o.op in ("switch_false", "switch_true") and (ins[1] != "bool" or ins[0] != o.dtype):
        return "passes its data on under a bool predicate"
    if o.op == "select" and (ins[0] != "bool" or ins[1:] != [o.dtype, o.dtype]):
        return "selects between two values of its dtype under a bool"
    if o.op == "assert" and ins != ["bool"]:
        return "asserts a bool"
    if o.op in ("merge",) or (o.op in UNARY or o.op in BINARY) and o.op not in _COMPARE:
        if o.op not in _LOGICAL and any(d != o.dtype for d in ins):
            return f"its inputs are {', '.join(ins)}, its value {o.dtype}"
    return ""


def _flush(x):
    """TF's CPU kernels run with denormals flushed to zero (FTZ and DAZ)."""
    if isinstance(x, np.float32) and x != 0 and abs(x) < _TINY:
        return F32(np.copysign(F32(0), x))
    return x


def evaluate(schedule: Schedule, step: int, variables: Mapping[str, np.ndarray]) -> np.float32:
    """The schedule's value at global step `step` (before that step's update), float32."""
    values: list = []
    live: list[bool] = []
    with np.errstate(all="ignore"):
        for o in schedule.ops:
            ins = [values[i] for i in o.inputs]
            alive = all(live[i] for i in o.controls)
            if o.op == "merge":
                taken = [i for i in o.inputs if live[i]]
                alive = alive and bool(taken)
                values.append(values[taken[0]] if taken else None)
                live.append(alive)
                continue
            alive = alive and all(live[i] for i in o.inputs)
            if not alive:
                values.append(None)
                live.append(False)
                continue
            dtype = DTYPES[o.dtype]
            if o.op == "const":
                value = dtype(o.value)
            elif o.op == "step":
                value = np.int64(step)
            elif o.op == "variable":
                value = F32(np.asarray(variables[o.name]).reshape(()))
            elif o.op == "input":  # a value of its dtype the caller computed (a batch's sum)
                value = dtype(np.asarray(variables[o.name]).reshape(()))
            elif o.op == "cast":
                value = _cast(ins[0], dtype)
            elif o.op == "select":
                value = ins[1] if ins[0] else ins[2]
            elif o.op in ("switch_false", "switch_true"):
                value = ins[0]
                alive = bool(ins[1]) == (o.op == "switch_true")
            elif o.op == "assert":
                if not ins[0]:
                    raise ScheduleError(f"the assertion {o.name} of the {schedule.hyper_parameter} "
                                        f"schedule failed at step {step}")
                value = np.bool_(True)
            else:
                fn = UNARY.get(o.op) or BINARY[o.op]
                value = dtype(fn(*(_flush(x) for x in ins)))
            values.append(_flush(value))
            live.append(alive)
    if not live[-1]:
        raise ScheduleError(f"the {schedule.hyper_parameter} schedule computes no value at "
                            f"step {step}")
    return F32(values[-1])


def _cast(x, dtype):
    if dtype is np.bool_:
        return np.bool_(x != 0)
    if np.issubdtype(dtype, np.integer) and isinstance(x, np.floating):
        return dtype(np.trunc(x)) if np.isfinite(x) else dtype(0)
    return dtype(x)


def render(schedule: Schedule) -> str:
    """The schedule as an expression, for the compile report."""
    text: list[str] = []
    for o in schedule.ops:
        a = [text[i] for i in o.inputs]
        if o.op == "const":
            text.append(f"{o.value:g}" if o.dtype != "bool" else str(bool(o.value)))
        elif o.op == "step":
            text.append("global_step")
        elif o.op in ("variable", "input"):
            text.append(o.name)
        elif o.op in ("identity", "switch_false", "switch_true", "assert"):
            text.append(a[0])
        elif o.op == "merge":
            text.append(f"cond({', '.join(a)})" if len(a) > 1 else a[0])
        elif o.op == "select":
            text.append(f"({a[1]} if {a[0]} else {a[2]})")
        elif o.op == "cast":
            text.append(f"{o.dtype}({a[0]})")
        elif o.op in BINARY and len(a) == 2:
            symbol = {"add": "+", "sub": "-", "mul": "*", "div": "/", "less": "<",
                      "less_equal": "<=", "greater": ">", "greater_equal": ">=", "equal": "==",
                      "not_equal": "!=", "floordiv": "//", "floormod": "%"}.get(o.op)
            text.append(f"({a[0]} {symbol} {a[1]})" if symbol else f"{o.op}({a[0]}, {a[1]})")
        else:
            text.append(f"{o.op}({', '.join(a)})")
        if len(text[-1]) > 400:
            return f"a program of {len(schedule.ops)} scalar ops"
    return text[-1]
