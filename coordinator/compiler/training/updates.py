"""Optimizer updates: one TF update op (Apply*/SparseApply*, v1 Adam's and SGD's sparse
patterns, the modelzoo's AdamW) as the variable, optimizer, slots and gradient it applies; constant
hyper-parameters or schedules (coordinator.compiler.schedules), float32 only, its slots
named and started as wafer.optimizers names and starts them."""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

import numpy as np
import tensorflow as tf

from coordinator.compiler.extract import ExtractedGraph, user_source
from coordinator.compiler.training.graph import (
    Refused,
    const,
    fail,
    scalar,
    skip_identity,
    variable_op,
    variables_under,
)
from wafer import optimizers as cs_optimizers
from wafer.optimizers import OptimizerConfig

SUPPORTED = ("tf.compat.v1.train.GradientDescentOptimizer, MomentumOptimizer, AdamOptimizer, "
             "RMSPropOptimizer, AdagradOptimizer, AdadeltaOptimizer, FtrlOptimizer, "
             "ProximalAdagradOptimizer, ProximalGradientDescentOptimizer, the modelzoo's "
             "AdamWOptimizer")


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
    "ApplyAdadelta": _ApplyKind("adadelta", (1, 2), {"learning_rate": 3, "decay": 4,
                                                     "epsilon": 5}, 6),
    "ApplyFtrl": _ApplyKind("ftrl", (1, 2), {"learning_rate": 4, "l1": 5, "l2": 6,
                                             "lr_power": 7}, 3),
    "ApplyFtrlV2": _ApplyKind("ftrl", (1, 2), {"learning_rate": 4, "l1": 5, "l2": 6,
                                               "l2_shrinkage": 7, "lr_power": 8}, 3),
    "ApplyProximalAdagrad": _ApplyKind("proximal_adagrad", (1,), {"learning_rate": 2, "l1": 3,
                                                                  "l2": 4}, 5),
    "ApplyProximalGradientDescent": _ApplyKind("proximal_sgd", (), {"learning_rate": 1, "l1": 2,
                                                                    "l2": 3}, 4),
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
    "SparseApplyAdadelta": _ApplyKind("adadelta", (1, 2), {"learning_rate": 3, "decay": 4,
                                                           "epsilon": 5}, 6, indices=7),
    "SparseApplyProximalAdagrad": _ApplyKind("proximal_adagrad", (1,), {
        "learning_rate": 2, "l1": 3, "l2": 4}, 5, indices=6),
    "SparseApplyFtrl": _ApplyKind("ftrl", (1, 2), {"learning_rate": 5, "l1": 6, "l2": 7,
                                                   "lr_power": 8}, 3, indices=4),
    "SparseApplyFtrlV2": _ApplyKind("ftrl", (1, 2), {"learning_rate": 5, "l1": 6, "l2": 7,
                                                     "l2_shrinkage": 8, "lr_power": 9}, 3,
                                    indices=4),
    "SparseApplyProximalGradientDescent": _ApplyKind("proximal_sgd", (), {
        "learning_rate": 1, "l1": 2, "l2": 3}, 4, indices=5),
}
APPLY_OPS = {prefix + name: kind for table in (_DENSE, _SPARSE) for name, kind in table.items()
             for prefix in ("", "Resource")}


@dataclass(eq=False)
class Update:
    variable: str
    op: tf.Operation  # the op that updates the variable itself
    optimizer: OptimizerConfig
    slots: tuple[str, ...]
    grad: tf.Tensor  # dense gradient, or the sparse gradient's values before deduplication
    indices: tf.Tensor | None  # sparse: the IndexedSlices' indices before deduplication
    owned: set = field(default_factory=set)  # write ops belonging to this update
    scheduled: dict = field(default_factory=dict)  # hyper-parameter -> (reader op, its tensor)
    cond: tf.Operation | None = None  # the tf.cond it was imported from (a delayed update)


def _hyper(op: tf.Operation, tensor: tf.Tensor, key: str) -> float:
    value = scalar(tensor)
    if value is None:
        raise fail(skip_identity(tensor).op,
                   f"the {key} of the optimizer is not a constant (this update takes a "
                   "schedule of the learning rate only)")
    return value


def _dedup(op: tf.Operation, values: tf.Tensor, indices: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """The IndexedSlices before the optimizer's _deduplicate_indexed_slices."""
    summed, unique = values.op, indices.op
    if (summed.type != "UnsortedSegmentSum" or unique.type != "Unique"
            or summed.inputs[1].name != unique.outputs[1].name
            or indices.name != unique.outputs[0].name):
        raise fail(op, "a sparse update whose gradient is not TF's deduplicated IndexedSlices")
    return summed.inputs[0], unique.inputs[0]


def apply_update(op: tf.Operation) -> Update:
    kind = APPLY_OPS[op.type]
    scheduled = {key: (op, op.inputs[i]) for key, i in kind.hyper.items()
                 if scalar(op.inputs[i]) is None}
    if kind.optimizer == "adam" and {"beta1", "beta2"} & set(scheduled):
        raise fail(op, "Adam's beta1 or beta2 is computed per step; the CS keeps them "
                       "constant (its beta powers multiply by them)")
    allowed = cs_optimizers.SCHEDULABLE[kind.optimizer]
    for key in sorted(set(scheduled) - set(allowed)):
        name = "rho" if (kind.optimizer, key) == ("adadelta", "decay") else key  # TF's name
        raise fail(op, f"the {name} of the {kind.optimizer} optimizer is computed per step; "
                       f"the CS takes schedules of its {', '.join(allowed)} only")
    values = {key: 0.0 if key in scheduled else _hyper(op, op.inputs[i], key)
              for key, i in kind.hyper.items()}
    nesterov = bool(op.get_attr("use_nesterov")) if "use_nesterov" in op.node_def.attr else False
    if kind.optimizer == "adam" and nesterov:
        raise fail(op, "Adam with Nesterov momentum is not a tf.compat.v1 optimizer")
    if kind.optimizer == "adagrad" and "update_slots" in op.node_def.attr and \
            not op.get_attr("update_slots"):
        raise fail(op, "Adagrad without accumulator updates is not supported")
    if kind.optimizer == "adam":
        values["scalar_names"] = _check_powers(op, [op.inputs[i] for i in kind.powers],  # type: ignore[assignment]
                                               values)
    slots = tuple(variable_op(op.inputs[i]).name for i in kind.slots)
    if kind.optimizer in ("adagrad", "ftrl", "proximal_adagrad"):
        values["initial_accumulator_value"] = _initial_value(op, variable_op(op.inputs[1]))
    if "multiply_linear_by_lr" in op.node_def.attr and op.get_attr("multiply_linear_by_lr"):
        raise fail(op, "FTRL with multiply_linear_by_lr is not a tf.compat.v1 optimizer")
    spec = OptimizerConfig(type=kind.optimizer, use_nesterov=nesterov,
                         **{**values, **kind.fixed})  # type: ignore[arg-type]  # (float hyper-parameters only)
    grad, indices = op.inputs[kind.grad], None
    if kind.indices is not None:
        grad, indices = _dedup(op, grad, op.inputs[kind.indices])
    return Update(variable_op(op.inputs[0]).name, op, spec, slots, grad, indices, {op},
                  scheduled)


def _initial_value(op: tf.Operation, slot: tf.Operation) -> float:
    """The constant a slot variable is initialized with (Adagrad's accumulator)."""
    inits = [c for c in slot.outputs[0].consumers()
             if c.type in ("AssignVariableOp", "Assign") and c.name.startswith(slot.name + "/")]
    value = _splat(inits[0].inputs[1]) if len(inits) == 1 else None
    if value is None:
        raise fail(op, f"the slot {slot.name} has no constant initial value")
    return value


def _splat(tensor: tf.Tensor) -> float | None:
    """The one value a constant-filled tensor holds (without materialising it)."""
    op = skip_identity(tensor).op
    if op.type == "Fill":
        return scalar(op.inputs[1])
    if op.type == "Mul":  # ones * value (tf.compat.v1's constant_initializer of FTRL's slot)
        factors = [_splat(t) for t in op.inputs]
        return None if None in factors else float(np.float32(factors[0]) * np.float32(factors[1]))
    if op.type == "Const":
        proto = op.get_attr("value")
        values = [*proto.float_val, *proto.double_val, *proto.int_val]
        if not proto.tensor_content and len(values) == 1:
            return float(values[0])
    value = const(tensor)
    if value is None or value.size == 0 or np.any(value != value.flat[0]):
        return None
    return float(value.flat[0])


def _check_powers(op: tf.Operation, reads: list[tf.Tensor], values: dict[str, float],
                  own_names: bool = True) -> tuple[str, ...]:
    """Adam's step counters, checked; their TF names when not the default ones (a second
    AdamOptimizer's beta1_power_1, beta2_power_1; `own_names` False: refused)."""
    names = tuple(variable_op(t).name for t in reads)
    expected = tuple(cs_optimizers.Adam.scalar_names)
    suffixes = {m.group(1) for n, e in zip(names, expected)
                if (m := re.fullmatch(re.escape(e) + r"(_\d+)?", n))}
    if len(suffixes) != 1 or len(names) != 2 or (suffixes != {None} and not own_names):
        raise fail(op, f"Adam's step counters are {', '.join(names)}, the CS names them "
                       f"{', '.join(expected)}")
    for name, read in zip(names, reads):
        beta = values["beta1" if name.startswith("beta1") else "beta2"]
        init = _initial_value(op, variable_op(read))
        if np.float32(init) != np.float32(beta):
            raise fail(op, f"{name} starts at {init}, not at its beta {beta}")
    return () if names == expected else names


def sgd_sparse(op: tf.Operation) -> Update | None:
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
    scheduled = {"learning_rate": (delta, lr)} if scalar(lr) is None else {}
    spec = OptimizerConfig(type="sgd", learning_rate=0.0 if scheduled else
                         _hyper(op, lr, "learning_rate"))
    return Update(variable_op(op.inputs[0]).name, op, spec, (), neg[0].op.inputs[0],
                  op.inputs[1], {op}, scheduled)


def adam_sparse(op: tf.Operation) -> Update | None:
    """v1 Adam's _apply_sparse_shared: var -= lr * m_t / (sqrt(v_t) + eps), with
    m = m * beta1 then m[rows] += g * (1 - beta1) (v alike with g * g, beta2)."""
    if op.type != "AssignSubVariableOp":
        return None
    try:
        div = expect(op.inputs[1], "RealDiv")
        num, den = div.inputs
        num_op = expect(num, "Mul")
        lr_t, m_read = num_op.inputs
        lr_div = expect(lr_t, "RealDiv")
        lr_mul = expect(lr_div.inputs[0], "Mul")
        lr = lr_mul.inputs[0]
        sqrt_b2 = expect(lr_mul.inputs[1], "Sqrt")
        b2p = _one_minus(sqrt_b2.inputs[0])
        b1p = _one_minus(lr_div.inputs[1])
        add = expect(den, "AddV2")
        v_read = expect(add.inputs[0], "Sqrt").inputs[0]
        eps = add.inputs[1]
        m_grad, m_idx, beta1, m_owned = _decayed_scatter(m_read, squared=False)
        v_grad, v_idx, beta2, v_owned = _decayed_scatter(v_read, squared=True)
    except NoMatch:
        return None
    if m_grad.name != v_grad.name or m_idx.name != v_idx.name:
        return None
    scheduled = {"learning_rate": (lr_mul, lr)} if scalar(lr) is None else {}
    values = {"learning_rate": 0.0 if scheduled else _hyper(op, lr, "learning_rate"),
              "beta1": _hyper(op, beta1, "beta1"), "beta2": _hyper(op, beta2, "beta2"),
              "epsilon": _hyper(op, eps, "epsilon")}
    values["scalar_names"] = _check_powers(op, [b1p, b2p], values)  # type: ignore[assignment]
    grad, indices = _dedup(op, m_grad, m_idx)
    slots = (variable_op(m_read).name, variable_op(v_read).name)
    return Update(variable_op(op.inputs[0]).name, op, OptimizerConfig(type="adam", **values),  # type: ignore[arg-type]  # (floats only)
                  slots, grad, indices, {op} | m_owned | v_owned, scheduled)


def adamw_update(op: tf.Operation) -> Update | None:
    """The modelzoo's AdamWOptimizer (examples/modelzoo_adamw.py): var = var - lr * u with
    u = next_m / (sqrt(next_v) + eps) [* bias correction] [+ rate * var], next_m and next_v
    written to the variable's slots in the same step; a sparse gradient's deduplicated
    rows scattered into a dense one (UnsortedSegmentSum)."""
    if op.type != "AssignVariableOp":
        return None
    target = variable_op(op.inputs[0])
    try:
        sub = expect(op.inputs[1], "Sub")
        if variable_op(skip_identity(sub.inputs[0])) is not target:
            raise NoMatch
        lr, update = expect(sub.inputs[1], "Mul").inputs
        rate, powers = 0.0, None
        if skip_identity(update).op.type == "AddV2":  # + weight_decay_rate * var
            add = skip_identity(update).op
            update, rate = add.inputs[0], _decay_rate(add.inputs[1], target)
        if skip_identity(update).op.type == "Mul":  # * sqrt(1 - beta2_power) / (1 - beta1_power)
            update, correction = skip_identity(update).op.inputs
            div = expect(correction, "RealDiv")
            powers = [_one_minus(div.inputs[1]), _one_minus(expect(div.inputs[0], "Sqrt").inputs[0])]
        next_m, denominator = expect(update, "RealDiv").inputs
        add = expect(denominator, "AddV2")
        next_v, eps = expect(add.inputs[0], "Sqrt").inputs[0], add.inputs[1]
        m, beta1, one_minus_beta1, g = _moment(next_m, squared=False)
        v, beta2, one_minus_beta2, g_v = _moment(next_v, squared=True)
        if g.name != g_v.name:
            raise NoMatch
        owned = {op, _slot_write(next_m, m), _slot_write(next_v, v)}
    except NoMatch:
        return None
    scheduled = {"learning_rate": (sub.inputs[1].op, lr)} if scalar(lr) is None else {}
    values = {"learning_rate": 0.0 if scheduled else _hyper(op, lr, "learning_rate"),
              "beta1": _hyper(op, beta1, "beta1"), "beta2": _hyper(op, beta2, "beta2"),
              "epsilon": _hyper(op, eps, "epsilon"), "weight_decay_rate": rate,
              "one_minus_beta1": _hyper(op, one_minus_beta1, "1 - beta1"),
              "one_minus_beta2": _hyper(op, one_minus_beta2, "1 - beta2")}
    if powers is not None:
        _check_powers(op, powers, values, own_names=False)
    grad, indices = g, None
    dense = skip_identity(g).op
    if dense.type == "UnsortedSegmentSum" and dense.inputs[1].op.type == "Unique":
        if scalar(dense.inputs[2]) != target.get_attr("shape").dim[0].size:
            raise fail(op, "a sparse gradient scattered into another shape than its variable's")
        grad, indices = _dedup(op, dense.inputs[0], dense.inputs[1])
    config = OptimizerConfig(type="adamw", use_bias_correction=powers is not None,
                             **values)  # type: ignore[arg-type]  # (floats only)
    return Update(target.name, op, config, (m.name, v.name), grad, indices, owned, scheduled)


def _decay_rate(term: tf.Tensor, target: tf.Operation) -> float:
    """rate of rate * var (a constant rate > 0)."""
    mul = expect(term, "Mul")
    for x, c in ((mul.inputs[0], mul.inputs[1]), (mul.inputs[1], mul.inputs[0])):
        rate = scalar(c)
        if variable_op(skip_identity(x)) is target and rate is not None and rate > 0:
            return rate
    raise NoMatch


def _moment(tensor: tf.Tensor, squared: bool):
    """beta * slot + one_minus * g (g * g: Square(g)): the slot, beta, one_minus and g."""
    add = expect(tensor, "AddV2")
    decayed, fresh = (expect(t, "Mul") for t in add.inputs)
    beta, read = decayed.inputs
    one_minus, g = fresh.inputs
    if scalar(beta) is None or scalar(one_minus) is None:
        raise NoMatch
    slot = variable_op(skip_identity(read))
    if slot.type != "VarHandleOp":
        raise NoMatch
    if squared:
        g = expect(g, "Square").inputs[0]
    return slot, beta, one_minus, g


def _slot_write(value: tf.Tensor, slot: tf.Operation) -> tf.Operation:
    """The op writing `value` into `slot`."""
    writes = [c for c in value.consumers()
              if c.type == "AssignVariableOp" and variable_op(c.inputs[0]) is slot]
    if len(writes) != 1:
        raise NoMatch
    return writes[0]


def merge_weight_decay(updates: list[Update]) -> None:
    """AdamW: one rate for the variables it decays, the others named in the config of all."""
    adamw = [u for u in updates if u.optimizer.type == "adamw"]
    rates = sorted({u.optimizer.weight_decay_rate for u in adamw} - {0.0})
    if len(rates) > 1:
        decayed = [u for u in adamw if u.optimizer.weight_decay_rate == rates[-1]]
        raise fail(decayed[0].op, f"AdamW decays {decayed[0].variable} at {rates[-1]} and "
                                  f"others at {rates[0]}: the CS decays at one rate")
    excluded = tuple(u.variable for u in adamw if not u.optimizer.weight_decay_rate)
    for u in adamw:
        if u.scheduled and u.optimizer.use_bias_correction and not u.optimizer.weight_decay_rate:
            raise fail(u.op, f"AdamW with bias correction and a learning-rate schedule: for "
                             f"{u.variable}, not decayed, TensorFlow reassociates lr * (update * "
                             "correction) and the CS does not follow it (use_bias_correction: "
                             "False, or a constant learning rate)")
    for u in adamw:
        u.optimizer = replace(u.optimizer, weight_decay_rate=rates[0] if rates else 0.0,
                              no_weight_decay=excluded if rates else ())


class NoMatch(Exception):
    pass


def expect(tensor: tf.Tensor, type_: str) -> tf.Operation:
    tensor = skip_identity(tensor)
    if tensor.op.type != type_:
        raise NoMatch
    return tensor.op


def _one_minus(tensor: tf.Tensor) -> tf.Tensor:
    """x for 1 - x (a beta power read)."""
    sub = expect(tensor, "Sub")
    if scalar(sub.inputs[0]) != 1.0:
        raise NoMatch
    return sub.inputs[1]


def _decayed_scatter(read: tf.Tensor, squared: bool):
    """A slot read after `slot = slot * beta` and `slot[i] += g (* g) * (1 - beta)`."""
    read = skip_identity(read)
    if read.op.type != "ReadVariableOp":
        raise NoMatch
    slot = variable_op(read)
    deps = {c.type: c for c in read.op.control_inputs}
    assign, scatter = deps.get("AssignVariableOp"), deps.get("ResourceScatterAdd")
    if assign is None or scatter is None or variable_op(assign.inputs[0]) is not slot \
            or variable_op(scatter.inputs[0]) is not slot:
        raise NoMatch
    decay = expect(assign.inputs[1], "Mul")
    if variable_op(decay.inputs[0]) is not slot:
        raise NoMatch
    beta = decay.inputs[1]
    scaled = expect(scatter.inputs[2], "Mul")
    grad_t, one_minus = scaled.inputs
    if _one_minus(one_minus).name != beta.name:
        raise NoMatch
    if squared:
        square = expect(grad_t, "Mul")
        if square.inputs[0].name != square.inputs[1].name:
            raise NoMatch
        grad_t = square.inputs[0]
    return grad_t, scatter.inputs[1], beta, {assign, scatter}


def check_dtypes(extracted: ExtractedGraph, updates: list[Update]) -> None:
    """float32 variables under the loss and float32 optimizer computations only."""
    variables = {op.name: op for op in variables_under(extracted.spec.loss)}
    variables.update({u.variable: variable_op(u.op.inputs[0]) for u in updates})
    for name in sorted(variables):
        dtype = tf.as_dtype(variables[name].get_attr("dtype")).base_dtype
        if dtype.is_floating and dtype != tf.float32:
            op = variables[name]
            raise Refused(f"variable {name} at {user_source(op)} is {dtype.name}: the CS "
                          "computes and trains in float32 only")
    for u in updates:
        dtype = u.op.get_attr("T") if "T" in u.op.node_def.attr else u.grad.dtype
        if tf.as_dtype(dtype).base_dtype != tf.float32:
            raise fail(u.op, f"the update of {u.variable} computes in "
                             f"{tf.as_dtype(dtype).name}; the CS trains in float32 only")


def check_slots(updates: list[Update], named: bool = True) -> None:
    """The CS's optimizer for the spec exists, names the slots as the graph does (`named`:
    a weight's first update; a further optimizer's slots keep TF's names) and starts them
    where the graph's initializers do."""
    for u in updates:
        config = u.optimizer
        problem = cs_optimizers.config_problem(config)
        if problem:
            raise fail(u.op, problem)
        cs = cs_optimizers.make_optimizer(config)
        expected = tuple(cs_optimizers.slot_name(u.variable, s) for s in cs.slot_suffixes)
        if named and u.slots != expected:
            raise fail(u.op, f"the optimizer's slots of {u.variable} are named "
                             f"{', '.join(u.slots)}; the CS checkpoints them as "
                             f"{', '.join(expected)} (create the optimizer without name=)")
        graph = u.op.graph
        for slot, value in zip(u.slots, cs.slot_initial_values):
            start = _initial_value(u.op, graph.get_operation_by_name(slot))
            if np.float32(start) != np.float32(value):
                raise fail(u.op, f"the slot {slot} starts at {start}, the CS starts it at "
                                 f"{value}")
