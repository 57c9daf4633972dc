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
per batch and differentiates back to every sample's values. A tail reading a weight or a
random number, computing in float16 or with an op the weight program does not run is
refused naming the op.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from coordinator.compiler import precision, second_order
from coordinator.compiler.extract import data_upstream, user_source
from coordinator.compiler.ir import ParamRef, UnsupportedOp
from coordinator.compiler.operands import static_shape
from coordinator.compiler.rules import TailContext, has_kernel
from coordinator.compiler.weight_program import WeightProgramBuilder
from wafer.kernels.batch_tail import source_name, steps_attrs

DIAGONALS = ("MatrixDiagPartV3", "MatrixDiagPart", "DiagPart")
# The README's row.
KERNEL_ROWS = {
    "batch_tail_loss": "a loss that is a non-linear function of values reduced over the batch "
                       "(a Mixture-of-Experts balance loss, VICReg's variance hinge and "
                       "covariance tf.matmul(zc, zc, transpose_a=True), Barlow Twins' "
                       "cross-correlation tf.einsum('bi,bj->ij', za, zb), "
                       "(mean(pred) - mean(y)) ** 2, a Pearson correlation, "
                       "the entropy of the batch's mean prediction, BPR's tf.nn.l2_loss of "
                       "looked-up embeddings, a Cox partial likelihood or ListMLE over the "
                       "batch sorted by tf.argsort, hard-example mining's tf.math.top_k of "
                       "the losses, a Sinkhorn loss's tf.while_loop of static steps over a "
                       "pairwise cost matrix): the loss's ops after the "
                       "per-sample values (element-wise ops, arithmetic, reductions, products "
                       "of matrices, transposes, reshapes, views, tf.linalg.diag_part, "
                       "tf.reduce_logsumexp's guard; sorts "
                       "of the batch's [batch] float32 values, tf.gather in their order, "
                       "tf.math.cumulative_logsumexp, tf.cumsum), run "
                       "once per batch on the whole batch's values, a batch barrier; its "
                       "gradient TF's, back to each sample",
}


class TailBuilder(WeightProgramBuilder):
    """Lowers the loss tail's values: the per-sample tensors it reads are its sources (the
    whole batch, in the order first read: `samples`), weights and random numbers refused."""

    SUBJECT = "computes the loss over the batch"
    PLACE = "on the whole batch"

    def __init__(self, m: TailContext, penalties: list[tf.Tensor]):
        super().__init__(m.operands, m.flow)
        self.m = m
        self.penalties = {t.name for t in penalties}  # measured apart: here 0
        self.samples: list[tf.Tensor] = []
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
        where = f"{op.type} '{op.name}' at {user_source(op)}"
        shaped = static_shape_value(tensor)
        if shaped is not None:
            return shaped
        if m.is_batched(tensor):
            return self._sample(tensor, where)
        if op.type in ("IsFinite", "Select", "SelectV2") and tensor.name in m.tail:
            return self._guard(op, tensor, where)
        if tensor.name not in m.tail:
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
        if tensor.dtype.base_dtype != tf.float32 or precision.tensor_precision(tensor):
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
        inputs = [self._lower(t) for t in op.inputs]
        bad = next((t for t, v in zip(op.inputs, inputs) if v is None), None)
        if bad is not None:
            return self._refuse(tensor, self.problems[bad.name])
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
        inputs = [self._lower(t) for t in op.inputs]
        bad = next((t for t, v in zip(op.inputs, inputs) if v is None), None)
        if bad is not None:
            return self._refuse(tensor, self.problems[bad.name])
        equation = op.get_attr("equation").decode().replace(" ", "")
        terms, _, out = equation.partition("->")
        letter = next(c for c in "ZYXWVUTSRQPONMLKJIHGFEDCBAzyxwvutsrqponmlkjihgfedcba"
                      if c not in equation)
        if len(inputs) != 2 or not all(isinstance(v, str) for v in inputs):
            return self._refuse(tensor, f"{self.SUBJECT} with {where}: the CS runs an einsum of "
                                        "two values of the batch there")
        names: list[str] = inputs  # type: ignore[assignment]  # (all kernels or sources)
        return self._add(op, tensor, "einsum", names, {
            "equation": ",".join(letter + t for t in terms.split(",")) + "->" + letter + out,
            "operands": "ii"})

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
        inputs = [self._lower(t) for t in op.inputs]
        bad = next((t for t, v in zip(op.inputs, inputs) if v is None), None)
        if bad is not None:
            return self._refuse(tensor, self.problems[bad.name])
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

    def _sample(self, tensor: tf.Tensor, where: str) -> str | None:
        """A per-sample value the tail reads: a source of the whole batch."""
        if tensor.dtype != tf.float32 or precision.tensor_precision(tensor):
            return self._refuse(tensor, f"reduces a {tensor.dtype.name} per-sample value over "
                                        f"the batch in a non-linear loss ({where}): the CS "
                                        "computes such a loss from float32 values")
        name = source_name(len(self.samples))
        self.samples.append(tensor)
        self.sources[name] = ParamRef("source", name, static_shape(tensor))
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
                                        f"'{op.name}' at {user_source(op)}: the CS takes the "
                                        "main diagonal of a square matrix")
        return self._main_diagonal(op, tensor, inner, shape)


def lower(m: TailContext, loss: tf.Tensor, penalties: list[tf.Tensor],
          ) -> tuple[str, list[tf.Tensor]]:
    """Add the `batch_tail_loss` kernel evaluating `loss` once per batch, the values of
    weight penalties added to it left out (`penalties` are 0: the caller measures them); its
    name and the per-sample values it reads ("" with the refusal in m.unsupported)."""
    builder = TailBuilder(m, penalties)
    upstream = set(data_upstream(loss.op))
    for op in loss.graph.get_operations():  # in graph order: the recursion stays shallow
        if op in upstream:                     # (an unrolled loop's iterations nest deep)
            for t in op.outputs:
                if t.name in m.tail:
                    builder._lower(t)
    value = builder._lower(loss)
    if not isinstance(value, str) or not has_kernel("batch_tail_loss"):
        op, reason = builder.root or (loss.op, "the loss is a constant")
        m.unsupported.append(UnsupportedOp(op.type, op.name, user_source(op), reason))
        return "", []
    program = builder.program({value})
    assert program is not None
    steps = [(k.name, k.type, k.inputs, k.attrs) for k in program.kernels]
    attrs = {**steps_attrs(steps), "batch_size": m.batch_size}
    return m.add_kernel("loss", "batch_tail_loss", list(builder.samples), attrs, [], [], loss,
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
