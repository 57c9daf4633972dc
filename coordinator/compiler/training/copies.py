"""Writes of weights the step does not train under a tf.cond on the global step: a DQN's
hard copy of its Q network into the target network every N steps (`tf.cond(tf.equal(step %
N, 0), lambda: tf.group(*[t.assign(o) ...]), tf.no_op)` under
tf.control_dependencies([the optimizer's op])), or a soft update every N steps.

One branch writes, each write an assignment of a computed value (writes.copies_only); its
writes are imported into the graph (loss_scaling.import_branch) and proven as soft updates
(writes.weight_write, ordered by the cond: the cond waits for the sources' updates or they
for it, and for the step's other reads of the target); the predicate, computed from the
global step and constants, is lowered to 1 / 0 (read before or after the step's
increment, as the cond orders it)."""
from __future__ import annotations

import dataclasses

import tensorflow as tf

from coordinator.compiler.extract import ExtractedGraph, data_upstream, op_closure
from coordinator.compiler.ir import GatedStateWrite
from coordinator.compiler.training.conditional import check_predicate, lowered, step_read_offset
from coordinator.compiler.training.graph import (
    fail,
    step_runs,
    uniform,
    variable_op,
)
from coordinator.compiler.training.loss_scaling import import_branch
from coordinator.compiler.training.updates import Update
from coordinator.compiler.training.writes import (
    CONDS,
    Write,
    copies_only,
    forward_reads,
    soft_update,
    variable_readers,
    weight_write,
    writes_variable,
)
from wafer.weight_writes import FACTOR

_PREFIX = "csrun_copy"


def conditional_writes(extracted: ExtractedGraph, updates: list[Update],
                       written: list[Write], gated: list[GatedStateWrite]) -> list[Write]:
    """The writes of the train_op's copying conds as soft updates with a predicate, or
    Refused; a write of frozen state from the batch's values (Deep SVDD's center
    `c.assign(tf.reduce_mean(z, 0))` on one step) into `gated`, which the matcher lowers
    (batch_writes.py)."""
    graph = extracted.graph
    conds = [op for op in op_closure(extracted.spec.train_op)
             if op.type in CONDS and copies_only(op)]
    if not conds:
        return []
    by_var = {u.variable: u for u in updates}
    trained = {variable_op(u.op.inputs[0]) for u in updates}
    readers = variable_readers(step_runs(extracted))
    inputs = {extracted.graph.get_tensor_by_name(p).op for p in extracted.placeholders.values()}
    taken = {w.variable for w in written}
    found: list[Write] = []
    for k, cond in enumerate(conds):
        if writes_variable(cond._true_graph) and writes_variable(cond._false_graph):
            raise fail(cond, "both branches of the tf.cond write variables: the CS writes a "
                             "copy on the steps a predicate of the global step holds, in one "
                             "branch", hint="copy in one branch, tf.no_op in the other")
        check_predicate(graph, cond, cond.inputs[0])
        negated = not writes_variable(cond._true_graph)
        branch = cond._false_graph if negated else cond._true_graph
        predicate, offset = _predicate(extracted, cond, negated)
        for op in import_branch(graph, cond, branch, f"{_PREFIX}_{k}"):
            target = variable_op(op.inputs[0]).name
            if target in by_var or target in taken:
                raise fail(cond, f"the tf.cond writes {target}, which the train_op "
                                 f"{'trains' if target in by_var else 'writes besides'}: the "
                                 "CS copies under a tf.cond only into a weight the step does "
                                 "not train and writes once (a target network)",
                           hint="copy into a target network the optimizers do not train")
            if not [r for r in forward_reads(op, readers) if r is not cond]:
                raise fail(cond, f"the tf.cond copies into {target}, which the training step "
                                 "does not read: the CS writes only weights its kernels hold",
                           hint="copy into the target network the loss reads")
            taken.add(target)
            if not soft_update(op, trained) and inputs & set(data_upstream(op)):
                gated.append(GatedStateWrite(op.name, cond.name, predicate, offset))
                continue
            write = weight_write(op, by_var, trained, readers, anchor=cond)
            if any(uniform(t) is None for t, _ in write.factors):
                raise fail(cond, f"the tf.cond writes {target} with a factor computed per "
                                 "step: the CS copies under a tf.cond with constant factors")
            found.append(dataclasses.replace(write, predicate=predicate,
                                             predicate_offset=offset))
    return found


def _predicate(extracted: ExtractedGraph, cond: tf.Operation, negated: bool):
    """The cond's predicate (negated: its negation) as a schedule of float32 1 / 0, and 1 if
    it reads the global step after the step's increment (else 0)."""
    offset = step_read_offset(extracted, cond)
    return lowered(extracted, cond, negated, offset, FACTOR,
                   "the predicate of the tf.cond copying weights"), offset
