"""model_fn's evaluation metrics, computed in a TensorFlow Session on the host.

The metrics are `host_call = (fn, tensors)` (fn(*tensors) -> {name: (value, update_op)}) or
`eval_metric_ops`, plus `loss`, the mean of the batches' losses, as an Estimator reports
it. `EvalMetrics` builds model_fn in EVAL mode (the same graph and variable names as
training) and accumulates the metrics over batches from numpy values fed by tensor name:

- the CPU path feeds the input batches (`input_names`) after restoring a checkpoint;
- the CS chief restores the same checkpoint and feeds what the CS returns: the values the
  compiler streams for the metrics (`streamed`) and each batch's loss.
"""
from __future__ import annotations

from typing import Any, Callable, Collection, Mapping

import numpy as np
import tensorflow as tf

from common.closing import Closing
from common.errors import CSRunError
from tf_model import host_graph
from tf_model.checkpoints import restore_variables
from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys
from tf_model.model_fn import batch_signature, call_model_fn, local_init_op, make_dataset, model_graph

LOSS = "loss"


def metric_ops(spec: CSEstimatorSpec) -> dict[str, tuple[Any, Any]]:
    """{name: (value, update_op)} of the spec's metrics, `loss` (the mean loss) included."""
    if spec.host_call is not None:
        fn, tensors = spec.host_call
        ops = dict(fn(*tensors))
    else:
        ops = dict(spec.eval_metric_ops or {})
    for name, pair in ops.items():
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise CSRunError(f"metric {name!r} is not a (value, update_op) pair",
                             "return tf.compat.v1.metrics.* results, e.g. "
                             "{'accuracy': tf.compat.v1.metrics.accuracy(labels, predictions)}")
    ops.setdefault(LOSS, tf.compat.v1.metrics.mean(spec.loss))
    return ops


MetricValue = float | np.ndarray  # a metric's value: a float, or an array of several values


class EvalMetrics(Closing):
    """model_fn's metrics in EVAL mode, accumulated over `update` calls, with a checkpoint's
    weights restored (when given).

    `streamed`: the tensor names the chief feeds from the CS's outputs (the loss, `loss_name`,
    is fed with them); the graph is cut at them (`host_graph.feed_only`).
    Without it the CPU path feeds the input batches (`input_names`)."""

    def __init__(self, model_fn: Callable, input_fn: Callable, params: dict,
                 checkpoint: str | None = None, streamed: Collection[str] | None = None):
        signature = batch_signature(make_dataset(input_fn, params))
        with model_graph(params) as graph:
            features, labels = signature.placeholders()
            spec = call_model_fn(model_fn, features, labels, ModeKeys.EVAL, params)
            ops = metric_ops(spec)
            init = local_init_op()
            variables = tf.compat.v1.global_variables()
        self.input_names = tuple(t.name for t in tf.nest.flatten((features, labels)))
        self.loss_name = spec.loss.name
        self._stand_ins = {} if streamed is None else \
            host_graph.feed_only(graph, [*streamed, self.loss_name])
        self._values = {name: value for name, (value, _) in ops.items()}
        self._updates = [update for _, update in ops.values()]
        self.session = tf.compat.v1.Session(graph=graph)
        self.session.run(init)
        if checkpoint is not None:
            restore_variables(self.session, variables, checkpoint)

    def update(self, values: Mapping[str, np.ndarray]) -> None:
        """Accumulate one batch: `values` maps tensor names (input_names, or the streamed
        ones and loss_name) to their numpy values."""
        host_graph.run(self.session, self._updates, values, self._stand_ins)

    def results(self) -> dict[str, MetricValue]:
        """Each metric's value: a float, or an array for a metric of several values
        (recall_at_thresholds of several thresholds), as TF's Estimator returns them."""
        values = host_graph.run(self.session, self._values, {}, self._stand_ins)
        return {name: float(np.asarray(value).reshape(())) if np.size(value) == 1 else np.asarray(value)
                for name, value in values.items()}

    def close(self) -> None:
        self.session.close()
