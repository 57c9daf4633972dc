"""model_fn's host-side computations (metrics, predictions) run from fed values.

The CS chief feeds what the CS streams back (kernel outputs and inputs, at the TF tensor
names they stand for, and the loss) and computes the rest in a TensorFlow Session.
`feed_only` cuts the graph at those tensors before a Session runs it: every op reading one
reads a placeholder standing in for it instead, and control dependencies on their ops are
dropped (`tf.compat.v1.metrics.mean`, and the Estimator's mean loss, runs its update under
a control dependency on the value it averages; the value exists, so the ordering holds).
Feeding the original tensor is not enough: TensorFlow's graph optimizer may rewrite its
readers to read past it (a float32 -> float16 -> float32 cast chain of a mixed-precision
loss is folded to its float32 source), and the Session then asks for the samples. The
compiler streams a value for every other path back to the samples
(`coordinator.compiler.match.Matcher.host_outputs`).
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np
import tensorflow as tf

from tf_model.model_fn import graph_op_error


def feed_only(graph: tf.Graph, fed: Iterable[str]) -> dict[str, tf.Tensor]:
    """Cut `graph` at the `fed` tensors (names): {name: the placeholder now read in its
    place}; pass it to `run`. Call before a Session first runs the graph."""
    stand_ins: dict[str, tf.Tensor] = {}
    with graph.as_default():
        for name in dict.fromkeys(fed):
            tensor = graph.get_tensor_by_name(name)
            stand_in = tf.compat.v1.placeholder(tensor.dtype, tensor.shape,
                                                name=f"{tensor.op.name}/fed_{tensor.value_index}")
            # TF has no public call to rewire an op's inputs or edit its control inputs (TF
            # is pinned: constraints.txt).
            for consumer in tensor.consumers():
                for index, read in enumerate(consumer.inputs):
                    if read is tensor:
                        consumer._update_input(index, stand_in)
            stand_ins[name] = stand_in
    fed_ops = {graph.get_tensor_by_name(name).op for name in stand_ins}
    for op in graph.get_operations():
        kept = [c for c in op.control_inputs if c not in fed_ops]
        if len(kept) != len(op.control_inputs):
            op._remove_all_control_inputs()
            op._add_control_inputs(kept)
    return stand_ins


def run(session: tf.compat.v1.Session, fetches: Any, values: Mapping[str, np.ndarray],
        stand_ins: Mapping[str, tf.Tensor] | None = None) -> Any:
    """session.run(fetches) fed `values` by tensor name (at their `stand_ins` from
    `feed_only`: a fetched fed tensor is its fed value); a failing op is one line
    (`graph_op_error`: the op, the user's source line, TensorFlow's own line)."""
    graph, stand_ins = session.graph, stand_ins or {}

    def at(tensor: tf.Tensor) -> tf.Tensor:
        return stand_ins.get(tensor.name, tensor) if isinstance(tensor, tf.Tensor) else tensor

    feeds = {stand_ins[n] if n in stand_ins else graph.get_tensor_by_name(n): v
             for n, v in values.items()}
    try:
        return session.run(tf.nest.map_structure(at, fetches), feeds)
    except tf.errors.OpError as error:
        raise graph_op_error(error) from error
