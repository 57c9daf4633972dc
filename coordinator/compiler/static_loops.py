"""Loops whose number of steps is known when model_fn builds its graph: tf.while_loop (and
tf.compat.v1's) whose condition reads only constants and the loop's own counters (a refinement
of 3 iterations, capsule routing, an Euler integrator of a constant step count, a hand-written
RNN over T steps), and tf.scan over an axis of static length (a custom recurrence over time).
During recurrences' second build of model_fn they run as Python loops, each step's ops once
in the graph, as Keras' unrolled recurrent layers do; recurrences then proves the unrolled
graph computes the user's loss and gradients.

A loop whose condition reads the batch, a variable or a random value, whose loop variables
hold a TensorArray, or that runs more than MAX_STEPS steps builds TF's own While (which the
matcher refuses)."""
from __future__ import annotations

import contextlib
import inspect
from typing import Any, Callable, Iterator

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import func_graph

MAX_STEPS = 256  # a longer loop stays a While: each unrolled step is a copy of its kernels
_RUNTIME = {"Placeholder", "PlaceholderWithDefault", "VarHandleOp", "VariableV2",
            "ReadVariableOp"}  # values the condition may not read: the batch, the weights


class NotStatic(Exception):
    """The loop's trip count is not known at build time: TF's While is built instead."""


def build_time_value(tensor: Any) -> np.ndarray:
    """A value of the loop's condition or bound as the graph computes it, known at build time."""
    if not isinstance(tensor, tf.Tensor):
        return np.asarray(tensor)
    static = tf.get_static_value(tensor)
    if static is not None:
        return np.asarray(static)
    from coordinator.compiler.extract import data_upstream  # (extract imports recurrences)

    ops = data_upstream(tensor.op)
    if any(op.type in _RUNTIME or op.op_def.is_stateful for op in ops):
        raise NotStatic
    with tf.compat.v1.Session(graph=tensor.graph) as session:
        try:
            return np.asarray(session.run(tensor))
        except tf.errors.OpError:
            raise NotStatic from None


def _tensors(structure: Any) -> Any:
    if any(isinstance(x, tf.TensorArray) for x in tf.nest.flatten(structure)):
        raise NotStatic
    return tf.nest.map_structure(tf.convert_to_tensor, structure)


def _python_while(cond: Callable, body: Callable, loop_vars: Any,
                  maximum_iterations: Any, same_structure: bool) -> Any:
    """tf.while_loop's result, its steps run in Python (NotStatic: not known at build time)."""
    single = not isinstance(loop_vars, (list, tuple))
    values = _tensors((loop_vars,) if single else loop_vars)
    _trace(values, cond=cond, body=body)
    limit = None if maximum_iterations is None else int(build_time_value(maximum_iterations))
    steps = 0
    with tf.name_scope("while"):  # (the steps' layer calls name no op a later layer's name)
        while (limit is None or steps < limit) and bool(build_time_value(cond(*values))):
            steps += 1
            if steps > MAX_STEPS:
                raise NotStatic
            result = body(*values)
            values = _tensors(result if isinstance(result, (list, tuple)) and not single
                              else (result,))
    if single:
        return values[0]
    if len(values) == 1 and not same_structure:
        return values[0]
    return tf.nest.pack_sequence_as(loop_vars, tf.nest.flatten(values))


def _trace(values: Any, **functions: Callable) -> None:
    """Trace `functions` (cond, body) once on `values` (tensors or their TensorSpecs) into
    throw-away function graphs, as TF's
    While does first: layers first called in the loop create their variables as they would
    for TF's While (the same names, the same initial values) before the Python steps reuse
    them."""
    signature = tf.nest.map_structure(
        lambda v: v if isinstance(v, tf.TensorSpec) else tf.TensorSpec.from_tensor(v), values)
    collections = tf.compat.v1.get_default_graph()._collections  # (as while_v2 passes them)
    try:
        with tf.name_scope("while"):
            for name, function in functions.items():
                func_graph.func_graph_from_py_func(
                    name, lambda *args, f=function: f(*args), [], {}, signature=signature,
                    func_graph=func_graph.FuncGraph(name, collections=collections))
    except Exception:  # (TF's own While then says what is wrong with the loop)
        raise NotStatic from None


def _unrolled_while(original: Callable, same_structure: bool) -> Callable:
    signature = inspect.signature(original)

    def while_loop(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        same = a.get("return_same_structure", same_structure)
        try:
            return _python_while(a["cond"], a["body"], a["loop_vars"],
                                 a["maximum_iterations"], same)
        except NotStatic:
            return original(*args, **kwargs)
    return while_loop


def _stack_steps(parts: tuple[tf.Tensor, ...]) -> tf.Tensor:
    """tf.stack(parts), the steps first: stacked after each part's first axis (a batch stays
    first), then transposed to the front, as Keras' unrolled recurrent layers swap the batch
    and time axes (the same values)."""
    rank = parts[0].shape.rank
    if not rank:
        return tf.stack(parts)
    return tf.transpose(tf.stack(parts, axis=1), [1, 0, *range(2, rank + 1)])


def _unrolled_scan(original: Callable) -> Callable:
    def scan(fn: Callable, elems: Any, initializer: Any = None, *args: Any,
             reverse: bool = False, **kwargs: Any) -> Any:
        flat = [tf.convert_to_tensor(e) for e in tf.nest.flatten(elems)]
        length = flat[0].shape[0] if flat and flat[0].shape.rank else None
        if length is None or length > MAX_STEPS or \
                any(e.shape.rank == 0 or e.shape[0] != length for e in flat):
            return original(fn, elems, initializer, *args, reverse=reverse, **kwargs)
        carried = None if initializer is None else _tensors(initializer)
        step = tf.nest.pack_sequence_as(elems, [tf.TensorSpec(e.shape[1:], e.dtype) for e in flat])
        try:
            _trace((step if carried is None else carried, step), body=fn)
        except NotStatic:
            return original(fn, elems, initializer, *args, reverse=reverse, **kwargs)
        with tf.name_scope("scan"):  # (its ops name no op the user names after it)
            slices = [tf.unstack(e, num=length, axis=0) for e in flat]
            order = list(range(length))[::-1] if reverse else list(range(length))

            def element(i: int) -> Any:
                return tf.nest.pack_sequence_as(elems, [s[i] for s in slices])
            outputs: dict[int, Any] = {}
            if carried is None:
                carried = outputs[order[0]] = element(order[0])
                order = order[1:]
            for i in order:
                carried = _tensors(fn(carried, element(i)))
                outputs[i] = carried
            stacked = [_stack_steps(parts) for parts in
                       zip(*(tf.nest.flatten(outputs[i]) for i in range(length)))]
        return tf.nest.pack_sequence_as(carried, stacked)
    return scan


def recorded(loop: Callable, created: set[str]) -> Callable:
    """`loop`, the names of the ops each call adds to the graph added to `created`."""
    def call(*args: Any, **kwargs: Any) -> Any:
        graph = tf.compat.v1.get_default_graph()
        before = {op.name for op in graph.get_operations()}
        try:
            return loop(*args, **kwargs)
        finally:
            created.update(op.name for op in graph.get_operations() if op.name not in before)
    return call


@contextlib.contextmanager
def python_loops() -> Iterator[set[str]]:
    """tf.while_loop and tf.scan (and tf.compat.v1's) built meanwhile run their steps in Python
    when their trip count is known at build time; yields the names of the ops the loops add
    (the user's graph, its While, has none of them: the host cannot read them by name)."""
    v1, created = tf.compat.v1, set[str]()
    patched = [(tf, "while_loop", _unrolled_while(tf.while_loop, True)),
               (v1, "while_loop", _unrolled_while(v1.while_loop, False)),
               (tf, "scan", _unrolled_scan(tf.scan)), (v1, "scan", _unrolled_scan(v1.scan))]
    saved = [(module, name, getattr(module, name)) for module, name, _ in patched]
    for module, name, function in patched:
        setattr(module, name, recorded(function, created))
    try:
        yield created
    finally:
        for module, name, function in saved:
            setattr(module, name, function)
