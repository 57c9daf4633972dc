"""Updates inside a tf.cond on a value of the global step (gradient accumulation, applying
every N steps) or on the loss or the gradients being finite (skipping a step that diverged).

A train_op may apply its updates inside a tf.cond whose predicate is computed from the
global step and constants (`(step + 1) % n == 0`). Its `ConditionalUpdate` holds the
predicate as a scalar program (wafer.schedules, float32 1 or 0) and the accumulators: a
non-trainable variable per trained weight to which every step adds the weight's gradient
(after the transforms), and which the update applies as the gradient, then zeroes, when the
predicate holds. Each step, before its update, the CS evaluates the predicate at the global
step the batch trains from; when it is 0 no update of the step runs (weights, slots, the
optimizer's bookkeeping), as TF's cond runs no branch op. When both branches apply the
optimizer (a warm-up training a head alone for K steps), each to some variables, or the
train_op updates other variables every step beside the cond (TD3's actor every d steps
beside its critic; a WGAN's generator every n_critic steps), a variable one branch alone
updates is updated on the steps that take it, the others every step, and an optimizer's
bookkeeping (Adam's beta powers) runs on the steps it updates a variable (TF's are in the
branch of its apply ops). The predicate reads the global step before the step's increment,
or after it (`step_offset` 1), as the graph orders it. The accumulators are job state,
checkpointed under their TF names. With `finite` instead of a predicate the updates run when
the batch's loss ("loss": TF's is_finite of the scalar loss) or every gradient the optimizer
applies ("gradients", after the transforms) is finite: known once the batch's gradients are
complete, before any update.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from wafer.schedules import Schedule, evaluate, schedule_problem

FINITE = ("loss", "gradients")


@dataclass(frozen=True)
class ConditionalUpdate:
    predicate: Schedule | None  # 1: the step's updates run; 0: none does
    accumulators: tuple[tuple[str, str], ...] = ()  # (trained variable, its accumulator)
    source: str = ""  # the user's tf.cond
    finite: str = ""  # (no predicate) the updates run when this (FINITE) is finite
    # updates in both branches: the variables updated only when the predicate holds, and
    # only when it fails; the step's other updates (and the optimizer's bookkeeping) run
    if_true: tuple[str, ...] = ()
    if_false: tuple[str, ...] = ()
    step_offset: int = 0  # 1: the predicate reads the global step after the step's increment

    @property
    def both(self) -> bool:
        """Both branches update (each some variables)."""
        return bool(self.if_true or self.if_false)

    def skipped(self, holds: bool) -> frozenset[str]:
        """The variables not updated in a step whose predicate holds or fails."""
        return frozenset(self.if_false if holds else self.if_true)

    def runs(self, step: int, variables: Mapping[str, np.ndarray]) -> bool:
        """Whether the updates of the step training from global step `step` run (a
        predicate's)."""
        assert self.predicate is not None
        return bool(evaluate(self.predicate, step + self.step_offset, variables) != 0)

    def to_message(self, pb):
        message = pb.ConditionalUpdate(variables=[v for v, _ in self.accumulators],
                                       accumulators=[a for _, a in self.accumulators],
                                       source=self.source, finite=self.finite,
                                       if_true=self.if_true, if_false=self.if_false,
                                       step_offset=self.step_offset)
        if self.predicate is not None:
            message.predicate.CopyFrom(self.predicate.to_message(pb))
        return message

    @classmethod
    def from_message(cls, message) -> "ConditionalUpdate":
        predicate = Schedule.from_message(message.predicate) if message.HasField("predicate") \
            else None
        return cls(predicate, tuple(zip(message.variables, message.accumulators)),
                   message.source, message.finite, tuple(message.if_true),
                   tuple(message.if_false), int(message.step_offset))


def accumulate(update: ConditionalUpdate, gradients: Mapping[str, np.ndarray],
               state: Mapping[str, np.ndarray], applying: bool) -> None:
    """Each accumulator plus its weight's gradient (float32, TF's AssignAdd); when the step
    applies, the gradient becomes the sum and the accumulator 0 (TF's zeroing assign)."""
    for variable, accumulator in update.accumulators:
        total = state[accumulator]
        np.add(total, gradients[variable], out=total)
        if applying:
            np.copyto(gradients[variable], total)
            total.fill(0)


def problem(update: ConditionalUpdate, trained: Mapping[str, str]) -> str:
    """Why the CS cannot carry `update` out, or "": `trained` maps each trained weight to its
    update ("dense", "sparse")."""
    if (update.predicate is None) == (not update.finite) or \
            update.finite not in ("", *FINITE) or update.finite and update.accumulators:
        return f"a predicate or a finite test ({', '.join(FINITE)}) without accumulators needed"
    if update.both and (update.finite or update.accumulators):
        return "updates in both branches with a finite test or accumulators"
    if update.step_offset not in (0, 1) or update.step_offset and update.predicate is None:
        return f"a step offset of {update.step_offset} (0 or 1, with a predicate)"
    gated = [*update.if_true, *update.if_false]
    if len(set(gated)) != len(gated) or any(trained.get(v) is None for v in gated):
        return "a variable updated under the predicate is no trained weight, or named twice"
    why = schedule_problem(update.predicate) if update.predicate is not None else ""
    if why:
        return f"its predicate: {why}"
    variables = [v for v, _ in update.accumulators]
    accumulators = [a for _, a in update.accumulators]
    if len(set(variables)) != len(variables) or len(set(accumulators)) != len(accumulators):
        return "a variable or an accumulator named twice"
    for variable, accumulator in update.accumulators:
        if trained.get(variable) != "dense":
            return f"{variable!r} is not a densely trained weight of the program"
        if accumulator in trained or not accumulator:
            return f"the accumulator {accumulator!r} is a weight of the program"
    return ""
