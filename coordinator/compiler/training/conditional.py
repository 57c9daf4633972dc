"""Updates inside a tf.cond on a value of the global step (wafer.conditional_updates), proven
from the graph: gradient accumulation by hand, applying every N steps.

The train_op runs one tf.cond that writes: one branch applies the updates (the optimizer's
apply ops and bookkeeping, and zeroing assigns of accumulators), the other writes nothing;
its predicate is computed from the global step and constants. Outside the cond the train_op
may add a value to each accumulator (AssignAdd; the cond waits for it) and increment the
global step (after the cond). The predicate is lowered as a schedule (the nodes TF executes)
to 1 / 0. `inline` hands the rest of the pass the updating branch as the train_op, each
read of an accumulator there replaced by the value added to it: the pass proves that value
is the transformed gradient of the weight the read's update trains, as for any update; the
CS then adds it to the accumulator each step and applies the sum on the steps the predicate
holds. Delayed updates (`_delayed`): when the train_op also updates variables outside the
cond every step (TD3's critic beside its actor every d steps), or both branches update
(alternating GAN steps), the view holds the writes outside and both branches' writes; a
variable one branch alone writes is gated by the predicate (or its negation), read before
or after the step's increment as the graph orders it. A cond of any other kind is left to
dynamic loss scaling (training/loss_scaling.py), which refuses what it does not recognise.
"""
from __future__ import annotations

import dataclasses
import re
import weakref

import numpy as np
import tensorflow as tf

from coordinator.compiler.extract import ExtractedGraph, data_upstream, op_closure, user_name, user_source
from coordinator.compiler.schedules import (
    Scheduled,
    ScheduleRefused,
    executed_graph,
    global_step,
    lower_predicate,
)
from coordinator.compiler.training.graph import Refused, fail, skip_identity, variable_op
from coordinator.compiler.training.loss_scaling import checked_gradients, import_branch
from coordinator.compiler.training.writes import CONDS, copies_only, is_write, writes_variable
from wafer.conditional_updates import ConditionalUpdate
from wafer.schedules import Schedule

_ADDS = ("AssignAddVariableOp", "AssignAdd")
_PREFIX = "csrun_conditional_update"
# each graph's conds' imported branches (branch_writes)
_IMPORTED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
WHAT = ("the CS carries out update conds whose predicate is computed from the global step "
        "and constants (apply every N steps, gradient accumulation)")


@dataclasses.dataclass(frozen=True)
class Inlined:
    view: ExtractedGraph  # the train_op: the updating branch's writes, then the increment
    predicate: Schedule | None  # float32 1 when the updates run (None: a finite test)
    added: dict[str, str]  # the tensor added to an accumulator each step -> the accumulator
    users: tuple[tf.Operation, ...]  # the branch's ops reading an accumulator (that tensor)
    cond: tf.Operation  # the user's tf.cond (refusals name it: imported ops have no line)
    finite: str = ""  # "loss" or "gradients": the cond tests it for being finite
    checked: frozenset[str] = frozenset()  # the tensors a "gradients" test checks
    counts_applied: bool = False  # the global step's increment is in the branch
    # (both branches update, or updates beside the cond) the variables one branch alone
    # writes, and whether it is the true one
    only: tuple[tuple[str, bool], ...] = ()
    # (updates beside the cond) the imported writes -> the branch (true: True) they run in,
    # the predicate's negation, and 1 if the predicate reads the step after its increment
    branch_of: dict[tf.Operation, bool] = dataclasses.field(default_factory=dict)
    negation: Schedule | None = None
    offset: int = 0

    @property
    def delayed(self) -> bool:
        """Updates beside the cond's every step (TD3's critic beside its delayed actor), or
        in both branches (alternating GAN updates)."""
        return self.negation is not None

    def update(self, updates: list) -> ConditionalUpdate:
        """The ConditionalUpdate of the pass's updates (training.updates.Update): each
        accumulator's value applied as the gradient of exactly one dense update."""
        pairs = []
        for u in updates:
            added = skip_identity(u.grad).name
            if added in self.added:
                if u.indices is not None:
                    raise fail(self.cond, f"a sparse update of {u.variable} from an "
                                          "accumulator: the CS accumulates dense gradients")
                pairs.append((u.variable, self.added[added]))
        applied = [a for _, a in pairs]
        applies = {u.op for u in updates if skip_identity(u.grad).name in self.added}
        if sorted(applied) != sorted(self.added.values()) or \
                not all(_applied_only(op, applies) for op in self.users):
            missing = sorted(set(self.added.values()).difference(applied) or applied)
            raise fail(self.cond, f"the optimizer does not apply the accumulator {missing[0]} "
                                  "as it is, as one variable's gradient: divide each step's "
                                  "gradient before adding it",
                       hint="apply the accumulators as they are: opt.apply_gradients(zip("
                            "[a.read_value() for a in accumulators], variables))")
        if self.finite == "gradients" and \
                self.checked != {skip_identity(u.grad).name for u in updates}:
            raise fail(self.cond, "the tf.cond tests other tensors than the gradients the "
                                  "optimizer applies for being finite")
        updated = {u.variable for u in updates}
        return ConditionalUpdate(self.predicate, tuple(pairs), user_source(self.cond), self.finite,
                                 tuple(v for v, holds in self.only if holds and v in updated),
                                 tuple(v for v, holds in self.only if not holds and v in updated),
                                 self.offset)

    def gated(self, write: tf.Operation) -> tuple[Schedule, int] | None:
        """The predicate an imported write runs under (its branch's) and its step offset;
        None for a write every step."""
        if write not in self.branch_of:
            return None
        schedule = self.predicate if self.branch_of[write] else self.negation
        assert schedule is not None
        return schedule, self.offset


def inline(extracted: ExtractedGraph) -> Inlined | None:
    """The train_op's update cond, proven; None when no cond writes or the writing conds are
    dynamic loss scaling's (several, or writes outside besides the step's increment, with a
    finite test); Refused otherwise."""
    train = extracted.spec.train_op
    conds = [op for op in op_closure(train) if op.type in CONDS and not copies_only(op) and (
        writes_variable(op._true_graph, deep=True) or writes_variable(op._false_graph, deep=True))]  # (copies:
    # training/copies.py)
    if not conds:
        return None
    cond = conds[-1]
    tests = any(op.type == "IsFinite" for c in conds for op in data_upstream(c.inputs[0].op))
    finite, checked = _finite(extracted, cond) if tests else ("", frozenset[str]())
    if tests and (len(conds) > 1 or not finite or _writes_besides_step(train, cond)):
        return None
    if len(conds) > 1:
        raise fail(cond, f"the train_op updates inside {len(conds)} tf.conds: {WHAT}, one cond")
    _check_nested(cond)
    predicate = cond.inputs[0]
    if not finite:
        check_predicate(extracted.graph, cond, predicate)
    both = writes_variable(cond._true_graph) and writes_variable(cond._false_graph)
    if both and finite:
        raise fail(cond, f"both branches of the tf.cond testing the {finite} for being finite "
                         "write variables: the CS skips every update of a non-finite step")
    negated = not writes_variable(cond._true_graph)
    branch = cond._false_graph if negated else cond._true_graph
    graph = extracted.graph
    zeroed = _zeroed(branch, cond) | (_zeroed(cond._false_graph, cond) if both else set())
    if zeroed and (finite or both):
        raise fail(cond, "gradient accumulation in a tf.cond testing for finite values or "
                         "updating in both branches: the CS accumulates under a predicate of "
                         "the global step, applying in one branch")
    adds, increments, beside = _outside_writes(train, cond, zeroed)
    if not finite and (both or any("Apply" in op.type for op in beside)):
        return _delayed(extracted, cond, beside, increments, zeroed)
    _check_outside(cond, beside, increments, adds, zeroed)
    if not finite:  # (read before the increment, which waits for the cond)
        step_read_offset(extracted, cond)
    schedule = None if finite else lowered(extracted, cond, negated)
    imported = import_branch(graph, cond, branch, _PREFIX)
    step = global_step(graph)
    counted = any(variable_op(op.inputs[0]).name == step for op in imported)
    if counted and (not finite or increments):
        raise fail(cond, "the tf.cond applying the updates increments the global step: "
                         "the CS counts every step under a predicate of the step; "
                         "increment it outside the cond",
                   hint="opt.apply_gradients(...) without global_step inside the cond, "
                        "then tf.compat.v1.assign_add(global_step, 1) under "
                        "tf.control_dependencies([the cond])")
    if finite and negated:
        raise fail(cond, f"the tf.cond applies the updates when the {finite} is not finite")
    loss = extracted.spec.loss
    read = sorted({variable_op(op.inputs[0]).name for op in data_upstream(loss.op)
                   if op.type == "ReadVariableOp"}.intersection(adds)) if loss is not None else []
    if read:
        raise fail(adds[read[0]], f"the loss reads the accumulator {read[0]}: the CS "
                                  "accumulates gradients the forward pass does not read")
    added, users = _rewire(graph, adds)
    with graph.as_default():
        writes = [op for op in imported if not (
            op.type == "AssignVariableOp" and variable_op(op.inputs[0]).name in zeroed)]
        with tf.control_dependencies(writes):
            steps = [tf.raw_ops.AssignAddVariableOp(
                resource=op.inputs[0], value=tf.constant(tf.get_static_value(op.inputs[1]),
                                                         op.inputs[1].dtype)) for op in increments]
        view = tf.group(*writes, *steps)
    return Inlined(dataclasses.replace(extracted, spec=dataclasses.replace(
        extracted.spec, train_op=view)), schedule, added, users, cond, finite, checked, counted)


def _delayed(extracted: ExtractedGraph, cond: tf.Operation, beside: list[tf.Operation],
             increments: list[tf.Operation], zeroed: set[str]) -> Inlined:
    """The update cond beside updates every step (TD3's actor and target networks every d
    steps beside its critic, a WGAN's generator every n_critic steps, alternating GAN
    updates): the train_op's writes outside the cond and each branch's writes (the
    variables one branch alone updates, on the steps that take it), the predicate read
    before or after the step's increment as the graph orders it."""
    if zeroed:  # (and not in both branches: refused before)
        raise fail(cond, "gradient accumulation beside updates every step: the CS "
                         "accumulates the gradients of every update the cond applies")
    graph = extracted.graph
    imported, other = branch_writes(cond)
    step = global_step(graph)
    if any(variable_op(op.inputs[0]).name == step for op in [*imported, *other]):
        raise fail(cond, "the tf.cond applying the updates increments the global step: "
                         "the CS counts every step; increment it outside the cond",
                   hint="minimize(loss, global_step=step) of the update every step, outside "
                        "the cond")
    offset = step_read_offset(extracted, cond)
    label = "the predicate of the tf.cond applying the updates"
    predicate, negation = (lowered(extracted, cond, negated, offset, "condition", label)
                           for negated in (False, True))
    writes, only = _merged(cond, imported, other)
    outside = {variable_op(op.inputs[0]).name for op in beside}
    inside = sorted(outside.intersection(variable_op(op.inputs[0]).name for op in writes))
    if inside:
        raise fail(cond, f"the train_op writes {inside[0]} both inside the tf.cond applying "
                         "the updates and outside it: the CS updates each variable every step "
                         "or under the predicate",
                   hint="give each optimizer (each AdamOptimizer's step counters) the updates "
                        "of one side of the cond")
    branch_of = {op: holds for op in writes for name, holds in only
                 if variable_op(op.inputs[0]).name == name}
    with graph.as_default():
        view = tf.group(*beside, *writes, *increments)
    return Inlined(dataclasses.replace(extracted, spec=dataclasses.replace(
        extracted.spec, train_op=view)), predicate, {}, (), cond, only=only,
        branch_of=branch_of, negation=negation, offset=offset)


def branch_writes(cond: tf.Operation) -> tuple[list[tf.Operation], list[tf.Operation]]:
    """The writes of the cond's true and false branches, imported into its graph once (the
    objectives' search, gradients.objective_losses, and the analysis share them)."""
    imported = _IMPORTED.setdefault(cond.graph, {})
    if cond.name not in imported:
        imported[cond.name] = (
            import_branch(cond.graph, cond, cond._true_graph, _PREFIX),
            import_branch(cond.graph, cond, cond._false_graph, _PREFIX + "_false"))
    return imported[cond.name]


def gradient_branches(train) -> list[tf.Operation]:
    """The writes of the branches of the train_op's update conds that compute gradients
    (minimize inside a branch: a delayed or alternating update), imported: the
    tf.gradients calls the train_op runs there."""
    found = []
    for cond in op_closure(train):
        if cond.type in CONDS and not copies_only(cond) and any(
                re.search(r"(^|/)grad_ys_\d+$", op.name) for branch in (
                    cond._true_graph, cond._false_graph) for op in branch.get_operations()):
            found += [op for ops in branch_writes(cond) for op in ops]
    return found


def step_read_offset(extracted: ExtractedGraph, cond: tf.Operation) -> int:
    """1 if the cond's predicate reads the global step after the step's increment (every
    read waits for it), 0 if before (the increment waits for every read); else refused: TF
    reads it before or after by chance."""
    step = global_step(extracted.graph)
    increments = [op for op in op_closure(extracted.spec.train_op)
                  if op.type in _ADDS and variable_op(op.inputs[0]).name == step]
    reads = [r for r in data_upstream(cond.inputs[0].op) if r.type in ("ReadVariableOp",
             "Identity") and r.inputs and variable_op(r.inputs[0]).name == step]
    if reads and not increments:
        raise fail(cond, "the tf.cond's predicate reads the global step, which the train_op "
                         "does not increment: TF decides alike every step",
                   hint="pass global_step to the optimizer's minimize outside the cond")
    if not reads:
        return 0
    late = [r for r in reads if increments[0] in set(op_closure(r))]
    if len(late) == len(reads):
        return 1
    before = set(op_closure(increments[0]))
    unordered = next((r for r in reads if r not in late and r not in before), None)
    if unordered is None and not late:
        return 0
    read = unordered or reads[0]
    raise fail(cond, f"the tf.cond's predicate reads the global step ({read.type} "
                     f"'{user_name(read)}' at {user_source(read)}) with no order to the step's "
                     f"increment ({increments[0].type} '{increments[0].name}' at "
                     f"{user_source(increments[0])}): TF reads it before or after by chance",
               hint="write the cond under tf.control_dependencies([the optimizer's op that "
                    "increments the step]), or increment the step under the cond's")


def lowered(extracted: ExtractedGraph, cond: tf.Operation, negated: bool, offset: int = 0,
            key: str = "condition",
            label: str = "the predicate of the tf.cond applying the updates") -> Schedule:
    """The cond's predicate (negated: its negation) as a schedule of float32 1 / 0 (`key`
    its hyper_parameter), read after the step's increment when `offset` is 1."""
    try:
        return lower_predicate(extracted, executed_graph(extracted), Scheduled(
            key, cond, cond.inputs[0], label=label, before_increment=not offset), negated)
    except ScheduleRefused as problem:
        raise Refused(str(problem)) from None


def _finite(extracted: ExtractedGraph, cond: tf.Operation) -> tuple[str, frozenset[str]]:
    """What the cond's predicate tests for being finite: "loss" (is_finite of model_fn's
    loss) or "gradients" (reduce_all of is_finite of tensors, returned: the analysis
    compares them with the gradients the updates apply); ("", ()) for anything else."""
    predicate = skip_identity(cond.inputs[0])
    loss = extracted.spec.loss
    if predicate.op.type == "IsFinite" and loss is not None and \
            skip_identity(predicate.op.inputs[0]) is skip_identity(loss):
        return "loss", frozenset()
    try:
        return "gradients", frozenset(checked_gradients(cond, Refused("")))
    except Refused:
        return "", frozenset()


def _writes_besides_step(train, cond: tf.Operation) -> bool:
    step = global_step(cond.graph)
    return any(is_write(op) and variable_op(op.inputs[0]).name != step
               for op in op_closure(train))


def _check_nested(cond: tf.Operation) -> None:
    """A cond's branches hold no further tf.cond or loop that writes (at any depth): the CS
    carries out the writes of the branches themselves."""
    for branch in (cond._true_graph, cond._false_graph):
        for op in branch.get_operations():
            inner = [getattr(op, k) for k in ("_true_graph", "_false_graph", "_body_graph")
                     if hasattr(op, k)]
            if op.type in ("While", "StatelessWhile") and not inner or \
                    any(writes_variable(g, deep=True) for g in inner):
                raise fail(cond, f"a {op.type} inside the tf.cond applying the updates writes "
                                 "variables: the CS carries out the writes of the cond's "
                                 "branches themselves", hint="write them in the cond's branch")


def check_predicate(graph: tf.Graph, cond: tf.Operation, predicate: tf.Tensor) -> None:
    """The predicate reads no input of the model and no variable but the global step."""
    step = global_step(graph)
    upstream = sorted(data_upstream(predicate.op), key=lambda op: op.name)
    inputs = [op.name for op in upstream if op.type == "Placeholder"]
    variables = [op.name for op in upstream if op.type in ("VarHandleOp", "VariableV2")
                 and op.name != step]
    if inputs or variables:
        what = f"the batch ({', '.join(inputs)})" if inputs else f"the variable {variables[0]}"
        raise fail(predicate.op, f"the tf.cond applying the updates decides from {what}: {WHAT}",
                   hint="compute the predicate from tf.compat.v1.train.get_global_step() and "
                        "constants, e.g. tf.equal((step + 1) % n, 0)")


def _merged(cond: tf.Operation, first: list[tf.Operation], second: list[tf.Operation],
            ) -> tuple[list[tf.Operation], tuple[tuple[str, bool], ...]]:
    """The writes of both branches (imported: the true one's `first`), what both write once,
    and the variables one branch alone writes (and whether it is the true one; what each
    write is, the step's analysis proves: an update, a clip after it); what both write,
    written alike."""
    ones: dict[str, list[tf.Operation]] = {}
    others: dict[str, list[tf.Operation]] = {}
    for ops, found in ((first, ones), (second, others)):
        for op in ops:
            found.setdefault(variable_op(op.inputs[0]).name, []).append(op)
    for name in sorted(ones.keys() & others.keys()):
        if len(ones[name]) != len(others[name]) or not all(
                _alike(x, y, {}) for x, y in zip(ones[name], others[name])):
            raise fail(cond, f"the tf.cond's branches write {name} differently: the CS carries "
                             "out branches that apply one optimizer, each updating some "
                             "variables")
    only = tuple([(n, True) for n in ones if n not in others] +
                 [(n, False) for n in others if n not in ones])
    return [*(op for ops in ones.values() for op in ops),
            *(op for n, holds in only if not holds for op in others[n])], only


def _alike(x: tf.Operation, y: tf.Operation, seen: dict) -> bool:
    """Whether two ops compute the same: one op, equal constants, or one type and attributes
    over alike inputs."""
    if x is y:
        return True
    if (x, y) not in seen:
        if x.type == "Const" and y.type == "Const":
            a, b = tf.get_static_value(x.outputs[0]), tf.get_static_value(y.outputs[0])
            seen[x, y] = a.dtype == b.dtype and np.array_equal(a, b)
        else:
            seen[x, y] = x.type == y.type and len(x.inputs) == len(y.inputs) and \
                _attributes(x) == _attributes(y) and all(
                    a.value_index == b.value_index and _alike(a.op, b.op, seen)
                    for a, b in zip(x.inputs, y.inputs))
    return seen[x, y]


def _attributes(op: tf.Operation) -> dict:
    """An op's attributes but TF's own (colocation, control-dependency marks: `_`-named)."""
    return {k: v for k, v in op.node_def.attr.items() if not k.startswith("_")}


def _zeroed(branch, cond: tf.Operation) -> set[str]:
    """The accumulators a branch zeroes (an assign of zeros), each after every read of it in
    the branch."""
    inner_of = {outer.name: inner for inner, outer in zip(branch.inputs, cond.inputs[1:])}
    zeroed = set()
    for op in branch.get_operations():
        if op.type != "AssignVariableOp":
            continue
        value = tf.get_static_value(op.inputs[1])
        if value is None or np.any(value != 0):
            continue
        outer = next((o for o in cond.inputs[1:] if inner_of[o.name] is op.inputs[0]), None)
        if outer is None:
            continue
        reads = [r for r in branch.get_operations() if r.type == "ReadVariableOp"
                 and r.inputs[0] is op.inputs[0]]
        before = set(op_closure(op))
        if any(r not in before for r in reads):
            raise fail(cond, f"the tf.cond zeroes {variable_op(outer).name} without waiting "
                             "for its reads (TF may read it before or after the zeroing)",
                       hint="zero the accumulators under tf.control_dependencies([the "
                            "apply_gradients op])")
        zeroed.add(variable_op(outer).name)
    return zeroed


def _outside_writes(train, cond: tf.Operation, zeroed: set[str],
                    ) -> tuple[dict[str, tf.Operation], list[tf.Operation], list[tf.Operation]]:
    """The writes of the train_op outside the cond: each accumulator's add (before the cond,
    of a value not computed from it), {accumulator: its add}; the global step's increments;
    and every other write (updates beside the cond's, or refused: _check_outside)."""
    step = global_step(cond.graph)
    before = set(op_closure(cond))
    adds: dict[str, tf.Operation] = {}
    increments, beside = [], []
    for op in op_closure(train):
        if not is_write(op):
            continue
        target = variable_op(op.inputs[0]).name
        if target == step and op.type in _ADDS and tf.get_static_value(op.inputs[1]) is not None:
            increments.append(op)
        elif target in zeroed and op.type in _ADDS and target not in adds:
            if op not in before:
                raise fail(op, f"the tf.cond applying the updates does not wait for the "
                               f"addition to {target} (TF may read it before or after)")
            if any(variable_op(t).name == target for t in _reads(op.inputs[1])):
                raise fail(op, f"the value added to {target} is computed from it: the CS "
                               "accumulates a sum of gradients")
            adds[target] = op
        else:
            beside.append(op)
    return adds, increments, beside


def _check_outside(cond: tf.Operation, beside: list[tf.Operation],
                   increments: list[tf.Operation], adds: dict[str, tf.Operation],
                   zeroed: set[str]) -> None:
    """With no update beside the cond's: the increments wait for the cond, every other
    write refused; and every accumulator the cond zeroes is added to."""
    for op in increments:
        if cond not in set(op_closure(op)):
            raise fail(op, "the global step's increment does not wait for the tf.cond "
                           "applying the updates: TF may read the step before or after it")
    for op in beside:
        target = variable_op(op.inputs[0]).name
        if op.type in _ADDS:
            raise fail(op, f"the train_op adds to {target} outside the tf.cond applying the "
                           "updates, which does not zero it: the CS carries out accumulators "
                           "the cond applies as gradients and then zeroes",
                       hint="in the cond, after apply_gradients: a.assign(tf.zeros_like(a))")
        raise fail(op, f"a write outside the tf.cond applying the updates ({target}): "
                       f"{WHAT}, every step adding gradients to accumulators and "
                       "incrementing the global step")
    missing = sorted(zeroed.difference(adds))
    if missing:
        raise fail(cond, f"the tf.cond zeroes {missing[0]}, which the train_op does not add "
                         "gradients to: it is no accumulator")


def _reads(tensor: tf.Tensor) -> list[tf.Tensor]:
    return [op.inputs[0] for op in data_upstream(tensor.op)
            if op.type in ("ReadVariableOp", "Identity") and op.inputs]


def _rewire(graph: tf.Graph, adds: dict[str, tf.Operation],
            ) -> tuple[dict[str, str], tuple[tf.Operation, ...]]:
    """Each read of an accumulator among the imported ops replaced by the value added to it:
    ({that value's tensor: the accumulator}, the ops reading it)."""
    handles = {variable_op(op.inputs[0]): name for name, op in adds.items()}
    added, users = {}, []
    for op in graph.get_operations():
        if not op.name.startswith(_PREFIX + "/") or op.type != "ReadVariableOp" or \
                variable_op(op.inputs[0]) not in handles:
            continue
        name = handles[variable_op(op.inputs[0])]
        value = adds[name].inputs[1]
        added[value.name] = name
        for user in list(op.outputs[0].consumers()):
            user._update_input(list(user.inputs).index(op.outputs[0]), value)
            users.append(user)
    return added, tuple(users)


def _applied_only(op: tf.Operation, applies: set[tf.Operation]) -> bool:
    """Whether `op` is one of `applies`, or Identity ops passing its value to them only."""
    if op.type == "Identity":
        return all(_applied_only(c, applies) for c in op.outputs[0].consumers())
    return op in applies
