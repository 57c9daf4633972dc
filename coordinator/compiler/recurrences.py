"""Fixed-length recurrences: Keras' recurrent layers (LSTM, GRU, SimpleRNN) build a While
loop, which the CS cannot pipeline. Over sequences of a length known at compile time the
compiler builds model_fn a second time with Keras' own unrolling (`unroll=True`, the same
cell's ops once per step, reading its shared weights), and proves the unrolled graph
computes what the user's does: with the same weights, on one batch of input_fn, the loss
and its gradient to every trainable variable (predict mode: the predictions) agree to
UNROLL_RTOL, or beyond it within rounding_spread's SPREAD_FACTOR x TF's own spread.
Hand-written tf.while_loop and tf.scan of a number of steps known at build time run as
Python loops in that second build (static_loops.py) and are proven alike; a loop left (its
steps depend on the data: tf.nn.ctc_loss's) stays in the second build, which the matcher
refuses naming that loop, not the recurrent layers unrolled around it."""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import tensorflow as tf

from common.errors import CSRunError
from coordinator.compiler.constant_conds import has_constant_conds, taken_branches
from coordinator.compiler.per_sample_maps import has_folded_convolutions, vectorized_maps
from coordinator.compiler.per_sample_pieces import has_per_sample_pieces, per_sample_joins
from coordinator.compiler.rounding_spread import SPREAD_FACTOR, distances, spread
from coordinator.compiler.static_loops import python_loops

LOOPS = {"While", "StatelessWhile"}
UNROLL_RTOL = 1e-5  # float32 sums of the same terms in another order (gradients over the steps)


def has_loops(graph: tf.Graph) -> bool:
    return any(op.type in LOOPS for op in graph.get_operations())


def built_again(graph: tf.Graph, batch: int) -> bool:
    """Whether model_fn is built a second time (`unrolled`): loops, the batch's samples split
    into pieces, convolutions of a tf.vectorized_map by per-sample filters, tf.conds of a
    predicate known at build time (tf.image.rot90's)."""
    return has_loops(graph) or has_per_sample_pieces(graph, batch) or \
        has_folded_convolutions(graph) or has_constant_conds(graph)


@contextlib.contextmanager
def keras_unrolled() -> Iterator[None]:
    """Keras recurrent layers built meanwhile unroll their loop over the (static) steps."""
    from keras.src import backend  # Keras' backend dispatch, which its RNN layer calls

    loop = backend.rnn

    def unrolled(*args: Any, **kwargs: Any) -> Any:
        mask = kwargs.get("mask")
        if mask is None or len(mask.shape) != 2 or not kwargs.get("zero_output_for_mask") or \
                kwargs.get("time_major"):  # Keras' RNN layer: a [B, T] mask, batch-major
            return loop(*args, **{**kwargs, "unroll": True})
        last, outputs, states = loop(*args, **{**kwargs, "unroll": True,
                                               "zero_output_for_mask": False})
        return (*_zeroed(last, outputs, mask, bool(kwargs.get("go_backwards"))), states)

    backend.rnn = unrolled
    try:
        yield
    finally:
        backend.rnn = loop


def _zeroed(last: tf.Tensor, outputs: tf.Tensor, mask: tf.Tensor,
            go_backwards: bool) -> tuple[tf.Tensor, tf.Tensor]:
    """A masked layer's last output and outputs zeroed at its masked steps, as TF's While does
    it under zero_output_for_mask (Bidirectional's layers returning sequences): Keras' unrolled
    path zeroes a go_backwards layer's outputs, which are in reversed time, by the mask in
    forward time. `outputs` is batch-major, [B, T, ...] or (the last output alone) [B, 1, ...];
    `mask` [B, T]."""
    held = tf.cast(mask, tf.bool)
    if go_backwards:
        held = tf.reverse(held, [1])
    steps = held if outputs.shape[1] == held.shape[1] else held[:, -1:]
    return (tf.where(_tiled(held[:, -1], last, 1), last, tf.zeros_like(last)),
            tf.where(_tiled(steps, outputs, 2), outputs, tf.zeros_like(outputs)))


def _tiled(held: tf.Tensor, like: tf.Tensor, leading: int) -> tf.Tensor:
    """The bool `held`, of `like`'s `leading` first axes, tiled over its other axes (Keras'
    own expand and tile of a step's mask)."""
    while len(held.shape) < len(like.shape):
        held = tf.expand_dims(held, -1)
    return tf.tile(held, [1] * leading + like.shape.as_list()[leading:])


def _outputs(graph: tf.Graph, spec: Any) -> dict[str, tf.Tensor]:
    """What the graph computes: the loss and its gradient by variable name, or without a loss
    (predict mode) the predictions."""
    with graph.as_default():
        if spec.loss is None:
            return {f"prediction {i}": t for i, t in enumerate(tf.nest.flatten(spec.predictions))}
        trainable = tf.compat.v1.trainable_variables()
        grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g  # dense
                 for g in tf.gradients(spec.loss, trainable)]
        return {"the loss": spec.loss, **{v.op.name: g for v, g in zip(trainable, grads)
                                         if g is not None}}


@contextlib.contextmanager
def _session(graph: tf.Graph, weights: dict[str, np.ndarray] | None
             ) -> Iterator[tf.compat.v1.Session]:
    """A session of `graph` at `weights` (variables by name; None: the graph's initializers)."""
    with graph.as_default(), tf.compat.v1.Session(graph=graph) as session:
        session.run([tf.compat.v1.global_variables_initializer(),
                     tf.compat.v1.local_variables_initializer()])  # (metrics' totals)
        for v in tf.compat.v1.global_variables():  # the initializer fed with the weight
            if weights is not None and v.op.name in weights:  # (Variable.load is deprecated)
                session.run(v.initializer, {v.initializer.inputs[1]: weights[v.op.name]})
        yield session


def _values(graph: tf.Graph, spec: Any, feed: dict[str, np.ndarray],
            weights: dict[str, np.ndarray] | None, tensors: Sequence[str] = ()
            ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(the graph's variables, its `_outputs` and the named `tensors`) at `weights` (None: the
    graph's initializers) on the batch `feed` (placeholder name -> value)."""
    outputs = {**_outputs(graph, spec), **{name: graph.get_tensor_by_name(name) for name in tensors}}
    with _session(graph, weights) as session:
        variables = tf.compat.v1.global_variables()
        state = {v.op.name: session.run(v) for v in variables}
        values = session.run(outputs, {graph.get_tensor_by_name(n): x for n, x in feed.items()})
    return state, {name: np.asarray(value) for name, value in values.items()}


def _differ(want: np.ndarray, got: np.ndarray | None) -> bool:
    """Whether `got` (the unrolled graph's) is not `want` within UNROLL_RTOL (exactly, for
    integers: an argmax)."""
    if got is None or got.shape != want.shape:
        return True
    if not np.issubdtype(want.dtype, np.floating):
        return not np.array_equal(got, want)
    return not np.allclose(got, want, rtol=UNROLL_RTOL, atol=UNROLL_RTOL * float(np.abs(want).max(initial=0)))


def _beyond_spread(graph: tf.Graph, spec: Any, feed: dict[str, np.ndarray],
                   weights: dict[str, np.ndarray], want: dict[str, np.ndarray],
                   got: dict[str, np.ndarray], differ: list[str]) -> list[str]:
    """Those of the outputs `differ` (beyond UNROLL_RTOL) whose unrolled value `got` is
    farther from the user's graph's `want` than SPREAD_FACTOR x TF's own spread (the user's
    graph from `weights` moved by 1 ULP, rounding_spread): a gradient summing terms that
    nearly cancel (a Sinkhorn loss's bias over B x B plan entries) rounds beyond 1e-5 of its
    largest element in TF's own loop. Integer values and other shapes stay apart."""
    close = [n for n in differ if np.issubdtype(want[n].dtype, np.floating) and
             n in got and got[n].shape == want[n].shape]
    if not close:
        return differ
    scale = {n: float(np.abs(want[n]).max(initial=0)) for n in close}
    outputs = _outputs(graph, spec)
    with _session(graph, weights) as session:
        tf_spread = spread(session, {n: outputs[n] for n in close},
                           {graph.get_tensor_by_name(n): x for n, x in feed.items()},
                           tf.compat.v1.trainable_variables(), {n: want[n] for n in close}, scale)
    apart = distances({n: got[n] for n in close}, {n: want[n] for n in close}, scale)
    return [n for n in differ if n not in close or apart[n] > SPREAD_FACTOR * tf_spread[n]]


def _host_names(spec: Any) -> list[str]:
    """The names of the tensors host-side computations read (the chief feeds them by name
    into the user's graph)."""
    found = [spec.host_call[1] if spec.host_call is not None else [], spec.predictions,
             spec.eval_metric_ops]
    return [t.name for t in tf.nest.flatten(found) if isinstance(t, tf.Tensor)]


def unrolled(build: Callable[[], tuple[tf.Graph, Any]], graph: tf.Graph, spec: Any,
             feed: dict[str, np.ndarray] | None, batch: int,
             seeded: bool) -> tuple[tf.Graph, Any, frozenset[str]]:
    """`graph` and `spec`, or when their loops unroll (Keras' recurrent layers, loops of steps
    known at build time, tf.map_fn) or their per-sample pieces join (per_sample_pieces),
    model_fn built again so (by `build`) and proven equal on the batch `feed` (placeholder ->
    value): the same variables (`seeded`, a runconfig.tf_random_seed: of the same initial
    values; else each build draws its own), and at the user's graph's weights the same loss
    and gradients (predictions); and the names of the ops the unrolled tf.while_loop and
    tf.scan steps, the vectorized maps and joins added."""
    if not built_again(graph, batch) or feed is None:
        return graph, spec, frozenset()
    with keras_unrolled(), python_loops() as created, vectorized_maps(created), \
            per_sample_joins(created, batch) as joined, taken_branches() as branches:
        graph2, spec2 = build()
    created |= branches
    if not (has_loops(graph) or joined or has_folded_convolutions(graph) or branches):
        return graph, spec, frozenset()  # no pieces of the batch joined in order
    if has_loops(graph2):  # a loop of data-dependent steps: the matcher refuses it, named
        return graph2, spec2, frozenset(created)  # alone (the layers around it unrolled)
    if _host_names(spec) != _host_names(spec2):
        raise CSRunError("host-side metrics or predictions read a recurrent layer's or a loop's "
                         "output, whose tensor the compiler's unrolled graph names otherwise",
                         "compute metrics and predictions from a layer after the recurrent one")
    weights, outputs = _values(graph, spec, feed, None)
    initial, _ = _values(graph2, spec2, feed, None)
    if initial.keys() != weights.keys() or any(
            initial[n].shape != weights[n].shape or initial[n].dtype != weights[n].dtype or
            seeded and not np.array_equal(initial[n], weights[n]) for n in weights):
        raise CSRunError("the unrolled graph of the recurrent layers, loops or per-sample maps "
                         "has other variables or initial values than their loop", "pass "
                         "unroll=True to the Keras recurrent layers, write the loop as a Python "
                         "for loop, create the layers a tf.map_fn calls before it")
    alike = _alike_ops(graph2, graph)
    fetched = [t.name for name in alike for t in graph2.get_operation_by_name(name).outputs]
    _, outputs2 = _values(graph2, spec2, feed, weights, fetched)
    differ = _beyond_spread(graph, spec, feed, weights, outputs, outputs2, [
        name for name in outputs if _differ(outputs[name], outputs2.get(name))])
    if differ or not set(outputs) <= set(outputs2):
        raise CSRunError("the unrolled graph of the recurrent layers, loops or per-sample maps "
                         "computes another "
                         f"{'loss or gradient' if spec.loss is not None else 'prediction'} than "
                         f"their loop ({', '.join(differ[:3]) or 'another set of values'})",
                         "pass unroll=True to the Keras recurrent layers, or write the loop as "
                         "a Python for loop")
    _, theirs = _values(graph, spec, feed, weights, fetched)
    same = {name for name in alike if not any(
        _differ(theirs[t.name], outputs2[t.name]) for t in graph2.get_operation_by_name(name).outputs)}
    return graph2, spec2, frozenset(created) | not_in_users_graph(graph2, graph, same)


def _alike_ops(unrolled_graph: tf.Graph, graph: tf.Graph) -> list[str]:
    """The stateless ops of `unrolled_graph` with numbers out that the user's `graph` has by
    name, of the same type and attributes, reading outputs of the same names."""
    alike = []
    for op in unrolled_graph.get_operations():
        theirs = _same_node(op, graph)
        if theirs is not None and not op.op_def.is_stateful and op.outputs and all(
                t.dtype.is_numpy_compatible and t.dtype != tf.resource for t in op.outputs):
            alike.append(op.name)
    return alike


def _same_node(op: tf.Operation, graph: tf.Graph) -> tf.Operation | None:
    """`graph`'s op of `op`'s name, type, attributes and input and control input names."""
    try:
        theirs = graph.get_operation_by_name(op.name)
    except KeyError:
        return None
    same = (theirs.type == op.type and theirs.node_def.attr == op.node_def.attr
            and [t.name for t in theirs.inputs] == [t.name for t in op.inputs]
            and [c.name for c in theirs.control_inputs] == [c.name for c in op.control_inputs])
    return theirs if same else None


def not_in_users_graph(unrolled_graph: tf.Graph, graph: tf.Graph,
                       same_values: set[str]) -> frozenset[str]:
    """The ops of `unrolled_graph` whose outputs the host, which runs the user's `graph`,
    must never be fed by name (Keras' unrolled steps are named like the While's own ops in
    the layer's scope): all but those of `graph`'s name, type, attributes and input names
    that computed the same values on the proof's batch (`same_values`), or, with no number
    to compare (a variable's handle), read only ops that are the user's too."""
    mine: set[str] = set()
    for op in unrolled_graph.get_operations():  # (in creation order: inputs come first)
        if op.name in same_values or _same_node(op, graph) is not None and op.op_def.is_stateful \
                and all(t.op.name in mine for t in op.inputs) \
                and all(c.name in mine for c in op.control_inputs):
            mine.add(op.name)
    return frozenset(op.name for op in unrolled_graph.get_operations()) - mine
