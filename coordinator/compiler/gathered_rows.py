"""A table TF updates sparsely that the model reads through one tf.gather at constant indices
(a T5 relative-position bias): the CS holds the gathered value as a view of the table and
applies the optimizer's sparse rule to the rows the indices name, as TF's IndexedSlices do
(wse_sim.shared_weights: the rows the view names, each occurrence one slice). Proven when
every kernel reads the whole gathered value in one arrangement: the view then holds each
element of the gather's output once, so its rows and their gradients are TF's."""
from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from coordinator.compiler.extract import user_name, user_source
from coordinator.compiler.ir import ParamRef, UnsupportedOp
from coordinator.compiler.operands import Operands

GATHERS = ("GatherV2", "ResourceGather")


def constant_indices(operands: Operands, op: tf.Operation) -> np.ndarray | None:
    """The indices of a tf.gather along a table's rows at constant indices (None: another read)."""
    if op.type not in GATHERS or op.get_attr("batch_dims") != 0:
        return None
    axis = operands.constant(op.inputs[2]) if op.type == "GatherV2" else 0
    indices = operands.constant(op.inputs[1])
    return None if indices is None or axis is None or int(axis) != 0 else np.asarray(indices)


def gathered_rows_refusal(operands: Operands, reads: list[tf.Operation], variable: str,
                          shape: tuple[int, ...], params: list[ParamRef]) -> UnsupportedOp | None:
    """None if the CS updates `variable` (TF's `shape`, updated sparsely) as TF does: the model
    reads it through one gather at constant indices (`reads`: its reads), and every kernel's
    param of it is the same view holding each element of that gather's output once; else the
    one-line refusal naming the read."""
    table = variable.split("/")[-1]
    indices = constant_indices(operands, reads[0]) if reads else None
    if len(reads) != 1 or indices is None:
        op = next((r for r in reads if constant_indices(operands, r) is None), reads[0])
        return UnsupportedOp(op.type, user_name(op), user_source(op), (
            f"TF updates {table} sparsely (the rows its tf.gather at constant indices names), "
            f"and the model also reads it here: the CS proves TF's sparse update only for a "
            f"table read through one tf.gather at constant indices; gather once and reuse the "
            f"value, or write tf.einsum of a constant tf.one_hot of the indices and {table} "
            "(a dense update)"))
    row = math.prod(shape[1:])
    elements = (np.asarray(indices, np.int64).reshape(-1, 1) % shape[0] * row
                + np.arange(row)).ravel()
    first = params[0].view
    if first is not None and all(p.view is not None and np.array_equal(p.view, first)
                                 for p in params) and \
            np.array_equal(np.sort(first, axis=None), np.sort(elements)):
        return None
    op = reads[0]
    return UnsupportedOp(op.type, user_name(op), user_source(op), (
        f"tf.gather of {table} at constant indices makes TF's optimizer update the rows it "
        "names, and the CS proves that update only where every use reads the gathered value "
        "whole, in one arrangement (here a slice or a second arrangement of it is read); "
        f"read the gathered value whole, or write tf.einsum of a constant tf.one_hot of the "
        f"indices and {table} (a dense update)"))
