"""What TF's Session runs in place of some float ops: Grappler's constant folding rewrites
the graph before it runs (tensorflow/core/grappler/optimizers/constant_folding.cc), and the
CS computes what the rewritten graph computes (docs/design.md, "Grappler's rewrites").

- ReduceDivToReciprocalMul: x / c, c constant, runs as x * (1 / c), the reciprocal rounded
  to the type (1 ULP from the division in about half of the values).
- ConstantPushDown: (x op y) op c, op * or + (a division by a constant counting as its
  reciprocal's product), y and c constant, float32, runs as x op (c op y) when the inner op
  has no other consumer among the ops the Session runs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np
import tensorflow as tf

from coordinator.compiler.operands import Operands

FAMILIES = {"Mul": "mul", "RealDiv": "mul", "Div": "mul", "Add": "add", "AddV2": "add"}
Factor = tuple[tf.Tensor, tf.Tensor, np.ndarray, str]  # x, a constant input, its value, mul/add


def reciprocal(value: np.ndarray, dtype: tf.DType) -> np.ndarray:
    """1 / value rounded to `dtype`, as float32 (ReduceDivToReciprocalMul's constant)."""
    return np.asarray(np.reciprocal(value.astype(dtype.as_numpy_dtype)), np.float32)


@dataclass(frozen=True)
class SessionOps:
    """The ops a Session runs for its fetches (their data and control inputs, transitively:
    it prunes the rest before Grappler) and the fetched ops (Grappler keeps their values)."""

    run: frozenset[tf.Operation]
    fetched: frozenset[tf.Operation]


def session_ops(fetches: Iterable[Any]) -> SessionOps:
    """SessionOps of `fetches` (tensors, variables - a metric's update op may be one - or ops,
    nested; None skipped)."""
    fetched = {f if isinstance(f, tf.Operation) else f.op for f in tf.nest.flatten(fetches)
               if f is not None}
    stack, seen = list(fetched), set()
    while stack:
        op = stack.pop()
        if op not in seen:
            seen.add(op)
            stack.extend([t.op for t in op.inputs] + list(op.control_inputs))
    return SessionOps(frozenset(seen), frozenset(fetched))


def _constant_factor(operands: Operands, op: tf.Operation) -> Factor | None:
    """x * c, x / c (as x * (1 / c)) or x + c of a float32 x and a constant c, else None."""
    if op.type not in FAMILIES or op.outputs[0].dtype != tf.float32 or len(op.inputs) != 2:
        return None
    values = [operands.constant(t) for t in op.inputs]
    if (values[0] is None) == (values[1] is None) or \
            (op.type in ("RealDiv", "Div") and values[1] is None):
        return None
    k = 0 if values[0] is not None else 1
    value = np.asarray(values[k], np.float32)
    if op.type in ("RealDiv", "Div"):
        value = reciprocal(value, tf.float32)
    return op.inputs[1 - k], op.inputs[k], value, FAMILIES[op.type]


def pushed_down(operands: Operands, session: SessionOps, op: tf.Operation) -> Factor | None:
    """(x op y) op c as the Session runs it, x op (c op y): x, c's tensor, the folded value
    (of c and y's broadcast shape) and op; None where ConstantPushDown leaves `op` alone (the inner
    op fetched, or feeding another op the Session runs)."""
    outer = _constant_factor(operands, op)
    if outer is None or outer[0].op not in session.run or outer[0].op in session.fetched or \
            sum(c in session.run for c in outer[0].consumers()) != 1:
        return None
    inner = pushed_down(operands, session, outer[0].op) or \
        _constant_factor(operands, outer[0].op)
    if inner is None or inner[3] != outer[3]:
        return None
    folded = np.asarray((np.multiply if outer[3] == "mul" else np.add)(outer[2], inner[2]),
                        np.float32)
    return inner[0], outer[1], folded, outer[3]
