"""Writes of frozen state from the step's values of the whole batch (wafer.weight_writes'
`batch`): a running mean of features `m.assign_sub(0.2 * (m - tf.reduce_mean(h, 0)))`, a
moving average of another batch value `v.assign(0.9 * v + 0.1 * tf.reduce_mean(x, 0))`,
MoCo's key queue `q.assign(tf.concat([keys, q[:-B]], 0))`. The written value is lowered to
write steps over the state's own value, constants and the per-sample values the CS holds
(kernels' outputs and inputs, TF's [B, ...] in batch order: `b<k>`); the state must be a
frozen weight of the program's kernels, and the write must wait for every read of it the
step makes (the forward pass reads the old value, as the CS's, which writes after the
step's updates). Anything else is refused naming the op."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import tensorflow as tf

from coordinator.compiler.extract import ExtractedGraph, data_upstream, op_closure, user_name, user_source
from coordinator.compiler.ir import TrainingSpec, UnsupportedOp
from coordinator.compiler.operands import static_shape
from coordinator.compiler.training.graph import skip_identity, step_runs, variable_op
from coordinator.compiler.training.writes import (
    WRITE_STEP,
    forward_reads,
    variable_readers,
    variables_read,
    write_step,
)
from wafer.kernels.base import KERNELS
from wafer.schedules import ScalarOp, Schedule
from wafer.weight_writes import (
    CAST,
    CONCAT,
    FACTOR,
    FILL,
    GATHER,
    INTEGER,
    RANGE,
    RESHAPE,
    SEGMENT_SUM,
    SLICE,
    UNIQUE,
    WEIGHT,
    WeightWrite,
    WriteStep,
)

_BATCH_DTYPES = (tf.float32, tf.int32, tf.int64)
_TENSOR_SCATTERS = {"TensorScatterUpdate": "scatter_update", "TensorScatterAdd": "scatter_add",
                    "TensorScatterSub": "scatter_sub"}
_SCATTER_STEP = {"ResourceScatterSub": "scatter_sub", "ScatterSub": "scatter_sub",
                 "ResourceScatterAdd": "scatter_add", "ScatterAdd": "scatter_add",
                 "ResourceScatterUpdate": "scatter_update", "ScatterUpdate": "scatter_update"}
WHAT = ("arithmetic, element-wise functions and reductions of it, constants and the batch's "
        "per-sample values, tf.concat along axis 0 and static row slices (a running mean "
        "m.assign_sub(0.2 * (m - tf.reduce_mean(h, 0))), MoCo's queue "
        "q.assign(tf.concat([keys, q[:-B]], 0)))")


class _Refused(Exception):
    def __init__(self, op: tf.Operation, reason: str):
        super().__init__(reason)
        self.unsupported = UnsupportedOp(op.type, user_name(op), user_source(op), reason)


def state_write_ops(matcher, training: TrainingSpec) -> list[tf.Operation]:
    """The train_op's writes of frozen state the matcher lowers here: those the training
    analysis found, and moving averages of a value that is no BatchNormalization's batch
    statistic."""
    graph = matcher.x.graph
    names = [*training.state_writes, *(a.op for a in training.statistic_averages
                                       if a.op and a.statistic not in matcher.statistics)]
    return [graph.get_operation_by_name(n) for n in names]


def lower(matcher, extracted: ExtractedGraph, training: TrainingSpec,
          ) -> tuple[tuple[WeightWrite, ...], list[UnsupportedOp]]:
    """The state writes of the step as weight writes of the batch, and the refused ones."""
    ops = state_write_ops(matcher, training)
    if not ops:
        return (), []
    runs = variable_readers(step_runs(extracted))
    writes, bad = [], []
    targets = [variable_op(op.inputs[0]) for op in ops]
    pointers = {t: op for op, t in zip(ops, targets) if _pointer(matcher, op, t, ops)}
    gated = {g.op: g for g in training.gated_state_writes}
    for op, target in zip(ops, targets):
        if targets.count(target) > 1:
            bad.append(UnsupportedOp(op.type, user_name(op), user_source(op),
                                     f"the train_op writes {target.name} twice a step: the CS "
                                     "writes state from the batch once a step"))
            continue
        g = gated.get(op.name)
        try:
            if g is None:
                writes.append(_lower(matcher, op, runs, pointers))
            else:  # (ordered by its cond; written on the steps the predicate holds)
                write = _lower(matcher, op, runs, pointers, op.graph.get_operation_by_name(g.cond))
                writes.append(replace(write, predicate=g.predicate, step_offset=g.step_offset))
        except _Refused as refused:
            bad.append(refused.unsupported)
    # (a pointer's write after those reading it, as TF orders them: _lower proved it)
    return tuple(sorted(writes, key=lambda w: bool(w.carried_dtype))), bad


def _pointer(m, op: tf.Operation, target: tf.Operation, ops: list[tf.Operation]) -> bool:
    """Whether `op` writes a scalar state no kernel holds from itself and constants alone,
    which another state write of `ops` reads (MoCo's ring pointer: ptr.assign((ptr + B) %
    K))."""
    held = any(p.variable == target.name for k in m.kernels for p in k.params) or \
        target.name in m.weight_program_sources()
    return (not held and op.type in WRITE_STEP and variables_read(op) == {target}
            and not any(r.type == "Placeholder" for r in data_upstream(op))
            and tuple(target.get_attr("shape").dim) == ()
            and tf.as_dtype(target.get_attr("dtype")) in _BATCH_DTYPES
            and any(target in variables_read(o) for o in ops if o is not op))


def _lower(m, op: tf.Operation, runs: dict, pointers: dict,
           anchor: tf.Operation | None = None) -> WeightWrite:
    """`op`'s write as a weight write of the batch, or _Refused (`anchor`: the tf.cond `op`
    was imported from, which orders it)."""
    target = variable_op(op.inputs[0])
    name = target.name
    if op.type not in WRITE_STEP and op.type not in _SCATTER_STEP:
        raise _Refused(op, f"the train_op writes {name} with {op.type}: the CS writes state "
                           "from the batch with assign, assign_add, assign_sub and "
                           "scatter_sub, scatter_add, scatter_update")
    params = [p for k in m.kernels for p in k.params if p.variable == name]
    if not params and name not in m.weight_program_sources() and target not in pointers:
        raise _Refused(op, f"the train_op writes {name}, which no layer the CS runs reads: "
                           "the CS keeps state written every step in the kernels that read it")
    if any(p.view for p in params):
        raise _Refused(op, f"the train_op writes {name} from the batch, and a layer reads a "
                           "slice of it: the CS writes state its kernels read whole")
    closure = set(op_closure(op)) | (set(op_closure(anchor)) if anchor is not None else set())
    unordered = next((r for r in forward_reads(op, runs) if r not in closure), None)
    if unordered is not None:
        raise _Refused(op, f"the write of {name} does not wait for the step's read of it "
                           f"('{user_name(unordered)}' at {user_source(unordered)}): TF reads the old "
                           "or the new value by chance; write it under "
                           "tf.control_dependencies([the optimizer's op])")
    batch: list[str] = []
    sources: list[str] = []  # the pointers it reads, written after it
    steps: list[WriteStep] = []
    factors: list[Schedule] = []
    shape = tuple(int(d.size) for d in target.get_attr("shape").dim)

    lowered: dict[str, str] = {}  # tensor -> its value's name (each tensor computed once)

    def lower_value(t: tf.Tensor) -> str:
        t = skip_identity(t)
        if t.name not in lowered:
            lowered[t.name] = value_of(t)
        return lowered[t.name]

    def value_of(t: tf.Tensor) -> str:
        if t.op.type in ("ReadVariableOp", "VariableV2") and variable_op(t) is target:
            return WEIGHT
        pointer = pointers.get(variable_op(t)) if t.op.type == "ReadVariableOp" else None
        if pointer is not None and op in set(op_closure(pointer)) and \
                pointer not in closure:  # (read before the pointer's write)
            sources.append(variable_op(t).name)
            return f"v{len(sources) - 1}"
        if t.op.type in ("ReadVariableOp", "VariableV2"):
            raise _Refused(t.op, f"the write of {name} reads {variable_op(t).name}: the CS "
                                 "writes state from itself, constants and the batch's values "
                                 "(fold a constant factor into the write)")
        if t.name in m.values:
            if t.name in m.leading or m.folds(t) != 1 or static_shape(t)[:1] != \
                    (m.batch_size,) or t.dtype.base_dtype not in _BATCH_DTYPES:
                raise _Refused(t.op, f"the write of {name} reads {t.name}, which the CS does "
                                     "not hold as TF's float32 or integer [batch, ...] values")
            value = m.values[t.name]
            if _is_loss(m, value):
                raise _Refused(t.op, f"the write of {name} reads {t.name}, which the CS "
                                     "holds as the loss's share of each sample: write from the "
                                     "per-sample values the loss reduces")
            if value not in batch:
                batch.append(value)
            return f"b{batch.index(value)}"
        constant = tf.get_static_value(t) if t.op.type not in ("ReadVariableOp",
                                                              "VariableV2") else None
        if constant is not None and np.ndim(constant) == 0 and t.dtype == tf.float32:
            factors.append(Schedule(FACTOR, (ScalarOp("const", "float32",
                                                      value=float(constant)),),
                                    source=user_source(t.op)))
            return f"f{len(factors) - 1}"
        if constant is not None and np.ndim(constant) == 0 and t.dtype == tf.int32:
            steps.append(WriteStep(f"{INTEGER}:{int(constant)}", ()))
            return f"s{len(steps) - 1}"
        if constant is not None and t.dtype == tf.int32 and np.ndim(constant) == 1 and \
                np.array_equal(constant, np.arange(np.size(constant))):
            steps.append(WriteStep(f"{RANGE}:{np.size(constant)}", ()))
            return f"s{len(steps) - 1}"
        if constant is not None and np.ndim(constant) and np.size(constant) and \
                np.all(constant == constant.flat[0]) and t.dtype in _BATCH_DTYPES:
            dims = ",".join(str(d) for d in np.shape(constant))
            value = repr(float(constant.flat[0])) if t.dtype.is_floating else \
                str(int(constant.flat[0]))
            steps.append(WriteStep(f"{FILL}:{t.dtype.name}:{value}:{dims}", ()))
            return f"s{len(steps) - 1}"
        if t.op.type in ("ResourceGather", "GatherV2") and _gathers_rows(t.op) and \
                variable_op(t.op.inputs[0]) is target:
            steps.append(WriteStep(GATHER, (WEIGHT, lower_value(t.op.inputs[1]))))
            return f"s{len(steps) - 1}"
        step, inputs = _structural(t)
        if not step:
            step, inputs = write_step(t.op)
        if not step:
            raise _Refused(t.op, f"the train_op writes {name} with a value that is not {WHAT}")
        steps.append(WriteStep(step, tuple(lower_value(x) for x in inputs)))
        return f"s{len(steps) - 1}"

    last: str | None = _SCATTER_STEP.get(op.type)
    if last is not None:
        rows = lower_value(op.inputs[1])
        steps.append(WriteStep(last, (WEIGHT, rows, lower_value(op.inputs[2]))))
    else:
        value = lower_value(op.inputs[1])
        last = WRITE_STEP[op.type]
        if last is not None:
            steps.append(WriteStep(last, (WEIGHT, value)))
    if target in pointers:
        return WeightWrite(name, tuple(steps), tuple(factors), source=user_source(op),
                           carried_dtype=tf.as_dtype(target.get_attr("dtype")).name)
    if not batch or not steps:
        raise _Refused(op, f"the train_op writes {name} with a value that reads no per-sample "
                           f"value of the batch: the CS writes state from the batch as {WHAT}")
    written = op.inputs[1].shape
    if op.type in WRITE_STEP and last is None and (not written.is_fully_defined() or tuple(written) != shape):
        raise _Refused(op, f"the train_op writes {name} {shape} with a value of shape {written}")
    return WeightWrite(name, tuple(steps), tuple(factors), source=user_source(op),
                       sources=tuple(sources), batch=tuple(batch))


def _is_loss(m, value: str) -> bool:
    """Whether the kernel computing `value` is a loss kernel."""
    node = next((k for k in m.kernels if k.name == value), None)
    return node is not None and node.type in KERNELS and KERNELS[node.type].is_loss


def _gathers_rows(op: tf.Operation) -> bool:
    """tf.gather along axis 0 (no batch_dims)."""
    axis = tf.get_static_value(op.inputs[2]) if op.type == "GatherV2" else 0
    return axis == 0 and op.get_attr("batch_dims") == 0

def _structural(t: tf.Tensor) -> tuple[str, list[tf.Tensor]]:
    """tf.concat of two values along axis 0, a static slice of rows (x[a:b], x[:-n]), a
    gather of rows, a cast, a reshape to a static shape (or a slice taking every element:
    x[:, None]), tf.unique_with_counts' idx or count, a segment sum, tf.tensor_scatter_nd_*
    of rows; "" for any other op."""
    op = t.op
    if op.type == "UniqueWithCounts" and t.value_index in (1, 2) and \
            op.get_attr("out_idx") == tf.int32:
        return f"{UNIQUE}:{t.value_index}", [op.inputs[0]]
    if op.type == "Cast" and t.dtype in (tf.float32, tf.int32, tf.int64):
        return f"{CAST}:{t.dtype.name}", [op.inputs[0]]
    if op.type == "Reshape" and t.shape.is_fully_defined():
        return f"{RESHAPE}:{','.join(str(d) for d in t.shape)}", [op.inputs[0]]
    if op.type in _TENSOR_SCATTERS and op.inputs[1].shape.rank == 2 and \
            op.inputs[1].shape[-1] == 1:  # (rows: indices [n, 1])
        return _TENSOR_SCATTERS[op.type], list(op.inputs)
    if op.type == "UnsortedSegmentSum" and tf.get_static_value(op.inputs[2]) is not None:
        return f"{SEGMENT_SUM}:{int(tf.get_static_value(op.inputs[2]))}", list(op.inputs[:2])
    if op.type == "GatherV2" and _gathers_rows(op):
        return GATHER, list(op.inputs[:2])
    if op.type == "ConcatV2" and len(op.inputs) == 3 and \
            tf.get_static_value(op.inputs[2]) == 0:
        return CONCAT, list(op.inputs[:2])
    if op.type != "StridedSlice" or op.inputs[0].shape.rank is None:
        return "", []
    begin, end, strides = (tf.get_static_value(x) for x in op.inputs[1:])
    if strides is not None and np.all(strides == 1) and t.shape.is_fully_defined() and \
            op.inputs[0].shape.is_fully_defined() and \
            t.shape.num_elements() == op.inputs[0].shape.num_elements():  # (x[:, None])
        return f"{RESHAPE}:{','.join(str(d) for d in t.shape)}", [op.inputs[0]]
    masks = {k: op.get_attr(k) for k in ("begin_mask", "end_mask", "ellipsis_mask",
                                          "new_axis_mask", "shrink_axis_mask")}
    rows = op.inputs[0].shape[0]
    if begin is None or end is None or strides is None or len(begin) != 1 or \
            int(strides[0]) != 1 or masks["ellipsis_mask"] or masks["new_axis_mask"] or \
            masks["shrink_axis_mask"] or rows is None:
        return "", []
    start = 0 if masks["begin_mask"] & 1 else int(begin[0])
    stop = rows if masks["end_mask"] & 1 else int(end[0])
    start, stop, _ = slice(start, stop).indices(rows)
    return f"{SLICE}:{start}:{stop}", [op.inputs[0]]
