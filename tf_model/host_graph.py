"""model_fn's host-side computations (metrics, predictions) run from fed values.

The CS chief feeds what the CS streams back (kernel outputs and inputs, at the TF tensor
names they stand for, and the loss) and computes the rest in a TensorFlow Session. A fed
tensor cuts its data edges, but not the control edges of its op: `tf.compat.v1.metrics.mean`
(and the Estimator's mean loss) runs its update under a control dependency on the value it
averages, and TF would then compute that op from its inputs again (the samples, the
weights). `feed_only` drops the control dependencies on ops whose value is fed: the value
exists, so the ordering they ask for holds. The compiler streams a value for every other
path back to the samples (`coordinator.compiler.match.Matcher.host_outputs`).
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np
import tensorflow as tf

from tf_model.model_fn import graph_op_error


def feed_only(graph: tf.Graph, fed: Iterable[str]) -> None:
    """Drop every control dependency on an op one of whose outputs is in `fed` (tensor
    names). Call before a Session first runs the graph."""
    fed_ops = {graph.get_tensor_by_name(name).op for name in fed}
    for op in graph.get_operations():
        kept = [c for c in op.control_inputs if c not in fed_ops]
        if len(kept) != len(op.control_inputs):
            # TF has no public call to edit an op's control inputs (TF is pinned: constraints.txt).
            op._remove_all_control_inputs()
            op._add_control_inputs(kept)


def run(session: tf.compat.v1.Session, fetches: Any, values: Mapping[str, np.ndarray]) -> Any:
    """session.run(fetches) fed `values` by tensor name; a failing op is one line
    (`graph_op_error`: the op, the user's source line, TensorFlow's own line)."""
    graph = session.graph
    try:
        return session.run(fetches, {graph.get_tensor_by_name(n): v for n, v in values.items()})
    except tf.errors.OpError as error:
        raise graph_op_error(error) from error
