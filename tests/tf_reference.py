"""The TensorFlow reference the simulator is compared against: a plain tf.compat.v1 Session
over the same model_fn (built with tf_model.model_fn.model_graph), started from given
weights and fed the same numpy batches. It runs TensorFlow's own CPU kernels, the same on every
x86 CPU: tests/conftest.py turns oneDNN off (with it, on CPUs with avx512_fp16, TF computes
float16 in oneDNN and rounds elsewhere: docs/design.md, "Mixed precision")."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import tensorflow as tf

from coordinator.compiler.extract import op_closure
from coordinator.compiler.training.writes import is_write
from tf_model.model_fn import batch_signature, call_model_fn, make_dataset, model_graph
from workers.feed import input_dataset


@dataclass(frozen=True)
class Reference:
    losses: list[float]  # one per batch (train: before that batch's update)
    state: dict[str, np.ndarray]  # every global number variable after the run (slots included)
    fetched: list[dict[str, np.ndarray]]  # per batch: the requested tensors' values


def batches(input_fn: Callable, params: dict, count: int) -> list[tuple[Any, Any]]:
    """The first `count` (features, labels) numpy batches of input_fn(params) (arrays, or
    dicts of them), under the seed an input worker sets (runconfig.tf_random_seed): the same
    batches whatever seed an earlier test left (a shuffle's order depends on it)."""
    dataset = input_dataset(input_fn, params).take(count)
    return [(x, y) for x, y in dataset.as_numpy_iterator()]


def run(model_fn: Callable, input_fn: Callable, params: dict, weights: dict[str, np.ndarray],
        data: Sequence[tuple[Any, Any]], mode: str = "train",
        fetch: Sequence[str] = (), floatx: str = "float32", strict: bool = True) -> Reference:
    """Train (or evaluate) model_fn on `data` from `weights` (variables by name; those not
    given keep their initial values: optimizer slots zero, beta powers beta1 and beta2).
    `fetch` names graph tensors (e.g. a kernel's tf_tensor) to return per batch.
    floatx="float64" builds Keras layers in float64: the high-precision reference that
    float32 TensorFlow and the CS are both compared with over long runs. strict=False leaves
    out the weights the graph has not (a mixed model's loss scale, which its float32 twin
    builds without: the LossScaleOptimizer wrapped under mixed_float16 only)."""
    signature = batch_signature(make_dataset(input_fn, params))
    previous = tf.keras.backend.floatx()
    tf.keras.backend.set_floatx(floatx)
    try:
        return _run(model_fn, params, weights, data, mode, fetch, signature, strict)
    finally:
        tf.keras.backend.set_floatx(previous)


def _run(model_fn, params, weights, data, mode, fetch, signature, strict) -> Reference:
    with model_graph(params) as graph:
        features, labels = signature.placeholders()
        spec = call_model_fn(model_fn, features, labels, mode, params)
        variables = {v.op.name: v for v in tf.compat.v1.global_variables()}
        fetched_tensors = [graph.get_tensor_by_name(name) for name in fetch]
        if mode == "train":
            _writes_wait_for_the_loss(spec.train_op, spec.loss)
        # One thread per op: TF's multi-threaded reductions vary from run to run.
        config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1,
                                          inter_op_parallelism_threads=1)
        with tf.compat.v1.Session(graph=graph, config=config) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            for name, value in weights.items():
                if name not in variables and not strict:
                    continue
                variables[name].load(np.asarray(value, variables[name].dtype.base_dtype.as_numpy_dtype),
                                     session)
            losses, fetched = [], []
            for x, y in data:
                ops = [spec.loss, fetched_tensors]
                if mode == "train":
                    ops.append(spec.train_op)
                out = session.run(ops, dict(zip(tf.nest.flatten((features, labels)), tf.nest.flatten((x, y)))))
                losses.append(float(out[0]))
                fetched.append(dict(zip(fetch, out[1])))
            numbers = {n: v for n, v in variables.items()
                       if v.dtype.base_dtype.is_floating or v.dtype.base_dtype.is_integer}
            state = dict(zip(numbers, session.run(list(numbers.values()))))
    return Reference(losses, state, fetched)


def _writes_wait_for_the_loss(train_op: tf.Operation, loss: tf.Tensor) -> None:
    """Every variable write of the train_op (but those the loss itself waits for) waits for
    the loss: a term that reads a weight its gradient does not need (loss - 0.5 * c, a
    flow's sum of log-scales) is then read before the update, the order the CS gives it.
    TF leaves that read unordered, so the loss it reports flips between runs."""
    before = set(op_closure(loss))
    for op in op_closure(train_op):
        if is_write(op) and op not in before:
            op._add_control_input(loss.op)


def mask_uniforms(model_fn: Callable, input_fn: Callable, params: dict,
                  selects: dict[str, tuple[str, tuple[int, ...]]],
                  mode: str = "train") -> dict[str, str]:
    """Each dropout's (name -> its select's output tensor, where(uniform >= rate, x * scale,
    0), and its per-sample shape) uniform numbers: the tensor of the raw draws its mask
    compares with the rate (tf.nn.dropout's RandomUniform; Keras' stateless draw, before its
    * 1 + 0). Only masks of rows in batch order (the batch first, or folded rows of it): a
    stack's [K, B, ...] is left out."""
    signature = batch_signature(make_dataset(input_fn, params))
    with model_graph(params) as graph:
        features, labels = signature.placeholders()
        call_model_fn(model_fn, features, labels, mode, params)
        found = {}
        for name, (select, per_sample) in selects.items():
            output = graph.get_tensor_by_name(select)
            rows, *rest = output.shape.as_list()
            if tuple(rest) != per_sample and (tuple(rest) != per_sample[1:] or rows !=
                                              params["batch_size"] * per_sample[0]):
                continue
            uniform = output.op.inputs[0].op.inputs[0]
            while uniform.op.type in ("Add", "AddV2", "Mul"):
                uniform = uniform.op.inputs[0]
            found[name] = uniform.name
    return found
