"""tf.conds whose predicate is known when model_fn builds its graph: tf.image.rot90(x, k) of a
Python int k is a tf.case of three tf.conds on k % 4 == 1, 2, 3 (TF builds the If ops, its
Session runs the branch the constant predicate takes). The CS has no kernel for an If, so during
recurrences' second build of model_fn such a tf.cond builds its taken branch alone, in the
graph (the transpose and reverse the rotation computes); recurrences then proves the rebuilt
graph computes the user's loss and gradients. A predicate that reads the batch, a variable or a
random value builds TF's own cond (the matcher refuses it as before)."""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import tensorflow as tf
from tensorflow.python.framework.func_graph import FuncGraph
from tensorflow.python.ops import cond_v2

from coordinator.compiler.static_loops import NotStatic, build_time_value, recorded

CONDS = ("If", "StatelessIf")


def _taken(pred: Any) -> bool | None:
    """The branch a cond of predicate `pred` takes, known at build time (True: its true_fn),
    else None."""
    if not isinstance(pred, tf.Tensor):
        return None
    if isinstance(pred.graph, FuncGraph):  # (a branch or loop body traced: no Session runs it)
        static = tf.get_static_value(pred)
        return None if static is None else bool(static)
    try:
        return bool(build_time_value(pred))
    except NotStatic:
        return None


def has_constant_conds(graph: tf.Graph) -> bool:
    """Whether `graph` holds a tf.cond whose predicate is known at build time."""
    return any(op.type in CONDS and _taken(op.inputs[0]) is not None
               for op in graph.get_operations())


def _taken_branch(original: Callable) -> Callable:
    def cond(pred: Any, true_fn: Callable, false_fn: Callable, name: str = "cond") -> Any:
        taken = _taken(pred)
        if taken is None:
            return original(pred, true_fn, false_fn, name)
        with tf.name_scope(name or "cond"):  # (its ops name no op the user names after it)
            return tf.nest.map_structure(lambda x: _output(x, pred),
                                         (true_fn if taken else false_fn)())
    return cond


def _output(value: Any, pred: tf.Tensor) -> Any:
    """A branch's output as the cond returns it: a tensor's identity, an op's the predicate
    after it (a tf.debugging assertion's guard), None as None."""
    if value is None:
        return None
    if isinstance(value, tf.Operation):
        with tf.control_dependencies([value]):
            return tf.identity(pred)
    return tf.identity(value)


@contextlib.contextmanager
def taken_branches() -> Iterator[set[str]]:
    """tf.conds built meanwhile whose predicate is known at build time build their taken
    branch alone; yields the names of the ops they add (the user's graph has none of them)."""
    original, created = cond_v2.cond_v2, set[str]()
    cond_v2.cond_v2 = recorded(_taken_branch(original), created)
    try:
        yield created
    finally:
        cond_v2.cond_v2 = original
