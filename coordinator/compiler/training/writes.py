"""Every variable write the train_op runs: an optimizer update of one variable (updates.py),
the optimizer's own bookkeeping (Adam's beta powers), the global step's increment, a Keras
seed generator's state, an ExponentialMovingAverage of a trained weight, a moving average
of a batch statistic (which the matcher must find), or a write of a trained weight that is
an expression of it (arithmetic with scalars, element-wise functions, reductions over
constant axes, comparisons and tf.where) before or after its update (decoupled weight decay
by hand, TransE's renormalization tf.nn.l2_normalize(ent, axis=1), a max-norm constraint,
tf.clip_by_norm;
wafer.weight_writes), or a soft update of a weight the step does not train toward trained
ones (a target network's Polyak averaging, a momentum encoder); a write of other frozen
state from the batch is left to the matcher (batch_writes.py); any other write is
refused."""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np
import tensorflow as tf

from coordinator.compiler.extract import ExtractedGraph, data_upstream, op_closure, user_name, user_source
from coordinator.compiler.ir import StatisticAverage
from coordinator.compiler.lowering import (
    REDUCTIONS,
    ROW_SELECT,
    SELECTS,
    UNARY,
    WEIGHT_ARITHMETIC,
    WEIGHT_COMPARISONS,
    selects_rows,
)
from coordinator.compiler.training.graph import (
    Refused,
    fail,
    scalar,
    skip_identity,
    step_runs,
    uniform,
    variable_op,
)
from coordinator.compiler.training.updates import (
    APPLY_OPS,
    SUPPORTED,
    NoMatch,
    Update,
    adam_sparse,
    adamw_update,
    apply_update,
    expect,
    merge_weight_decay,
    sgd_sparse,
)
from wafer.optimizers import OptimizerConfig
from wafer.schedules import Schedule
from wafer.weight_writes import COPY, SELECT, WEIGHT

_WRITE_PREFIXES = ("Assign", "ResourceScatter", "Scatter", "ResourceApply", "Apply",
                   "SparseApply", "ResourceSparseApply", "ResourceStridedSliceAssign",
                   "StridedSliceAssign")


CONDS = ("If", "StatelessIf")  # a tf.cond's op types
_SEED_STATE = re.compile(r"(^|/)seed_generator(_\d+)?/seed_generator_state$")
_BETA_POWER = re.compile(r"^beta([12])_power(_\d+)?$")


STATE_HINT = ("the CS keeps no state but weights, optimizer slots and moving statistics: compute "
              "the value anew every step from the weights (e.g. spectral normalization's power "
              "iteration from a constant vector, a fixed number of steps), or train on the CPU "
              "(python run.py)")


def is_write(op: tf.Operation) -> bool:
    """An op that writes a variable: its first input is a resource handle or a ref."""
    return (op.type.startswith(_WRITE_PREFIXES) and bool(op.inputs)
            and (op.inputs[0].dtype == tf.resource or op.inputs[0].dtype._is_ref_dtype))


def writes_variable(branch, deep: bool = False) -> bool:
    """Whether a tf.cond's or loop's branch writes a variable (`deep`: or a tf.cond or loop
    inside it does)."""
    return any(is_write(op) or deep and any(writes_variable(getattr(op, k), True) for k in (
        "_true_graph", "_false_graph", "_body_graph") if hasattr(op, k))
        for op in branch.get_operations())


def computed_after_write(value: tf.Tensor, wanted: Callable[[tf.Operation], bool] = lambda w: True
                         ) -> tuple[tf.Operation, tf.Operation] | None:
    """The first op (in graph order) `value` computes from that runs under
    tf.control_dependencies of a variable write `wanted` accepts, and that write; else None."""
    for op in sorted(data_upstream(value.op), key=lambda op: op._id):
        write = next((w for c in op.control_inputs for w in op_closure(c)
                      if is_write(w) and wanted(w)), None)
        if write is not None:
            return op, write
    return None


def bookkeeping(op: tf.Operation, graph: tf.Graph,
                optimizers: Sequence[OptimizerConfig] = ()) -> bool:
    """The global step's increment, Adam's (and AdamW's) beta powers of one of the
    `optimizers`, a Keras seed generator's state."""
    target = variable_op(op.inputs[0])
    steps = graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_STEP)
    if steps and target is variable_op(steps[0]) and op.type in ("AssignAddVariableOp",
                                                                 "AssignAdd"):
        return scalar(op.inputs[1]) == 1
    if _SEED_STATE.search(target.name) and not tf.as_dtype(target.get_attr("dtype")).is_floating:
        return True
    match = _BETA_POWER.match(target.name)
    owner = next((o for o in optimizers if (o.type == "adam" or o.use_bias_correction) and
                  target.name in (o.scalar_names or ("beta1_power", "beta2_power"))), None)
    if match and owner is not None and op.type == "AssignVariableOp":
        mul = skip_identity(op.inputs[1]).op
        beta = owner.beta1 if match.group(1) == "1" else owner.beta2
        return (mul.type == "Mul" and variable_op(mul.inputs[0]) is target
                and scalar(mul.inputs[1]) is not None
                and np.float32(scalar(mul.inputs[1])) == np.float32(beta))
    return False


@dataclass(frozen=True)
class Average:
    """ExponentialMovingAverage.apply's update of one shadow variable."""

    op: tf.Operation  # AssignSub(shadow, (shadow - variable) * factor)
    variable: str
    shadow: str
    mul: tf.Operation
    factor: tf.Tensor  # 1 - decay


def _moving_average(op: tf.Operation) -> Average | None:
    if op.type not in ("AssignSubVariableOp", "AssignSub"):
        return None
    try:
        mul = expect(op.inputs[1], "Mul")
        sub = expect(mul.inputs[0], "Sub")
    except NoMatch:
        return None
    shadow, variable = variable_op(op.inputs[0]), variable_op(sub.inputs[1])
    if variable_op(sub.inputs[0]) is not shadow or variable.type not in ("VarHandleOp",
                                                                         "VariableV2"):
        return None
    return Average(op, variable.name, shadow.name, mul, mul.inputs[1])


def train_op_writes(extracted: ExtractedGraph, statistics: list[StatisticAverage],
                    states: list[tf.Operation] | None = None,
                    anchors: Mapping[tf.Operation, tf.Operation] | None = None,
                    again: list[Update] | None = None,
                    ) -> tuple[list[Update], list[Average], list["Write"]]:
    """The optimizer updates, ExponentialMovingAverage updates and other writes of trained
    weights (decoupled weight decay) of the train_op (the moving averages of batch
    statistics into `statistics`, the writes of other frozen state into `states`: the
    matcher lowers them from the step's values, batch_writes.py). `anchors`: writes
    imported from a tf.cond's branch -> the cond, which orders them. `again`: collects the
    later updates of a weight another optimizer updates first (else refused)."""
    order = {op.name: i for i, op in enumerate(extracted.graph.get_operations())}
    writes = sorted((op for op in op_closure(extracted.spec.train_op) if is_write(op)),
                    key=lambda op: order[op.name])
    updates: list[Update] = []
    for op in writes:
        if op.type in APPLY_OPS:
            updates.append(apply_update(op))
            continue
        found = adam_sparse(op) or sgd_sparse(op) or adamw_update(op)
        if found is not None:
            updates.append(found)
    merge_weight_decay(updates)
    for u in updates:
        u.cond = (anchors or {}).get(u.op)
    owned = set().union(*(u.owned for u in updates)) if updates else set()
    optimizers = list(dict.fromkeys(u.optimizer for u in updates))
    averages, others = [], []
    increments = []
    trained = {variable_op(u.op.inputs[0]) for u in updates}
    runs = variable_readers(step_runs(extracted))
    inputs = {extracted.graph.get_tensor_by_name(p).op for p in extracted.placeholders.values()}
    of_batch = [op for op in writes if op not in owned and variable_op(op.inputs[0]) not in
                trained and inputs & set(data_upstream(op))]
    pointers = {variable_op(r.inputs[0]) for op in of_batch for r in data_upstream(op)
                if r.type == "ReadVariableOp"}  # (state a write of the batch reads: a ring
    for op in writes:  # pointer, batch_writes.py)
        if op in owned:
            continue
        if bookkeeping(op, extracted.graph, optimizers):
            if op.type in ("AssignAddVariableOp", "AssignAdd"):
                increments.append(op)
            continue
        if soft_update(op, trained) and forward_reads(op, runs):
            others.append(op)  # (not ema.apply's shadow: the step reads it)
            continue
        average = _moving_average(op)
        if average is not None:
            averages.append(average)
            continue
        statistic = _statistic_average(op)
        if statistic is not None and anchors and op in anchors:
            raise fail(anchors[op], f"the tf.cond's branch moves {statistic.variable}, a "
                                    "moving statistic: the CS moves them every step",
                       hint="run the update ops (UPDATE_OPS) outside the cond")
        if statistic is not None:
            statistics.append(statistic)
            continue
        target = variable_op(op.inputs[0]) if op.inputs else op
        if states is not None and target not in trained and not (anchors and op in anchors) and \
                (op.type in WRITE_STEP or op.type in STATE_SCATTERS) and \
                "ExponentialMovingAverage" not in target.name and \
                (op in of_batch or target in pointers and variables_read(op) == {target}):
            states.append(op)
            continue
        if op.type in WRITE_STEP and "ExponentialMovingAverage" not in target.name:
            others.append(op)
            continue
        if "ExponentialMovingAverage" in target.name:
            raise fail(op, f"the train_op keeps an ExponentialMovingAverage of "
                           f"{target.name.rsplit('/', 1)[0]}: the CS does not keep weight moving "
                           "averages (ExponentialMovingAverage.apply); train without them on "
                           "the CS")
        if "Apply" in op.type:  # a TF optimizer's kernel the CS does not carry out
            raise fail(op, f"the train_op updates {target.name} with {op.type}, an optimizer "
                           "update the CS does not carry out")
        raise fail(op, f"the train_op writes {target.name}, which is not an optimizer update "
                       "the CS carries out", STATE_HINT)
    if not updates:
        raise Refused(f"the train_op updates no variable with a supported optimizer "
                      f"(supported: {SUPPORTED})")
    by_var: dict[str, Update] = {}
    for u in updates:
        if u.variable in by_var:  # (a further optimizer's: reupdates.py)
            if again is None:
                raise fail(u.op, f"{u.variable} is updated twice (also by "
                                 f"'{by_var[u.variable].op.name}' at "
                                 f"{user_source(by_var[u.variable].op)}): the CS updates a "
                                 "weight by one optimizer a step here")
            again.append(u)
            continue
        by_var[u.variable] = u
    updates = [u for u in updates if u not in (again or ())]
    if len(increments) > 1:
        raise fail(increments[1], "the train_op increments the global step twice a step (two "
                                  "optimizers' minimize(global_step=...)); the CS counts one "
                                  "step a batch", hint="pass global_step to one optimizer only")
    for a in averages:
        if a.variable not in by_var or not {by_var[a.variable].op, *(
                u.op for u in again or () if u.variable == a.variable)} <= set(op_closure(a.op)):
            raise fail(a.op, f"the ExponentialMovingAverage of {a.variable} does not wait for "
                             f"its update: the CS averages the weights the train_op trains, "
                             "after their update (ema.apply under "
                             "tf.control_dependencies([the optimizer's op]))")
    written = [weight_write(op, by_var, trained, runs, (anchors or {}).get(op))
               for op in others]
    twice = next((w for k, w in enumerate(written) if w.variable in
                  {x.variable for x in written[:k]}), None)
    if twice is not None:
        raise fail(twice.op, f"the train_op writes {twice.variable} twice besides its update: "
                             "the CS carries out one such write per weight")
    rewritten = next(((w, v) for w in written for v in w.sources
                      if v in {x.variable for x in written}), None)
    if rewritten is not None:
        raise fail(rewritten[0].op, f"the soft update of {rewritten[0].variable} reads "
                                    f"{rewritten[1]}, which the train_op writes besides its "
                                    "update too: the CS reads a source only as its optimizer "
                                    "leaves it")
    # updates in graph order: compute_gradients' (creation) order
    return updates, averages, written


# TF's variable writes -> the last step of the value they write (None: the value itself)
WRITE_STEP = {"AssignSubVariableOp": "sub", "AssignAddVariableOp": "add",
              "AssignVariableOp": None, "AssignSub": "sub", "AssignAdd": "add", "Assign": None}
STATE_SCATTERS = ("ResourceScatterSub", "ResourceScatterAdd", "ResourceScatterUpdate",
                  "ScatterSub", "ScatterAdd", "ScatterUpdate")
_FUNCTIONS = {op: f for op, f in UNARY.items() if op != "LeakyRelu"}  # (no parameter)


@dataclass(frozen=True)
class Write:
    """A write of a trained weight besides its update (decoupled weight decay by hand, a
    renormalization)."""

    op: tf.Operation
    variable: str
    steps: tuple[tuple[str, tuple[str, ...]], ...]  # wafer.weight_writes' steps
    factors: tuple[tuple[tf.Tensor, tf.Operation], ...]  # scalar tensors and their readers
    before_update: bool
    sources: tuple[str, ...] = ()  # the trained weights a frozen weight's soft update reads
    predicate: Schedule | None = None  # under a tf.cond (training/copies.py): its predicate
    predicate_offset: int = 0  # 1: the predicate reads the step after its increment


def copies_only(cond: tf.Operation) -> bool:
    """Whether a cond's writes are all assignments of computed values (no optimizer's
    update, no accumulator's zeroing): a target network's copy (training/copies.py)."""
    writes = [op for branch in (cond._true_graph, cond._false_graph)
              for op in branch.get_operations() if is_write(op)]
    return bool(writes) and all(op.type in ("AssignVariableOp", "Assign") and
                                tf.get_static_value(op.inputs[1]) is None for op in writes)


def variables_read(op: tf.Operation) -> set[tf.Operation]:
    """The variables `op` computes from."""
    return {variable_op(r.inputs[0]) for r in data_upstream(op) if r.type == "ReadVariableOp"}


def _direct_reads(t: tf.Tensor) -> list[tf.Operation]:
    """The variables `t` computes from through element-wise write steps only (arithmetic,
    functions; not through a reduction: a batch statistic's moving average reduces the
    activations of trained weights): the weights a written value is an expression of."""
    t = skip_identity(t)
    if t.op.type in ("ReadVariableOp", "VariableV2"):
        return [variable_op(t)]
    kind, inputs = write_step(t.op) if t.op.type in WEIGHT_ARITHMETIC or t.op.type in _FUNCTIONS \
        else ("", [])
    return [v for x in inputs for v in _direct_reads(x)]


def soft_update(op: tf.Operation, trained: set[tf.Operation]) -> bool:
    """A write of a weight the step does not train whose value is an expression of trained
    weights (a target network's Polyak averaging)."""
    return (op.type in WRITE_STEP and len(op.inputs) == 2
            and variable_op(op.inputs[0]) not in trained
            and bool(trained & set(_direct_reads(op.inputs[1]))))


def variable_readers(runs: set[tf.Operation]) -> dict[tf.Operation, list[tf.Operation]]:
    """Each variable's readers among the ops the step runs (`runs`): the ops taking its
    handle, ref or a read of it."""
    readers: dict[tf.Operation, list[tf.Operation]] = {}
    for r in runs:
        for var in {variable_op(t) for t in r.inputs} if r.type not in ("VarHandleOp",
                                                                         "VariableV2") else ():
            readers.setdefault(var, []).append(r)
    return readers


def forward_reads(op: tf.Operation, runs: dict[tf.Operation, list[tf.Operation]],
                  ) -> list[tf.Operation]:
    """The ops the step runs (`runs`: `variable_readers`) that read the variable `op` writes, but
    for `op`'s value."""
    own = {op, *data_upstream(op)}
    return [r for r in runs.get(variable_op(op.inputs[0]), []) if r not in own]


def weight_write(op: tf.Operation, by_var: dict[str, Update], trained: set[tf.Operation],
                 runs: dict[tf.Operation, list[tf.Operation]],
                 anchor: tf.Operation | None = None) -> Write:
    """`op`'s write as steps on its weight (wafer.weight_writes), or refused: the weight
    must be trained, or not trained and the value a soft update reading trained weights
    (sources), the value arithmetic, element-wise functions and reductions over constant
    axes of the weight, its sources, constants and scalars computed per step, and the write
    ordered with the update (with its sources' updates, and after the step's reads of it;
    `anchor`: the tf.cond `op` was imported from, which orders it)."""
    target = variable_op(op.inputs[0])
    update = by_var.get(target.name)
    frozen = update is None
    if frozen and not soft_update(op, trained):
        raise fail(op, f"the train_op writes {target.name}, which is not an optimizer update "
                       "the CS carries out", STATE_HINT)
    weights = {target, *trained} if frozen else {target}
    steps: list[tuple[str, tuple[str, ...]]] = []
    factors: list[tuple[tf.Tensor, tf.Operation]] = []
    reads: list[tf.Operation] = []
    sources: dict[str, list[tf.Operation]] = {}  # a source's name -> its reads
    not_affine = (f"the train_op writes {target.name} with a value that is not arithmetic, "
                  "element-wise functions and reductions over constant axes of it, constants "
                  "and schedules (the CS carries out decoupled weight decay such as "
                  "v.assign_sub(wd * lr * v), and renormalizations such as "
                  "v.assign(tf.nn.l2_normalize(v, axis=1)) or v * tf.minimum(1.0, c / "
                  "tf.norm(v, axis=1, keepdims=True))), and soft updates of a weight the "
                  "step does not train such as t.assign(0.99 * t + 0.01 * o)")

    def reads_target(t: tf.Tensor) -> bool:
        return bool(weights & set(data_upstream(t.op)))

    def lower(t: tf.Tensor, reader: tf.Operation) -> str:
        t = skip_identity(t)
        if t.op.type in ("ReadVariableOp", "VariableV2") and variable_op(t) is target:
            reads.append(t.op)
            return WEIGHT
        if t.op.type in ("ReadVariableOp", "VariableV2") and variable_op(t) in weights:
            sources.setdefault(variable_op(t).name, []).append(t.op)
            return f"v{list(sources).index(variable_op(t).name)}"
        if not reads_target(t):
            value = scalar(t) if not _spread(t, reader) else uniform(t)
            if t.dtype.base_dtype != tf.float32 or (value is None and t.shape.rank != 0) or \
                    (value is not None and t.shape.rank > len(target_shape)):
                raise fail(t.op, not_affine)
            factors.append((t, reader))
            return f"f{len(factors) - 1}"
        kind, inputs = write_step(t.op)
        if not kind:
            raise fail(t.op, ROW_SELECT if t.op.type in SELECTS else not_affine)
        steps.append((kind, tuple(lower(x, t.op) for x in inputs)))
        return f"s{len(steps) - 1}"

    target_shape = tf.TensorShape(target.get_attr("shape") if "shape" in target.node_def.attr
                                  else target.outputs[0].shape)
    value = lower(op.inputs[1], op)
    last = WRITE_STEP[op.type]
    if last is not None:
        steps.append((last, (WEIGHT, value)))
    if update is None and not steps and value.startswith("v"):  # a copy: t.assign(o)
        steps.append((COPY, (value,)))
    if not steps or not (sources if update is None else reads):
        raise fail(op, not_affine)
    write = Write(op, target.name, tuple(steps), tuple(factors), False, tuple(sources))
    if update is None:
        return _soft_write(write, by_var, sources, runs, anchor)
    after = all(waits(r, update.op, anchor, update.cond) for r in reads)
    before = waits(update.op, op, update.cond, anchor)
    if after == before:
        raise fail(op, f"the train_op writes {target.name} besides its update, and neither "
                       "waits for the other: TF may run them in either order (write under "
                       "tf.control_dependencies([the optimizer's op]), or the other way round)")
    return dataclasses.replace(write, before_update=before)


def _soft_write(write: Write, by_var: dict[str, Update], sources: dict[str, list[tf.Operation]],
                runs: dict[tf.Operation, list[tf.Operation]],
                anchor: tf.Operation | None = None) -> Write:
    """`write`, a soft update (reading `sources`, each's reads), ordered: each read of a
    source waits for the source's update or the update for it, all alike, and the write
    for the step's other reads of its weight (the forward pass's); else refused. An
    `anchor` (the tf.cond the write was imported from) orders the write and its reads."""
    op, target = write.op, write.variable
    orders = set()
    for name, read_ops in sources.items():
        update, cond = by_var[name].op, by_var[name].cond
        for r in read_ops:
            after, before = waits(r, update, anchor, cond), waits(update, r, cond, anchor)
            if after == before:
                raise fail(op, f"the soft update of {target} reads {name} with no order to "
                               f"its update: TF reads it before or after the update by chance",
                           hint="write the update under tf.control_dependencies([the "
                                "optimizer's op]), or the optimizer's under the update's")
            orders.add(before)
    if len(orders) > 1:
        raise fail(op, f"the soft update of {target} reads some weights before their update "
                       "and some after: the CS reads them all before or all after")
    closure = set(op_closure(anchor if anchor is not None else op))
    unordered = next((r for r in forward_reads(op, runs) if r not in closure), None)
    if unordered is not None:
        raise fail(op, f"the soft update of {target} does not wait for the step's read of it "
                       f"('{user_name(unordered)}' at {user_source(unordered)}): TF reads the old or "
                       "the new value by chance", hint="write the update under "
                       "tf.control_dependencies([the optimizer's op]) or of the loss")
    return dataclasses.replace(write, before_update=orders.pop())


def waits(later: tf.Operation, earlier: tf.Operation, later_in: tf.Operation | None = None,
          earlier_in: tf.Operation | None = None) -> bool:
    """Whether `later` runs after `earlier`. An op imported from a tf.cond's branch
    (`later_in`, `earlier_in`: the cond) runs after what the cond waits for, and before what
    waits for the cond (a soft update under tf.control_dependencies([the cond of a delayed
    update]) reads the weight after it)."""
    if earlier in set(op_closure(later)):
        return True
    after, before = later_in or later, earlier_in or earlier
    return (later_in or earlier_in) is not None and after is not before and \
        before in set(op_closure(after))


def write_step(op: tf.Operation) -> tuple[str, list[tf.Tensor]]:
    """The write step computing `op` (wafer.weight_writes' name) and its value inputs; ""
    if none does."""
    if op.type in WEIGHT_ARITHMETIC:
        return WEIGHT_ARITHMETIC[op.type], list(op.inputs)
    if op.type in _FUNCTIONS:
        return f"f:{_FUNCTIONS[op.type]}", [op.inputs[0]]
    if op.type in WEIGHT_COMPARISONS:
        return WEIGHT_COMPARISONS[op.type], list(op.inputs)
    if op.type in SELECTS:  # clip_by_norm's guard (a v1 Select of rows is no element-wise one)
        return ("", []) if selects_rows(op) else (SELECT, list(op.inputs))
    axes = tf.get_static_value(op.inputs[1]) if op.type in REDUCTIONS else None
    rank = op.inputs[0].shape.rank
    if axes is None or rank is None or rank == 0 or np.size(axes) == 0:
        return "", []
    listed = ",".join(str(a) for a in sorted({int(a) % rank for a in np.atleast_1d(axes)}))
    keep = int(bool(op.get_attr("keep_dims")))
    return f"r:{REDUCTIONS[op.type]}:{listed}:{keep}", [op.inputs[0]]


def _spread(t: tf.Tensor, reader: tf.Operation) -> bool:
    """Whether `reader`'s other inputs broadcast to its value's shape without `t` (then a
    constant `t` whose elements are all equal, tf.ones_like's, is a scalar to it)."""
    others = [x.shape for x in reader.inputs if skip_identity(x) is not t]
    out = reader.outputs[0].shape
    return bool(others) and out.is_fully_defined() and all(s.is_fully_defined() for s in others) \
        and np.broadcast_shapes(*(tuple(s) for s in others)) == tuple(out)


def _statistic_average(op: tf.Operation) -> StatisticAverage | None:
    """A write moving a variable toward another value: `v.assign(v * a + s * b)` (Keras'
    BatchNormalization, written by hand) or `v.assign_sub((v - s) * d)`
    (assign_moving_average), a, b, d constants. Whether s is a batch statistic the CS
    computes is the matcher's to decide (match.moving_statistics)."""
    target = variable_op(op.inputs[0])
    shape = target.get_attr("shape") if "shape" in target.node_def.attr else None
    if shape is None or len(op.inputs) != 2:
        return None
    dims = tuple(int(d.size) for d in shape.dim)

    def own(t: tf.Tensor) -> bool:
        return variable_op(skip_identity(t)) is target

    def products(t: tf.Tensor) -> tuple[tf.Tensor, float] | None:
        mul = skip_identity(t).op
        if mul.type != "Mul":
            return None
        for x, c in ((mul.inputs[0], mul.inputs[1]), (mul.inputs[1], mul.inputs[0])):
            if scalar(c) is not None:
                return x, float(np.float32(scalar(c)))
        return None

    value = skip_identity(op.inputs[1]).op
    found: tuple[str, tuple[float, ...], tf.Tensor] | None = None
    if op.type in ("AssignVariableOp", "Assign") and value.type in ("AddV2", "Add"):
        terms = [products(t) for t in value.inputs]
        if None not in terms:
            (x0, c0), (x1, c1) = terms  # type: ignore[misc]
            if own(x0) and not own(x1):
                found = ("affine", (c0, c1), x1)
            elif own(x1) and not own(x0):
                found = ("affine", (c1, c0), x0)
    elif op.type in ("AssignSubVariableOp", "AssignSub"):
        term = products(op.inputs[1])
        sub = skip_identity(term[0]).op if term is not None else None
        if term is not None and sub is not None and sub.type == "Sub" and \
                own(sub.inputs[0]) and not own(sub.inputs[1]):
            found = ("delta", (term[1],), sub.inputs[1])
    if found is None:
        return None
    update, constants, statistic = found
    return StatisticAverage(target.name, skip_identity(statistic).name, update, constants,
                            dims, user_source(op), op.name)
