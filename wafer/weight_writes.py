"""Weight writes: the train_op's own writes of a trained weight besides the optimizer's
update, such as decoupled weight decay written by hand after the optimizer (AdamW by hand,
the modelzoo style): `v.assign_sub(wd * lr * v)` or `v.assign(v * (1 - wd))` under
tf.control_dependencies([the optimizer's op]), or before the update with the dependencies
the other way round; or a renormalization after it (TransE's entity embeddings
`ent.assign(tf.nn.l2_normalize(ent, axis=1))`, a max-norm `w * tf.minimum(1., c / norm)`).
Or a soft update of a frozen weight toward trained ones (a target network's Polyak
averaging in DDPG, TD3, SAC; BYOL's momentum encoder): `t.assign(0.99 * t + 0.01 * o)`
reads the trained weights `sources` (after their update, or before it: `before_update`) and
is written after the step's updates; with a `predicate` (a schedule of the global step,
1 / 0) only on the steps it holds (a DQN's hard copy `t.assign(o)` every N steps under
tf.cond). Or a write of frozen state from the whole batch (`batch`: the kernels or inputs
whose values of every sample of the step it reads, "b<k>" in the steps, [B, ...] in batch
order): a running mean of features `m.assign_sub(0.2 * (m - tf.reduce_mean(h, 0)))`, MoCo's
queue `q.assign(tf.concat([keys, q[:-B]], 0))`, written after the step's updates (with a
`predicate`, only on the steps it holds: Deep SVDD's center set once under a tf.cond); its
`sources` ("v<k>") are then states other writes write after it (MoCo's ring pointer `ptr`,
a `carried_dtype` state no kernel holds, written from itself: `(ptr + B) % K`).

A write is an expression of the weight, its sources' values and scalar factors (constants
or schedules, wafer.schedules, evaluated at the global step + `step_offset`): steps in TF's
operation order, each one float32 numpy operation as TF's CPU kernel computes it:
arithmetic of two values (add, sub, mul, div, maximum, ...: the binary kernel's), an
element-wise function of one (`f:<function>`: the activation kernel's, square, rsqrt, ...),
a reduction of one over axes (`r:<op>:<axes>:<keepdims 0/1>`, sum, mean, max, min, prod), a
comparison of two (greater, equal, ...: a bool value), tf.where of a bool value and two
others (`select`: clip_by_norm's guard, bits copied as TF's Select) or a copy of one
(`copy`), so the written value is TF's. The last step's value is written (an
assign_sub's `v - value` is its last step).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from wafer.kernels.activations import FUNCTIONS, PARAMETERS
from wafer.kernels.elementwise import ARITHMETIC, COMPARISONS, INTEGER_ARITHMETIC, where
from wafer.schedules import Schedule, render, schedule_problem

FACTOR = "weight_write"  # the factor schedules' hyper_parameter
REDUCE: dict[str, Callable[..., Any]] = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min, "prod": np.prod}
COPY = "copy"  # the step whose value is its input's (a hard copy t.assign(o))
SELECT = "select"  # tf.where(cond, x, y) of a bool step and two values
WEIGHT = "w"  # an input naming the weight's value; "f<k>": factor k; "s<k>": step k's value;
# "v<k>": source k's value; "b<k>": the whole batch of batch value k
CONCAT = "concat"  # tf.concat of two values along axis 0
SLICE = "slice"  # "slice:<start>:<stop>": rows start..stop of one value (a static slice)
GATHER = "gather"  # tf.gather(values, indices) along axis 0
CAST = "cast"  # "cast:<float32|int32|int64>"
UNIQUE = "unique"  # "unique:<1|2>": tf.unique_with_counts(x)'s idx (1) or count (2)
RESHAPE = "reshape"  # "reshape:<d0,d1,...>": to a static shape
INTEGER = "int"  # "int:<value>": an int32 scalar constant (no inputs)
FILL = "fill"  # "fill:<dtype>:<value>:<d0,d1,...>": a constant of equal elements (no inputs)
RANGE = "range"  # "range:<n>": tf.range(n), int32 (no inputs)
SEGMENT_SUM = "segment_sum"  # "segment_sum:<n>": tf.math.unsorted_segment_sum(x, ids, n)
# the last step of tf.compat.v1.scatter_sub / scatter_add / scatter_update(w, indices,
# updates): TF's CPU kernel applies the rows in order (duplicate indices accumulate)
SCATTERS = {"scatter_sub": np.subtract, "scatter_add": np.add}
SCATTER_UPDATE = "scatter_update"
_DTYPES = {"float32": np.float32, "int32": np.int32, "int64": np.int64}


@dataclass(frozen=True)
class WriteStep:
    op: str  # a binary kernel's op, "f:<function>", "r:<reduction>:<axes>:<keepdims>", ...
    inputs: tuple[str, ...]  # two values for arithmetic and comparisons, three for select


@dataclass(frozen=True)
class WeightWrite:
    variable: str  # the written weight's TF name
    steps: tuple[WriteStep, ...]
    factors: tuple[Schedule, ...]
    before_update: bool = False  # False: after the step's update (of its sources, if any)
    step_offset: int = 0  # 1: the factors read the global step after the step's increment
    source: str = ""  # the user's source line of the write
    sources: tuple[str, ...] = ()  # trained weights a frozen weight's write reads
    predicate: Schedule | None = None  # a frozen weight's: written on the steps it is 1
    batch: tuple[str, ...] = ()  # kernels or inputs whose whole batch a state write reads
    carried_dtype: str = ""  # a state no kernel holds (a ring pointer): its dtype

    def to_message(self, pb):
        return pb.WeightWrite(
            variable=self.variable, steps=[pb.WriteStep(op=s.op, inputs=list(s.inputs))
                                           for s in self.steps],
            factors=[f.to_message(pb) for f in self.factors], before_update=self.before_update,
            step_offset=self.step_offset, source=self.source, sources=list(self.sources),
            predicate=self.predicate.to_message(pb) if self.predicate is not None else None,
            batch=list(self.batch), carried_dtype=self.carried_dtype)

    @classmethod
    def from_message(cls, message) -> "WeightWrite":
        return cls(message.variable, tuple(WriteStep(s.op, tuple(s.inputs))
                                           for s in message.steps),
                   tuple(Schedule.from_message(f) for f in message.factors),
                   bool(message.before_update), int(message.step_offset), message.source,
                   tuple(message.sources), Schedule.from_message(message.predicate)
                   if message.HasField("predicate") else None, tuple(message.batch),
                   message.carried_dtype)


def write_problem(write: WeightWrite) -> str:
    """Why the CS cannot carry out `write`, or ""."""
    if not write.steps or write.step_offset not in (0, 1):
        return "it needs steps and a step offset of 0 or 1"
    for index, step in enumerate(write.steps):
        known = {WEIGHT, *(f"f{k}" for k in range(len(write.factors))),
                 *(f"v{k}" for k in range(len(write.sources))),
                 *(f"b{k}" for k in range(len(write.batch))),
                 *(f"s{k}" for k in range(index))}
        if _arity(step.op) != len(step.inputs) or not set(step.inputs) <= known:
            return (f"step {index} ({step.op} of {list(step.inputs)}): the CS computes "
                    "arithmetic (add, sub, mul, div, ...), comparisons, select, element-wise "
                    "functions, reductions, concat and row slices of the weight, its sources, "
                    "batch values, factors and earlier steps")
    if (write.batch or write.carried_dtype) and write.before_update or \
            write.carried_dtype and write.predicate is not None:
        return "a write of state is made after the updates (of the batch: on the steps a " \
               "predicate holds, or every step)"
    if write.carried_dtype and (write.batch or write.sources or write.carried_dtype not in
                                _DTYPES):
        return "a carried state is int32, int64 or float32, written from itself and constants"
    for factor in (*write.factors, *((write.predicate,) if write.predicate else ())):
        problem = schedule_problem(factor)
        if problem or factor.hyper_parameter != FACTOR or factor.variables:
            return f"a factor: {problem or 'a ' + FACTOR + ' schedule of no variable needed'}"
    return ""


def _arity(op: str) -> int:
    """How many values step `op` takes (-1: no operation the CS computes)."""
    kind, _, rest = op.partition(":")
    if kind == "f":
        return 1 if rest in FUNCTIONS and rest not in (*PARAMETERS, "leaky_relu") else -1
    if kind == "r":
        name, axes, keep = (rest.split(":") + ["", ""])[:3]
        ok = name in REDUCE and keep in ("0", "1") and all(a.isdigit() for a in axes.split(","))
        return 1 if ok else -1
    if kind == SLICE:
        bounds = rest.split(":")
        return 1 if len(bounds) == 2 and all(b.lstrip("-").isdigit() for b in bounds) else -1
    if kind == RESHAPE:
        return 1 if all(d.isdigit() for d in rest.split(",")) else -1
    if kind == INTEGER:
        return 0 if rest.lstrip("-").isdigit() else -1
    if kind == FILL:
        dtype, _, dims = (rest.split(":") + ["", ""])[:3]
        return 0 if dtype in _DTYPES and all(d.isdigit() for d in dims.split(",")) else -1
    if kind == SEGMENT_SUM:
        return 2 if rest.isdigit() else -1
    if kind == RANGE:
        return 0 if rest.isdigit() else -1
    if (kind, rest) in ((CAST, "float32"), (CAST, "int32"), (CAST, "int64"), (UNIQUE, "1"),
                        (UNIQUE, "2")):
        return 1
    if op in SCATTERS or op == SCATTER_UPDATE:
        return 3
    return 2 if op in (CONCAT, GATHER) else 2 if op in ARITHMETIC or op in COMPARISONS else \
        3 if op == SELECT else 1 if op == COPY else -1


def _step(op: str, args: list[Any]) -> np.ndarray:
    """One step's float32 value."""
    kind, _, rest = op.partition(":")
    if kind == "f":
        return FUNCTIONS[rest][0](np.asarray(args[0], np.float32), 0.0, None)
    if kind == "r":
        name, axes, keep = rest.split(":")
        return REDUCE[name](args[0], axis=tuple(int(a) for a in axes.split(",")),
                            keepdims=keep == "1", dtype=np.float32)
    if kind == SLICE:
        start, stop = (int(b) for b in rest.split(":"))
        return np.array(args[0][start:stop], np.float32)
    if kind == CAST:
        return np.asarray(args[0]).astype(_DTYPES[rest])
    if kind == INTEGER:
        return np.asarray(int(rest), np.int32)
    if kind == FILL:
        dtype, value, dims = rest.split(":")
        return np.full(tuple(int(d) for d in dims.split(",")), float(value), _DTYPES[dtype])
    if kind == RANGE:
        return np.arange(int(rest), dtype=np.int32)
    if kind == SEGMENT_SUM:  # (TF's CPU kernel: the rows in order)
        data = np.asarray(args[0], np.float32)
        out = np.zeros((int(rest), *data.shape[1:]), np.float32)
        np.add.at(out, np.asarray(args[1]).astype(np.int64), data)
        return out
    if kind == RESHAPE:
        return np.reshape(args[0], tuple(int(d) for d in rest.split(",")))
    if kind == UNIQUE:  # (TF's order of first appearance)
        _, first, index, count = np.unique(args[0], return_index=True, return_inverse=True,
                                           return_counts=True)
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        return rank[index.reshape(-1)].astype(np.int32) if rest == "1" else \
            count[order].astype(np.int32)
    if op == GATHER:
        return np.take(args[0], np.asarray(args[1]).astype(np.int64), axis=0)
    if op in SCATTERS or op == SCATTER_UPDATE:
        out = np.array(args[0], np.float32)
        rows = np.asarray(args[1]).astype(np.int64).reshape(-1)
        updates = np.broadcast_to(np.asarray(args[2], np.float32),
                                  (len(rows), *out.shape[1:]))
        if op == SCATTER_UPDATE:
            for row, update in zip(rows, updates):  # (in order: the last duplicate wins)
                out[row] = update
        else:
            SCATTERS[op].at(out, rows, updates)
        return out
    if op == CONCAT:
        return np.concatenate([np.asarray(a, np.float32) for a in args], 0)
    if op == COPY:
        return np.array(args[0], np.float32)
    if op in COMPARISONS:
        return np.asarray(COMPARISONS[op](*args))
    if op == SELECT:
        return where(np.asarray(args[0], np.bool_), *np.broadcast_arrays(
            np.asarray(args[1], np.float32), np.asarray(args[2], np.float32)))
    if op in INTEGER_ARITHMETIC and all(np.asarray(a).dtype.kind == "i" for a in args):
        return np.asarray(ARITHMETIC[op][0](*args))  # (TF's int kernel)
    return np.asarray(ARITHMETIC[op][0](*args), np.float32)


def apply(write: WeightWrite, weight: np.ndarray, factors: list[np.float32],
          sources: tuple[np.ndarray, ...] = (), batch: tuple[np.ndarray, ...] = ()) -> None:
    """Writes `weight` (float32, in place) with the steps' last value, given the sources'
    values and the batch values' (each the whole batch, in batch order)."""
    values: dict[str, np.ndarray | np.float32] = {
        WEIGHT: weight, **{f"f{k}": np.float32(f) for k, f in enumerate(factors)},
        **{f"v{k}": source for k, source in enumerate(sources)},
        **{f"b{k}": value for k, value in enumerate(batch)}}
    for index, step in enumerate(write.steps):
        values[f"s{index}"] = _step(step.op, [values[name] for name in step.inputs])
    np.copyto(weight, values[f"s{len(write.steps) - 1}"])


def describe(write: WeightWrite) -> str:
    """The written value as a formula of the weight `w` and the factors (the report's)."""
    symbols = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
    rendered = [render(f) for f in write.factors]
    terms = {WEIGHT: "w", **{f"f{k}": f"({r})" if " " in r else r for k, r in enumerate(rendered)},
             **{f"v{k}": source for k, source in enumerate(write.sources)},
             **{f"b{k}": f"batch({value})" for k, value in enumerate(write.batch)}}
    for index, step in enumerate(write.steps):
        args = [terms[name] for name in step.inputs]
        kind, _, rest = step.op.partition(":")
        if step.op in symbols:
            terms[f"s{index}"] = f"({args[0]} {symbols[step.op]} {args[1]})"
        elif step.op == COPY:
            terms[f"s{index}"] = args[0]
        elif kind == "f":
            terms[f"s{index}"] = f"{rest}({args[0]})"
        elif kind == SLICE:
            terms[f"s{index}"] = f"{args[0]}[{rest}]"
        elif kind == INTEGER:
            terms[f"s{index}"] = rest
        elif kind == FILL:
            dtype, value, dims = rest.split(":")
            terms[f"s{index}"] = f"fill([{dims}], {value})"
        elif kind == RANGE:
            terms[f"s{index}"] = f"range({rest})"
        elif kind == SEGMENT_SUM:
            terms[f"s{index}"] = f"unsorted_segment_sum({args[0]}, {args[1]}, {rest})"
        elif kind in (CAST, RESHAPE):
            terms[f"s{index}"] = f"{kind}({args[0]}, {rest})"
        elif kind == UNIQUE:
            terms[f"s{index}"] = f"unique_with_counts({args[0]})." + \
                ("idx" if rest == "1" else "count")
        elif kind == "r":
            name, axes, keep = rest.split(":")
            terms[f"s{index}"] = f"reduce_{name}({args[0]}, axis={axes}" + \
                (", keepdims)" if keep == "1" else ")")
        else:
            terms[f"s{index}"] = f"{step.op}({', '.join(args)})"
    last = terms[f"s{len(write.steps) - 1}"]
    return last[1:-1] if last.startswith("(") else last
