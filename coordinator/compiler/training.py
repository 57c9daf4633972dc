"""Training analysis: what the train_op does to which variables, proven from the graph.

    analyze_training(extracted) -> TrainingSpec

1. Writes. Every variable write the train_op runs is an optimizer update of one variable
   (Apply*/SparseApply*, v1 Adam's and SGD's sparse patterns), the optimizer's own
   bookkeeping (Adam's beta powers), the global step's increment, a Keras seed
   generator's state or a moving average (BatchNormalization's moving statistics, whose
   batch statistic the matcher must find); any other write is refused. Variables not updated are frozen.
2. Updates. One optimizer type with constant hyper-parameters for all variables (a
   schedule is refused), float32 only, dense or sparse (an IndexedSlices gradient), its
   slots named as wafer.optimizers names them.
3. Gradients. Each applied gradient is peeled back through recognised transforms (scale,
   clip_by_value, clip_by_norm, clip_by_global_norm) to the output of tf.gradients; that
   call's seed must sit on model_fn's loss (or on S * loss: loss scaling, a scale S).
4. Numbers. One Session.run on input_fn's first batch compares those raw gradients with
   tf.gradients(loss) (same run, same dropout masks); random gradients fed into TF's
   transform subgraph are compared with wafer.grad_transforms.apply_transforms.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from operator import attrgetter

import numpy as np
import tensorflow as tf

from common.errors import CSRunError
from coordinator.compiler.extract import ExtractedGraph, data_upstream, op_closure, user_source
from coordinator.compiler.ir import OptimizerSpec, StatisticAverage, TrainedVariable, TrainingSpec
from coordinator.compiler.schedules import Scheduled, ScheduleRefused, lower_schedules
from wafer import optimizers as cs_optimizers
from wafer.grad_transforms import GradientTransform, apply_transforms
from wafer.moving_averages import FACTOR, MovingAverage

SUPPORTED = ("tf.compat.v1.train.GradientDescentOptimizer, MomentumOptimizer, AdamOptimizer, "
             "RMSPropOptimizer, AdagradOptimizer")
TRANSFORMS = "scaling, tf.clip_by_value, tf.clip_by_norm, tf.clip_by_global_norm"
# The numeric checks initialise every variable on the host: above this many values (1 GiB of
# float32) they are skipped and the structural proof stands alone.
NUMERIC_CHECK_VALUES = 2 ** 28
# A float16 backward's raw gradients against S x tf.gradients(loss): rounded apart by
# float16 (2 ** -11 per op), to this fraction of the largest.
HALF_GRADIENT_RTOL = 1e-2


@dataclass(frozen=True)
class _ApplyKind:
    """A TF update op's inputs: slots (wafer.optimizers' order), hyper-parameters, grad."""

    optimizer: str
    slots: tuple[int, ...]
    hyper: dict[str, int]
    grad: int
    indices: int | None = None
    powers: tuple[int, ...] = ()  # Adam's beta1_power, beta2_power reads
    fixed: dict[str, object] = field(default_factory=dict)


_DENSE = {
    "ApplyGradientDescent": _ApplyKind("sgd", (), {"learning_rate": 1}, 2),
    "ApplyMomentum": _ApplyKind("momentum", (1,), {"learning_rate": 2, "momentum": 4}, 3),
    "ApplyAdam": _ApplyKind("adam", (1, 2), {"learning_rate": 5, "beta1": 6, "beta2": 7,
                                             "epsilon": 8}, 9, powers=(3, 4)),
    "ApplyRMSProp": _ApplyKind("rmsprop", (1, 2), {"learning_rate": 3, "decay": 4,
                                                   "momentum": 5, "epsilon": 6}, 7),
    "ApplyCenteredRMSProp": _ApplyKind("rmsprop", (2, 1, 3), {
        "learning_rate": 4, "decay": 5, "momentum": 6, "epsilon": 7}, 8,
        fixed={"centered": True}),
    "ApplyAdagrad": _ApplyKind("adagrad", (1,), {"learning_rate": 2}, 3),
}
_SPARSE = {
    "SparseApplyMomentum": _ApplyKind("momentum", (1,), {"learning_rate": 2, "momentum": 5},
                                      3, indices=4),
    "SparseApplyRMSProp": _ApplyKind("rmsprop", (1, 2), {"learning_rate": 3, "decay": 4,
                                                         "momentum": 5, "epsilon": 6}, 7, 8),
    "SparseApplyCenteredRMSProp": _ApplyKind("rmsprop", (2, 1, 3), {
        "learning_rate": 4, "decay": 5, "momentum": 6, "epsilon": 7}, 8, 9,
        fixed={"centered": True}),
    "SparseApplyAdagrad": _ApplyKind("adagrad", (1,), {"learning_rate": 2}, 3, indices=4),
}
APPLY_OPS = {prefix + name: kind for table in (_DENSE, _SPARSE) for name, kind in table.items()
             for prefix in ("", "Resource")}
_WRITE_PREFIXES = ("Assign", "ResourceScatter", "Scatter", "ResourceApply", "Apply",
                   "SparseApply", "ResourceSparseApply", "ResourceStridedSliceAssign",
                   "StridedSliceAssign")
_READ_OPS = {"Identity", "ReadVariableOp", "Snapshot"}
_SEED_STATE = re.compile(r"(^|/)seed_generator(_\d+)?/seed_generator_state$")
_BETA_POWER = re.compile(r"^beta([12])_power$")
# Ops allowed inside a clipping factor's computation (norms of gradients).
_NORM_OPS = {"Mul", "Sum", "Greater", "Fill", "Select", "SelectV2", "Sqrt", "Maximum",
             "Minimum", "RealDiv", "AddV2", "Add", "Sub", "Pack", "L2Loss", "Const",
             "Identity", "OnesLike", "ZerosLike", "Cast"}


class _Refused(Exception):
    """One problem, as the line the user reads."""


def _fail(op: tf.Operation, what: str) -> _Refused:
    """A problem: what is wrong in the user's terms, then the op and its source line."""
    return _Refused(f"{what} ({op.type} '{op.name}' at {user_source(op)})")


def variable_op(tensor: tf.Tensor) -> tf.Operation:
    """The VarHandleOp/VariableV2 a handle, ref or read of a variable comes from."""
    op = tensor.op
    while op.type in _READ_OPS and op.inputs:
        op = op.inputs[0].op
    return op


# Arithmetic on constants that tf.get_static_value does not fold (MixedPrecisionLossScale-
# Optimizer's 1 / S of a FixedLossScale): evaluated when every op above is one of these.
_FOLDABLE = {"Const", "Identity", "Cast", "RealDiv", "Mul", "Reciprocal", "AddV2", "Sub", "Neg"}


def _const(tensor: tf.Tensor) -> np.ndarray | None:
    value = tf.get_static_value(tensor)
    if value is None and tensor.shape.rank == 0 and \
            all(op.type in _FOLDABLE for op in data_upstream(tensor.op)):
        with tf.compat.v1.Session(graph=tensor.graph) as session:
            value = session.run(tensor)
    return None if value is None else np.asarray(value)


def _scalar(tensor: tf.Tensor) -> float | None:
    value = _const(tensor)
    return None if value is None or value.size != 1 else float(value.reshape(()))


def _skip_identity(tensor: tf.Tensor) -> tf.Tensor:
    while tensor.op.type in ("Identity", "Snapshot") or (
            tensor.op.type == "Cast" and tensor.op.inputs[0].dtype == tensor.dtype):
        tensor = tensor.op.inputs[0]
    return tensor


# ---- 1. writes and updates ----

@dataclass(eq=False)
class _Update:
    variable: str
    op: tf.Operation  # the op that updates the variable itself
    optimizer: OptimizerSpec
    slots: tuple[str, ...]
    grad: tf.Tensor  # dense gradient, or the sparse gradient's values before deduplication
    indices: tf.Tensor | None  # sparse: the IndexedSlices' indices before deduplication
    owned: set = field(default_factory=set)  # write ops belonging to this update
    scheduled: dict = field(default_factory=dict)  # hyper-parameter -> (reader op, its tensor)


def _is_write(op: tf.Operation) -> bool:
    """An op that writes a variable: its first input is a resource handle or a ref."""
    return (op.type.startswith(_WRITE_PREFIXES) and bool(op.inputs)
            and (op.inputs[0].dtype == tf.resource or op.inputs[0].dtype._is_ref_dtype))


def _hyper(op: tf.Operation, tensor: tf.Tensor, key: str) -> float:
    value = _scalar(tensor)
    if value is None:
        raise _fail(_skip_identity(tensor).op,
                    f"the {key} of the optimizer is not a constant (this update takes a "
                    "schedule of the learning rate only)")
    return value


def _dedup(op: tf.Operation, values: tf.Tensor, indices: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """The IndexedSlices before the optimizer's _deduplicate_indexed_slices."""
    summed, unique = values.op, indices.op
    if (summed.type != "UnsortedSegmentSum" or unique.type != "Unique"
            or summed.inputs[1].name != unique.outputs[1].name
            or indices.name != unique.outputs[0].name):
        raise _fail(op, "a sparse update whose gradient is not TF's deduplicated IndexedSlices")
    return summed.inputs[0], unique.inputs[0]


def _apply_update(op: tf.Operation) -> _Update:
    kind = APPLY_OPS[op.type]
    scheduled = {key: (op, op.inputs[i]) for key, i in kind.hyper.items()
                 if _scalar(op.inputs[i]) is None}
    if kind.optimizer == "adam" and {"beta1", "beta2"} & set(scheduled):
        raise _fail(op, "Adam's beta1 or beta2 is computed per step; the CS keeps them "
                        "constant (its beta powers multiply by them)")
    values = {key: 0.0 if key in scheduled else _hyper(op, op.inputs[i], key)
              for key, i in kind.hyper.items()}
    nesterov = bool(op.get_attr("use_nesterov")) if "use_nesterov" in op.node_def.attr else False
    if kind.optimizer == "adam" and nesterov:
        raise _fail(op, "Adam with Nesterov momentum is not a tf.compat.v1 optimizer")
    if kind.optimizer == "adagrad" and "update_slots" in op.node_def.attr and \
            not op.get_attr("update_slots"):
        raise _fail(op, "Adagrad without accumulator updates is not supported")
    if kind.optimizer == "adam":
        _check_powers(op, [op.inputs[i] for i in kind.powers], values)
    slots = tuple(variable_op(op.inputs[i]).name for i in kind.slots)
    if kind.optimizer == "adagrad":
        values["initial_accumulator_value"] = _initial_value(op, variable_op(op.inputs[1]))
    spec = OptimizerSpec(type=kind.optimizer, use_nesterov=nesterov,
                         **{**values, **kind.fixed})  # type: ignore[arg-type]  # (float hyper-parameters only)
    grad, indices = op.inputs[kind.grad], None
    if kind.indices is not None:
        grad, indices = _dedup(op, grad, op.inputs[kind.indices])
    return _Update(variable_op(op.inputs[0]).name, op, spec, slots, grad, indices, {op},
                   scheduled)


def _initial_value(op: tf.Operation, slot: tf.Operation) -> float:
    """The constant a slot variable is initialized with (Adagrad's accumulator)."""
    inits = [c for c in slot.outputs[0].consumers()
             if c.type in ("AssignVariableOp", "Assign") and c.name.startswith(slot.name + "/")]
    value = _splat(inits[0].inputs[1]) if len(inits) == 1 else None
    if value is None:
        raise _fail(op, f"the slot {slot.name} has no constant initial value")
    return value


def _splat(tensor: tf.Tensor) -> float | None:
    """The one value a constant-filled tensor holds (without materialising it)."""
    op = _skip_identity(tensor).op
    if op.type == "Fill":
        return _scalar(op.inputs[1])
    if op.type == "Const":
        proto = op.get_attr("value")
        values = [*proto.float_val, *proto.double_val, *proto.int_val]
        if not proto.tensor_content and len(values) == 1:
            return float(values[0])
    value = _const(tensor)
    if value is None or value.size == 0 or np.any(value != value.flat[0]):
        return None
    return float(value.flat[0])


def _check_powers(op: tf.Operation, reads: list[tf.Tensor], values: dict[str, float]) -> None:
    names = tuple(variable_op(t).name for t in reads)
    if names != tuple(cs_optimizers.Adam.scalar_names):
        raise _fail(op, f"Adam's step counters are {', '.join(names)}, the CS names them "
                        f"{', '.join(cs_optimizers.Adam.scalar_names)} (a second Adam optimizer "
                        "in the graph)")
    for name, read in zip(names, reads):
        beta = values["beta1" if name.startswith("beta1") else "beta2"]
        init = _initial_value(op, variable_op(read))
        if np.float32(init) != np.float32(beta):
            raise _fail(op, f"{name} starts at {init}, not at its beta {beta}")


def _sgd_sparse(op: tf.Operation) -> _Update | None:
    """ResourceScatterAdd(var, indices, -grad * lr): GradientDescent's sparse update."""
    if op.type != "ResourceScatterAdd":
        return None
    delta = op.inputs[2].op
    if delta.type != "Mul":
        return None
    neg = [t for t in delta.inputs if t.op.type == "Neg"]
    if len(neg) != 1:
        return None
    lr = [t for t in delta.inputs if t is not neg[0]][0]
    scheduled = {"learning_rate": (delta, lr)} if _scalar(lr) is None else {}
    spec = OptimizerSpec(type="sgd", learning_rate=0.0 if scheduled else
                         _hyper(op, lr, "learning_rate"))
    return _Update(variable_op(op.inputs[0]).name, op, spec, (), neg[0].op.inputs[0],
                   op.inputs[1], {op}, scheduled)


def _adam_sparse(op: tf.Operation) -> _Update | None:
    """v1 Adam's _apply_sparse_shared: var -= lr * m_t / (sqrt(v_t) + eps), with
    m = m * beta1 then m[rows] += g * (1 - beta1) (v alike with g * g, beta2)."""
    if op.type != "AssignSubVariableOp":
        return None
    try:
        div = _expect(op.inputs[1], "RealDiv")
        num, den = div.inputs
        num_op = _expect(num, "Mul")
        lr_t, m_read = num_op.inputs
        lr_div = _expect(lr_t, "RealDiv")
        lr_mul = _expect(lr_div.inputs[0], "Mul")
        lr = lr_mul.inputs[0]
        sqrt_b2 = _expect(lr_mul.inputs[1], "Sqrt")
        b2p = _one_minus(sqrt_b2.inputs[0])
        b1p = _one_minus(lr_div.inputs[1])
        add = _expect(den, "AddV2")
        v_read = _expect(add.inputs[0], "Sqrt").inputs[0]
        eps = add.inputs[1]
        m_grad, m_idx, beta1, m_owned = _decayed_scatter(m_read, squared=False)
        v_grad, v_idx, beta2, v_owned = _decayed_scatter(v_read, squared=True)
    except _NoMatch:
        return None
    if m_grad.name != v_grad.name or m_idx.name != v_idx.name:
        return None
    scheduled = {"learning_rate": (lr_mul, lr)} if _scalar(lr) is None else {}
    values = {"learning_rate": 0.0 if scheduled else _hyper(op, lr, "learning_rate"),
              "beta1": _hyper(op, beta1, "beta1"), "beta2": _hyper(op, beta2, "beta2"),
              "epsilon": _hyper(op, eps, "epsilon")}
    _check_powers(op, [b1p, b2p], values)
    grad, indices = _dedup(op, m_grad, m_idx)
    slots = (variable_op(m_read).name, variable_op(v_read).name)
    return _Update(variable_op(op.inputs[0]).name, op, OptimizerSpec(type="adam", **values),  # type: ignore[arg-type]  # (floats only)
                   slots, grad, indices, {op} | m_owned | v_owned, scheduled)


class _NoMatch(Exception):
    pass


def _expect(tensor: tf.Tensor, type_: str) -> tf.Operation:
    tensor = _skip_identity(tensor)
    if tensor.op.type != type_:
        raise _NoMatch
    return tensor.op


def _one_minus(tensor: tf.Tensor) -> tf.Tensor:
    """x for 1 - x (a beta power read)."""
    sub = _expect(tensor, "Sub")
    if _scalar(sub.inputs[0]) != 1.0:
        raise _NoMatch
    return sub.inputs[1]


def _decayed_scatter(read: tf.Tensor, squared: bool):
    """A slot read after `slot = slot * beta` and `slot[i] += g (* g) * (1 - beta)`."""
    read = _skip_identity(read)
    if read.op.type != "ReadVariableOp":
        raise _NoMatch
    slot = variable_op(read)
    deps = {c.type: c for c in read.op.control_inputs}
    assign, scatter = deps.get("AssignVariableOp"), deps.get("ResourceScatterAdd")
    if assign is None or scatter is None or variable_op(assign.inputs[0]) is not slot \
            or variable_op(scatter.inputs[0]) is not slot:
        raise _NoMatch
    decay = _expect(assign.inputs[1], "Mul")
    if variable_op(decay.inputs[0]) is not slot:
        raise _NoMatch
    beta = decay.inputs[1]
    scaled = _expect(scatter.inputs[2], "Mul")
    grad_t, one_minus = scaled.inputs
    if _one_minus(one_minus).name != beta.name:
        raise _NoMatch
    if squared:
        square = _expect(grad_t, "Mul")
        if square.inputs[0].name != square.inputs[1].name:
            raise _NoMatch
        grad_t = square.inputs[0]
    return grad_t, scatter.inputs[1], beta, {assign, scatter}


def _bookkeeping(op: tf.Operation, graph: tf.Graph, optimizer: OptimizerSpec | None) -> bool:
    """The global step's increment, Adam's beta powers, a Keras seed generator's state."""
    target = variable_op(op.inputs[0])
    steps = graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_STEP)
    if steps and target is variable_op(steps[0]) and op.type in ("AssignAddVariableOp",
                                                                 "AssignAdd"):
        return _scalar(op.inputs[1]) == 1
    if _SEED_STATE.search(target.name) and not tf.as_dtype(target.get_attr("dtype")).is_floating:
        return True
    match = _BETA_POWER.match(target.name)
    if match and optimizer is not None and optimizer.type == "adam" and \
            op.type == "AssignVariableOp":
        mul = _skip_identity(op.inputs[1]).op
        beta = optimizer.beta1 if match.group(1) == "1" else optimizer.beta2
        return (mul.type == "Mul" and variable_op(mul.inputs[0]) is target
                and _scalar(mul.inputs[1]) is not None
                and np.float32(_scalar(mul.inputs[1])) == np.float32(beta))
    return False


@dataclass(frozen=True)
class _Average:
    """ExponentialMovingAverage.apply's update of one shadow variable."""

    op: tf.Operation  # AssignSub(shadow, (shadow - variable) * factor)
    variable: str
    shadow: str
    mul: tf.Operation
    factor: tf.Tensor  # 1 - decay


def _moving_average(op: tf.Operation) -> _Average | None:
    if op.type not in ("AssignSubVariableOp", "AssignSub"):
        return None
    try:
        mul = _expect(op.inputs[1], "Mul")
        sub = _expect(mul.inputs[0], "Sub")
    except _NoMatch:
        return None
    shadow, variable = variable_op(op.inputs[0]), variable_op(sub.inputs[1])
    if variable_op(sub.inputs[0]) is not shadow or variable.type not in ("VarHandleOp",
                                                                         "VariableV2"):
        return None
    return _Average(op, variable.name, shadow.name, mul, mul.inputs[1])


def _updates(extracted: ExtractedGraph, statistics: list[StatisticAverage],
             ) -> tuple[list[_Update], list[_Average]]:
    """The optimizer updates and ExponentialMovingAverage updates of the train_op (the
    moving averages of batch statistics into `statistics`)."""
    order = {op.name: i for i, op in enumerate(extracted.graph.get_operations())}
    writes = sorted((op for op in op_closure(extracted.spec.train_op) if _is_write(op)),
                    key=lambda op: order[op.name])
    updates: list[_Update] = []
    for op in writes:
        if op.type in APPLY_OPS:
            updates.append(_apply_update(op))
            continue
        found = _adam_sparse(op) or _sgd_sparse(op)
        if found is not None:
            updates.append(found)
    owned = set().union(*(u.owned for u in updates)) if updates else set()
    optimizer = updates[0].optimizer if updates else None
    averages = []
    for op in writes:
        if op in owned or _bookkeeping(op, extracted.graph, optimizer):
            continue
        average = _moving_average(op)
        if average is not None:
            averages.append(average)
            continue
        statistic = _statistic_average(op)
        if statistic is not None:
            statistics.append(statistic)
            continue
        target = variable_op(op.inputs[0]) if op.inputs else op
        if "ExponentialMovingAverage" in target.name:
            raise _fail(op, f"the train_op keeps an ExponentialMovingAverage of "
                            f"{target.name.rsplit('/', 1)[0]}: the CS does not keep weight moving "
                            "averages (ExponentialMovingAverage.apply); train without them on "
                            "the CS")
        raise _fail(op, f"the train_op writes {target.name}, which is not an optimizer update "
                        "the CS carries out")
    conds = [op for op in op_closure(extracted.spec.train_op) if op.type in ("If", "StatelessIf")]
    if not updates and conds:
        raise _fail(conds[-1], "the train_op applies its updates inside a tf.cond: dynamic loss "
                               "scaling (a LossScaleOptimizer with 'dynamic') is not carried out "
                               "on the CS yet; use a fixed loss scale (a number)")
    if not updates:
        raise _Refused(f"the train_op updates no variable with a supported optimizer "
                       f"(supported: {SUPPORTED})")
    by_var: dict[str, _Update] = {}
    for u in updates:
        if u.variable in by_var:
            raise _fail(u.op, f"{u.variable} is updated twice (also by "
                              f"'{by_var[u.variable].op.name}' at "
                              f"{user_source(by_var[u.variable].op)})")
        by_var[u.variable] = u
    first = updates[0]
    for u in updates[1:]:
        if u.optimizer != first.optimizer or set(u.scheduled) != set(first.scheduled):
            raise _fail(u.op, f"{u.variable} is trained with {u.optimizer}, but {first.variable} "
                              f"with {first.optimizer} ('{first.op.name}' at "
                              f"{user_source(first.op)}); the CS trains every variable with "
                              "one optimizer")
    for a in averages:
        if a.variable not in by_var or by_var[a.variable].op not in set(op_closure(a.op)):
            raise _fail(a.op, f"the ExponentialMovingAverage of {a.variable} does not wait for "
                              f"its update: the CS averages the weights the train_op trains, "
                              "after their update (ema.apply under "
                              "tf.control_dependencies([the optimizer's op]))")
    return updates, averages  # updates in graph order: compute_gradients' (creation) order


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
        return variable_op(_skip_identity(t)) is target

    def products(t: tf.Tensor) -> tuple[tf.Tensor, float] | None:
        mul = _skip_identity(t).op
        if mul.type != "Mul":
            return None
        for x, c in ((mul.inputs[0], mul.inputs[1]), (mul.inputs[1], mul.inputs[0])):
            if _scalar(c) is not None:
                return x, float(np.float32(_scalar(c)))
        return None

    value = _skip_identity(op.inputs[1]).op
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
        sub = _skip_identity(term[0]).op if term is not None else None
        if term is not None and sub is not None and sub.type == "Sub" and \
                own(sub.inputs[0]) and not own(sub.inputs[1]):
            found = ("delta", (term[1],), sub.inputs[1])
    if found is None:
        return None
    update, constants, statistic = found
    return StatisticAverage(target.name, _skip_identity(statistic).name, update, constants,
                            dims, user_source(op))


def _variables_under(tensor: tf.Tensor) -> list[tf.Operation]:
    """The variables `tensor` is computed from."""
    return [op for op in data_upstream(tensor.op) if op.type in ("VarHandleOp", "VariableV2")]


def _check_dtypes(extracted: ExtractedGraph, updates: list[_Update]) -> None:
    """float32 variables under the loss and float32 optimizer computations only."""
    variables = {op.name: op for op in _variables_under(extracted.spec.loss)}
    variables.update({u.variable: variable_op(u.op.inputs[0]) for u in updates})
    for name in sorted(variables):
        dtype = tf.as_dtype(variables[name].get_attr("dtype")).base_dtype
        if dtype.is_floating and dtype != tf.float32:
            op = variables[name]
            raise _Refused(f"variable {name} at {user_source(op)} is {dtype.name}: the CS "
                           "computes and trains in float32 only")
    for u in updates:
        dtype = u.op.get_attr("T") if "T" in u.op.node_def.attr else u.grad.dtype
        if tf.as_dtype(dtype).base_dtype != tf.float32:
            raise _fail(u.op, f"the update of {u.variable} computes in "
                              f"{tf.as_dtype(dtype).name}; the CS trains in float32 only")


def _check_slots(updates: list[_Update]) -> None:
    """The CS's optimizer for the spec exists, names the slots as the graph does and
    starts them where the graph's initializers do."""
    for u in updates:
        config = cs_optimizers.OptimizerConfig(**dataclasses.asdict(u.optimizer))
        problem = cs_optimizers.config_problem(config)
        if problem:
            raise _fail(u.op, problem)
        cs = cs_optimizers.make_optimizer(config)
        expected = tuple(cs_optimizers.slot_name(u.variable, s) for s in cs.slot_suffixes)
        if u.slots != expected:
            raise _fail(u.op, f"the optimizer's slots of {u.variable} are named "
                              f"{', '.join(u.slots)}; the CS checkpoints them as "
                              f"{', '.join(expected)} (create the optimizer without name=)")
        graph = u.op.graph
        for slot, value in zip(u.slots, cs.slot_initial_values):
            start = _initial_value(u.op, graph.get_operation_by_name(slot))
            if np.float32(start) != np.float32(value):
                raise _fail(u.op, f"the slot {slot} starts at {start}, the CS starts it at "
                                  f"{value}")


# ---- 3. gradients ----

@dataclass(frozen=True)
class _GradientCall:
    """One tf.gradients call: its name scope and the loss scale S of y = S * loss."""

    scope: str
    scale: float


@dataclass(eq=False)
class _Step:
    """A recognised transform (one instance shared by a clip_by_global_norm group)."""

    kind: str
    anchor: tf.Operation
    value: float = 0.0
    low: float = 0.0
    high: float = 0.0
    group: tuple[tf.Tensor, ...] = ()  # clip_by_global_norm: the gradients, in TF's order
    variables: tuple[str, ...] = ()  # clip_by_global_norm: the group's variables


@dataclass(eq=False)
class _Chain:
    """One update's gradient: raw (tf.gradients' output) -> steps -> applied."""

    update: _Update
    raw: tf.Tensor
    raw_indices: tf.Tensor | None
    call: _GradientCall
    steps: list[_Step]
    inputs: list[tf.Tensor]  # the tensor each step reads


def _gradient_calls(extracted: ExtractedGraph,
                    updates: list[_Update]) -> dict[str, _GradientCall | _Refused]:
    """tf.gradients calls by name scope (their seeds `<scope>/grad_ys_<i>`) and what they
    differentiate: the loss, S * loss, or something else (refused)."""
    graph, loss = extracted.graph, extracted.spec.loss
    seeds: dict[str, list[tf.Operation]] = {}
    for op in graph.get_operations():
        m = re.match(r"^(.*)/grad_ys_\d+$", op.name)
        if m and op.type == "Fill":
            seeds.setdefault(m.group(1), []).append(op)
    core = _skip_identity(loss).op
    varying = _downstream([graph.get_operation_by_name(u.variable) for u in updates])
    calls: dict[str, _GradientCall | _Refused] = {}
    for scope, fills in seeds.items():
        if len(fills) != 1:
            calls[scope] = _fail(fills[0], "gradients of several tensors at once")
            continue
        fill = fills[0]
        seed_value = _scalar(fill.inputs[1])
        starts = {op for c in fill.outputs[0].consumers()
                  if (op := _forward_op(graph, scope, c)) is not None}
        if not starts or seed_value is None:
            calls[scope] = _fail(fill, "a gradient computation the compiler cannot follow")
            continue
        scale = 1.0 if _is_loss(starts, core, varying) else (
            _loss_scale(next(iter(starts)), core) if len(starts) == 1 else None)
        if scale is None:
            upstream = set(data_upstream(core))
            y = min((op for op in starts if op not in upstream), default=None,
                    key=attrgetter("name"))
            calls[scope] = _Refused(
                f"the train_op minimizes {y.outputs[0].name} computed at {user_source(y)}, not "
                f"the loss model_fn returns ({loss.name} at {user_source(loss.op)})"
                if y is not None else
                f"the train_op minimizes part of the loss model_fn returns ("
                f"{', '.join(sorted(op.name for op in starts))} at "
                f"{user_source(min(starts, key=lambda op: op.name))}), not all of it")
            continue
        calls[scope] = _GradientCall(scope, scale * seed_value)
    return calls


# Ops whose gradient functions may pass the seed on without creating an op.
_PASS_THROUGH = {"Identity", "AddN", "Add", "AddV2"}


def _is_loss(starts: set[tf.Operation], core: tf.Operation, varying: set) -> bool:
    """The ops whose gradient functions read the seed are those of d(loss): the loss's op,
    or the terms it passes the seed to (a sum's terms that depend on trained variables)."""
    front = {core}
    while True:
        front = {op for op in front if op in varying}
        if front == starts:
            return True
        expand = {op for op in front if op not in starts and op.type in _PASS_THROUGH}
        if not expand:
            return False
        front = (front - expand) | {t.op for op in expand for t in op.inputs}


def _downstream(ops: list[tf.Operation]) -> set[tf.Operation]:
    seen, stack = set(ops), list(ops)
    while stack:
        for out in stack.pop().outputs:
            for c in out.consumers():
                if c not in seen:
                    seen.add(c)
                    stack.append(c)
    return seen


def _forward_op(graph: tf.Graph, scope: str, grad_op: tf.Operation) -> tf.Operation | None:
    rest = grad_op.name[len(scope) + 1:]
    if "_grad/" not in rest:
        return None
    try:
        return graph.get_operation_by_name(rest[:rest.index("_grad/")])
    except KeyError:
        return None


def _loss_scale(y: tf.Operation, core: tf.Operation) -> float | None:
    """S if y is S * loss (constant S), else None."""
    if y.type == "Mul":
        a, b = y.inputs
        for x, s in ((a, b), (b, a)):
            if _skip_identity(x).op is core and _scalar(s) is not None:
                return _scalar(s)
    return None


def _in_scope(op: tf.Operation, calls: dict) -> str | None:
    for scope in calls:
        if op.name.startswith(scope + "/"):
            return scope
    return None


def _chain(update: _Update, calls: dict, norms: dict) -> _Chain:
    """Peel update.grad back to the tf.gradients output it is computed from."""
    steps: list[_Step] = []
    inputs: list[tf.Tensor] = []
    t = update.grad
    sparse = update.indices is not None
    while (scope := _in_scope(t.op, calls)) is None:
        op = t.op
        if op.type in ("Identity", "Snapshot") or (op.type == "Cast" and
                                                    op.inputs[0].dtype == t.dtype):
            t = op.inputs[0]
            continue
        step, t = _recognise(op, update.variable, sparse, calls, norms)
        steps.append(step)
        inputs.append(t)
    call = calls[scope]
    if isinstance(call, _Refused):
        raise call
    raw_indices = None
    if sparse:
        raw_indices = _skip_identity(update.indices)
        if _in_scope(raw_indices.op, calls) != scope:
            raise _fail(update.op, f"the sparse gradient of {update.variable} has indices "
                                   "not computed by tf.gradients")
    _check_source(update, t, scope)
    steps.reverse()
    inputs.reverse()
    return _Chain(update, t, raw_indices, call, steps, inputs)


def _depends_on(op: tf.Operation, variable: tf.Operation) -> bool:
    """Whether the forward op's value depends on the variable (TF's gradient functions pass
    a gradient through unchanged, e.g. Sub's when shapes agree, so the op whose `_grad` scope
    made the tensor may read the variable only through another op)."""
    seen, stack = set(), [op]
    while stack:
        current = stack.pop()
        if current is variable:
            return True
        if current in seen:
            continue
        seen.add(current)
        stack.extend(t.op for t in current.inputs)
    return False


def _check_source(update: _Update, raw: tf.Tensor, scope: str) -> None:
    """The raw gradient is computed by the gradient functions of ops whose value depends
    on the variable (`<scope>/<op>_grad/...`, summed by AddN), not by another part of the
    graph; the numeric check then proves it is that variable's gradient."""
    target = update.op.graph.get_operation_by_name(update.variable)
    forward, stack = [], [_skip_identity(raw).op]
    while stack:
        op = stack.pop()
        rest = op.name[len(scope) + 1:]
        if op.type == "AddN" and "_grad/" not in rest:
            stack.extend(_skip_identity(t).op for t in op.inputs)
        elif "_grad/" in rest:
            forward.append(rest[:rest.index("_grad/")])
    readers = []
    for name in forward:
        try:
            readers.append(target.graph.get_operation_by_name(name))
        except KeyError:
            pass
    if readers and not any(_depends_on(r, target) for r in readers):
        raise _fail(update.op, f"the gradient applied to {update.variable} is the gradient of "
                               f"another tensor ({readers[0].name}'s input at "
                               f"{user_source(readers[0])}), not of {update.variable}")


def _recognise(op: tf.Operation, variable: str, sparse: bool, calls: dict,
               norms: dict) -> tuple[_Step, tf.Tensor]:
    """The transform `op` computes from one gradient tensor, and that tensor."""

    def why() -> _Refused:
        if not any(_in_scope(o, calls) for o in data_upstream(op)):
            return _fail(op, f"the gradient applied to {variable} is not computed from the "
                             "loss's gradient (tf.gradients / compute_gradients)")
        return _fail(op, f"the gradient of {variable} is changed by an op the CS cannot carry "
                         f"out (it carries out {TRANSFORMS})")

    if op.type == "Mul":
        a, b = op.inputs
        for x, s in ((a, b), (b, a)):
            c = _scalar(s)
            if c is not None:
                return _Step("scale", op, value=c), x
        for x, s in ((a, b), (b, a)):
            step = _global_norm(s, norms)
            if step is not None and any(_skip_identity(g).name == _skip_identity(x).name
                                        for g in step.group):
                if sparse:
                    raise _fail(op, "clip_by_global_norm of a sparse (embedding) gradient "
                                    "measures the looked-up rows, duplicates included; the CS "
                                    "cannot")
                return step, x
        raise why()
    if op.type == "RealDiv":
        c = _scalar(op.inputs[1])
        if c is not None and c != 0:
            return _Step("scale", op, value=1.0 / c), op.inputs[0]
        return _clip_by_norm(op, sparse, why)
    if op.type == "Maximum":
        low = _scalar(op.inputs[1])
        inner = op.inputs[0].op
        high = _scalar(inner.inputs[1]) if inner.type == "Minimum" else None
        if low is None or high is None:
            raise why()
        if sparse:
            raise _fail(op, "clip_by_value of a sparse (embedding) gradient clips each "
                            "looked-up row before duplicates are summed; the CS cannot")
        return _Step("clip_by_value", op, low=low, high=high), inner.inputs[0]
    raise why()


def _norm_graph(tensor: tf.Tensor) -> tuple[list[tf.Operation], list[tf.Tensor]] | None:
    """The ops of a norm computation and the gradients whose squares it sums (None: it
    reads something else or uses an op outside _NORM_OPS)."""
    ops, leaves, seen, stack = [], [], set(), [tensor]
    while stack:
        t = stack.pop()
        if t.name in seen:
            continue
        seen.add(t.name)
        op = t.op
        if op.type == "Const":
            continue
        if op.type == "L2Loss" or (op.type == "Mul" and op.inputs[0].name == op.inputs[1].name):
            ops.append(op)
            leaves.append(op.inputs[0])
            continue
        if op.type not in _NORM_OPS:
            return None
        ops.append(op)
        if op.type not in ("OnesLike", "ZerosLike"):
            stack.extend(op.inputs)
    return ops, leaves


def _clip_by_norm(op: tf.Operation, sparse: bool, why) -> tuple[_Step, tf.Tensor]:
    """t * c / maximum(l2norm(t), c) (tf.clip_by_norm over all axes)."""
    mul, maximum = op.inputs[0].op, op.inputs[1].op
    if mul.type != "Mul" or maximum.type != "Maximum":
        raise why()
    x, c = mul.inputs[0], _scalar(mul.inputs[1])
    found = _norm_graph(maximum.inputs[0])
    if c is None or _scalar(maximum.inputs[1]) != c or found is None or \
            {t.name for t in found[1]} != {x.name}:
        raise why()
    rank = x.shape.rank
    for s in (o for o in found[0] if o.type == "Sum"):
        axes = _const(s.inputs[1])
        if axes is None or rank is None or sorted({int(a) % rank for a in axes.flat}) != \
                list(range(rank)):
            raise _fail(op, "clip_by_norm over some axes only; the CS clips by the norm of "
                            "the whole gradient")
    if sparse:
        raise _fail(op, "clip_by_norm of a sparse (embedding) gradient measures the looked-up "
                        "rows, duplicates included; the CS cannot")
    return _Step("clip_by_norm", op, value=c), x


def _global_norm(scale: tf.Tensor, norms: dict) -> _Step | None:
    """clip_norm * minimum(1 / gn, 1 / clip_norm) + (gn - gn), gn the group's global norm."""
    add = _skip_identity(scale).op
    if add in norms:
        return norms[add]
    if add.type not in ("AddV2", "Add"):
        return None
    mul = next((t.op for t in add.inputs if t.op.type == "Mul"), None)
    clip = None if mul is None else next(
        (_scalar(t) for t in mul.inputs if _scalar(t) is not None), None)
    found = _norm_graph(add.outputs[0])
    if clip is None or found is None or not found[1]:
        return None
    packs = [o for o in found[0] if o.type == "Pack"]
    l2 = {o.outputs[0].name: o.inputs[0] for o in found[0] if o.type == "L2Loss"}
    if len(packs) == 1 and len(l2) == len(found[1]):
        group = tuple(l2[t.name] for t in packs[0].inputs if t.name in l2)
    else:
        group = tuple(found[1])
    step = _Step("clip_by_global_norm", add, value=clip, group=group)
    norms[add] = step
    return step


def _group_order(chains: list[_Chain]) -> None:
    """A clip_by_global_norm group's variables in TF's order (the norm sums in it)."""
    for chain in chains:
        for step in chain.steps:
            if step.kind != "clip_by_global_norm" or step.variables:
                continue
            members = {_skip_identity(c.inputs[c.steps.index(step)]).name: c.update.variable
                       for c in chains if step in c.steps}
            names = []
            for g in step.group:
                if _skip_identity(g).name not in members:
                    raise _fail(step.anchor, "clip_by_global_norm over gradients the train_op "
                                             "does not apply; the CS computes the norm of the "
                                             "applied gradients only")
                names.append(members[_skip_identity(g).name])
            step.variables = tuple(names)


# ---- emission of the ordered transform list ----

def _merge(chains: list[_Chain]) -> list[GradientTransform]:
    """One ordered list: each variable's steps in its order, a global-norm group once,
    equal per-variable steps merged when no step on their variables lies between."""
    order = {op.name: i for i, op in enumerate(chains[0].update.op.graph.get_operations())}
    instances: list[tuple[_Step, tuple[str, ...]]] = []
    for chain in chains:
        for step in chain.steps:
            if step.kind == "clip_by_global_norm":
                if all(s is not step for s, _ in instances):
                    instances.append((step, step.variables))
            else:
                instances.append((step, (chain.update.variable,)))
    instances.sort(key=lambda sv: order[sv[0].anchor.name])
    merged: list[tuple[tuple, list[str]]] = []
    for step, names in instances:
        key = (step.kind, step.value, step.low, step.high)
        target = None
        if step.kind != "clip_by_global_norm":
            for entry in reversed(merged):
                if set(entry[1]) & set(names):
                    break
                if entry[0] == key:
                    target = entry
                    break
        if target is None:
            merged.append((key, list(names)))
        else:
            target[1].extend(names)
    rank = {c.update.variable: i for i, c in enumerate(chains)}
    return [GradientTransform(k[0], value=k[1], low=k[2], high=k[3], variables=tuple(
        v if k[0] == "clip_by_global_norm" else sorted(v, key=rank.__getitem__)))
        for k, v in merged]


def _fold_loss_scale(chains: list[_Chain], half: bool) -> tuple[list[GradientTransform], float]:
    """The steps as the CS applies them to d(loss)/d(var): the loss scale S first, folded
    into the scale steps that follow it (S * (1 / S) = 1 drops both); and the scale left in
    the backward's seed. A float16 program keeps S in its seed (float16 gradients of S x the
    loss are what TF rounds and what overflows), and its 1 / S steps in the transforms."""
    if half:
        scales = {chain.call.scale for chain in chains}
        if len(scales) > 1:
            raise _fail(chains[0].update.op, f"gradients of the loss scaled by several factors "
                                             f"({', '.join(map(str, sorted(scales)))})")
        return _merge(chains), scales.pop()
    for chain in chains:
        if chain.call.scale != 1.0:
            chain.steps.insert(0, _Step("scale", chain.raw.op, value=chain.call.scale))
        while (len(chain.steps) >= 2 and chain.steps[0].kind == "scale"
               and chain.steps[1].kind == "scale"):
            first = chain.steps.pop(0)
            chain.steps[0] = _Step("scale", chain.steps[0].anchor, value=float(
                np.float32(first.value) * np.float32(chain.steps[0].value)))
        if chain.steps and chain.steps[0].kind == "scale" and \
                abs(chain.steps[0].value - 1.0) < 1e-6:
            chain.steps.pop(0)
    return _merge(chains), 1.0


# ---- 4. numbers ----

def _check_numbers(extracted: ExtractedGraph, chains: list[_Chain],
                   averages: list[StatisticAverage], rtol: float = 1e-4) -> None:
    """One run on input_fn's first batch: raw gradients == S * d(loss)/d(var) (to `rtol`:
    a float16 backward rounds S * g and g differently); then TF's transforms ==
    apply_transforms on random gradients. (Moving averages are initialised too: gradients
    computed under tf.control_dependencies(update_ops) run them.)"""
    graph, loss = extracted.graph, extracted.spec.loss
    handles = {op.name for op in _variables_under(loss)} | {c.update.variable for c in chains} \
        | {a.variable for a in averages}
    with graph.as_default():
        variables = [v for v in tf.compat.v1.global_variables() if v.op.name in handles]
    if sum(v.shape.num_elements() or 0 for v in variables) > NUMERIC_CHECK_VALUES:
        return  # the weights alone exceed the check's memory: the structure is what is proven
    with graph.as_default(), tf.name_scope("csrun_training_check"):
        tensors = [graph.get_operation_by_name(c.update.variable).outputs[0] for c in chains]
        expected = tf.gradients(loss, tensors)
        raw, ours = [], []
        for chain, grad, handle in zip(chains, expected, tensors):
            if grad is None:
                raise _fail(chain.update.op, f"the loss does not depend on {chain.update.variable}")
            if chain.raw_indices is not None:
                rows = handle.op.get_attr("shape").dim[0].size
                raw.append(tf.math.unsorted_segment_sum(chain.raw, chain.raw_indices, rows))
            else:
                raw.append(chain.raw)
            ours.append(tf.convert_to_tensor(grad))
        init = tf.compat.v1.variables_initializer(variables)
    batch = extracted.first_batch or {}
    feed = {graph.get_tensor_by_name(extracted.placeholders[s.name]): batch[s.name] for s in extracted.inputs}
    with tf.compat.v1.Session(graph=graph) as session:
        session.run(init)
        raw_values, loss_grads = session.run([raw, ours], feed)
        # A gradient that is zero in exact arithmetic (an attention key's bias) is rounding
        # noise on both sides: judged at the scale of the model's gradients, not its own.
        overall = max((float(np.max(np.abs(w), initial=0.0)) * abs(c.call.scale)
                       for c, w in zip(chains, loss_grads)), default=0.0)
        for chain, got, want in zip(chains, raw_values, loss_grads):
            want = want * np.float32(chain.call.scale)
            bound = rtol * float(np.max(np.abs(want), initial=0.0)) + 1e-6 * overall + 1e-30
            if got.shape != want.shape or float(np.max(np.abs(got - want), initial=0.0)) > bound:
                raise _fail(chain.update.op, f"the gradient applied to {chain.update.variable} "
                                             "is not the gradient of the loss model_fn returns")
        _check_transforms(session, chains)


def _check_transforms(session, chains: list[_Chain]) -> None:
    """TF's transform subgraph and apply_transforms agree on random gradients, with every
    clipping both inactive (tiny gradients) and active (large ones), and mixed."""
    transforms = _merge(chains)
    if not transforms:
        return
    limits = [abs(v) for t in transforms if t.kind != "scale" for v in (t.value, t.low, t.high)
              if v]
    shapes = {c.update.variable: c.raw.shape for c in chains}
    if not all(s.is_fully_defined() for s in shapes.values()):
        raise _fail(chains[0].update.op, "a gradient of unknown shape")
    size = max(s.num_elements() for s in shapes.values())
    scales = [10.0 * max(limits), min(limits) / (10.0 * np.sqrt(size))] if limits else [1.0]
    rng = np.random.default_rng(0)
    for trial in range(len(scales) + 1):
        feed, grads = {}, {}
        for c in chains:
            factor = scales[trial] if trial < len(scales) else float(
                np.exp(rng.uniform(np.log(min(scales)), np.log(max(scales)))))
            values = (rng.normal(size=shapes[c.update.variable].as_list()) * factor)
            feed[c.raw] = values.astype(np.float32)
            grads[c.update.variable] = feed[c.raw].copy()
        applied = session.run([c.update.grad for c in chains], feed)
        apply_transforms(transforms, grads)
        for c, want in zip(chains, applied):
            bound = 1e-5 * float(np.max(np.abs(want), initial=0.0)) + 1e-30
            if float(np.max(np.abs(grads[c.update.variable] - want), initial=0.0)) > bound:
                anchor = c.steps[-1].anchor if c.steps else c.update.op
                raise _fail(anchor, f"the gradient transforms of {c.update.variable} do not "
                                    f"compute what the CS computes ({TRANSFORMS})")


# ---- the pass ----

def analyze_training(extracted: ExtractedGraph, half: bool = False) -> TrainingSpec:
    """The TrainingSpec of extracted.spec.train_op, or CSRunError listing every problem
    (one line each: op, what is wrong, the user's source line). `half`: the forward graph
    computes in float16 (mixed precision)."""
    try:
        return _analyze(extracted, half)
    except _Problems as problems:
        lines = list(dict.fromkeys(problems.lines))
    raise CSRunError(lines[0],
                     "train with one tf.compat.v1.train optimizer (constant hyper-parameters, "
                     f"float32) minimizing model_fn's loss, gradients changed only by "
                     f"{TRANSFORMS}",
                     detail="Training problems:\n" + "\n".join(f"  {line}" for line in lines))


class _Problems(Exception):
    def __init__(self, lines: list[str]):
        super().__init__(lines[0])
        self.lines = lines


def _analyze(extracted: ExtractedGraph, half: bool) -> TrainingSpec:
    if extracted.spec.train_op is None:
        raise _Problems(["model_fn returned no train_op in train mode"])
    with extracted.graph.as_default():
        statistic_averages: list[StatisticAverage] = []
        try:
            updates, averages = _updates(extracted, statistic_averages)
            _check_dtypes(extracted, updates)
            _check_slots(updates)
        except _Refused as problem:
            raise _Problems([str(problem)]) from None
        calls = _gradient_calls(extracted, updates)
        norms: dict = {}
        chains, problems = [], []
        for u in updates:
            try:
                chains.append(_chain(u, calls, norms))
            except _Refused as problem:
                problems.append(str(problem))
        if problems:
            raise _Problems(problems)
        try:
            _group_order(chains)
            _check_numbers(extracted, chains, statistic_averages,
                           HALF_GRADIENT_RTOL if half else 1e-4)
            transforms, loss_scale = _fold_loss_scale(chains, half)
        except _Refused as problem:
            raise _Problems([str(problem)]) from None
        try:
            schedules, moving = _schedules(extracted, updates, averages)
        except ScheduleRefused as problem:
            raise _Problems([str(problem)]) from None
    variables = tuple(TrainedVariable(u.variable, "dense" if u.indices is None else "sparse",
                                      u.slots, user_source(u.op)) for u in updates)
    return TrainingSpec(updates[0].optimizer, variables, tuple(transforms), loss_scale=loss_scale,
                        schedules=schedules, moving_averages=moving,
                        statistic_averages=tuple(statistic_averages))


def _schedules(extracted: ExtractedGraph, updates: list[_Update], averages: list[_Average]):
    """The schedules of the hyper-parameters the updates read per step, and the moving
    averages with their factors (coordinator.compiler.schedules: lowered from the graph TF
    executes)."""
    train = extracted.spec.train_op
    increments = [op for op in op_closure(train) if _is_write(op) and op.type in (
        "AssignAddVariableOp", "AssignAdd") and _bookkeeping(op, extracted.graph, None)]
    items = [Scheduled(key, reader, tensor) for u in updates
             for key, (reader, tensor) in u.scheduled.items()]
    offsets = {}
    for a in averages:
        offsets[a.shadow] = int(bool(increments) and increments[0] in set(op_closure(a.op)))
        items.append(Scheduled(FACTOR, a.mul, a.factor, name=a.shadow,
                               before_increment=not offsets[a.shadow],
                               label=f"the decay of the ExponentialMovingAverage of {a.variable}"))
    written = {variable_op(op.inputs[0]).name for op in op_closure(train) if _is_write(op)}
    lowered = lower_schedules(extracted, items, written)
    schedules = tuple(lowered[key] for key in dict.fromkeys(
        key for u in updates for key in u.scheduled))
    moving = tuple(MovingAverage(a.variable, a.shadow, lowered[a.shadow], offsets[a.shadow])
                   for a in averages)
    return schedules, moving
