"""A gradient inside the loss (tf.gradients in model_fn: physics-informed networks, gradient
penalties): its seed and the activations' gradient ops.

The seed. `tf.gradients(u, x)` of a per-sample u [B, ...]
starts from ones shaped like u (`gradients/Fill`, or tf.ones_like(u) given as grad_ys), or,
of a scalar (a mean over the batch), from a scalar 1 tiled over the batch by the mean's
gradient: a constant whose first axis is the batch. Everything the gradient then computes
is per sample (the gradient of a sum of per-sample values to one sample's input is that
sample's own), so such a constant is a source of the data flow, like an input: a
`sample_constant` kernel gives each sample its row, and the ops of the gradient that read
it (the MatMul by a transposed weight, Mul, ...) are lowered per sample.

The activations' gradient ops (TanhGrad, SigmoidGrad, ReluGrad, LeakyReluGrad, EluGrad,
Relu6Grad, SeluGrad) of two per-sample values become `activation_grad` kernels (wafer/kernels/activation_grads.py):
TF's arithmetic forward, TF's registered second-order gradient backward; AvgPoolGrad (through
AveragePooling2D) an `avg_pool_grad` kernel (the pooling's input gradient forward, its average
pooling backward, as TF's _AvgPoolGradGrad)."""
from __future__ import annotations

import re

import numpy as np
import tensorflow as tf

from coordinator.compiler.operands import STATEFUL_SOURCES, static_shape
from coordinator.compiler.rules import Context, generic
from wafer.kernels.activation_grads import OPS

__all__ = ["OPS", "WEIGHT_GRADIENT", "in_gradient", "lower", "refusal", "seeds"]

CROSS_ENTROPIES = {"SoftmaxCrossEntropyWithLogits", "SparseSoftmaxCrossEntropyWithLogits"}
_GRADIENT_SCOPE = re.compile(r"^(.*/)?gradients(_\d+)?/")


WEIGHT_GRADIENT = ("takes a gradient to a weight inside the loss (tf.gradients(loss, weights): "
                   "a sum over the batch's samples before the loss, a gradient norm penalty): "
                   "the CS computes each sample on its own; penalise the gradient to the "
                   "inputs (tf.gradients(u, x)) instead")


def in_gradient(op: tf.Operation) -> bool:
    """Whether `op` is one of tf.gradients' ops."""
    return _GRADIENT_SCOPE.match(op.name) is not None


def _is_batch_constant(tensor: tf.Tensor, batch: int, stateful: set[tf.Operation]) -> bool:
    if tensor.dtype != tf.float32 or not tensor.shape.is_fully_defined() or \
            tensor.op in stateful:
        return False
    shape = static_shape(tensor)
    return len(shape) >= 1 and shape[0] == batch


def seeds(graph: tf.Graph, batch: int) -> set[tf.Operation]:
    """The ops of tf.gradients' scope giving a constant whose first axis is the batch, from
    inputs that are not such constants (the first of a chain: Fill, a Tile of a scalar)."""
    stateful: set[tf.Operation] = set()  # ops computed from an input, variable or random op
    grown = True
    while grown:  # (graph order is topological but for a v1 loop's back edges)
        before = len(stateful)
        stateful.update(op for op in graph.get_operations() if op.type in STATEFUL_SOURCES or
                        any(t.op in stateful for t in op.inputs))
        grown = len(stateful) > before
    return {op for op in graph.get_operations()
            if len(op.outputs) == 1 and in_gradient(op) and
            _is_batch_constant(op.outputs[0], batch, stateful) and
            not any(_is_batch_constant(t, batch, stateful) for t in op.inputs)}


def refusal(m: Context, op: tf.Operation) -> str:
    """Why `op` of a gradient inside the loss cannot be lowered, else "": one in float16, or
    one reading a fused softmax cross-entropy's backprop output that the CS does not compute
    (the `softmax_cross_entropy_backprop` kernel computes it of per-sample [..., k] logits)."""
    if in_gradient(op) and any(t.dtype == tf.float16 for t in op.outputs):
        return (f"{op.type} in float16: the CS computes a gradient inside the loss in float32 "
                "(TF rounds each op of its second order in float16); build that part of the "
                "model in float32")
    for t in op.inputs:
        if t.op.type in CROSS_ENTROPIES and t.value_index == 1 and not m.is_batched(t):
            return (f"takes the gradient of the fused {t.op.type} '{t.op.name}' inside the loss "
                    "(its backprop output) of logits that are not each sample's own rows (a "
                    "loss of logits of rank > 2 flattened across the batch): take the gradient "
                    "of a cross-entropy written with tf.nn.log_softmax, or of an MSE")
    return ""


def lower(m: Context, op: tf.Operation, graph: tf.Graph) -> None:
    """Each sample's row of the seed, from a `sample_constant` kernel."""
    value = tf.get_static_value(op.outputs[0])
    if value is None:
        with tf.compat.v1.Session(graph=graph) as session:
            value = session.run(op.outputs[0])
    m.add_kernel(op.name, "sample_constant", [m.sample_input()],
                 {"value": np.asarray(value, np.float32)}, [], [op], op.outputs[0])


@generic(*OPS)
def _activation_grad(m: Context, op: tf.Operation) -> str:
    if not all(m.is_batched(t) for t in op.inputs) or m.shape(op.inputs[0]) != m.shape(op.inputs[1]):
        return (f"{op.type} of values that are not both per-sample of one shape: the CS computes "
                "a gradient inside the loss from the seed tf.gradients gives each sample")
    attrs: dict = {"function": OPS[op.type]}
    if op.type == "LeakyReluGrad":
        attrs["alpha"] = float(op.get_attr("alpha"))
    m.add_kernel(op.name, "activation_grad", list(op.inputs), attrs, [], [op], op.outputs[0])
    return ""


@generic("AvgPoolGrad")
def _avg_pool_grad(m: Context, op: tf.Operation) -> str:
    """AvgPoolGrad(input shape, g) of a per-sample g (a gradient penalty through
    AveragePooling2D): the `avg_pool_grad` kernel, TF's AvgPool of its gradient backward."""
    shape, ksize, strides = m.operands.constant(op.inputs[0]), op.get_attr("ksize"), op.get_attr("strides")
    if not m.is_batched(op.inputs[1]) or shape is None or op.outputs[0].dtype != tf.float32 or \
            op.get_attr("data_format").decode() != "NHWC" or ksize[0] != 1 or ksize[3] != 1 or \
            strides[0] != 1 or strides[3] != 1:
        return ("AvgPoolGrad other than of a per-sample float32 gradient, NHWC, pooled over height "
                "and width: the CS computes the gradient penalty of such an AveragePooling2D")
    m.add_kernel(op.name, "avg_pool_grad", [op.inputs[1]],
                 {"pool_size": [int(ksize[1]), int(ksize[2])], "strides": [int(strides[1]), int(strides[2])],
                  "padding": op.get_attr("padding").decode(), "input_shape": [int(d) for d in shape[1:]]},
                 [], [op], op.outputs[0])
    return ""


@generic("BiasAddGrad")
def _bias_add_grad(m: Context, op: tf.Operation) -> str:
    return WEIGHT_GRADIENT
