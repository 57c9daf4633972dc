"""Selections by value: tf.boolean_mask(x, mask) and tf.gather(x, tf.where(cond)[:, 0])
(or tf.gather_nd(x, tf.where(cond))), a one-argument Where whose indices pick elements or
rows; an ignore-index loss, a masked-token loss, CFRNet's split of the batch by treatment.
The result's size depends on the values and the CS computes fixed-size values, so they are
refused with the masked form that computes the same (sum(mask * f(x)) / sum(mask)), apart
from a SparseTensor's Where (feature_columns.refusal)."""
from __future__ import annotations

import tensorflow as tf

from coordinator.compiler.extract import data_downstream, is_gradient, user_source
from coordinator.compiler.feature_columns import COLUMN_SCOPE

# What carries a Where's indices to the gather that reads them (boolean_mask's Squeeze,
# tf.where(c)[:, 0]'s StridedSlice, a tf.cast to int32).
INDEX_VIEWS = ("StridedSlice", "Squeeze", "Reshape", "Identity", "Cast")
GATHERS = ("GatherV2", "GatherNd", "ResourceGather")
# Ops named Sparse* that read no SparseTensor (a selected loss's cross entropy).
DENSE_SPARSE_OPS = ("SparseSoftmaxCrossEntropyWithLogits",)
# The README's row of what is refused.
REFUSED = {
    "selections by value": "tf.boolean_mask and tf.gather(x, tf.where(cond)[:, 0]) or "
                           "tf.gather_nd(x, tf.where(cond)) (an ignore-index or masked-token "
                           "loss, CFRNet's treated rows): the selection's size depends on the "
                           "values; weigh every element by the mask instead, "
                           "tf.reduce_sum(loss * mask) / tf.reduce_sum(mask)",
}


def selecting_gather(where: tf.Operation) -> tf.Operation | None:
    """The gather that reads a one-argument Where's indices (through INDEX_VIEWS), or None:
    a SparseTensor's Where (a feature column's, or one a Sparse* op reads from: tf.sparse.
    from_dense, tf.sparse.retain), or indices that another op than the gather's gradient
    takes."""
    if where.type != "Where" or len(where.inputs) != 1 or COLUMN_SCOPE.search(where.name) or \
            any(op.type.startswith("Sparse") and op.type not in DENSE_SPARSE_OPS
                for op in data_downstream([where])):
        return None
    frontier, gathers = [where.outputs[0]], []
    while frontier:
        tensor = frontier.pop()
        for consumer in tensor.consumers():
            if consumer.type in GATHERS and consumer.inputs[1] is tensor:
                gathers.append(consumer)
            elif consumer.type in INDEX_VIEWS and consumer.inputs[0] is tensor:
                frontier.extend(consumer.outputs)
            elif not is_gradient(consumer):
                return None
    return gathers[0] if gathers else None


def refusal(gather: tf.Operation) -> str:
    """Why a selection by value is refused, with the masked form to write instead."""
    return (f"selects elements by value (tf.boolean_mask / tf.where(cond) with one argument, "
            f"read by {gather.type} '{gather.name}' at {user_source(gather)}): the CS computes "
            "fixed-size values; compute on every element and weigh by the mask as a float: "
            "a loss tf.reduce_sum(loss * mask) / tf.reduce_sum(mask), a mean of the selected "
            "rows tf.reduce_sum(x * mask[:, None], 0) / tf.reduce_sum(mask)")
