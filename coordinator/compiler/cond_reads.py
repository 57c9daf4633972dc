"""A tf.cond the forward pass reads that writes state from the batch's values (Deep SVDD's
center set to the mean of the outputs at step 0, before the loss reads it): refused in the
user's terms, with the form the CS carries out (the write after the step: batch_writes.py,
training/copies.py)."""
from __future__ import annotations

import tensorflow as tf

_ASSIGNS = ("AssignVariableOp", "AssignSubVariableOp", "AssignAddVariableOp", "Assign",
            "AssignSub", "AssignAdd")


def read_in_its_step(m, cond: tf.Operation) -> str:
    """Why the CS cannot compute `cond` (m: the matcher's context, whose `values` are the
    per-sample values), or "" if it writes no state or reads no per-sample value."""
    writes = [(op, branch) for branch in (cond._true_graph, cond._false_graph)
              for op in branch.get_operations() if op.type in _ASSIGNS]
    if not writes or not any(t.name in m.values for t in cond.inputs[1:]):
        return ""
    op, branch = writes[0]
    handle = dict(zip((t.name for t in branch.inputs), cond.inputs[1:])).get(op.inputs[0].name)
    state = handle.op.name if handle is not None and handle.op.type in (
        "VarHandleOp", "VariableV2") else "the variable"
    return (f"the tf.cond sets {state} from the batch's values and the step reads it: each "
            "sample's forward pass would read a value of the whole batch computed in the same "
            "step, and the CS computes each sample's forward pass from the state as the step "
            f"began; set {state} after the step instead: under tf.control_dependencies([the "
            f"optimizer's op]), tf.cond(tf.equal(global_step, 1), lambda: {state}.assign(...), "
            f"lambda: tf.identity({state})) grouped with it in the train_op")
