"""Match kernels: lower every op that carries samples from the inputs to the loss (or to
the predictions) onto the kernels of wafer.kernels, or list it as unsupported.

Library kernels (dense + bias + activation, conv2d, pooling, dropout, batch norm, softmax
cross-entropy) are the fused fast paths (`fast_paths.py`); every other op of the forward
graph lowers to a generic kernel through the registry of `rules.py` (`lowering.py`,
`lowering_spatial.py`, `sequences.py`). The Matcher is the rules' `rules.Context`. The loss
tail (the reduction over the batch and terms of the weights alone) is read by
`loss_tail.py`. Nothing is assumed: an op
that fits no rule is reported with its type, name, source line and the reason.
"""
from __future__ import annotations

import dataclasses
from dataclasses import replace
from typing import Any, Iterable, Iterator

import numpy as np
import tensorflow as tf

from common.errors import CSRunError
from coordinator.compiler import (
    batch_broadcast,
    batch_tail,
    batch_writes,
    bincount,
    blockers,
    candidate_sampling,  # noqa: F401 (its fast path)
    complex_values,
    fast_paths,
    folded_batch,
    grappler,
    in_batch,
    leading_stack,
    loss_tail,
    lowering,
    precision,
    random_numbers,
    refusals,
    reported_loss,
    second_order,
    spectra,
)
from coordinator.compiler.extract import (
    ExtractedGraph,
    data_flow_ops,
    data_upstream,
    is_gradient,
    user_name,
    user_source,
)
from coordinator.compiler.gathered_rows import GATHERS, gathered_rows_refusal
from coordinator.compiler.ir import KernelNode, MatchedModel, ParamRef, TrainingSpec, UnsupportedOp
from coordinator.compiler.operands import Operands, Weight, static_shape
from coordinator.compiler.rules import FAST_PATHS
from coordinator.compiler.step_values import StepValues
from coordinator.compiler.training import analyze_training, objective_losses, skip_identity
from coordinator.compiler.training.graph import variable_op
from coordinator.compiler.training.writes import computed_after_write
from coordinator.compiler.weight_program import WeightProgramBuilder
from tf_model.estimator_spec import ModeKeys
from tf_model.keras_regularizers import unpenalized_regularizers

# Host-side tails of predict-mode outputs: computed by the chief from streamed values.
HOST_OPS = {"Softmax", "ArgMax", "ArgMin", "Cast", "Identity", "Squeeze", "ExpandDims",
            "Reshape", "Sigmoid", "Round", "Greater", "GreaterEqual", "Less", "LogSoftmax"}
STREAMED_DTYPES = ("float32", "float16", "int32", "int64", "bool")
# What to do with an input the CS does not stream, by its dtype (float64 is refused before:
# tf_model.model_fn.batch_signature).
STREAM_INSTEAD = {
    "string": "map strings to integer ids in input_fn (tf.strings.to_hash_bucket_fast, "
              "tf.lookup.StaticHashTable)",
    "bfloat16": "cast it to float16 in input_fn (the CS computes 16-bit floats as IEEE "
                "float16: the mixed_float16 policy)",
}


# Ops adding terms to a loss (the weight penalties added to a loss slicing the batch).
ADDED_TERMS = ("Add", "AddV2", "AddN")
# Ops whose operand may be a value of the global step (step_values.py): element-wise ones.
STEP_VALUE_READERS = {*lowering.BINARY, "Select", "SelectV2"}


class Matcher:
    """One pass over the data-flow ops, in graph (= topological) order."""

    def __init__(self, extracted: ExtractedGraph, targets: list[tf.Tensor],
                 host_tensors: list[tf.Tensor]):
        self.x = extracted
        self.batch_size = extracted.batch_size
        graph = self.graph = extracted.graph
        sources = [graph.get_tensor_by_name(extracted.placeholders[s.name]) for s in extracted.inputs]
        # a weight tiled over the batch is a source too: every sample's copy of it
        # (batch_broadcast.py)
        forward = {op for t in targets for op in data_upstream(t.op)}
        self.broadcasts = {op for op in graph.get_operations() if batch_broadcast.broadcast_value(
            op, self.batch_size, forward) is not None}
        sources += [op.outputs[0] for op in self.broadcasts]
        # and the seed of a gradient the loss takes (second_order.py): ones per sample
        self.seeds = second_order.seeds(graph, self.batch_size)
        sources += [op.outputs[0] for op in self.seeds]
        # random numbers are drawn per sample on the CS (or refused): sources of values too,
        # but for noise on weights, which the weight program draws
        self.noise_on_weights = random_numbers.noise_on_weights(graph, sources, targets,
                                                                self.batch_size)
        sources += [op.outputs[0] for op in graph.get_operations()
                    if random_numbers.is_draw(op) and op not in self.noise_on_weights]
        self.ops = folded_batch.with_unfolds(
            self._drop_host_tails(data_flow_ops(graph, sources, targets), targets),
            host_tensors, self.batch_size)
        self.flow = set(self.ops)
        self.operands = Operands(graph, self.flow)
        self.weight_program = WeightProgramBuilder(self.operands, self.flow)
        self.step_values = StepValues(extracted)
        self.values: dict[str, str] = {}  # batched tensor -> kernel or input name
        self.shapes: dict[str, tuple[int, ...]] = {}  # batched tensor -> per-sample shape
        self.fold_factors: set[int] = set()  # rows per sample of the folded values so far
        self.tail: set[str] = set()  # tensors of the loss tail (after a batch reduction)
        self.refused: set[str] = set()  # tail tensors computed from a refused op's outputs
        self.leading: set[str] = set()  # batched tensors held with a stack axis first
        self.frontier: list[tf.Tensor] = []  # batched tensors the batch reductions read
        self.internal: dict[str, str] = {}  # tensors inside a fused kernel -> kernel
        self.consumed: set[tf.Operation] = set()
        self.kernels: list[KernelNode] = []
        self.unsupported: list[UnsupportedOp] = []
        self.protected = self._host_read_tensors(host_tensors)
        model = extracted.spec
        self.session_ops = grappler.session_ops(
            [model.loss, model.train_op, model.predictions, model.eval_metric_ops,
             model.host_call[1] if model.host_call else None])
        # a batch_norm_training kernel's moments (keepdims and squeezed) -> (kernel, statistic)
        self.statistics: dict[str, tuple[str, str]] = {}
        for spec in extracted.inputs:
            placeholder = extracted.placeholders[spec.name]
            self.values[placeholder] = spec.name
            self.shapes[placeholder] = spec.shape

    # ---- graph queries ----
    def _drop_host_tails(self, ops: list[tf.Operation], targets: list[tf.Tensor]):
        if self.x.mode != ModeKeys.PREDICT:
            return ops
        keep, changed = list(ops), True
        while changed:
            changed, alive = False, set(keep)
            for op in reversed(keep):
                users = [c for out in op.outputs for c in out.consumers() if c in alive]
                if op.type in HOST_OPS and not users:
                    keep.remove(op)
                    changed = True
                    break
        return keep

    def _host_read_tensors(self, host_tensors: list[tf.Tensor]) -> set[str]:
        """Data-flow tensors read by host-side computations (metrics, predictions)."""
        upstream, stack = set(), [t.op for t in host_tensors]
        while stack:
            op = stack.pop()
            if op in upstream or op in self.flow:
                continue
            upstream.add(op)
            stack.extend(t.op for t in op.inputs)
            stack.extend(op.control_inputs)
        for op in self.noise_on_weights & upstream:  # (drawn on the CS and on the host)
            self.unsupported.append(refusals.attribute(op, random_numbers.HOST_READS_NOISE,
                                                       self.tail, self.is_batched))
        read = {t.name for t in host_tensors if t.op in self.flow}
        for op in upstream:
            read.update(t.name for t in op.inputs if t.op in self.flow)
            read.update(t.name for c in op.control_inputs if c in self.flow for t in c.outputs[:1])
        return read

    def consumers(self, tensor: tf.Tensor) -> list[tf.Operation]:
        return [c for c in tensor.consumers() if c in self.flow]

    def sole_consumer(self, tensor: tf.Tensor) -> tf.Operation | None:
        """The one data-flow op reading `tensor`, if fusing it hides nothing the host reads."""
        users = self.consumers(tensor)
        if len(users) != 1 or tensor.name in self.protected or users[0] in self.consumed:
            return None
        return users[0]

    def value(self, tensor: tf.Tensor) -> str | None:
        return self.values.get(tensor.name)

    def sample_input(self) -> str:
        return self.x.inputs[0].name

    def shape(self, tensor: tf.Tensor) -> tuple[int, ...]:
        return self.shapes.get(tensor.name, self.sample_shape(tensor))

    def is_batched(self, tensor: tf.Tensor) -> bool:
        return tensor.name in self.values

    def folds(self, tensor: tf.Tensor) -> int:
        """k for a per-sample value whose per-sample axis of k is folded into the batch
        ([B*k, ...], carried as the per-sample (k, ...): folded_batch.py), else 1."""
        static, batch = static_shape(tensor), self.batch_size
        if not self.is_batched(tensor) or not static or static[0] == batch or static[0] % batch:
            return 1
        k = static[0] // batch
        return k if self.shapes.get(tensor.name) == (k, *static[1:]) else 1

    def axis_shift(self, tensor: tf.Tensor) -> int:
        """What to subtract from an axis of `tensor` for the same axis of its per-sample value:
        1 (the batch), 0 for folded rows (their per-sample axis 0 is the k rows a sample)."""
        return 0 if self.folds(tensor) > 1 else 1

    def sample_shape(self, tensor: tf.Tensor, inputs: Iterable[tf.Tensor | str] = ()) -> tuple[int, ...]:
        """The per-sample shape of `tensor`, computed row by row from `inputs`: (k, ...) when
        it keeps their folded [B*k, ...] rows, (S, ...) for a value held with its stack axis
        first (the batch second), else its static shape without the batch."""
        static = static_shape(tensor)
        if tensor.name in self.leading:
            return (static[0], *static[2:])
        k = max((self.folds(t) for t in inputs if isinstance(t, tf.Tensor)), default=1)
        return (k, *static[1:]) if k > 1 and static and static[0] == k * self.batch_size \
            else static[1:]

    def derived_weight(self, tensor: tf.Tensor) -> Weight | None:
        if self.is_batched(tensor) or tensor.name in self.tail or \
                self.operands.view(tensor) is not None:  # a static view: read as such
            return None
        found = self.weight_program.derive(tensor)
        return found if isinstance(found, Weight) else None

    def weight_program_sources(self) -> set[str]:
        program = self.weight_program.program({p.variable for k in self.kernels for p in k.params})
        return {p.variable for p in program.sources} if program is not None else set()

    def weight_problem(self, tensor: tf.Tensor) -> str:
        if self.is_batched(tensor) or tensor.name in self.tail or \
                self.operands.view(tensor) is not None or \
                self.operands.constant(tensor) is not None or self._drawn_per_sample(tensor):
            return ""
        found = self.weight_program.derive(tensor)
        return found if isinstance(found, str) else ""

    def _drawn_per_sample(self, tensor: tf.Tensor) -> bool:
        """Whether `tensor` reads random numbers of the samples' side (not the weight
        program's noise on weights, which is no source of the data flow)."""
        random = self.operands.random_source(tensor)
        return random is not None and random in self.flow

    def unique_name(self, base: str) -> str:
        taken = {k.name for k in self.kernels} | {s.name for s in self.x.inputs}
        name, i = base, 1
        while name in taken:
            name, i = f"{base}_{i}", i + 1
        return name

    @staticmethod
    def scope(op: tf.Operation, variable: str = "") -> str:
        """A kernel's base name: its variable's scope, else its op's name."""
        if "/" in variable:
            return variable.rsplit("/", 1)[0]
        return op.name

    # ---- recording ----
    def add_kernel(self, base: str, type_: str, inputs: list[tf.Tensor | str], attrs: dict[str, Any],
                   params: list[ParamRef], ops: list[tf.Operation], output: tf.Tensor | None,
                   output_shape: tuple[int, ...] | None = None,
                   source_op: tf.Operation | None = None) -> KernelNode:
        """A kernel reading `inputs` (batched tensors or kernel names) that computes `output`
        (None: an intermediate kernel of a lowering); `ops` are the TF ops it replaces."""
        name = self.unique_name(base)
        names = [t if isinstance(t, str) else self.values[t.name] for t in inputs]
        shapes = [self.kernel_shape(t) if isinstance(t, str) else self.shape(t) for t in inputs]
        if output_shape is None:
            output_shape = self.sample_shape(output, inputs)
        computed = output if output is not None else (source_op or ops[0]).outputs[0]
        if type_ != "loss" and precision.tensor_precision(computed):
            attrs = {**attrs, "precision": precision.tensor_precision(computed)}
        kernel = KernelNode(
            name=name, type=type_, inputs=tuple(names), input_shapes=tuple(shapes), attrs=attrs,
            params=tuple(params), output_shape=tuple(output_shape),
            tf_tensor=output.name if output is not None else "",
            source=user_source(source_op or ops[0]),
            ops=tuple(op.name for op in ops))
        self.kernels.append(kernel)
        self.consumed.update(ops)
        for op in ops:
            for out in op.outputs:
                self.internal.setdefault(out.name, name)
        if output is not None:
            self.values[output.name] = name
            self.shapes[output.name] = kernel.output_shape
            self._note_fold(output)
        return kernel

    def _note_fold(self, output: tf.Tensor) -> None:
        """Record `output`'s rows per sample if it holds folded rows (fold_factors)."""
        if self.folds(output) > 1:
            self.fold_factors.add(self.folds(output))

    def kernel_shape(self, name: str) -> tuple[int, ...]:
        for k in self.kernels:
            if k.name == name:
                return k.output_shape
        for s in self.x.inputs:
            if s.name == name:
                return s.shape
        raise KeyError(name)

    def alias(self, op: tf.Operation, source: tf.Tensor, output: tf.Tensor | None = None) -> None:
        """`op`'s output (its first, or `output`) is `source`'s value (an identity)."""
        output = op.outputs[0] if output is None else output
        self.values[output.name] = self.values[source.name]
        self.shapes[output.name] = self.shape(source)
        self._note_fold(output)  # (tf.repeat's reshape of the tiled [B, k, ...] rows)
        self.consumed.add(op)

    def reject(self, op: tf.Operation, reason: str = "") -> None:
        if not self._knock_on(op, reason):
            self.unsupported.append(refusals.attribute(op, reason, self.tail, self.is_batched))
        self.consumed.add(op)
        for out in op.outputs:  # keep going so that every unsupported op is found
            if out.shape.rank and out.shape[0] == self.x.batch_size:
                self.values[out.name] = op.name
                self.shapes[out.name] = static_shape(out)[1:]
            else:
                self.tail.add(out.name)
                self.refused.add(out.name)

    def _knock_on(self, op: tf.Operation, reason: str) -> bool:
        """Whether `op` is refused only for mixing samples through values of the tail that
        an op already refused computes (a refused split of the batch's pieces): a
        consequence of that refusal, not a problem of its own."""
        tail = [t for t in op.inputs if t.name in self.tail]
        return reason == lowering.mixes_samples(op, self.x.batch_size) and bool(tail) and \
            all(t.name in self.refused for t in tail)

    # ---- operands of generic kernels ----
    def weight_param(self, role: str, weight: Weight) -> ParamRef:
        return ParamRef(role, weight.variable, weight.shape, variable_shape=weight.variable_shape,
                        view=weight.view)

    def operand_list(self, op: tf.Operation, tensors: Iterable[tf.Tensor],
                     float_constants: bool = True):
        """(letters, batched inputs, constant attrs, params) for the kernel's `operands`,
        or a reason (str) why a tensor cannot be an operand."""
        letters, inputs, params = "", [], []
        attrs: dict[str, Any] = {}
        for k, t in enumerate(tensors):
            if self.is_batched(t):
                letters += "i"
                inputs.append(t)
                continue
            if t.name in self.tail:
                return lowering.mixes_samples(op, self.x.batch_size)
            if self.step_values.reads_step(t) and not self.step_values.reads_weights(t):
                if op.type not in STEP_VALUE_READERS:
                    return (f"computes with a value of the global step ({t.op.type} "
                            f"'{user_name(t.op)}' at {user_source(t.op)}): the CS multiplies, adds "
                            "or selects per-sample values by one element-wise (beta * x, "
                            "loss + beta * tf.reduce_mean(kl))")
                kernel = self.step_values.kernel(self, t, op)
                if isinstance(kernel, tuple):
                    return kernel[0]
                letters += "i"
                inputs.append(kernel)
                continue
            weight = self.operands.weight(t) or self.operands.view(t)
            if weight is not None and weight.view is not None:
                weight = self.per_sample_view(op, weight)
            if weight is not None:
                if self.step_values.written(weight.variable) is not None:
                    return self.step_values.written_refusal(weight.variable)
                if weight.dtype != "float32":
                    return f"weight {weight.variable} is {weight.dtype}: the CS computes in float32"
                letters += "p"
                params.append(self.weight_param(f"p{k}", weight))
                attrs[f"p{k}"] = list(weight.shape)
                continue
            value = self.operands.constant(t)
            if value is None:
                value = self.operands.zero_product(t)
            if value is not None:
                rows = self.folded_rows(op)
                stacked = leading_stack.batch_constant(self, op, t)
                if stacked is not None:
                    value = stacked
                elif value.ndim and value.ndim == len(static_shape(op.outputs[0])) and \
                        value.shape[0] in (self.x.batch_size, *rows) and value.shape[0] != 1:
                    if not (value == value[:1]).all():
                        return (f"a constant of shape {value.shape} holds other values for "
                                "each sample: feed per-sample values through input_fn")
                    value = value[:1]  # the same for every sample (tf.zeros_like of a batch)
                if float_constants and value.dtype.kind == "f":
                    value = value.astype(np.float32)
                value = np.asarray(value)
                letters += "c"
                attrs[f"c{k}"] = value
                continue
            random = self.operands.random_source(t)
            if random is not None and self._drawn_per_sample(t):
                return (f"uses random numbers ({random.type} at {user_source(random)}): "
                        f"{random_numbers.refusal(random.type)}")
            derived = self.weight_program.derive(t, condition=k == 0 and op.type in lowering.SELECTS)
            if isinstance(derived, str):
                return derived
            letters += "p"
            params.append(self.weight_param(f"p{k}", derived))
            attrs[f"p{k}"] = list(derived.shape)
        return letters, inputs, attrs, params

    def folded_rows(self, op: tf.Operation) -> tuple[int, ...]:
        """(B*k,) if `op` reads folded rows (a constant of B*k equal rows broadcasts along
        them as the batch's does), else ()."""
        folded = any(self.folds(t) > 1 for t in op.inputs)
        return static_shape(op.outputs[0])[:1] if folded else ()

    def per_sample_view(self, op: tf.Operation, weight: Weight) -> Weight:
        """A view broadcast over the batch (zeros of a batch's shape plus a weight: a
        recurrent layer's first step) reads the same elements for every sample: one row."""
        view, rows = weight.view, self.folded_rows(op)
        assert view is not None
        if view.ndim and view.ndim == len(static_shape(op.outputs[0])) and \
                view.shape[0] in (self.x.batch_size, *rows) and view.shape[0] != 1 and \
                (view == view[:1]).all():
            return dataclasses.replace(weight, shape=(1, *weight.shape[1:]),
                                       view=np.ascontiguousarray(view[:1]))
        return weight

    # ---- the pass ----
    def run(self) -> None:
        for op in self.ops:
            if op in self.consumed or (op.type == "Placeholder" and op.outputs[0].name in self.values):
                continue
            if op.type == "RFFT" and spectra.lower(self, op):
                continue
            if any(t.dtype.is_complex for t in op.outputs):
                reason = complex_values.lower(self, op)
                if reason:
                    self.reject(op, reason)
                continue
            bad = self._check_dtypes(op) or second_order.refusal(self, op) or \
                folded_batch.refusal(self, op)
            if bad and op.type not in lowering.RECURRENT:
                self.reject(op, bad)
                continue
            if op.type in lowering.RECURRENT or random_numbers.is_draw(op):
                lowering.lower_generic(self, op)
                continue
            if op in self.seeds:
                second_order.lower(self, op, self.graph)
                continue
            if any(t.name in self.leading for t in op.inputs) and \
                    not leading_stack.loss_reduction(self, op):
                reason = leading_stack.lower(self, op)
                if reason:
                    self.reject(op, reason)
                continue
            if op in self.broadcasts:
                reason = batch_broadcast.lower(self, op)
                if reason:
                    self.reject(op, reason)
                continue
            if op.type in lowering.BINARY or op.type in in_batch.PAIRING:
                in_batch.sample_constants(self, op)
            if fast_paths.match_batch_norm_training(self, op) or bincount.match_bincount(self, op) \
                    or self._enters_tail(op):
                continue
            if self.match_alias(op) or in_batch.row(self, op) or leading_stack.unit_stack(self, op) or \
                    any(rule(self, op) for rule in FAST_PATHS):
                continue
            lowering.lower_generic(self, op)
        for op, reason in folded_batch.host_reads(self):
            self.reject(op, reason)

    def _check_dtypes(self, op: tf.Operation) -> str:
        for t in list(op.outputs) + [t for t in op.inputs if t.op in self.flow]:
            name = t.dtype.base_dtype.name
            if name not in STREAMED_DTYPES + precision.COMPUTED and name != "resource":
                return precision.dtype_problem(name)
        return ""

    def _enters_tail(self, op: tf.Operation) -> bool:
        """Batch reductions start the loss tail; ops reading the tail stay in it."""
        tail_inputs = [t for t in op.inputs if t.name in self.tail]
        if tail_inputs:
            batched = [t for t in op.inputs if self.is_batched(t)]
            if batched and not self._loss_only(op):
                self.reject(op, lowering.mixes_samples(op, self.x.batch_size))
                return True
            self.tail.update(out.name for out in op.outputs)
            if any(t.name in self.refused for t in tail_inputs):
                self.refused.update(out.name for out in op.outputs)
            self.consumed.add(op)
            return True
        axes = lowering.batch_reduction_axes(self, op)
        if axes is None:
            if not batch_tail.contraction(self, op) and not batch_tail.batch_sort(self, op) \
                    and not self._slices_for_the_loss(op):
                return False
            self.tail.update(out.name for out in op.outputs)  # (a batch tail's: loss_tail.py)
            self.consumed.add(op)
            return True
        if in_batch.statistic(self, op, axes):
            return True
        self.frontier.append(op.inputs[0])
        self.tail.update(out.name for out in op.outputs)
        self.consumed.add(op)
        return True

    def _slices_for_the_loss(self, op: tf.Operation) -> bool:
        """A slice of the batch axis (batch_tail.batch_slice) whose every reader computes
        the loss of training or evaluation: a value of the loss tail."""
        return self.x.mode != ModeKeys.PREDICT and batch_tail.batch_slice(self, op) and \
            self._loss_only(op, ADDED_TERMS)

    def _loss_only(self, op: tf.Operation, terms: tuple[str, ...] = ()) -> bool:
        """`op` (reading the loss tail and per-sample values: x - tf.reduce_mean(x)) and all
        it feeds compute the loss from values, constants and float32 scalars of weights alone
        (a batch tail, batch_tail.py: it gives each sample such a scalar; tf.shape of a
        value, static, is a constant),
        but for other values that ops of the `terms` types add (weight penalties, which the
        tail measures apart or refuses naming the weight)."""
        seen, stack = set(), [op]
        while stack:
            current = stack.pop()
            if current in seen:
                continue
            seen.add(current)
            if current.type not in terms and any(t.op not in self.flow and self.operands.constant(t) is None
                   and batch_tail.static_shape_value(t) is None and not batch_tail.weight_scalar(t)
                   for t in current.inputs):
                return False
            stack.extend(c for out in current.outputs for c in self.consumers(out))
        return True

    def match_alias(self, op: tf.Operation) -> bool:
        """Ops that pass their input on unchanged (a reshape to the same shape included)."""
        if not op.inputs or not self.is_batched(op.inputs[0]):
            return False
        same = op.outputs and op.outputs[0].shape == op.inputs[0].shape and \
            op.outputs[0].dtype == op.inputs[0].dtype
        if op.type in ("Identity", "Snapshot", "PreventGradient") or \
                (op.type in ("Reshape", "Squeeze", "ExpandDims", "Cast", "EnsureShape") and same):
            self.alias(op, op.inputs[0])
            return True
        return False

    # ---- host outputs ----
    def host_outputs(self, host_tensors: Iterable[tf.Tensor], known: Iterable[tf.Tensor] = ()) -> tuple[str, ...]:
        """Kernels and inputs whose values the host needs to compute `host_tensors`.

        The host is fed these values (and the `known` ones: the loss, returned every step)
        and computes everything else itself, with the checkpoint's weights: every data or
        control path from `host_tensors` back to the samples ends at a fed value (the host
        drops control dependencies on the ops whose values it is fed: `tf_model.host_graph`).
        A value inside a fused kernel or of the loss's reduction is recomputed from the
        values before it, and so is one of an unrolled loop's steps, from the values before
        the loop (the host's graph has the user's While)."""
        found: list[str] = []
        fed = {t.name for t in known}
        seen: set[str] = set()
        queue: list[tf.Tensor | tf.Operation] = list(host_tensors)
        while queue:
            item = queue.pop(0)
            if item.name in seen:
                continue
            seen.add(item.name)
            tensors = item.outputs if isinstance(item, tf.Operation) else [item]
            ready = [t for t in tensors if (t.name in fed or t.name in self.values
                                            and t.name not in self.leading)  # (not TF's layout)
                     and t.op.name not in self.x.loop_ops]  # (not in the host's graph)
            if ready and ready[0].name not in fed and self.folds(ready[0]) > 1 and \
                    self.operands.constant(ready[0]) is not None:
                ready = []  # (folded labels of a constant: the host computes them as TF does)
            if ready and ready[0].name not in fed and self.folds(ready[0]) > 1:
                # (a metric of the loss recomputed on the host from folded rows)
                self.reject(ready[0].op, folded_batch.host_read(self.folds(ready[0])))
                continue
            if ready:  # a control dependency is met by any fed output of its op
                name = self.values.get(ready[0].name)
                if ready[0].name not in fed and name is not None and name not in found:
                    found.append(name)
                continue
            op = item if isinstance(item, tf.Operation) else item.op
            queue.extend(op.inputs)
            queue.extend(op.control_inputs)
        return tuple(found)


def host_tensors(extracted: ExtractedGraph) -> list[tf.Tensor]:
    """Tensors the chief computes on the host: host_call inputs, metrics (not in PREDICT:
    an Estimator runs only the predictions there), predictions."""
    spec = extracted.spec
    tensors: list[Any] = []
    if spec.host_call is not None:
        args = spec.host_call[1]
        tensors.extend(args.values() if isinstance(args, dict) else args)
    if spec.eval_metric_ops and extracted.mode != ModeKeys.PREDICT:
        for value, update in spec.eval_metric_ops.values():
            tensors.extend([value, update])
    if extracted.mode == ModeKeys.PREDICT and spec.predictions is not None:
        preds = spec.predictions
        tensors.extend(preds.values() if isinstance(preds, dict) else [preds])
    out = []
    for t in tensors:
        if isinstance(t, tf.Variable):  # an update op that is a variable's assign_add
            t = t.op                   # (tf.compat.v1.metrics.mean_iou's): its op
        if isinstance(t, tf.Operation):
            out.extend(t.inputs)
            out.extend(i for c in t.control_inputs for i in c.inputs)
        elif isinstance(t, tf.Tensor):
            out.append(t)
    return out


def _check_inputs(extracted: ExtractedGraph) -> list[UnsupportedOp]:
    bad = []
    for spec in extracted.inputs:
        if spec.dtype not in STREAMED_DTYPES:
            op = extracted.graph.get_tensor_by_name(extracted.placeholders[spec.name]).op
            what = STREAM_INSTEAD.get(spec.dtype, "cast it in input_fn")
            bad.append(UnsupportedOp(op.type, spec.name, f"{extracted.input_source} (input_fn)",
                                     f"input_fn yields {spec.name} as {spec.dtype}: the CS streams "
                                     f"{', '.join(STREAMED_DTYPES[:-1])} or bool; {what}"))
    return bad


def match(extracted: ExtractedGraph) -> MatchedModel:
    """Lower the user's ops onto kernels; unsupported ops are listed, not raised."""
    hosts = host_tensors(extracted)
    predict = extracted.mode == ModeKeys.PREDICT
    train = extracted.mode == ModeKeys.TRAIN
    # (the optimizer minimizes another loss than the returned one: the training passes see it)
    extracted, returned = reported_loss.minimized_view(extracted) if train else (extracted, None)
    spec = extracted.spec
    objectives = objective_losses(extracted) if train else []
    losses = [spec.loss, *objectives] + ([returned] if returned is not None else [])
    matcher = Matcher(extracted, list(hosts) if predict else losses, hosts)
    matcher.unsupported.extend(_check_inputs(extracted))
    matcher.unsupported.extend(_after_update([spec.loss, *objectives] if objectives else []))
    matcher.unsupported.extend(reported_loss.after_update(returned) if returned is not None
                               else [])
    for loss in losses if spec.loss is not None and not objectives else []:
        matcher.unsupported.extend(_after_state_write(loss))
    if not matcher.unsupported or not objectives:
        matcher.run()
    if matcher.unsupported:  # (what the first refusals hide: named at first contact too)
        matcher.unsupported.extend(blockers.hidden(matcher, matcher.ops, matcher.tail,
                                                   matcher.unsupported,
                                                   matcher.weight_program.kernel_less))
    loss_kernel, regularizers = "", dict[str, list[tuple[str, float]]]()
    reported_kernel, own = reported_loss.lower_first(matcher, spec.loss, returned)
    if not predict and not matcher.unsupported:
        loss_kernel, regularizers = loss_tail.lower_loss(matcher, spec.loss, bool(objectives))
    loss_kernels, penalties = _objective_kernels(matcher, spec, objectives, loss_kernel)
    unreported = frozenset[str]()
    if returned is not None and not matcher.unsupported:
        if not reported_kernel:
            reported_kernel, own = loss_tail.lower_loss(matcher, returned, True)
        unreported, refused = reported_loss.unreported(returned, regularizers, own)
        matcher.unsupported.extend(refused)
    training = None
    if extracted.mode == ModeKeys.TRAIN and not matcher.unsupported:
        half = any(k.attrs.get("precision") == precision.FLOAT16 for k in matcher.kernels)
        training = analyze_training(extracted, half=half, normalized=normalized(matcher))
        training = replace(training, objectives=tuple(
            replace(o, loss_kernel=loss_kernels.get(skip_identity(
                extracted.graph.get_tensor_by_name(o.loss)).name, ""))
            for o in training.objectives))
        matcher.unsupported.extend(
            UnsupportedOp("Loss", o.loss, o.source, "a loss the train_op minimizes besides "
                          "model_fn's that the compiler did not lower (no loss kernel)")
            for o in training.objectives if not o.loss_kernel)
        matcher.unsupported.extend(_misplaced_penalties(spec.loss, training, penalties, regularizers))
        matcher.unsupported.extend(untrainable(matcher, training))
        matcher.unsupported.extend(moving_statistics(matcher, training))
        state_writes, refused = batch_writes.lower(matcher, extracted, training)
        matcher.unsupported.extend(refused)
        training = replace(training, weight_writes=training.weight_writes + state_writes)
        if training.dynamic_loss_scale is not None and \
                any(k.name == loss_kernel and k.type == "batch_tail_loss" for k in matcher.kernels):
            matcher.unsupported.append(UnsupportedOp(
                spec.loss.op.type, spec.loss.op.name, user_source(spec.loss.op), "dynamic loss "
                "scaling of a loss of the whole batch (not a sum of per-sample values): the CS "
                "scales a sum of per-sample losses; set a fixed loss_scaling_factor"))
        if training.loss_scale != 1.0:  # into the float16 backward's seed
            matcher.kernels = [replace(k, attrs={**k.attrs, "loss_scale": training.loss_scale})
                               if k.name == loss_kernel else k for k in matcher.kernels]
    if not matcher.unsupported and training is not None:
        matcher.unsupported.extend(spectra.rounding_noise(matcher.kernels, extracted))
    # The root cause first: a recurrent layer explains the ops around its loop, else the
    # earliest op in graph order those after it read (a fold's reshape before the dropout
    # drawn on its rows); what is no op of the graph (a variable, a loss) after them.
    order = {op.name: index for index, op in enumerate(extracted.graph.get_operations())}
    matcher.unsupported.sort(key=lambda u: (u.type not in lowering.RECURRENT,
                                            order.get(u.name, len(order))))
    kernels = tuple(loss_tail.attach_regularizers(matcher.kernels, regularizers))
    weights = matcher.weight_program.program({p.variable for k in kernels for p in k.params})
    if weights is not None:
        weights = replace(weights, sources=tuple(
            replace(p, regularizers=tuple(regularizers.get(p.variable, ())))
            for p in weights.sources))
    if unreported:
        marked, sources = reported_loss.mark_unreported(
            kernels, weights.sources if weights is not None else (), unreported)
        kernels = tuple(marked)
        weights = replace(weights, sources=tuple(sources)) if weights is not None else None
    reported = returned if returned is not None else spec.loss
    known = [reported] if reported is not None and not predict else []
    outputs = matcher.host_outputs(hosts, known) if not matcher.unsupported else ()
    return MatchedModel(inputs=extracted.inputs, kernels=kernels, loss_kernel=loss_kernel,
                        outputs=outputs, training=training,
                        unsupported=tuple(matcher.unsupported), weight_program=weights,
                        reported_loss_kernel=reported_kernel,
                        unpenalized_regularizers=unpenalized_regularizers(extracted.graph))


def _objective_kernels(matcher: Matcher, spec: Any, objectives: list[tf.Tensor], loss_kernel: str
                       ) -> tuple[dict[str, str], dict[str, dict[str, list[tuple[str, float]]]]]:
    """The loss kernel of each loss a GAN's train_op minimizes besides model_fn's, by
    tensor (model_fn's: `loss_kernel`), their tails proven as model_fn's loss's; and the
    weight penalties measured in each (by tensor; `_misplaced_penalties` checks them)."""
    kernels = {skip_identity(spec.loss).name: loss_kernel} if spec.loss is not None else {}
    penalties: dict[str, dict[str, list[tuple[str, float]]]] = {}
    for loss in objectives:
        if matcher.unsupported:
            break
        name = skip_identity(loss).name
        # (a loss lowered before is the batch's value, not a per-sample one: an objective
        # adding model_fn's loss, mse + 0.1 * ce beside mse, recomputes it from its frontier)
        lowered = {t: matcher.values.pop(t) for t in [k.tf_tensor for k in matcher.kernels
                                                      if k.name in kernels.values()]
                   if t in matcher.values}
        kernels[name], penalties[name] = loss_tail.lower_loss(matcher, loss, True)
        matcher.values.update(lowered)
    nodes = {k.name: k for k in matcher.kernels}
    for loss in ([*objectives, spec.loss] if objectives and not matcher.unsupported else []):
        node = nodes[kernels[skip_identity(loss).name]]
        if "divisors" in node.attrs:
            matcher.unsupported.append(UnsupportedOp(
                loss.op.type, loss.op.name, user_source(loss.op), "a loss divided by a count or "
                "sum of the batch (per-sample weights) among several losses minimized in one "
                "step: the CS divides one loss so; weight the samples with a constant mean "
                "(tf.reduce_mean(w * l)) or train without per-sample weights"))
            break
    return kernels, penalties


def _misplaced_penalties(loss: tf.Tensor, training: TrainingSpec,
                         penalties: dict[str, dict[str, list[tuple[str, float]]]],
                         regularizers: dict[str, list[tuple[str, float]]]) -> list[UnsupportedOp]:
    """Of several losses minimized in one step, weight penalties the CS cannot carry. The CS
    adds a weight's penalty to its gradient in every objective's pass and keeps the pass of
    the objective training it, and adds all penalties to model_fn's loss: right when each
    penalty is in the loss minimized for its weight and model_fn's loss holds them all, and
    no reupdate (a further optimizer's pass of the weight) keeps it."""
    if not training.objectives:
        return []
    penalized = next((r for r in training.reupdates if r.variable in regularizers), None)
    if penalized is not None:
        return [UnsupportedOp("Loss", penalized.variable, penalized.source, (
            f"a weight penalty on {penalized.variable}, which two optimizers update in one "
            "step: the CS adds a weight's penalty to its gradient in every loss's pass, TF to "
            "the loss that holds it alone; drop the penalty or train the weight by one "
            "optimizer"))]
    carried: dict[str, list[tuple[str, float]]] = {}
    penalties = {**penalties, skip_identity(loss).name: regularizers}  # (minimized itself)
    for objective in training.objectives:
        own = penalties.get(skip_identity(loss.graph.get_tensor_by_name(objective.loss)).name, {})
        for variable, terms in own.items():
            if variable not in objective.variables:
                return [UnsupportedOp("Loss", objective.loss, objective.source, (
                    f"a weight penalty on {variable} in a loss of several minimized in one step "
                    f"whose optimizer does not train {variable} (TF leaves it out of every "
                    f"update): the CS adds a weight's penalty to its gradient; add the penalty "
                    f"to the loss minimized for {variable}, or drop it"))]
            carried[variable] = terms
    if sorted(carried.items()) != sorted(regularizers.items()):
        return [UnsupportedOp(loss.op.type, user_name(loss.op), user_source(loss.op), (
            "model_fn's loss holds other weight penalties than the losses minimized in one "
            "step: the CS adds every minimized loss's penalties to the loss it reports; return "
            "the sum of the minimized losses (with their penalties) as model_fn's loss"))]
    return []


def _after_update(losses: list[tf.Tensor]) -> list[UnsupportedOp]:
    """Of several losses minimized in one step, one computed (in part) after a variable's
    write: a forward pass built anew under tf.control_dependencies([an update]), which reads
    the updated weights, where the CS computes every loss from the step's forward pass."""
    for loss in losses:
        found = computed_after_write(loss)
        if found is not None:
            op = found[0]
            return [UnsupportedOp(op.type, user_name(op), user_source(op), (
                "computes a loss of several minimized in one step after the train_op's "
                "update (under tf.control_dependencies): it reads the updated weights, the "
                "CS computes every loss from the step's forward pass; compute the losses "
                "outside the control dependencies"))]
    return []


def _after_state_write(loss: tf.Tensor) -> list[UnsupportedOp]:
    """The loss computed under tf.control_dependencies([a write of state the loss reads])
    (facenet's center loss): TF runs the write wherever it computes the loss (in evaluation
    too, if model_fn builds it there), where the CS writes state after a training step's
    updates only (batch_writes.py)."""
    read = {variable_op(t) for op in data_upstream(loss.op) for t in op.inputs
            if t.dtype == tf.resource}
    found = computed_after_write(loss, lambda w: variable_op(w.inputs[0]) in read)
    if found is None:
        return []
    op, write = found
    name = variable_op(write.inputs[0]).name
    return [UnsupportedOp(op.type, user_name(op), user_source(op), (
        f"computes the loss under tf.control_dependencies([the write of {name}] "
        f"({write.type} at {user_source(write)})): the CS writes state after the "
        "step's loss and updates, when training only; write it under "
        "tf.control_dependencies of the optimizer's minimize, or tf.group it with it"))]


def normalized(matcher: Matcher) -> dict[str, frozenset[str]]:
    """The batch normalizations in training: {the tensor normalized: the kernel's ops}
    (its first op, tf.nn.moments' Mean or FusedBatchNormV3, reads that tensor first)."""
    graph = matcher.graph
    return {graph.get_operation_by_name(k.ops[0]).inputs[0].name: frozenset(k.ops)
            for k in matcher.kernels if k.type == "batch_norm_training"}


def untrainable(matcher: Matcher, training) -> list[UnsupportedOp]:
    """Variables the train_op updates that no kernel holds (TF would train them, the CS
    could not), and sparse updates of a weight some kernel reads other than as a whole
    table (an embedding lookup, or a read of every row in order) or as the view of one
    gather at constant indices (gathered_rows)."""
    held: dict[str, list[tuple[KernelNode, ParamRef]]] = {}
    for k in matcher.kernels:
        for p in k.params:
            held.setdefault(p.variable, []).append((k, p))
    weights = matcher.weight_program.program(set(held))
    sources = {p.variable for p in weights.sources} if weights is not None else set()
    bad = []
    for v in training.variables:
        if v.name in sources and v.update == "sparse":
            reader = _dense_reader(matcher.graph, v.name)
            where = f" (by {reader.type} '{user_name(reader)}' at {user_source(reader)})" if reader else ""
            bad.append(UnsupportedOp("Variable", v.name, v.source,
                                     f"TF updates {v.name} as an embedding table (sparse: only its "
                                     f"lookups' rows have gradients), but the CS also computes with "
                                     f"it as a whole{where}: pick its rows by tf.matmul(tf.one_hot(ids, "
                                     f"rows), {v.name.split('/')[-1]}) instead of tf.gather (a dense "
                                     "update), or read the whole under tf.stop_gradient"))
            continue
        if v.name in sources and v.name not in held:
            continue
        if v.name not in held:
            bad.append(UnsupportedOp("Variable", v.name, v.source,
                                     f"the train_op updates {v.name}, which no op on the way "
                                     "from the samples to the loss reads: the CS would not "
                                     "train it; leave it out of var_list"))
            continue
        params = [p for _, p in held[v.name]]
        if v.update == "sparse" and any(p.view is not None for p in params):
            refusal = gathered_rows_refusal(matcher.operands, list(_model_reads(matcher.graph, v.name)),
                                            v.name, _variable_shape(matcher.graph, v.name), params)
            bad += [refusal] if refusal is not None else []
            continue
        for kernel, param in held[v.name]:
            sparse_ok = kernel.type in ("gather", "sampled_logits") or param.role.startswith("p")
            if v.update == "sparse" and not sparse_ok:
                bad.append(UnsupportedOp("Variable", v.name, v.source,
                                         f"TF updates {v.name} as an embedding table (sparse), "
                                         f"but the CS holds the {param.role} of it in {kernel.name}"))
                break
    return bad


def _model_reads(graph: tf.Graph, variable: str) -> Iterator[tf.Operation]:
    """The ops of the model (not its gradients) reading `variable`: tf.gather of its handle,
    then the readers of its value (through Identity), in graph order."""
    yield from (op for op in graph.get_operations() if op.type == "ResourceGather"
                and op.inputs[0].op.name == variable)
    reads = [op for op in graph.get_operations()
             if op.type == "ReadVariableOp" and op.inputs[0].op.name == variable]
    while reads:
        op = reads.pop(0)
        for reader in op.outputs[0].consumers():
            if is_gradient(reader):
                continue
            if reader.type == "Identity":
                reads.append(reader)
            else:
                yield reader


def _dense_reader(graph: tf.Graph, variable: str) -> tf.Operation | None:
    """The first op of the model (not its gradients) reading the whole value of `variable`."""
    return next((op for op in _model_reads(graph, variable) if op.type not in GATHERS), None)


def _variable_shape(graph: tf.Graph, variable: str) -> tuple[int, ...]:
    """The TF shape of resource variable `variable`."""
    return tuple(tf.TensorShape(graph.get_operation_by_name(variable).get_attr("shape")).as_list())


def moving_statistics(matcher: Matcher, training: TrainingSpec) -> list[UnsupportedOp]:
    """The train_op's moving-average updates, each of a batch_norm_training kernel's batch
    statistic: its kernel moves the variable by the same rule (a frozen weight it holds);
    an update of any other value is refused."""
    bad = []
    for ma in training.statistic_averages:
        owner = matcher.statistics.get(ma.statistic)
        if owner is None and ma.op:  # (a state write of another batch value: batch_writes)
            continue
        index = next((i for i, k in enumerate(matcher.kernels)
                      if owner is not None and k.name == owner[0]), None)
        if owner is None or index is None:
            bad.append(UnsupportedOp("Variable", ma.variable, ma.source,
                                     f"the train_op moves {ma.variable} toward {ma.statistic}, "
                                     "which is not a batch statistic of a BatchNormalization "
                                     "the CS carries out"))
            continue
        kernel, stat = matcher.kernels[index], owner[1]
        channels = kernel.output_shape[-1]
        problem = ""
        if kernel.attrs[f"{stat}_update"]:
            problem = f"the batch {stat} of {kernel.name} moves a second variable"
        elif ma.shape != (channels,):
            problem = f"{ma.variable} is {ma.shape}, the batch {stat} ({channels},)"
        if problem:
            bad.append(UnsupportedOp("Variable", ma.variable, ma.source, problem))
            continue
        attrs = {**kernel.attrs, f"{stat}_rule": ma.update, f"{stat}_update": list(ma.constants)}
        param = ParamRef(f"moving_{stat}", ma.variable, (channels,), frozen=True)
        matcher.kernels[index] = replace(kernel, attrs=attrs,
                                                     params=kernel.params + (param,))
    return bad



def unsupported_detail(model: MatchedModel) -> str:
    """The lines listing every unsupported layer and op, and what the compiler supports."""
    lines = refusals.detail_lines(refusals.group(model.unsupported))
    lines.append("Supported (see README, 'Supported operations'): "
                 + ", ".join(sorted(lowering.supported_op_types())))
    return "\n".join(lines)


def check_supported(model: MatchedModel, report: str = "") -> None:
    """Refuse the model if any op is unsupported: one line naming the first refusal in graph
    order (the root cause of those after it), how many more, and where the full list is (the
    error's detail, which the CLIs print before the line, and the validation report)."""
    if model.unsupported:
        grouped = refusals.group(model.unsupported)
        first, more = grouped[0], len(grouped) - 1
        why = f": {first.reason}" if first.reason else ""
        others = f" (and {more} more unsupported layer{'s' if more > 1 else ''} or " \
                 f"operation{'s' if more > 1 else ''})" if more else ""
        where = f"the list printed before this line and {report}" if report else \
            "the list printed before this line"
        hint = (f"this line names the first in graph order; {where} give all "
                f"{len(grouped)} with their source lines: change each"
                if more else "change that layer or operation as the line says")
        raise CSRunError(f"validation failed: {first.headline()}{why}{others}", hint,
                         detail=unsupported_detail(model))
