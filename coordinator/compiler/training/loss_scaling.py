"""Dynamic loss scaling in the train_op (wafer.loss_scaling), proven from the graph.

`MixedPrecisionLossScaleOptimizer(optimizer, "dynamic")` builds two tf.conds on one
predicate, "every applied gradient is finite" (reduce_all of is_finite per gradient): one
applies the updates (its true branch: the wrapped optimizer's apply_gradients, the global
step's increment included; its false branch: nothing), the other moves the scale S and its
good-step counter. The loss is multiplied by a read of S and each gradient by 1 / S.
With the CS-1's rule (examples/modelzoo_loss_scale.CS1DynamicLossScale) the predicate is
"the gradients' global norm is finite" and S with its two counters move by writes outside
any cond, every step: the one cond applies the updates.

`inline` hands the rest of the pass a view of the graph it already knows: the apply
branch's ops imported into the graph (reading the tensors the cond captured) as the
train_op, and S's reads replaced by `PROOF_SCALE`, so that the pass proves a static loss
scale P (seed P, then 1 / P first among the transforms; P, not S's initial value, which
may overflow the float16 backward on purpose); the CS then uses the current S where the
graph reads S. The scale's cond is proven by running it on the host
from states around each of its branches against wafer.loss_scaling's rule.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from coordinator.compiler.extract import ExtractedGraph, each_once, op_closure
from coordinator.compiler.training.graph import Refused, fail, skip_identity, variable_op
from coordinator.compiler.training.writes import CONDS, copies_only, is_write, writes_variable
from tf_model.model_fn import mark_imported
from wafer.loss_scaling import CS1DynamicLossScale, DynamicLossScale, Rule, problem

# The value S's reads take in the view: a power of two no float16 backward overflows at.
PROOF_SCALE = 256.0
_PREDICATE_OPS = {"All", "Pack", "IsFinite", "Const", "Identity", "Reshape", "Range", "Rank"}
_INCREMENTS = ("AssignAddVariableOp", "AssignAdd")


@dataclasses.dataclass(frozen=True)
class Inlined:
    view: ExtractedGraph  # the train_op: the apply branch's updates
    rule: Rule
    initial: float  # S's initial value
    checked: frozenset[str]  # the gradients the predicate checks
    step_counts_applied: bool  # the global step's increment is in the apply branch
    proof_scale: tf.Tensor  # the constant PROOF_SCALE that S's reads take in the view


def inline(extracted: ExtractedGraph) -> Inlined | None:
    """The train_op's dynamic loss scaling, proven; None when it runs no tf.cond that
    writes; Refused for a cond it does not recognise."""
    conds = [op for op in op_closure(extracted.spec.train_op) if op.type in CONDS and
             not copies_only(op) and (writes_variable(op._true_graph) or writes_variable(op._false_graph))]
    # (a schedule's conds write not; a target network's copies: training/copies.py)
    if not conds:
        return None
    why = fail(conds[-1], "the train_op applies its updates inside a tf.cond: the CS carries "
                          "out the conds of dynamic loss scaling (tf.compat.v1.mixed_precision."
                          "MixedPrecisionLossScaleOptimizer with 'dynamic', a DynamicLossScale "
                          "or the CS-1's rule, examples/modelzoo_loss_scale) and update conds "
                          "on the global step (apply every N steps, gradient accumulation)")
    apply = [op for op in conds if writes_variable(op._true_graph) and not writes_variable(op._false_graph)]
    moves = [op for op in conds if op not in apply]
    if len(conds) > 2 or len(apply) != 1 or (moves and moves[0].inputs[0] is not apply[0].inputs[0]):
        raise why
    apply_if = apply[0]
    graph = extracted.graph
    rule: Rule
    if moves:
        rule, scale_var, update = _tf_rule(graph, moves[0], why)
        checked = checked_gradients(apply_if, why)
    else:
        rule, scale_var, update = _cs1_rule(graph, extracted.spec.train_op, apply_if, why)
        checked = _checked_norm(apply_if, why)
    initial = _initial(graph, scale_var.name)
    with graph.as_default():
        pinned = tf.constant(np.float32(PROOF_SCALE), name="csrun_proof_loss_scale")
    rule = dataclasses.replace(rule, half_seed=_pin_reads(scale_var, pinned, update | {apply_if}, why))
    with graph.as_default():
        view = tf.group(*import_branch(graph, apply_if, apply_if._true_graph,
                                       "csrun_dynamic_loss_scale"))
    step = tf.compat.v1.train.get_global_step(graph)
    counts_applied = step is not None and any(
        op.type in _INCREMENTS and variable_op(op.inputs[0]) is step.op for op in op_closure(view))
    return Inlined(dataclasses.replace(extracted, spec=dataclasses.replace(
        extracted.spec, train_op=view)), rule, initial, frozenset(checked), counts_applied, pinned)


def _tf_rule(graph: tf.Graph, scale_if: tf.Operation,
             why: Refused) -> tuple[DynamicLossScale, tf.Operation, set[tf.Operation]]:
    """TF's rule from the scale's cond, proven: (the rule, S's variable, the cond)."""
    handles = [t for t in scale_if.inputs[1:] if t.dtype == tf.resource]
    kinds = {variable_op(t).get_attr("dtype"): variable_op(t) for t in handles}
    if len(handles) != 2 or set(kinds) != {tf.float32, tf.int64}:
        raise why
    scale_var, good_var = kinds[tf.float32], kinds[tf.int64]
    rule = DynamicLossScale(scale_var.name, good_var.name,
                            int(_constant(scale_if, "GreaterEqual")), _constant(scale_if, "RealDiv"))
    return _prove_rule(graph, scale_if, handles, kinds, rule, why), scale_var, {scale_if}


def _constant(scale_if: tf.Operation, op_type: str) -> float:
    """The constant operand of the scale's cond's GreaterEqual (the increment period, in its
    true branch) or RealDiv (S / multiplier, in its false branch)."""
    branch = scale_if._true_graph if op_type == "GreaterEqual" else scale_if._false_graph
    for op in branch.get_operations():
        if op.type == op_type and op.inputs[1].op.type == "Const":
            return tf.get_static_value(op.inputs[1]).item()
    raise fail(scale_if, f"the loss scale's tf.cond has no {op_type} by a constant: not "
                         "TensorFlow's DynamicLossScale")


def _initial(graph: tf.Graph, name: str) -> float:
    with graph.as_default():
        variable = next(v for v in tf.compat.v1.global_variables() if v.op.name == name)
        with tf.compat.v1.Session(graph=graph) as session:
            return float(session.run(variable.initial_value))


def _pin_reads(scale_var: tf.Operation, pinned: tf.Tensor, rule_ops: set[tf.Operation],
               why: Refused) -> bool:
    """Replace S's reads outside the rule's ops (the conds, the CS-1 rule's update) by
    PROOF_SCALE: each must scale the loss (loss * S, S maybe cast to the loss's dtype) or
    be 1 / S. Whether S meets the loss as a float16."""
    half = False
    for read in [op for op in scale_var.outputs[0].consumers() if op.type == "ReadVariableOp"]:
        for user in read.outputs[0].consumers():
            if user in rule_ops:
                continue
            targets = [user]
            if user.type == "Cast":
                half = half or user.outputs[0].dtype == tf.float16
                targets = user.outputs[0].consumers()
            for target in targets:
                reciprocal = target.type == "RealDiv" and target is user and \
                    tf.get_static_value(target.inputs[0]) == 1
                if not (target.type == "Mul" or reciprocal) or not targets:
                    raise why
            if not targets:
                raise why
            user._update_input(list(user.inputs).index(read.outputs[0]), pinned)
    return half


def _prove_rule(graph: tf.Graph, scale_if: tf.Operation, handles: list[tf.Tensor], kinds: dict,
                rule: DynamicLossScale, why: Refused) -> DynamicLossScale:
    """Run the scale's cond from states around each branch; every result must be the rule's."""
    if rule.increment_period < 1 or not rule.multiplier > 1:
        raise why
    period = rule.increment_period
    states = [(1024.0, 0, False), (1.5, 0, False), (1.0, 3, False), (1024.0, 0, True),
              (1024.0, period - 1, True), (3.0e38, period - 1, True), (1024.0, period + 5, True)]
    if period >= 2:
        states.append((1024.0, period - 2, True))
    handle = {kinds[dtype].name: t for t in handles for dtype in kinds if variable_op(t) is kinds[dtype]}
    scale_h, good_h = handle[rule.scale_variable], handle[rule.good_steps_variable]
    with graph.as_default(), tf.name_scope("csrun_loss_scale_check"):
        scale_in = tf.compat.v1.placeholder(tf.float32, [])
        good_in = tf.compat.v1.placeholder(tf.int64, [])
        assign = [tf.raw_ops.AssignVariableOp(resource=scale_h, value=scale_in),
                  tf.raw_ops.AssignVariableOp(resource=good_h, value=good_in)]
        reads = [tf.raw_ops.ReadVariableOp(resource=scale_h, dtype=tf.float32),
                 tf.raw_ops.ReadVariableOp(resource=good_h, dtype=tf.int64)]
        # the cond runs through the ops the train_op groups (its own op is not fetchable)
        step = [c for out in scale_if.outputs for c in out.consumers()]
    predicate = scale_if.inputs[0]
    with tf.compat.v1.Session(graph=graph) as session:
        for scale, good, finite in states:
            session.run(assign, {scale_in: scale, good_in: good})
            session.run(step, {predicate: finite})
            got = session.run(reads)
            want = rule.next(np.float32(scale), np.int64(good), finite)
            if np.float32(got[0]).tobytes() != np.float32(want[0]).tobytes() or int(got[1]) != int(want[1]):
                raise why
    return rule


def _cs1_rule(graph: tf.Graph, train_op: tf.Operation, apply_if: tf.Operation,
              why: Refused) -> tuple[CS1DynamicLossScale, tf.Operation, set[tf.Operation]]:
    """The CS-1's rule from the writes outside the cond that read the predicate, proven:
    (the rule, S's variable, the update's ops)."""
    predicate = apply_if.inputs[0]
    writes = [op for op in op_closure(train_op) if is_write(op) and predicate.op in op_closure(op)]
    variables = {variable_op(op.inputs[0]) for op in writes}
    floats = [v for v in variables if v.get_attr("dtype") == tf.float32]
    counters = sorted((v for v in variables if v.get_attr("dtype") == tf.int64), key=lambda v: v.name)
    if len(variables) != 3 or len(floats) != 1 or len(counters) != 2:
        raise why
    update = _ops_above(writes, predicate.op)
    tolerance = _one_constant(update, "Greater", tf.float32, why)
    high = _one_constant(update, "Minimum", tf.float32, why)
    low = _one_constant(update, "Maximum", tf.float32, why)
    period = _one_constant(update, "Sub", tf.int64, why)
    for steps, overflows in (counters, counters[::-1]):
        rule = CS1DynamicLossScale(floats[0].name, steps.name, overflows.name, int(period), low,
                                   high, tolerance)
        if not problem(rule) and _runs_as(graph, writes, predicate, rule):
            return rule, floats[0], update
    raise why


def _ops_above(writes: list[tf.Operation], stop: tf.Operation) -> set[tf.Operation]:
    """The ops the writes depend on, up to (not including) `stop`."""
    found, stack = set(), list(writes)
    while stack:
        op = stack.pop()
        if op in found or op is stop:
            continue
        found.add(op)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return found


def _one_constant(ops: set[tf.Operation], op_type: str, dtype: tf.DType, why: Refused) -> float:
    """The constant second operand of the one `op_type` of `dtype` among `ops`."""
    found = [tf.get_static_value(op.inputs[1]) for op in ops if op.type == op_type and
             op.outputs[0].dtype in (dtype, tf.bool) and op.inputs[0].dtype == dtype and
             op.inputs[1].op.type == "Const"]
    if len(found) != 1:
        raise why
    return found[0].item()


def _runs_as(graph: tf.Graph, writes: list[tf.Operation], predicate: tf.Tensor,
             rule: CS1DynamicLossScale) -> bool:
    """Whether the writes, run on the host from states around each of the rule's branches
    (a halving, a tolerated overflow at the tolerance's edge, a doubling, both clips), leave
    the variables where the rule does."""
    period, tolerance = rule.increment_period, rule.overflow_tolerance
    states = [(1024.0, 0, 0, True), (1024.0, 0, 0, False), (1024.0, 3, 1, True), (1.5, 2, 1, False),
              (1024.0, period - 1, 0, True), (1024.0, period - 1, 0, False),
              (rule.max_scale, period - 1, 0, True), (rule.min_scale, 0, 0, False),
              (3.0e38, period - 1, 0, True), (1024.0, period + 5, 0, True)]
    if period >= 2:
        states.append((1024.0, period - 2, 0, True))
    if tolerance > 0:
        edge = int(np.ceil(1 / tolerance))
        states += [(1024.0, n, 0, False) for n in range(max(edge - 2, 0), edge + 1)]
    handles = {op.name: op.outputs[0] for op in {variable_op(w.inputs[0]) for w in writes}}
    names = list(rule.state)
    with graph.as_default(), tf.name_scope("csrun_loss_scale_check"):
        fed = {name: tf.compat.v1.placeholder(dtype, []) for name, dtype in rule.state.items()}
        assign = [tf.raw_ops.AssignVariableOp(resource=handles[n], value=fed[n]) for n in names]
        reads = [tf.raw_ops.ReadVariableOp(resource=handles[n], dtype=rule.state[n]) for n in names]
    with tf.compat.v1.Session(graph=graph) as session:
        for scale, steps, overflows, finite in states:
            start = dict(zip(names, (scale, steps, overflows)))
            session.run(assign, {fed[n]: start[n] for n in names})
            try:
                session.run(writes, {predicate: finite})
            except (tf.errors.OpError, ValueError):
                return False
            got = dict(zip(names, session.run(reads)))
            want = rule.advance({n: np.asarray(v) for n, v in start.items()}, finite)
            if any(np.asarray(got[n]).tobytes() != np.asarray(want[n]).astype(rule.state[n]).tobytes()
                   for n in names):
                return False
    return True


def import_branch(graph: tf.Graph, cond: tf.Operation, branch, name: str) -> list[tf.Operation]:
    """The writes of a cond's branch (its `_true_graph` or `_false_graph`) as ops of the
    graph (imported under `name`), reading what the cond captured."""
    mapping = {inner.name: outer for inner, outer in zip(branch.inputs, cond.inputs[1:])}
    writes = [op.name for op in branch.get_operations() if is_write(op)]
    scope = graph.unique_name(name, mark_as_used=False) + "/"  # (the import's, uniquified)
    with graph.as_default():
        imported = tf.graph_util.import_graph_def(branch.as_graph_def(), input_map=mapping,
                                                  return_elements=writes, name=name)
    for original in branch.get_operations():  # refusals name the user's op and its line
        try:
            copy = graph.get_operation_by_name(scope + original.name)
        except KeyError:
            continue
        mark_imported(copy, f"{cond.name}/{original.name}", original)
    return imported


def checked_gradients(apply_if: tf.Operation, why: Refused) -> set[str]:
    """The tensors the predicate is reduce_all of is_finite of (the analysis compares them
    with the gradients the updates apply)."""
    checked, stack = set(), [apply_if.inputs[0].op]
    for op in each_once(stack):  # reduce_all over is_finite of each gradient
        if op.type not in _PREDICATE_OPS:
            raise why
        if op.type == "IsFinite":
            checked.add(skip_identity(op.inputs[0]).name)
        elif op.type != "Rank":  # (a shape only)
            stack.extend(t.op for t in op.inputs)
    return checked


def _checked_norm(apply_if: tf.Operation, why: Refused) -> set[str]:
    """The tensors of the global norm the CS-1 rule's predicate is is_finite of:
    IsFinite(Sqrt(Sum(Pack(L2Loss(g) ...)) * 2))."""
    def one(tensor: tf.Tensor, op_type: str) -> tf.Operation:
        op = skip_identity(tensor).op
        if op.type != op_type:
            raise why
        return op

    scaled = one(one(one(apply_if.inputs[0], "IsFinite").inputs[0], "Sqrt").inputs[0], "Mul")
    constants = [tf.get_static_value(t) for t in scaled.inputs]
    if sum(c is not None and float(c) == 2.0 for c in constants) != 1:
        raise why
    total = one(next(t for t, c in zip(scaled.inputs, constants) if c is None), "Sum")
    halves = one(total.inputs[0], "Pack").inputs
    return {skip_identity(one(h, "L2Loss").inputs[0]).name for h in halves}
