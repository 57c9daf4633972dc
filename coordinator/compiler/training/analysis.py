"""The pass: writes and updates, gradients, numbers, schedules, in that order; every problem
of a stage reported at once."""
from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np
import tensorflow as tf

from common.errors import CSRunError
from coordinator.compiler.extract import (
    ExtractedGraph,
    data_upstream,
    op_closure,
    user_name,
    user_source,
)
from coordinator.compiler.ir import (
    GatedStateWrite,
    Objective,
    StatisticAverage,
    TrainedVariable,
    TrainingSpec,
)
from coordinator.compiler.schedules import Scheduled, ScheduleRefused, lower_schedules
from coordinator.compiler.training import conditional as training_conditional
from coordinator.compiler.training import loss_scaling
from coordinator.compiler.training.copies import conditional_writes
from coordinator.compiler.training.gradient_program import GradientPrograms
from coordinator.compiler.training.gradients import (
    TRANSFORMS,
    densified,
    gradient_calls,
    gradient_chain,
    group_order,
    in_scope,
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
from coordinator.compiler.training.noise import check_moving_shift, floored
from coordinator.compiler.training.numbers import (
    GRADIENT_NOISE,
    HALF_GRADIENT_NOISE,
    HALF_GRADIENT_RTOL,
    check_numbers,
)
from coordinator.compiler.training.reupdates import check_reupdates
from coordinator.compiler.training.shift import normalized_ends, zero_gradients
from coordinator.compiler.training.transforms import fold_loss_scale
from coordinator.compiler.training.updates import SUPPORTED, Update, check_dtypes, check_slots
from coordinator.compiler.training.writes import Average, Write, bookkeeping, is_write, train_op_writes
from wafer.conditional_updates import ConditionalUpdate
from wafer.grad_transforms import GradientTransform
from wafer.loss_scaling import Rule
from wafer.moving_averages import FACTOR, MovingAverage
from wafer.optimizers import OptimizerGroup, Reupdate
from wafer.schedules import ScalarOp, Schedule
from wafer.weight_writes import FACTOR as FACTOR_OF_WRITE
from wafer.weight_writes import WeightWrite, WriteStep


def analyze_training(extracted: ExtractedGraph, half: bool = False,
                     normalized: Mapping[str, frozenset[str]] | None = None) -> TrainingSpec:
    """The TrainingSpec of extracted.spec.train_op, or CSRunError listing every problem
    (one line each: op, what is wrong, the user's source line). `half`: the forward graph
    computes in float16 (mixed precision). `normalized`: the batch normalizations in
    training, {the tensor normalized: the ops computing it} (shift.zero_gradients)."""
    try:
        return _analyze(extracted, half, normalized or {})
    except _Problems as problems:
        lines, hint = list(dict.fromkeys(problems.lines)), problems.hint
    raise CSRunError(lines[0],
                     hint or f"train with optimizers the CS carries out ({SUPPORTED}; constant "
                     "hyper-parameters or schedules of the global step, float32) minimizing "
                     f"model_fn's loss, gradients changed only by {TRANSFORMS}",
                     detail="Training problems:\n" + "\n".join(f"  {line}" for line in lines))


class _Problems(Exception):
    def __init__(self, lines: list[str], hint: str = ""):
        super().__init__(lines[0])
        self.lines, self.hint = lines, hint


def _analyze(extracted: ExtractedGraph, half: bool,
             normalized: Mapping[str, frozenset[str]]) -> TrainingSpec:
    if extracted.spec.train_op is None:
        raise _Problems(["model_fn returned no train_op in train mode"])
    with extracted.graph.as_default():
        statistic_averages: list[StatisticAverage] = []
        original = extracted
        try:
            conditional = training_conditional.inline(extracted)
            dynamic = loss_scaling.inline(extracted) if conditional is None else None
            if dynamic is not None:
                extracted = dynamic.view
            if conditional is not None:
                extracted = conditional.view
            states: list[tf.Operation] = []
            again: list[Update] = []
            updates, averages, written = train_op_writes(
                extracted, statistic_averages, states,
                dict.fromkeys(conditional.branch_of, conditional.cond) if conditional else None,
                again)
            gated: list[GatedStateWrite] = []
            written += conditional_writes(original, updates, written, gated)
            check_reupdates(updates, again, written)
            if again and (conditional is not None or dynamic is not None or half):
                raise fail(again[0].op, f"{again[0].variable} is updated by two optimizers "
                                        "with updates inside a tf.cond, loss scaling or a "
                                        "float16 model: the CS reupdates a weight in float32 "
                                        "steps that apply every update")
            condition = None
            if conditional is not None:
                condition = conditional.update(updates)
                written = _gated(conditional, written)
                _alone(condition, averages, [] if conditional.delayed else written)
                if conditional.delayed and not condition.both:
                    condition = None  # (the cond gates writes alone: each its predicate's)
            groups = optimizer_groups(updates, again)
            if dynamic is not None and groups:
                raise fail(updates[-1].op, "dynamic loss scaling with several optimizers: the "
                                           "CS carries it out for one; train without it")
            if (states or gated) and (conditional is not None or dynamic is not None):
                first = states[0] if states else extracted.graph.get_operation_by_name(gated[0].op)
                raise fail(first, f"a write of {variable_op(first.inputs[0]).name} from the "
                                      "batch's values with updates inside a tf.cond or "
                                      "dynamic loss scaling: the CS writes such state every "
                                      "step; train without the cond or the loss scaling")
            if dynamic is not None and written:
                raise fail(written[0].op, "a write of a weight besides its update with dynamic "
                                          "loss scaling: the CS does not skip it with a "
                                          "skipped step; train without one")
            check_dtypes(extracted, updates + again)
            check_slots(updates)
            check_slots(again, named=False)
        except Refused as problem:
            raise _Problems([str(problem)], problem.hint) from None
        calls = gradient_calls(extracted, updates)
        norms: dict = {}
        programs = GradientPrograms(extracted, lambda op: in_scope(op, calls) is not None
                                    or densified(op, calls) is not None)
        chains, problems, hints = [], [], []
        for u in updates + again:  # (the weights' first updates, then their reupdates)
            try:
                chains.append(gradient_chain(u, calls, norms, programs))
            except Refused as problem:
                problems.append(str(problem))
                hints.append(problem.hint)
        if problems:
            raise _Problems(problems, hints[0])
        chains, again_chains = chains[:len(updates)], chains[len(updates):]
        try:
            objectives = _objectives(extracted, chains, dynamic is not None or half, again_chains)
            reupdates = _reupdates(extracted, chains, again_chains, objectives, updates)
            if objectives and conditional is not None and not conditional.delayed:
                raise fail(chains[0].update.op, "several losses minimized in one step with "
                                                "updates inside a tf.cond: the CS carries out "
                                                "the cond for one loss")
        except Refused as problem:
            raise _Problems([str(problem)], problem.hint) from None
        zeroed = tuple(v for loss, names in _losses(extracted, chains)
                       for v in zero_gradients(loss, [u.variable for u in updates if u.indices
                                                      is None and u.variable in names],
                                               normalized))
        zeroed_again = next((c for c in again_chains if c.update.indices is None and zero_gradients(
            c.call.objective if c.call.objective is not None else extracted.spec.loss,
            [c.update.variable], normalized)), None)
        try:
            if zeroed_again is not None:
                raise fail(zeroed_again.update.op, f"{zeroed_again.update.variable}, which two "
                                                   "optimizers update, has a gradient 0 in exact "
                                                   "arithmetic (a shift a softmax or batch "
                                                   "normalization cancels; TF's is rounding "
                                                   "noise): the CS zeroes a weight's first "
                                                   "update's gradient alone")
            group_order(chains)
            _clipped_apart(chains, objectives)
            noise = HALF_GRADIENT_NOISE if half else GRADIENT_NOISE
            if half:
                largest = check_numbers(extracted, chains, statistic_averages, HALF_GRADIENT_RTOL,
                                        noise, zeroed,
                                        dynamic.proof_scale if dynamic is not None else None)
            else:
                largest = check_numbers(extracted, chains + again_chains, statistic_averages,
                                        zeroed=zeroed)
            check_moving_shift(extracted.graph, {
                u.variable: (u.optimizer, normalized_ends(loss, u.variable, normalized))
                for loss, names in _losses(extracted, chains) for u in updates
                if u.variable in zeroed and u.variable in names}, normalized, statistic_averages,
                largest, noise)
            noise_floored = () if half else tuple(  # (float16's noise is real gradients' size)
                v for loss, names in _losses(extracted, chains) for v in floored(loss, {
                    u.variable: u.optimizer for u in updates if u.indices is None
                    and u.variable not in zeroed and u.variable in names}, largest, noise))
            transforms, loss_scale = fold_loss_scale(chains, half)
            scaling = None
            if dynamic is not None:
                transforms, scaling = _dynamic(chains, transforms, loss_scale, half, dynamic,
                                               averages)
                loss_scale = dynamic.initial
        except Refused as problem:
            raise _Problems([str(problem)], problem.hint) from None
        if zeroed:  # (last: the other transforms and the finite test read TF's gradient)
            transforms = [*transforms, GradientTransform("zero", variables=zeroed)]
        if noise_floored:
            transforms = [*transforms, GradientTransform("noise_floor", GRADIENT_NOISE,
                                                         variables=noise_floored)]
        try:
            schedules, moving, writes = _schedules(extracted, updates + again, averages, written)
        except ScheduleRefused as problem:
            raise _Problems([str(problem)]) from None
    variables = tuple(TrainedVariable(u.variable, "dense" if u.indices is None else "sparse",
                                      u.slots, user_source(u.op)) for u in updates)
    return TrainingSpec(updates[0].optimizer, variables, tuple(transforms), groups,
                        loss_scale=loss_scale,
                        schedules=schedules, moving_averages=moving, weight_writes=writes,
                        statistic_averages=tuple(statistic_averages),
                        dynamic_loss_scale=scaling,
                        step_counts_applied=dynamic.step_counts_applied if dynamic is not None
                        else conditional is not None and conditional.counts_applied,
                        objectives=objectives, conditional_update=condition,
                        state_writes=(*(op.name for op in states), *(g.op for g in gated)),
                        gated_state_writes=tuple(gated), reupdates=reupdates)


def _gated(conditional: training_conditional.Inlined, written: list[Write]) -> list[Write]:
    """The writes of the cond's branches (updates beside the cond) with their branch's
    predicate; a factor computed per step, refused."""
    found = []
    for w in written:
        gate = conditional.gated(w.op)
        if gate is not None:
            if any(uniform(t) is None for t, _ in w.factors):
                raise fail(conditional.cond, f"the tf.cond writes {w.variable} with a factor "
                                             "computed per step: the CS writes under a "
                                             "tf.cond with constant factors")
            w = dataclasses.replace(w, predicate=dataclasses.replace(
                gate[0], hyper_parameter=FACTOR_OF_WRITE), predicate_offset=gate[1])
        found.append(w)
    return found


def _alone(condition: ConditionalUpdate, averages: list[Average], written: list[Write]) -> None:
    """What the CS does not carry out with an update cond, refused."""
    what = next((f"an ExponentialMovingAverage of {a.variable}" for a in averages), "") or \
        next((f"a write of {w.variable} besides its update" for w in written), "")
    if what:
        op = averages[0].op if averages else written[0].op
        raise fail(op, f"{what} with updates inside a tf.cond ({condition.source}): the CS "
                       "carries out the cond's optimizer updates alone; train without it")


def _losses(extracted: ExtractedGraph, chains: list) -> list[tuple[tf.Tensor, set[str]]]:
    """Each loss the updates minimize (model_fn's, or each objective) and their variables,
    in the order of their first update."""
    found: dict[str, tuple[tf.Tensor, set[str]]] = {}
    for c in chains:
        loss = c.call.objective if c.call.objective is not None else extracted.spec.loss
        found.setdefault(loss.name, (loss, set()))[1].add(c.update.variable)
    return list(found.values())


def _clipped_apart(chains: list, objectives: tuple[Objective, ...]) -> None:
    """A clip_by_global_norm over several losses' gradients, refused: the CS transforms each
    loss's gradients after its own backward pass."""
    owner = {v: k for k, o in enumerate(objectives) for v in o.variables}
    if not owner:
        return
    for step in (s for c in chains for s in c.steps if s.kind == "clip_by_global_norm"):
        if len({owner[v] for v in step.variables}) > 1:
            raise fail(step.anchor, "clip_by_global_norm over the gradients of several losses "
                                    "minimized in one step: the CS transforms each loss's "
                                    "gradients apart; clip each optimizer's gradients by "
                                    "their own norm")


def _unscaled(chain) -> bool:
    """An objective's gradients of S x its loss unscaled by 1 / S (a loss scale optimizer's
    static scale S)."""
    y = chain.call.objective
    if y is None or y.op.type != "Mul" or not chain.steps or chain.steps[0].kind != "scale":
        return False
    return any(s is not None and s != 1.0 and np.isclose(s * chain.steps[0].value, 1.0)
               for s in map(scalar, y.op.inputs))


def _objectives(extracted: ExtractedGraph, chains: list, scaling: bool,
                again: list) -> tuple[Objective, ...]:
    """The objectives when the updates minimize several losses (a GAN's; `again`: the
    chains of weights' further optimizers, whose losses are objectives too, their weights
    the first update's); what the CS does not carry out with them (loss scaling: one scale
    seeds one backward pass; `scaling`: a float16 model's, or dynamic), refused."""
    losses = _losses(extracted, chains)
    named = {loss.name for loss, _ in losses}
    further: list[tuple[tf.Tensor, set[str]]] = [
        (loss, set()) for loss, _ in _losses(extracted, again) if loss.name not in named]
    if len(losses) == 1 and not further and losses[0][0] is not extracted.spec.loss:
        loss = extracted.spec.loss
        raise fail(chains[0].update.op, f"the train_op minimizes {losses[0][0].name} computed "
                                        f"at {user_source(losses[0][0].op)}, not the loss "
                                        f"model_fn returns ({loss.name} at "
                                        f"{user_source(loss.op)})")
    if again and len(losses) + len(further) < 2:
        raise fail(again[0].update.op, f"{again[0].update.variable} is updated by two "
                                       "optimizers minimizing one loss: the CS reupdates a "
                                       "weight from another loss's backward pass",
                   hint="minimize the loss with one optimizer")
    if len(losses) < 2 and not further:
        return ()
    scaled = next((c for c in chains + again if c.call.scale != 1.0 or _unscaled(c)), None)
    if scaling or scaled is not None:
        raise fail(chains[0].update.op if scaled is None else scaled.update.op,
                   "loss scaling (or a float16 model) with several losses minimized in one "
                   "step: the CS scales one loss's backward pass; train them in float32 "
                   "without loss scaling")
    _read_before_updates(_losses(extracted, chains + again), chains + again, step_runs(extracted),
                         extracted.spec.loss)
    order = [c.update.variable for c in chains]
    return tuple(Objective(loss.name, tuple(v for v in order if v in names),
                           user_source(loss.op)) for loss, names in losses + further)


def _reupdates(extracted: ExtractedGraph, chains: list, again: list,
               objectives: tuple[Objective, ...], updates: list[Update]) -> tuple[Reupdate, ...]:
    """The further optimizers' updates of weights (reupdates.py) in graph order, each with
    its optimizer's index (optimizer_groups') and its loss's objective; a transform of any
    gradient beside them, refused (the CS transforms a pass's gradients of its own
    objective's weights)."""
    if not again:
        return ()
    steps = next((c for c in chains + again if c.steps), None)
    if steps is not None:
        raise fail(steps.update.op, f"gradient transforms ({steps.steps[0].kind}) with "
                                    f"{again[0].update.variable} updated by two optimizers: "
                                    "the CS reupdates a weight from its loss's raw gradient")
    keys = list(dict.fromkeys(map(_group_key, [*updates, *(c.update for c in again)])))
    losses = [o.loss for o in objectives]
    return tuple(Reupdate(c.update.variable, keys.index(_group_key(c.update)),
                          losses.index((c.call.objective if c.call.objective is not None
                                        else extracted.spec.loss).name),
                          c.update.slots, user_source(c.update.op)) for c in again)


def _read_before_updates(losses: list[tuple[tf.Tensor, set[str]]], chains: list,
                         runs: set[tf.Operation], loss: tf.Tensor) -> None:
    """A loss reading a weight another loss's optimizer updates reads it in that loss's
    forward pass too, or before the update (the update waits for the read): the ordering
    TF gives one loss and its update, which the CS gives (every read before any update). A
    read of a pass of its own with no order to the update (another batch of fakes through
    the generator: TF reads before or after the update, by chance) is refused, unless the
    step never runs it (`runs`: a DDPG actor loss's read of the critic's output bias, which
    its gradient does not need and nothing fetches). A weight several optimizers update
    (reupdates.py): each read before every update of another loss. `loss`: model_fn's."""
    index = {y.name: j for j, (y, _) in enumerate(losses)}
    updates: dict[str, list[tuple[tf.Operation, int]]] = {}  # variable -> (update, its loss)
    for c in chains:
        minimized = c.call.objective if c.call.objective is not None else loss
        updates.setdefault(c.update.variable, []).append((c.update.op, index[minimized.name]))
    forward = [set(data_upstream(y.op)) for y, _ in losses]
    closures: dict[tf.Operation, set[tf.Operation]] = {}
    for k, (y, _) in enumerate(losses):
        for read in sorted(forward[k], key=lambda op: op._id):
            if read.type not in ("ReadVariableOp", "Identity") or not read.inputs or \
                    read not in runs:
                continue
            variable = variable_op(read.inputs[0]).name
            for update, j in updates.get(variable, ()):
                if j == k or read in forward[j]:
                    continue
                if update not in closures:
                    closures[update] = set(op_closure(update))
                if read in closures[update]:
                    continue
                raise fail(read, f"{y.name} reads {variable}, which another loss's "
                                 f"optimizer updates in the step, with no order to that "
                                 f"update ('{user_name(update)}' at {user_source(update)}: "
                                 f"TF reads it before or after the update, by "
                                 f"chance); compute the losses from one forward pass, or "
                                 f"make the update wait for the read",
                           hint="compute every loss's gradients first (compute_gradients), "
                                "then apply them under tf.control_dependencies([every "
                                "gradient])")


def optimizer_groups(updates: list[Update],
                     again: Sequence[Update] = ()) -> tuple[OptimizerGroup, ...]:
    """The optimizers besides the first update's and the variables each updates first (two
    minimize calls with the same hyper-parameters, and no scalars of their own, are one;
    `again`: weights' further updates, whose optimizers may update no weight first)."""
    by_key: dict[tuple, list[str]] = {}
    for u in updates:
        by_key.setdefault(_group_key(u), []).append(u.variable)
    for u in again:
        by_key.setdefault(_group_key(u), [])
    return tuple(OptimizerGroup(key[0], tuple(names)) for key, names in list(by_key.items())[1:])


def _group_key(u: Update) -> tuple:
    """What makes updates one optimizer: its constant hyper-parameters and the tensors of its
    scheduled ones (two SGDs on schedules of their own are two)."""
    return u.optimizer, tuple(sorted((key, t.name) for key, (_, t) in u.scheduled.items()))


def _dynamic(chains: list, transforms: list[GradientTransform], loss_scale: float, half: bool,
             dynamic: loss_scaling.Inlined, averages: list[Average],
             ) -> tuple[list[GradientTransform], Rule]:
    """The transforms without the leading 1 / P (the CS unscales by the current S), after
    the static proof with S pinned to P (loss_scaling.PROOF_SCALE); and S's initial value
    as the loss scale; what the CS does not carry out with it, refused."""
    anchor = chains[0].update.op
    if dynamic.checked != {skip_identity(c.update.grad).name for c in chains}:
        raise fail(anchor, "dynamic loss scaling checks other tensors than the gradients the "
                           "optimizer applies for being finite: not TensorFlow's rule nor "
                           "the CS-1's")
    if not half:
        raise fail(anchor, "dynamic loss scaling of a float32 model: the CS carries it out "
                           "for float16 (mixed precision) models; train without it")
    if averages:
        raise fail(averages[0].op, "an ExponentialMovingAverage with dynamic loss scaling: the "
                                   "CS does not skip it with a skipped step; train without one")
    unscale = float(np.float32(1.0) / np.float32(loss_scaling.PROOF_SCALE))
    first = transforms[0] if transforms else None
    if loss_scale != loss_scaling.PROOF_SCALE or first is None or first.kind != "scale" or \
            first.value != unscale or set(first.variables) != {c.update.variable for c in chains}:
        raise fail(anchor, "the loss scale's reads do not scale the loss and unscale every "
                           "gradient first: not TensorFlow's dynamic loss scaling")
    return transforms[1:], dynamic.rule


def _schedules(extracted: ExtractedGraph, updates: list[Update], averages: list[Average],
               written: list[Write]):
    """The schedules of the hyper-parameters the updates read per step, the moving averages
    and the weight writes with their factors (coordinator.compiler.schedules: lowered from
    the graph TF executes; a constant factor is its value)."""
    train = extracted.spec.train_op
    increments = [op for op in op_closure(train) if is_write(op) and op.type in (
        "AssignAddVariableOp", "AssignAdd") and bookkeeping(op, extracted.graph)]
    groups = list(dict.fromkeys(map(_group_key, updates)))  # (optimizer_groups' order: the
    # first updates come first in `updates`, then the further ones)
    items = [Scheduled(key, reader, tensor, name=f"{key}@{groups.index(_group_key(u))}")
             for u in updates for key, (reader, tensor) in u.scheduled.items()]
    offsets = {}
    for a in averages:
        offsets[a.shadow] = int(bool(increments) and increments[0] in set(op_closure(a.op)))
        items.append(Scheduled(FACTOR, a.mul, a.factor, name=a.shadow,
                               before_increment=not offsets[a.shadow],
                               label=f"the decay of the ExponentialMovingAverage of {a.variable}"))
    write_offsets, constants = {}, {}
    for w in written:
        offset = set()
        for k, (tensor, reader) in enumerate(w.factors):
            name = f"{w.variable}/{FACTOR_OF_WRITE}_{k}"
            value = uniform(tensor)  # (writes.py: a scalar, or one not shaping its reader)
            if value is not None:
                constants[name] = Schedule(FACTOR_OF_WRITE, (ScalarOp(
                    "const", "float32", value=float(np.float32(value))),), tensor.name,
                    user_source(tensor.op))
                continue
            late = bool(increments) and all(
                increments[0] in set(op_closure(r)) for r in data_upstream(tensor.op)
                if r.type in ("ReadVariableOp", "Identity") and variable_op(r.outputs[0]) is
                variable_op(increments[0].inputs[0]))
            offset.add(int(late))
            items.append(Scheduled(FACTOR_OF_WRITE, reader, tensor, name=name,
                                   before_increment=not late,
                                   label=f"a factor of the write of {w.variable} ('{w.op.name}')"))
        if w.predicate is not None:
            offset.add(w.predicate_offset)
        if len(offset) > 1:
            raise ScheduleRefused(f"the write of {w.variable} reads the global step before and "
                                  f"after the step's increment ({w.op.type} '{w.op.name}' at "
                                  f"{user_source(w.op)})")
        write_offsets[w.variable] = offset.pop() if offset else 0
    written_vars = {variable_op(op.inputs[0]).name for op in op_closure(train) if is_write(op)}
    lowered = {**lower_schedules(extracted, items, written_vars), **constants}
    schedules = tuple(dataclasses.replace(lowered[f"{key}@{index}"], optimizer=index)
                      for key, index in dict.fromkeys(
                          (key, groups.index(_group_key(u))) for u in updates
                          for key in u.scheduled))
    moving = tuple(MovingAverage(a.variable, a.shadow, lowered[a.shadow], offsets[a.shadow])
                   for a in averages)
    writes = tuple(WeightWrite(
        w.variable, tuple(WriteStep(op, inputs) for op, inputs in w.steps),
        tuple(lowered[f"{w.variable}/{FACTOR_OF_WRITE}_{k}"] for k in range(len(w.factors))),
        w.before_update, write_offsets[w.variable], user_source(w.op), w.sources, w.predicate)
        for w in written)
    return schedules, moving, writes
