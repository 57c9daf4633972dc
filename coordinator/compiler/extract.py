"""Extract: build model_fn in a tf.compat.v1 graph on placeholders shaped like input_fn's
batches, and find the ops that carry the samples from the inputs to the loss."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import tensorflow as tf

from common.errors import CSRunError
from coordinator.compiler.recurrences import built_again, unrolled
from cs_api import MAX_BATCH_BYTES
from cs_api.input_spec import InputSpec, as_streamed
from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys
from tf_model.model_fn import (
    BatchSignature,
    batch_signature,
    call_model_fn,
    function_source,
    make_dataset,
    model_graph,
    named_inputs,
)
from tf_model.model_fn import user_name as user_name  # the compiler's passes name ops by them
from tf_model.model_fn import user_source as user_source
from wse_sim.limits import MAX_BATCH_SIZE

MODES = (ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT)
# Ops whose outputs depend on their input's shape only: shapes are static here, so the
# samples' values do not flow through them.
SHAPE_OPS = {"Shape", "ShapeN", "Size", "Rank", "ZerosLike", "OnesLike"}

@dataclass(frozen=True)
class ExtractedGraph:
    """The user's model built once on placeholders, with what the later passes need."""

    graph: tf.Graph
    mode: str
    batch_size: int
    inputs: tuple[InputSpec, ...]
    placeholders: dict[str, str]  # input name -> the placeholder tensor it replaces in the graph
    spec: CSEstimatorSpec
    seed: int | None
    first_batch: dict[str, np.ndarray] | None = None  # train mode: input_fn's first batch
    input_source: str = "input_fn"  # where input_fn is defined ("file:line")
    # the ops of unrolled tf.while_loop/tf.scan steps, which the user's graph (the host's) lacks
    loop_ops: frozenset[str] = frozenset()

    def input_name(self, tensor: tf.Tensor) -> str | None:
        """The program input a placeholder tensor stands for."""
        return next((name for name, placeholder in self.placeholders.items()
                     if placeholder == tensor.name), None)


def _fixed_batch(signature: BatchSignature, params: dict) -> tuple[BatchSignature, int]:
    """The signature with its batch dimension fixed; every other dimension must be known."""
    specs = dict(_flatten(signature))
    sizes = {s.shape[0] for s in specs.values() if s.shape.rank}
    sizes.discard(None)
    if len(sizes) > 1:
        raise CSRunError(f"input_fn's features and labels have different batch sizes "
                         f"{sorted(sizes)}", "batch features and labels together")
    batch = sizes.pop() if sizes else params.get("batch_size")
    if not isinstance(batch, int) or batch <= 0:
        raise CSRunError("input_fn's batches have no fixed batch size",
                         "batch with dataset.batch(batch_size, drop_remainder=True)")
    for name, spec in specs.items():
        if spec.shape.rank is None or spec.shape.rank == 0 or None in spec.shape[1:]:
            raise CSRunError(f"input_fn's {name} have shape {spec.shape}: the CS needs "
                             "every dimension of a sample known",
                             "give the dataset fixed sample shapes (no None dimensions)")

    _check_batch_fits(batch, specs)

    def fix(spec: tf.TensorSpec) -> tf.TensorSpec:
        return tf.TensorSpec([batch, *spec.shape[1:]], spec.dtype)

    def fix_all(value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, dict):
            return {k: fix(v) for k, v in value.items()}
        return fix(value)

    return BatchSignature(fix_all(signature.features), fix_all(signature.labels)), batch


def _check_batch_fits(batch: int, specs: dict[str, tf.TensorSpec]) -> None:
    """A batch the CS cannot take is refused before input_fn builds one (a batch_size of
    1e9 would otherwise fill the host's memory on the way to the CS's refusal)."""
    size = sum(batch * int(np.prod(spec.shape[1:], dtype=np.int64)) * spec.dtype.size for spec in specs.values())
    if batch > MAX_BATCH_SIZE or size > MAX_BATCH_BYTES:
        raise CSRunError(f"input_fn's batches of {batch:,} samples hold {size / (1 << 20):,.1f} MiB: the CS "
                         f"takes at most {MAX_BATCH_SIZE:,} samples and {MAX_BATCH_BYTES >> 20} MiB a batch",
                         "lower batch_size")


def _flatten(signature: BatchSignature) -> Iterable[tuple[str, tf.TensorSpec]]:
    return named_inputs(signature.features, signature.labels).items()


def extract(model_fn: Callable, input_fn: Callable, params: dict,
            mode: str = ModeKeys.TRAIN) -> ExtractedGraph:
    """Build model_fn on placeholders shaped like one input_fn batch."""
    if mode not in MODES:
        raise CSRunError(f"unknown mode {mode!r}", f"use one of {', '.join(MODES)}")
    # input_fn runs eagerly, outside the model's graph, only to learn its element structure.
    dataset = make_dataset(input_fn, params)
    signature, batch = _fixed_batch(batch_signature(dataset), params)
    seed = (params.get("runconfig") or {}).get("tf_random_seed")

    def build() -> tuple[tf.Graph, CSEstimatorSpec]:
        with model_graph(params) as graph:
            features, labels = signature.placeholders()
            return graph, call_model_fn(model_fn, features, labels, mode, params)  # one line

    wide = [name for name, s in _flatten(signature) if s.dtype == tf.float64]
    if wide:
        _check_cast_to_float32(build()[0], wide)
        signature = _retyped(signature, wide, tf.float32)
    flat = tuple(_flatten(signature))
    first = _first_batch(dataset, flat) if mode == ModeKeys.TRAIN else None
    graph, spec = build()
    loop_ops: frozenset[str] = frozenset()
    if built_again(graph, batch):  # loops unrolled, maps vectorized (recurrences)
        batch_values = first if first is not None else _first_batch(dataset, flat)
        graph, spec, loop_ops = unrolled(build, graph, spec, {f"{name}:0": batch_values[name]
                                                              for name, _ in flat}, batch,
                                         seed is not None)
    inputs = tuple(InputSpec(name, spec.dtype.name, tuple(spec.shape.as_list()[1:])) for name, spec in flat)
    _check_spec(spec, mode)
    return ExtractedGraph(graph, mode, batch, inputs, {name: f"{name}:0" for name, _ in flat}, spec,
                          seed, first, function_source(input_fn), loop_ops)


def _first_batch(dataset: tf.data.Dataset,
                 flat: tuple[tuple[str, tf.TensorSpec], ...]) -> dict[str, np.ndarray]:
    """input_fn's first batch by program input name, as the program streams it (`flat`: its
    inputs; the training analysis runs on it)."""
    element = next(iter(dataset.take(1)), None)
    if element is None:
        raise CSRunError("input_fn's dataset yields no batch", "give the dataset some samples")
    features, labels = element if isinstance(element, tuple) else (element, None)
    named = {name: np.asarray(value) for name, value in named_inputs(features, labels).items()}
    return as_streamed(named, tuple(InputSpec(name, spec.dtype.name, ()) for name, spec in flat))


# Ops that move an input's values without changing them: a float64 input may pass them on
# its way to the cast (Keras' Flatten before a Dense's autocast).
VALUE_VIEWS = {"Identity", "Reshape", "ExpandDims", "Squeeze", "Transpose", "StridedSlice",
               "Slice"}


def _check_cast_to_float32(graph: tf.Graph, wide: list[str]) -> None:
    """The float64 inputs `wide` stream as float32 (cast on the input worker as TF's Cast
    rounds) only when every reader of each, in `graph` (built on float64 placeholders),
    casts it to float32 first (Keras layers' autocast, tf.cast), after views that change no
    value (VALUE_VIEWS) or reads its shape alone: then the model computes what TF computes.
    Else one line naming the reader."""
    for name in wide:
        stack = [graph.get_tensor_by_name(f"{name}:0")]
        while stack:
            for op in stack.pop().consumers():
                if op.type in VALUE_VIEWS:
                    stack.append(op.outputs[0])
                    continue
                if op.type in SHAPE_OPS or (op.type == "Cast" and op.get_attr("DstT") == tf.float32
                                            and not op.get_attr("Truncate")):
                    continue
                reads = f"casts it to {op.get_attr('DstT').name}" if op.type == "Cast" else \
                    "reads it as float64"
                raise CSRunError(f"input_fn yields {name} as float64 and {op.type} "
                                 f"'{user_name(op)}' at {user_source(op)} {reads}: the CS "
                                 "computes in float32 (it streams a float64 input every reader "
                                 "casts to float32 first)",
                                 "cast in input_fn: tf.cast(x, tf.float32) (or build the arrays "
                                 "as np.float32), or cast it to float32 before it is read")


def _retyped(signature: BatchSignature, names: list[str], dtype: tf.DType) -> BatchSignature:
    """`signature` with the inputs `names` (program input names) of `dtype`."""

    def retype(value: Any, name: str) -> Any:
        if isinstance(value, dict):
            return {k: retype(v, f"{name}.{k}") for k, v in value.items()}
        return tf.TensorSpec(value.shape, dtype) if name in names else value

    return BatchSignature(retype(signature.features, "features"),
                          None if signature.labels is None else retype(signature.labels, "labels"))


def _check_spec(spec: CSEstimatorSpec, mode: str) -> None:
    if mode == ModeKeys.PREDICT and spec.predictions is None:
        raise CSRunError("model_fn in predict mode returned no predictions",
                         "return CSEstimatorSpec(mode, predictions=...)")
    if spec.loss is not None and tuple(spec.loss.shape.as_list()) != ():
        raise CSRunError(f"model_fn's loss has shape {tuple(spec.loss.shape.as_list())}, "
                         "not a scalar", "reduce the per-sample losses to one value")


def data_flow_ops(graph: tf.Graph, sources: Iterable[tf.Tensor],
                  targets: Iterable[tf.Tensor]) -> list[tf.Operation]:
    """Ops through which the values of `sources` reach `targets`, in graph order.

    Shape-only ops (tf.shape of a sample) are cuts: with static shapes they carry no data.
    """
    downstream = _reached([t.op for t in sources],
                          lambda op: () if op.type in SHAPE_OPS else _consumers(op))
    upstream = _reached([t.op for t in targets], _producers)
    keep = {op for op in downstream & upstream if op.type not in SHAPE_OPS}
    return [op for op in graph.get_operations() if op in keep]


def op_closure(start: tf.Operation | tf.Tensor) -> list[tf.Operation]:
    """Every op `start` (an op, or a tensor's op) depends on through data and control edges,
    `start` first."""
    first = start.op if isinstance(start, tf.Tensor) else start
    seen, stack, order = set(), [first], []
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        order.append(op)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return order


def each_once(stack: list[Any]) -> Iterator[Any]:
    """Pop `stack` (tensors or ops) depth-first, yielding each once (by name); the caller
    pushes onto `stack` what to visit next."""
    seen: set[str] = set()
    while stack:
        item = stack.pop()
        if item.name not in seen:
            seen.add(item.name)
            yield item


def _reached(ops: Iterable[tf.Operation],
             step: Callable[[tf.Operation], Iterable[tf.Operation]]) -> set[tf.Operation]:
    """`ops` and the ops `step` leads to from them, transitively (depth-first)."""
    seen = set(ops)
    stack = list(seen)
    while stack:
        for nxt in step(stack.pop()):
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


def _consumers(op: tf.Operation) -> list[tf.Operation]:
    return [c for out in op.outputs for c in out.consumers()]


def _producers(op: tf.Operation) -> list[tf.Operation]:
    return [t.op for t in op.inputs]


def is_gradient(op: tf.Operation) -> bool:
    """Whether `op` is of a gradient tf.gradients or an optimizer built (its scope)."""
    return op.name.startswith("gradients")


def data_downstream(ops: Iterable[tf.Operation]) -> set[tf.Operation]:
    """The ops computed from `ops` (their data consumers, transitively), `ops` included."""
    return _reached(ops, _consumers)


def data_upstream(op: tf.Operation) -> list[tf.Operation]:
    """The ops `op` computes from (its data inputs, transitively; control inputs only order),
    `op` included."""
    return list(_reached([op], _producers))
