"""The blockers a refusal hides: after the pass over the data-flow ops has refused an op, the
ops it feeds are swallowed into the loss tail unexamined (their inputs are no per-sample
values the CS holds), and the weight-only values they read are never lowered. So that a
model's first validation names every op that certainly stops it (not one per attempt), the
swallowed ops are checked for what no rule of the compiler lowers: an op type no kernel
computes (lowering's tables, the weight program's, the loss tail's), and a value of weights
alone the weight program cannot compute (its own refusal: the op it has no kernel for on
weights). Only called when the model is refused already: it adds lines, never a refusal."""
from __future__ import annotations

import tensorflow as tf

from coordinator.compiler import lowering, refusals
from coordinator.compiler.extract import user_name, user_source
from coordinator.compiler.ir import UnsupportedOp
from coordinator.compiler.rules import Context

# Op types the loss tail lowers besides lowering's and the weight program's (batch_tail.py).
TAIL_OPS = {"TopKV2", "CumulativeLogsumexp", "OneHot", "Roll", "UnsortedSegmentSum",
            "DiagPart", "MatrixDiagPart", "IsFinite", "Select", "SelectV2", "Cast", "Identity",
            "Reshape", "Squeeze", "ExpandDims", "L2Loss", "DivNoNan"}


def computed_types() -> set[str]:
    """Op types some rule of the compiler lowers (per sample, on weights, in the tail)."""
    return lowering.supported_op_types() | set(lowering.WEIGHT_PROGRAM_OPS) | TAIL_OPS


def hidden(m: Context, ops: list[tf.Operation], tail: set[str],
           refused: list[UnsupportedOp], kernel_less: dict[str, tf.Operation]
           ) -> list[UnsupportedOp]:
    """The blockers among `ops` (the data-flow ops, graph order) swallowed into the `tail`
    that the `refused` ops do not name already: kernel-less op types, then (at the op that
    reads it) each weight-only value the weight program cannot compute, once per cause; and
    upstream of an op the weight program has no kernel for (`kernel_less`: by the refusal
    naming it), the values of weights before it that it cannot compute either."""
    named = {u.name for u in refused}
    said = {u.reason for u in refused}
    found: list[UnsupportedOp] = []
    known = computed_types()
    for op in ops:
        if op.name in named or not any(out.name in tail for out in op.outputs):
            continue
        if op.type not in known:
            found.append(refusals.attribute(op, refusals.NO_KERNEL, set(), m.is_batched))
        for t in op.inputs:
            if t.dtype.base_dtype != tf.float32 or t.name in tail:
                continue
            problem = m.weight_problem(t)
            if problem and problem not in said:
                said.add(problem)
                found.append(UnsupportedOp(op.type, user_name(op), user_source(op), problem))
    pending = [op for reason, op in kernel_less.items() if reason in said]
    while pending:  # (a Cholesky before the triangular solve of weights)
        op = pending.pop()
        for t in op.inputs:
            problem = m.weight_problem(t) if t.dtype.base_dtype == tf.float32 else ""
            if problem and problem not in said:
                said.add(problem)
                found.append(UnsupportedOp(op.type, user_name(op), user_source(op), problem))
                pending += [kernel_less[problem]] if problem in kernel_less else []
    return found
