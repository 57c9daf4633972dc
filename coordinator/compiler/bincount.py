"""tf.math.bincount of each sample's ids (Keras CategoryEncoding multi_hot and count): its
size is computed from the whole batch's largest id, then clamped to a constant (Keras:
minlength = maxlength = num_tokens), so each sample's counts are its own."""
from __future__ import annotations

import tensorflow as tf

from coordinator.compiler.operands import static_shape
from coordinator.compiler.rules import TailContext

# The README's row: kernel -> the TF ops it computes.
KERNEL_ROWS = {"one_hot, reduce (bincount)": (
    "DenseBincount of per-sample ids [batch, n] to a size that does not depend on the batch "
    "(Keras CategoryEncoding multi_hot and count; tf.math.bincount(ids, axis=-1, minlength=k, "
    "maxlength=k)): each sample's one-hot ids summed, or their max for binary_output")}


def clamped_size(m: TailContext, tensor: tf.Tensor) -> int | None:
    """A size tf.math.bincount computes as min(maxlength, max(minlength, max(x) + 1)) with
    minlength >= maxlength (Keras CategoryEncoding: both num_tokens): maxlength, whatever
    the batch's values; else the constant's value, or None."""
    value = m.operands.constant(tensor)
    if value is not None:
        return int(value)
    if tensor.op.type != "Minimum":
        return None
    for k, inner in enumerate(tensor.op.inputs):
        cap, low = m.operands.constant(tensor.op.inputs[1 - k]), inner.op
        if cap is not None and low.type == "Maximum":
            floors = [m.operands.constant(t) for t in low.inputs]
            if any(f is not None and int(f) >= int(cap) for f in floors):
                return int(cap)
    return None


def match_bincount(m: TailContext, op: tf.Operation) -> bool:
    """DenseBincount of per-sample ids [n] (Keras CategoryEncoding multi_hot and count,
    tf.math.bincount(ids, axis=-1)) to a size that does not depend on the batch: a one_hot
    of the ids and a sum (count) or max (binary_output) over them. Ids outside [0, size)
    count nowhere (TF's kernel drops those above and fails on negative ones)."""
    if op.type != "DenseBincount" or not m.is_batched(op.inputs[0]):
        return False
    size = clamped_size(m, op.inputs[1])
    if size is None or len(static_shape(op.inputs[0])) != 2 or \
            static_shape(op.inputs[2]) != (0,) or op.outputs[0].dtype != tf.float32:
        m.reject(op, "tf.math.bincount of per-sample ids [batch, n] without weights, to a size "
                     "that does not depend on the batch (minlength = maxlength), is supported")
        return True
    if not _drop_size_tail(m, op):
        m.reject(op, "tf.math.bincount's size is read by other ops too: give minlength and "
                     "maxlength the same constant and read nothing else of it")
        return True
    n = static_shape(op.inputs[0])[1]
    hot = m.add_kernel(f"{op.name}/one_hot", "one_hot", [op.inputs[0]], {
        "depth": size, "on_value": 1.0, "off_value": 0.0}, [], [], None, output_shape=(n, size),
        source_op=op)
    m.add_kernel(op.name, "reduce", [hot.name], {
        "op": "max" if op.get_attr("binary_output") else "sum", "axes": [0]}, [], [op],
        op.outputs[0])
    return True


def _drop_size_tail(m: TailContext, op: tf.Operation) -> bool:
    """The batch reductions computing only bincount `op`'s size (tf.math.bincount's max of
    the ids + 1), which the clamp makes a constant, leave the loss tail (False: other ops
    read them)."""
    size_ops, stack = set(), [op.inputs[1].op]
    while stack:
        found = stack.pop()
        if found not in size_ops and any(t.name in m.tail for t in found.outputs):
            size_ops.add(found)
            stack.extend(t.op for t in found.inputs)
    if any(c not in size_ops and c is not op for s in size_ops for t in s.outputs
           for c in t.consumers()):
        return False
    for found in size_ops:
        m.tail.difference_update(t.name for t in found.outputs)
        read = [k for k, t in enumerate(m.frontier) if found.inputs and t is found.inputs[0]]
        if read:  # the reduction's own entry
            del m.frontier[read[0]]
    return True
