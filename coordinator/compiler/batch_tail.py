"""The batch tail: a loss that is a non-linear function of values of the whole batch (a
Mixture-of-Experts balance loss E * sum(mean(gates, 0) * mean(mask, 0)), VICReg's
tf.sqrt(tf.math.reduce_variance(z, 0) + eps) hinge and its covariance matmul(zc, zc,
transpose_a=True), Barlow Twins' cross-correlation (an einsum 'bi,bj->ij') and its
tf.linalg.diag_part, a squared difference of batch means, a Pearson correlation over the
batch, the entropy of the batch's mean prediction, tf.nn.l2_loss of a [B, d] lookup, a Cox
partial likelihood's or ListMLE's tf.argsort of the batch, tf.gather in its order and
tf.math.cumulative_logsumexp, a Sinkhorn loss's unrolled iterations of tf.reduce_logsumexp
over a pairwise cost matrix), which loss_tail.py cannot prove a sum of per-sample values.

The tail's ops, from the per-sample values they read (each the whole batch: tf's tensor
[B, ...] as one sample) to the loss, are lowered as the weight program's are
(weight_program.WeightProgramBuilder: element-wise ops, arithmetic with constants,
reductions, transposes, reshapes, products of matrices, views; here also sorts of the
batch: TopKV2 as top_k, GatherV2 at its positions as sample_gather) onto library kernels run on
a batch of one, which a `batch_tail_loss` kernel (wafer.kernels.batch_tail) evaluates once
per batch and differentiates back to every sample's values. A float32 scalar of weights
the tail reads (a learned temperature, a KL of weights added), or a value of the global step
(a capacity schedule's C in gamma * |mean(KL) - C|: its `schedule` kernel, step_values.py), is
given to every sample and read at the batch's first. A tail reading another weight or a
random number, computing in float16 or with an op the weight program does not run is
refused naming the op.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import tensorflow as tf

from coordinator.compiler import precision, second_order
from coordinator.compiler.extract import data_upstream, user_name, user_source
from coordinator.compiler.ir import ParamRef, UnsupportedOp
from coordinator.compiler.lowering import WEIGHT_COMPARISONS, slice_bounds
from coordinator.compiler.operands import static_shape
from coordinator.compiler.rules import TailContext, has_kernel
from coordinator.compiler.weight_program import WeightProgramBuilder, one_sample_equation
from wafer.kernels.batch_tail import source_name, steps_attrs

DIAGONALS = ("MatrixDiagPartV3", "MatrixDiagPart", "DiagPart")
CROSS_ENTROPIES = ("SoftmaxCrossEntropyWithLogits", "SparseSoftmaxCrossEntropyWithLogits")
INTEGERS = (tf.int32, tf.int64)
# What the tail does with the batch's integers (labels) before tf.one_hot or tf.cast.
INTEGER_VIEWS = ("StridedSlice", "Slice", "Split", "SplitV", "ConcatV2", "Identity",
                 "Reshape", "Squeeze", "ExpandDims")
# The README's row.
KERNEL_ROWS = {
    "batch_tail_loss": "a loss that is a non-linear function of values reduced over the batch "
                       "(a Mixture-of-Experts balance loss, VICReg's variance hinge and "
                       "covariance tf.matmul(zc, zc, transpose_a=True), Barlow Twins' "
                       "cross-correlation tf.einsum('bi,bj->ij', za, zb), "
                       "(mean(pred) - mean(y)) ** 2, a Pearson correlation, "
                       "the entropy of the batch's mean prediction, BPR's tf.nn.l2_loss of "
                       "looked-up embeddings, a Dice loss over tf.reshape(y, [-1]) of the "
                       "whole batch, a Cox partial likelihood or ListMLE over the "
                       "batch sorted by tf.argsort, hard-example mining's tf.math.top_k of "
                       "the losses, a Sinkhorn loss's tf.while_loop of static steps over a "
                       "pairwise cost matrix; slices of the batch on the way to the loss: "
                       "a prototypical network's support set and queries emb[:k], emb[k:] "
                       "and labels[:k], NT-Xent's tf.split(z, 2, 0) or tf.concat([z1, z2], 0), "
                       "neighbours' x[1:] - x[:-1] and tf.roll(z, 1, 0)): the loss's ops after the "
                       "per-sample values (element-wise ops, arithmetic, reductions, products "
                       "of matrices, transposes, reshapes, views, tf.linalg.diag_part, "
                       "tf.reduce_logsumexp's guard, slices, splits, rolls and concats of "
                       "the batch, tf.one_hot and tf.cast of its integer labels, "
                       "tf.math.unsorted_segment_sum/_mean by them, softmax cross entropies; sorts "
                       "of the batch's [batch] float32 values, tf.gather in their order, "
                       "tf.math.cumulative_logsumexp, tf.cumsum), run "
                       "once per batch on the whole batch's values, a batch barrier; its "
                       "gradient TF's, back to each sample; a float32 scalar of weights or a "
                       "value of the global step it reads (a capacity schedule's C in "
                       "gamma * |mean(KL) - C|) given to every sample",
}


class TailBuilder(WeightProgramBuilder):
    """Lowers the loss tail's values: the per-sample tensors it reads are its sources (the
    whole batch, in the order first read: `samples`), weight scalars given to every sample
    (`share`), other weights and random numbers refused."""

    SUBJECT = "computes the loss over the batch"
    PLACE = "on the whole batch"

    def __init__(self, m: TailContext, penalties: list[tf.Tensor],
                 share: Callable[[tf.Tensor], str | None]):
        super().__init__(m.operands, m.flow)
        self.m = m
        self.penalties = {t.name for t in penalties}  # measured apart: here 0
        self.share = share  # a weight scalar's kernel giving it to every sample, or None
        self.samples: list[tf.Tensor] = []
        self.inputs: list[tf.Tensor | str] = []  # the kernel's: a weight scalar's share
        self.root: tuple[tf.Operation, str] | None = None  # the first refusal: its cause

    def _refuse(self, tensor: tf.Tensor, reason: str) -> str | None:
        if self.root is None:
            self.root = (tensor.op, reason)
        return super()._refuse(tensor, reason)

    def _lower_new(self, tensor: tf.Tensor) -> str | np.ndarray | None:
        m, op = self.m, tensor.op
        if tensor.name in self.penalties:
            return np.zeros(static_shape(tensor), np.float32)
        constant = self.operands.constant(tensor)
        if constant is not None:
            return constant.astype(np.float32) if constant.dtype.kind == "f" else constant
        where = f"{op.type} '{user_name(op)}' at {user_source(op)}"
        shaped = static_shape_value(tensor)
        if shaped is not None:
            return shaped
        if m.is_batched(tensor):
            return self._sample(tensor, where)
        if op.type in ("IsFinite", "Select", "SelectV2") and tensor.name in m.tail:
            return self._guard(op, tensor, where)
        if tensor.name not in m.tail:
            shared = self.share(tensor)
            if shared is not None:  # (a learned temperature, a KL of weights added)
                source = self._source_of(tensor, shared)
                first = self._add(op, None, "take", [source], {"axis": 0, "indices": [0]},
                                  suffix="/weight_scalar")
                return self._add(op, tensor, "reshape", [first], {"shape": []})
            if m.step_values.reads_step(tensor) and not m.step_values.reads_weights(tensor):
                problem = m.step_values.kernel(m, tensor, op)  # (why not: the share's)
                return self._refuse(tensor, "a loss of the whole batch reads a value of the "
                                            f"global step that is no schedule: {problem[0]}")
            weight = self.operands.weight(tensor) or self.operands.view(tensor)
            what = f"weight {weight.variable}" if weight is not None else "a random number" \
                if self.operands.random_source(tensor) is not None else "a value of weights"
            return self._refuse(tensor, f"a loss of the whole batch (not a sum of per-sample "
                                        f"values) reads {what} ({where}): the CS evaluates such "
                                        "a loss from the batch's per-sample values and "
                                        "constants, plus weight penalties; compute with the "
                                        "weight per sample, before the reduction over the batch")
        if op.type == "TopKV2":
            return self._sort(op, tensor, where)
        if op.type == "CumulativeLogsumexp":
            return self._logsumexp_scan(op, tensor)
        if op.type == "GatherV2" and self.operands.constant(op.inputs[1]) is None:
            return self._gather(op, tensor, where)
        if op.type in CROSS_ENTROPIES:
            return self._cross_entropy(op, tensor, where)
        if op.type == "OneHot" or op.type == "Cast" and op.inputs[0].dtype in INTEGERS:
            return self._from_integers(op, tensor, where)
        if op.type == "Roll":
            return self._roll(op, tensor, where)
        if op.type == "UnsortedSegmentSum":
            return self._segment_sum(op, tensor, where)
        if tensor.dtype in INTEGERS and op.type in INTEGER_VIEWS:
            return self._lower_op(op, tensor, where)
        if tensor.dtype.base_dtype != (tf.bool if op.type in WEIGHT_COMPARISONS else tf.float32) \
                or precision.tensor_precision(tensor):
            return self._refuse(tensor, f"computes the loss over the batch in "
                                        f"{tensor.dtype.base_dtype.name} ({where}): the CS "
                                        "computes such a loss in float32")
        if op.type in DIAGONALS:
            return self._diagonal(op, tensor)
        if op.type == "Einsum":
            return self._einsum(op, tensor, where)
        return self._lower_op(op, tensor, where)

    def _guard(self, op: tf.Operation, tensor: tf.Tensor, where: str) -> str | None:
        """tf.reduce_logsumexp's guard of its maximum, tf.where(tf.math.is_finite(m), m, 0):
        the is_finite and select kernels."""
        inputs = self._inputs(op, tensor)
        if inputs is None:
            return None
        if op.type == "IsFinite":
            if not isinstance(inputs[0], str):
                return self._refuse(tensor, f"{self.SUBJECT} with {where}: of a constant")
            return self._add(op, tensor, "is_finite", [inputs[0]], {})
        if op.type == "Select" and len(static_shape(op.inputs[0])) != len(static_shape(tensor)):
            return self._refuse(tensor, f"{self.SUBJECT} with {where}: a vector condition")
        letters = "".join("i" if isinstance(v, str) else "c" for v in inputs)
        constants = {f"c{k}": np.asarray(v) for k, v in enumerate(inputs) if not isinstance(v, str)}
        return self._add(op, tensor, "select", [v for v in inputs if isinstance(v, str)],
                         {"operands": letters, **constants})

    def _einsum(self, op: tf.Operation, tensor: tf.Tensor, where: str) -> str | None:
        """tf.einsum of two values of the tail ('bi,bj->ij' of the whole batch's): the
        einsum kernel with a letter of its own for its one sample."""
        inputs = self._inputs(op, tensor)
        if inputs is None:
            return None
        equation = op.get_attr("equation").decode().replace(" ", "")
        if len(inputs) != 2 or not all(isinstance(v, str) for v in inputs):
            return self._refuse(tensor, f"{self.SUBJECT} with {where}: the CS runs an einsum of "
                                        "two values of the batch there")
        names: list[str] = inputs  # type: ignore[assignment]  # (all kernels or sources)
        return self._add(op, tensor, "einsum", names, {
            "equation": one_sample_equation(equation, [True, True]), "operands": "ii"})

    def _sort(self, op: tf.Operation, tensor: tf.Tensor, where: str) -> str | None:
        """tf.sort / tf.argsort (TF's top_k with k B) or tf.math.top_k of the whole batch's
        [B] float32 values (largest first, equal values by lower index first): the top_k
        kernel on the one sample, its values or its int32 positions."""
        inner = self._lower(op.inputs[0])
        if inner is None:
            return self._refuse(tensor, self.problems[op.inputs[0].name])
        if not isinstance(inner, str) or op.inputs[0].dtype != tf.float32 or \
                not op.get_attr("sorted"):
            return self._refuse(tensor, f"{self.SUBJECT} with {where}: the CS sorts the "
                                        "batch's float32 values (tf.cast them), largest first "
                                        "(sorted=True)")
        return self._add(op, tensor, "top_k", [inner], {
            "k": static_shape(tensor)[-1], "indices": tensor.value_index == 1})

    def _logsumexp_scan(self, op: tf.Operation, tensor: tf.Tensor) -> str | None:
        """tf.math.cumulative_logsumexp of a value of the tail (a Cox risk set's
        log-sum, ListMLE's): the cumulative_logsumexp kernel."""
        inputs = self._inputs(op, tensor)
        if inputs is None:
            return None
        if not isinstance(inputs[0], str):
            return self._refuse(tensor, f"{self.SUBJECT} with {op.type} '{op.name}' at "
                                        f"{user_source(op)}: its input is a constant")
        return self._scan(op, tensor, inputs, "cumulative_logsumexp")

    def _gather(self, op: tf.Operation, tensor: tf.Tensor, where: str) -> str | None:
        """tf.gather(x, order) of the whole batch's values x at the positions of a sort of
        the batch (distinct positions: axis 0, no batch_dims): the sample_gather kernel on
        the one sample, its gradient each value's back to its place."""
        x, order = op.inputs[0], op.inputs[1]
        axis = self.operands.constant(op.inputs[2])
        if order.op.type != "TopKV2" or order.value_index != 1 or \
                axis is None or int(axis) != 0 or op.get_attr("batch_dims") != 0:
            return self._refuse(tensor, f"{self.SUBJECT} with {where}: the CS gathers the "
                                        "batch's values in the order of a sort of the batch "
                                        "(tf.gather(x, tf.argsort(t)))")
        inputs = [self._lower(x), self._lower(order)]
        bad = next((t for t, v in zip((x, order), inputs) if v is None), None)
        if bad is not None:
            return self._refuse(tensor, self.problems[bad.name])
        if not all(isinstance(v, str) for v in inputs):
            return self._refuse(tensor, f"{self.SUBJECT} with {where}: it gathers from a "
                                        "constant")
        names: list[str] = inputs  # type: ignore[assignment]  # (kernels or sources)
        return self._add(op, tensor, "sample_gather", names, {})

    def _inputs(self, op: tf.Operation, tensor: tf.Tensor) -> list[str | np.ndarray] | None:
        """The values of `op`'s inputs (None: `tensor` refused for the first that has none)."""
        inputs = [self._lower(t) for t in op.inputs]
        bad = next((t for t, v in zip(op.inputs, inputs) if v is None), None)
        if bad is not None:
            self._refuse(tensor, self.problems[bad.name])
            return None
        return inputs  # type: ignore[return-value]  # (none is None)

    def _cross_entropy(self, op: tf.Operation, tensor: tf.Tensor, where: str) -> str | None:
        """tf.nn.(sparse_)softmax_cross_entropy_with_logits of logits of the tail (a query's
        distances to the prototypes, NT-Xent's similarities): with labels of the batch (its
        integer labels sliced), the softmax_cross_entropy_with_logits kernel; with constant
        labels (tf.range, tf.one_hot of it), -sum(labels * log_softmax(logits), -1), TF's
        log(sum(exp(s))) - s at the label exactly."""
        inputs = self._inputs(op, tensor)
        if inputs is None:
            return None
        logits, labels = inputs
        depth, sparse = static_shape(op.inputs[0])[-1], op.type == CROSS_ENTROPIES[1]
        if tensor.value_index != 0 or not isinstance(logits, str) or sparse and \
                not isinstance(labels, str) and not np.all((0 <= labels) & (labels < depth)):
            return self._refuse(tensor, f"{self.SUBJECT} with {where}: the CS takes the cross "
                                        "entropy of logits computed from the batch, labels "
                                        "within their classes")
        if isinstance(labels, str):
            return self._add(op, tensor, "softmax_cross_entropy_with_logits", [logits, labels],
                             {"sparse": sparse})
        hot = np.eye(depth, dtype=np.float32)[labels] if sparse else labels
        out = static_shape(op.inputs[0])
        log_p = self._add(op, None, "softmax", [logits], {"axis": -1, "log": True},
                          suffix="/log_softmax")
        picked = self._elementwise(op, None, "binary", [log_p, hot], {"op": "mul"},
                                   "/picked", "0", out)
        total = self._add(op, None, "reduce", [picked], {
            "op": "sum", "keepdims": False, "axes": [len(out) - 1]}, suffix="/sum")
        return self._add(op, tensor, "binary", [total], {
            "op": "mul", "operands": "ic", "c1": np.asarray(-1.0, np.float32)})

    def _from_integers(self, op: tf.Operation, tensor: tf.Tensor, where: str) -> str | None:
        """tf.one_hot of the batch's integer labels (a support set's classes) or tf.cast of
        them to float32: the one_hot and cast kernels (no gradient)."""
        inputs = self._inputs(op, tensor)
        if inputs is None:
            return None
        if tensor.dtype != tf.float32 or not isinstance(inputs[0], str) or \
                op.type == "OneHot" and (op.get_attr("axis") != -1 or
                                         any(isinstance(v, str) for v in inputs[1:])):
            return self._refuse(tensor, f"{self.SUBJECT} with {where}: the CS takes the batch's "
                                        "integers to float32 by tf.cast or tf.one_hot (last "
                                        "axis, constant depth and values)")
        names = [inputs[0]]
        if op.type == "Cast":
            return self._add(op, tensor, "cast", names, {"dtype": "float32"})
        depth, on, off = (np.asarray(v) for v in inputs[1:])
        return self._add(op, tensor, "one_hot", names, {
            "depth": int(depth), "on_value": float(on), "off_value": float(off)})

    def _segment_sum(self, op: tf.Operation, tensor: tf.Tensor, where: str) -> str | None:
        """tf.math.unsorted_segment_sum (and _mean's counts) of values of the tail by the
        batch's integer ids (a support set's classes): tf.one_hot(ids, n)ᵀ × the values as
        rows, TF's gradient the rows' own segment's (a gather)."""
        inputs = self._inputs(op, tensor)
        if inputs is None:
            return None
        data, ids, segments = inputs
        if isinstance(segments, str) or len(static_shape(op.inputs[1])) != 1 or \
                not isinstance(ids, str) and not isinstance(data, str):
            return self._refuse(tensor, f"{self.SUBJECT} with {where}: the CS sums rows of the "
                                        "batch's values into a constant number of segments by "
                                        "ids of rank 1")
        shape, out = static_shape(op.inputs[0]), static_shape(tensor)
        rows = [shape[0], int(np.prod(shape[1:], dtype=np.int64))]
        hot = self._add(op, None, "one_hot", [ids], {"depth": int(segments)},
                        suffix="/one_hot") if isinstance(ids, str) else \
            np.eye(int(segments), dtype=np.float32)[np.asarray(ids)]
        flat = self._add(op, None, "reshape", [data], {"shape": rows}, suffix="/rows") \
            if isinstance(data, str) else np.reshape(data, rows)
        values = [hot, flat]
        summed = self._add(op, None, "matmul", [v for v in values if isinstance(v, str)], {
            "operands": "".join("i" if isinstance(v, str) else "c" for v in values),
            "transpose_a": True, "transpose_b": False,
            **{f"c{k}": np.asarray(v) for k, v in enumerate(values) if not isinstance(v, str)}},
            suffix="/sum")
        return self._add(op, tensor, "reshape", [summed], {"shape": list(out)})

    def _roll(self, op: tf.Operation, tensor: tf.Tensor, where: str) -> str | None:
        """tf.roll of a value of the tail (the batch's samples shifted: negatives of their
        neighbours) by constant shifts: a take per axis at the rolled positions, its
        gradient rolled back (TF's _RollGrad)."""
        inputs = self._inputs(op, tensor)
        if inputs is None:
            return None
        value, shift, axes = inputs
        if not isinstance(value, str) or isinstance(shift, str) or isinstance(axes, str):
            return self._refuse(tensor, f"{self.SUBJECT} with {where}: the CS rolls values of "
                                        "the batch by constant shifts")
        shape = static_shape(tensor)
        total: dict[int, int] = {}
        for s, a in zip(np.ravel(shift), np.ravel(axes)):
            axis = int(a) % len(shape)
            total[axis] = total.get(axis, 0) + int(s)
        moves = [(a, s % shape[a]) for a, s in sorted(total.items()) if s % shape[a]]
        current = value
        for k, (axis, s) in enumerate(moves):
            last = k == len(moves) - 1
            current = self._add(op, tensor if last else None, "take", [current], {
                "axis": axis, "indices": [int(i) for i in (np.arange(shape[axis]) - s) % shape[axis]]},
                suffix="" if last else f"/roll_{axis}")
        return current if moves else self._add(op, tensor, "reshape", [value],
                                                {"shape": list(shape)})

    def _sample(self, tensor: tf.Tensor, where: str) -> str | None:
        """A per-sample value the tail reads: a source of the whole batch (float32, or the
        integers a slice of the batch takes: labels); one folded into the batch
        (tf.reshape(y, [-1]), a Dice loss's flatten: the batch's [B, k, ...]) in TF's shape."""
        if tensor.dtype not in INTEGERS and (
                tensor.dtype != tf.float32 or precision.tensor_precision(tensor)):
            return self._refuse(tensor, f"reduces a {tensor.dtype.name} per-sample value over "
                                        f"the batch in a non-linear loss ({where}): the CS "
                                        "computes such a loss from float32 values")
        source = self._source_of(tensor)
        if self.m.folds(tensor) == 1:
            return source
        return self._add(tensor.op, tensor, "reshape", [source],
                         {"shape": list(static_shape(tensor))}, suffix="/unfolded")

    def _source_of(self, tensor: tf.Tensor, shared: str | None = None) -> str:
        """The source of a per-sample value (or of the weight scalar `tensor`, every sample
        given it by the kernel `shared`: the batch's [B] copies, row 0 read)."""
        name = source_name(len(self.samples))
        self.samples.append(tensor)
        self.inputs.append(shared if shared is not None else tensor)
        folds, shape = self.m.folds(tensor), static_shape(tensor)
        if shared is not None:
            shape = (self.m.batch_size,)
        elif folds > 1:
            shape = (self.m.batch_size, folds, *shape[1:])
        self.sources[name] = ParamRef("source", name, shape)
        return name

    def _diagonal(self, op: tf.Operation, tensor: tf.Tensor) -> str | None:
        """tf.linalg.diag_part of an [n, n] value: its flat entries i * (n + 1)."""
        shape = static_shape(op.inputs[0])
        offset = self.operands.constant(op.inputs[1]) if op.type == "MatrixDiagPartV3" else 0
        inner = self._lower(op.inputs[0])
        if inner is None:
            return self._refuse(tensor, self.problems[op.inputs[0].name])
        if len(shape) != 2 or shape[0] != shape[1] or offset is None or np.any(offset != 0) or \
                not isinstance(inner, str):
            return self._refuse(tensor, f"computes the loss over the batch with {op.type} "
                                        f"'{user_name(op)}' at {user_source(op)}: the CS takes the "
                                        "main diagonal of a square matrix")
        return self._main_diagonal(op, tensor, inner, shape)


def lower(m: TailContext, loss: tf.Tensor, penalties: list[tf.Tensor],
          share: Callable[[tf.Tensor], str | None]) -> tuple[str, list[tf.Tensor]]:
    """Add the `batch_tail_loss` kernel evaluating `loss` once per batch, the values of
    weight penalties added to it left out (`penalties` are 0: the caller measures them), a
    scalar of weights read from the kernel `share` gives every sample it (None: refused);
    its name and the values it reads, per sample or such scalars ("" with the refusal in
    m.unsupported)."""
    builder = TailBuilder(m, penalties, share)
    upstream = set(data_upstream(loss.op))
    for op in loss.graph.get_operations():  # in graph order: the recursion stays shallow
        if op in upstream:                     # (an unrolled loop's iterations nest deep)
            for t in op.outputs:
                if t.name in m.tail:
                    builder._lower(t)
    value = builder._lower(loss)
    if not isinstance(value, str) or not has_kernel("batch_tail_loss"):
        op, reason = builder.root or (loss.op, "the loss is a constant")
        m.unsupported.append(UnsupportedOp(op.type, user_name(op), user_source(op), reason))
        return "", []
    program = builder.program({value})
    assert program is not None
    steps = [(k.name, k.type, k.inputs, k.attrs) for k in program.kernels]
    attrs = {**steps_attrs(steps), "batch_size": m.batch_size}
    return m.add_kernel("loss", "batch_tail_loss", list(builder.inputs), attrs, [], [], loss,
                        output_shape=(), source_op=loss.op).name, builder.samples


def batch_sort(m: TailContext, op: tf.Operation) -> bool:
    """tf.sort or tf.argsort of a per-sample float32 [B] value (TopKV2 with k B: a Cox
    partial likelihood's order of the times, ListMLE's of the relevances), or tf.math.top_k
    of it with a constant k (hard-example mining's largest losses): a value of the loss
    tail, ranking the samples against each other."""
    if op.type != "TopKV2" or not m.is_batched(op.inputs[0]) or \
            op.inputs[0].dtype != tf.float32 or len(static_shape(op.inputs[0])) != 1:
        return False
    k = m.operands.constant(op.inputs[1])
    return k is not None and 0 < int(k) <= m.batch_size


BATCH_SLICES = ("StridedSlice", "Slice", "Split", "SplitV", "Roll", "ConcatV2", "Reshape")


def weight_scalar(tensor: tf.Tensor) -> bool:
    """Whether `tensor` is a float32 scalar (of weights: a learned scale tf.maximum(w, eps),
    which the tail gives every sample; anything else the tail refuses naming it)."""
    return tensor.dtype == tf.float32 and tensor.shape.rank == 0


def batch_slice(m: TailContext, op: tf.Operation) -> bool:
    """A slice of the batch axis of a per-sample value with constant bounds: a support set
    and its queries (emb[:k], emb[k:], tf.slice), two views (tf.split(z, 2, 0)), neighbours
    (x[1:] - x[:-1], tf.roll(z, 1, axis=0)), per-sample values concatenated along it
    (two views' embeddings, tf.concat([z1, z2], 0)), or the batch regrouped (GE2E's
    tf.reshape(e, [N, M, d]) of its N speakers' M utterances). Samples against others: a value of the
    loss tail if all it feeds computes the loss (the caller checks)."""
    if op.type not in BATCH_SLICES:
        return False
    inputs = list(op.inputs)
    data, bounds = {"Split": (inputs[1:], inputs[:1]), "ConcatV2": (inputs[:-1], inputs[-1:])
                    }.get(op.type, (inputs[:1], inputs[1:]))
    if not all(m.is_batched(t) and m.folds(t) == 1 and t.name not in m.leading and
               t.dtype in (tf.float32, *INTEGERS) for t in data):
        return False
    found = [m.operands.constant(t) for t in bounds]
    rest = [v for v in found if v is not None]
    if len(rest) != len(found):
        return False
    rank, batch = len(static_shape(data[0])), m.batch_size
    if op.type == "StridedSlice":
        begin, end, strides = rest
        if op.get_attr("new_axis_mask") & 1 and not op.get_attr("ellipsis_mask") & 1:
            return False  # (a row of the batch: in_batch.row)
        return slice_bounds(op, begin, end, strides)[0] != (0, batch, 1, False)
    if op.type == "Slice":
        begin, size = rest
        return int(begin[0]) != 0 or int(size[0]) not in (-1, batch)
    if op.type == "Roll":
        return any(int(a) % rank == 0 for a in np.atleast_1d(rest[1]).ravel())
    if op.type == "Reshape":  # the batch regrouped: GE2E's [N speakers, M utterances, d]
        rows = static_shape(op.outputs[0])[:1] if op.outputs[0].shape.is_fully_defined() else ()
        return bool(rows) and 1 < rows[0] < batch and batch % rows[0] == 0
    axis = rest[0] if op.type in ("Split", "ConcatV2") else rest[1]
    return int(axis) % rank == 0


def static_shape_value(tensor: tf.Tensor) -> np.ndarray | None:
    """The value of tf.shape, tf.zeros_like or tf.ones_like of a value of static shape (in
    the tail, the whole batch's), or None."""
    op = tensor.op
    if op.type not in ("Shape", "ZerosLike", "OnesLike") or \
            not op.inputs[0].shape.is_fully_defined():
        return None
    shape = static_shape(op.inputs[0])
    if op.type == "Shape":
        return np.asarray(shape, tensor.dtype.as_numpy_dtype)
    if tensor.dtype != tf.float32:
        return None
    return (np.zeros if op.type == "ZerosLike" else np.ones)(shape, np.float32)


def contraction(m: TailContext, op: tf.Operation) -> bool:
    """tf.matmul(a, b, transpose_a=True) of two per-sample [B, n] float32 values, or
    tf.einsum('bi,bj->ij', a, b) of two per-sample float32 values summing over the batch
    letter (a covariance or cross-correlation over the batch): a value of the loss tail,
    as a reduction over the batch is."""
    if len(op.inputs) != 2 or second_order.in_gradient(op) or \
            not all(m.is_batched(t) and t.dtype == tf.float32 for t in op.inputs):
        return False
    if op.type == "Einsum":
        terms, _, out = op.get_attr("equation").decode().replace(" ", "").partition("->")
        first = {term[:1] for term in terms.split(",")}
        return "." not in terms and len(first) == 1 and not first & set(out)
    return op.type == "MatMul" and op.get_attr("transpose_a") and \
        not op.get_attr("transpose_b") and all(len(static_shape(t)) == 2 for t in op.inputs)
