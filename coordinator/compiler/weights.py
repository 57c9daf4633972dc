"""Initial weights: the values of the graph's initializers, as the CPU path gets them."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from coordinator.compiler.extract import ExtractedGraph
from tf_model.checkpoints import is_optimizer_scalar


def _float_variables(graph: tf.Graph) -> list[Any]:
    with graph.as_default():
        return [v for v in tf.compat.v1.global_variables() if v.dtype.base_dtype.is_floating]


def host_variables(extracted: ExtractedGraph, weights: Sequence[str]) -> list[str]:
    """Variables of the user's graph besides the CS's weights, the optimizer's slots and
    scalars and the global step (e.g. Keras' dropout seed state): the chief keeps them in
    the checkpoints the CPU path restores."""
    with extracted.graph.as_default():
        names = [v.op.name for v in tf.compat.v1.global_variables()]
    owned = set(weights)
    return [n for n in names if n not in owned and n != "global_step"
            and not is_optimizer_scalar(n)
            and n.rsplit("/", 1)[0] not in owned]


def initial_weights(extracted: ExtractedGraph, names: Sequence[str]) -> dict[str, np.ndarray]:
    """The variables `names` (the program's weights and the host variables) after running
    their initializers in a Session; the graph carries runconfig.tf_random_seed, as on the
    CPU path (with unrolled loops: the values of the user's graph as written). Optimizer
    slots are not stored: they start as TF starts them."""
    if extracted.initial_values is not None:
        missing = [n for n in names if n not in extracted.initial_values]
        if missing:
            raise RuntimeError(f"kernel weights {missing} are not global variables of the graph")
        return {n: extracted.initial_values[n] for n in names}
    graph = extracted.graph
    with graph.as_default():
        by_name = {v.op.name: v for v in tf.compat.v1.global_variables()}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise RuntimeError(f"kernel weights {missing} are not global variables of the graph")
    variables = [by_name[n] for n in names]
    with graph.as_default(), tf.compat.v1.Session(graph=graph) as session:
        session.run([v.initializer for v in variables])
        values = session.run(variables)
    return {n: np.asarray(value) for n, value in zip(names, values)}


def initializer_summary(extracted: ExtractedGraph) -> list[Any]:
    """What the initializers compute, for the compile's key: op types, attributes and float
    constants of every variable's initializer (random seeds drawn per process left out)."""
    summary = []
    for variable in _float_variables(extracted.graph):
        ops, stack, seen = [], [variable.initializer], set()
        while stack:
            op = stack.pop()
            if op.name in seen:
                continue
            seen.add(op.name)
            entry: list[Any] = [op.type]
            for key in sorted(op.node_def.attr):
                if key in ("seed", "seed2", "shared_name", "_class", "container"):
                    continue
                if key == "value":
                    tensor = op.get_attr("value")
                    if tf.as_dtype(tensor.dtype).is_floating:
                        entry.append(tf.make_ndarray(tensor).tolist())
                    continue
                entry.append([key, str(op.node_def.attr[key])])
            ops.append(entry)
            stack.extend(t.op for t in op.inputs if not t.op.type.startswith("VarHandle"))
        summary.append([variable.op.name, sorted(ops, key=str)])
    return summary
