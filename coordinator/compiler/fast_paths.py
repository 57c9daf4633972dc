"""The library fast paths: the ops of a dense layer (MatMul [+ BiasAdd] [+ activation]),
conv2d, pooling, dropout, batch normalization (inference, and training as a batch barrier)
and softmax cross-entropy, each fused into one library kernel. Each path registers itself
(`rules.fast_path`) and is tried in this file's order; one that declines leaves the ops to
the generic lowerings (lowering.py).

The one exception to "every sample on its own" is BatchNormalization in training
(`match_batch_norm_training`): exactly tf.nn.moments over every axis but the last feeding
tf.nn.batch_normalization, carried out as a batch barrier.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

from coordinator.compiler import filters
from coordinator.compiler.ir import ParamRef
from coordinator.compiler.operands import static_shape
from coordinator.compiler.rules import Context, fast_path, has_kernel

# Fused into a dense or conv2d kernel (leaky_relu keeps its own kernel for its alpha).
FUSABLE_ACTIVATIONS = {"Relu": "relu", "Relu6": "relu6", "Elu": "elu", "Selu": "selu",
                       "Tanh": "tanh", "Sigmoid": "sigmoid", "Softplus": "softplus"}

# The README's rows: kernel -> the TF ops it starts from.
KERNEL_ROWS = {
    "dense": "MatMul / BatchMatMulV2 / Keras Tensordot with a weight [+ BiasAdd] [+ activation]",
    "conv2d": "Conv2D (NHWC, SAME/VALID, strides; grouped: Keras Conv2D(groups=)'s XLA function "
              "of one Conv2D, Conv1D(groups=)'s of ExpandDims, Conv2D, Squeeze) [+ BiasAdd] "
              "[+ activation]; by a weight or a constant filter (tf.constant, or computed from "
              "constants: a Gaussian blur, tf.nn.conv1d's box filter), held frozen; float16 too, "
              "grouped and by a constant filter",
    "max_pool, avg_pool": "MaxPool, AvgPool (NHWC, over height and width; float16 too: AvgPool's "
                          "sums rounded as TF's float16 kernel's)",
    "dropout": "tf.nn.dropout, Keras Dropout / SpatialDropout (random mask, rate, noise_shape; "
               "the mask drawn on the CS in every mode the graph holds it, as TF's op; a "
               "locked mask [batch, 1, d] each sample's own, shared by its time steps; one "
               "of noise_shape [1, ...] for the batch: the weight program's draw, a select "
               "reading it)",
    "batch_norm_inference": "BatchNormalization with training=False, FusedBatchNormV3 (inference)",
    "batch_norm_training": "BatchNormalization with training=True, tf.nn.moments + "
                           "tf.nn.batch_normalization, FusedBatchNormV3 with is_training: the "
                           "whole batch's statistics (a batch barrier), moving statistics as "
                           "the train_op's assign ops move them",
    "softmax_cross_entropy_with_logits": "SparseSoftmaxCrossEntropyWithLogits, "
                                         "SoftmaxCrossEntropyWithLogits",
}
POOLS = {"MaxPool": "max_pool", "AvgPool": "avg_pool"}  # TF op -> the pooling kernel
_FUSED = "FusedBatchNormV3 in training, other than"
REFUSED = {
    _FUSED: "on NHWC data with scale and offset weights and exponential_avg_factor 1 "
            "(tf.compat.v1.nn.fused_batch_norm's default): compute the moving averages with "
            "assign ops of its batch_mean and batch_variance",
}


def _bias_and_activation(m: Context, out: tf.Tensor, channels: int, ops: list[tf.Operation],
                         params: list[ParamRef]) -> tuple[tf.Tensor, str]:
    nxt = m.sole_consumer(out)
    if nxt is not None and nxt.type in ("BiasAdd", "Add", "AddV2") and \
            (nxt.type != "BiasAdd" or nxt.get_attr("data_format") == b"NHWC"):
        other = [t for t in nxt.inputs if t is not out]
        bias = (m.operands.weight(other[0]) or m.derived_weight(other[0])) \
            if len(other) == 1 else None
        if bias is not None and bias.variable_shape == (channels,) and \
                bias.dtype == "float32" and all(d == 1 for d in bias.shape[:-1]):
            params.append(ParamRef("bias", bias.variable, (channels,)))
            ops.append(nxt)
            out = nxt.outputs[0]
    activation = "linear"
    nxt = m.sole_consumer(out)
    if nxt is not None and nxt.type in FUSABLE_ACTIVATIONS:
        activation = FUSABLE_ACTIVATIONS[nxt.type]
        ops.append(nxt)
        out = nxt.outputs[0]
    return out, activation


def _dense(m: Context, x: tf.Tensor | str, weight, ops: list[tf.Operation], out: tf.Tensor,
           first: tf.Operation, stacked: bool = False) -> bool:
    """A dense kernel; `stacked`: x and its output held stack-first (leading_stack.py)."""
    if weight.dtype != "float32" or len(weight.shape) != 2:
        return False
    units = weight.shape[1]
    params = [ParamRef("kernel", weight.variable, weight.shape, variable_shape=weight.variable_shape)]
    out, activation = _bias_and_activation(m, out, units, ops, params)
    if stacked:
        m.leading.add(out.name)
    m.add_kernel(m.scope(first, weight.variable), "dense", [x],
                 {"units": units, "use_bias": len(params) == 2, "activation": activation},
                 params, ops, out)
    return True


@fast_path
def match_dense(m: Context, op: tf.Operation) -> bool:
    if op.type == "MatMul":
        x, w = op.inputs
        if not m.is_batched(x) or op.get_attr("transpose_a") or op.get_attr("transpose_b"):
            return False
        weight = m.operands.weight(w) or m.derived_weight(w)
        if weight is None:
            return False
        return _dense(m, x, weight, [op], op.outputs[0], op)
    if op.type in ("BatchMatMulV2", "BatchMatMulV3"):
        x, w = op.inputs
        if not m.is_batched(x) or op.get_attr("adj_x") or op.get_attr("adj_y"):
            return False
        weight = m.operands.weight(w) or m.derived_weight(w)
        if weight is None:
            return False
        return _dense(m, x, weight, [op], op.outputs[0], op)
    if op.type == "Reshape" and m.is_batched(op.inputs[0]):
        return tensordot(m, op)
    return False


def tensordot(m: Context, reshape: tf.Operation, stacked: bool = False) -> bool:
    """Keras Dense on rank > 2 inputs: Reshape (B*T, n) -> MatMul weight -> Reshape (B, T, m)
    (or (S, B, m) of a stack-first value: leading_stack.py)."""
    x = reshape.inputs[0]
    full = static_shape(x)
    if static_shape(reshape.outputs[0]) != (int(np.prod(full[:-1])), full[-1]) or len(full) < 3:
        return False
    matmul = m.sole_consumer(reshape.outputs[0])
    if matmul is None or matmul.type != "MatMul" or matmul.inputs[0] is not reshape.outputs[0] or \
            matmul.get_attr("transpose_a") or matmul.get_attr("transpose_b"):
        return False
    weight = m.operands.weight(matmul.inputs[1])
    back = m.sole_consumer(matmul.outputs[0])
    if weight is None or back is None or back.type != "Reshape" or \
            static_shape(back.outputs[0]) != (*full[:-1], weight.shape[-1]):
        return False
    return _dense(m, x, weight, [reshape, matmul, back], back.outputs[0], matmul, stacked)


@fast_path
def match_conv2d(m: Context, op: tf.Operation) -> bool:
    if op.type != "Conv2D":
        return False
    x, w = op.inputs
    if not m.is_batched(x):
        return False
    found = filters.find(m, op, w, derived=True)
    if isinstance(found, str):
        m.reject(op, found)
        return True
    return _conv2d(m, op, op.node_def, x, found)


def _conv2d(m: Context, op: tf.Operation, conv: Any, x: tf.Tensor, filt: filters.Filter) -> bool:
    """A conv2d kernel for `op` computing the Conv2D node `conv` (op's own NodeDef, or the
    one in the function op calls) of x and a weight or constant filter [+ bias]
    [+ activation]; grouped when the filter has fewer input channels than x (TF's grouped
    convolution)."""
    attrs = _conv2d_attrs(m, op, conv, static_shape(x)[-1], filt)
    if attrs is None:
        return True
    params, ops = filt.params(), [op]
    attrs.update(filt.attrs())
    out, attrs["activation"] = _bias_and_activation(m, op.outputs[0], attrs["filters"], ops, params)
    attrs["use_bias"] = any(p.role == "bias" for p in params)
    m.add_kernel(m.scope(op, filt.variable), "conv2d", [x], attrs, params, ops, out)
    return True


def _conv2d_attrs(m: Context, op: tf.Operation, conv: Any, channels: int,
                  weight: Any) -> dict[str, Any] | None:
    """The conv2d kernel's attrs (bias and activation aside) for the Conv2D node `conv` of
    `channels` input channels, or None (op rejected: m.reject)."""
    attrs = conv2d_attrs(conv, channels, weight.shape)
    if isinstance(attrs, str):
        m.reject(op, attrs)
        return None
    return attrs


def conv2d_attrs(conv: Any, channels: int, filter_shape: tuple[int, ...]) -> dict[str, Any] | str:
    """The conv2d kernel's attrs (bias and activation aside) for the Conv2D node `conv` of
    `channels` input channels by a filter of `filter_shape`, or why it has none (the weight
    program's convolutions too)."""
    attr = conv.attr
    padding = attr["padding"].s.decode()
    strides = list(attr["strides"].list.i)
    if attr["data_format"].s.decode() != "NHWC" or padding not in ("SAME", "VALID"):
        return "conv2d needs NHWC data and SAME or VALID padding"
    if list(attr["dilations"].list.i) != [1, 1, 1, 1] or strides[0] != 1 or strides[3] != 1:
        return "dilated convolutions are not supported"
    kh, kw, part, filters = filter_shape
    if channels % part or filters % (channels // part):
        return (f"a grouped conv2d of {channels} channels with a kernel of {part} input "
                f"channels and {filters} filters")
    attrs = {"filters": int(filters), "kernel_size": [int(kh), int(kw)],
             "strides": [int(strides[1]), int(strides[2])], "padding": padding}
    if channels != part:
        attrs["groups"] = channels // part
    return attrs


def _xla_function(op: tf.Operation) -> tuple[dict[str, Any], list[str], list[str]] | None:
    """(nodes by name, argument names, returned tensors) of the function a
    StatefulPartitionedCall of two inputs calls (Keras' XLA grouped convolutions)."""
    if op.type != "StatefulPartitionedCall" or len(op.inputs) != 2:
        return None
    function = op.graph._get_function(op.get_attr("f").name)
    definition = getattr(function, "definition", None)
    if definition is None:
        return None
    return ({n.name: n for n in definition.node_def},
            [a.name for a in definition.signature.input_arg],
            [definition.ret[a.name] for a in definition.signature.output_arg])


def _function_filter(nodes: dict[str, Any], x_dtype: tf.DType) -> tuple[Any, str, list[str]] | None:
    """(ReadVariableOp, the tensor the Conv2D reads as its filter, the other node types) of a
    grouped convolution's XLA function whose samples are `x_dtype`: the read's value in
    float32; in float16 (mixed_float16) its Cast to float16 (Keras' AutoCastVariable, the
    rounding a float16 kernel applies to its weight), None otherwise."""
    reads = [n for n in nodes.values() if n.op == "ReadVariableOp"]
    casts = [n for n in nodes.values() if n.op == "Cast"]
    if len(reads) != 1:
        return None
    value = f"{reads[0].name}:value:0"
    if x_dtype == tf.float32 and not casts:
        return reads[0], value, []
    if x_dtype != tf.float16 or len(casts) != 1 or list(casts[0].input) != [value] or \
            casts[0].attr["SrcT"].type != tf.float32.as_datatype_enum or \
            casts[0].attr["DstT"].type != tf.float16.as_datatype_enum:
        return None
    return reads[0], f"{casts[0].name}:y:0", ["Cast"]


class _XlaConvolution(NamedTuple):
    """A Keras grouped convolution's XLA function (_xla_function, _function_filter)."""
    nodes: dict[str, Any]  # by name
    args: list[str]  # the argument names
    returns: list[str]  # the returned tensors
    read: Any  # the filter's ReadVariableOp
    filter: str  # the tensor the Conv2D reads as its filter
    extra: list[str]  # the node types besides the convolution's own (a Cast to float16)


def _xla_convolution(op: tf.Operation, x_input: int) -> _XlaConvolution | None:
    """The grouped convolution's XLA function `op` calls on the samples of its input
    `x_input`, else None."""
    found = _xla_function(op)
    if found is None:
        return None
    read_filter = _function_filter(found[0], op.inputs[x_input].dtype)
    return None if read_filter is None else _XlaConvolution(*found, *read_filter)


@fast_path
def match_grouped_conv2d(m: Context, op: tf.Operation) -> bool:
    """Keras Conv2D(groups=): a call of an XLA-compiled function holding one Conv2D of its
    arguments (a variable's read as the filter, cast to float16 under mixed_float16), which
    TF's CPU runs as a grouped convolution (in float16: the float32 result rounded once)."""
    found = _xla_convolution(op, 1)
    if found is None:
        return False
    nodes, args, returns, read, filt, extra = found
    convs = [n for n in nodes.values() if n.op == "Conv2D"]
    if len(convs) != 1 or sorted(n.op for n in nodes.values()) != \
            sorted(["Conv2D", "Identity", "NoOp", "ReadVariableOp", *extra]):
        return False
    conv = convs[0]
    identity = next(n for n in nodes.values() if n.op == "Identity")
    # outputs after the first: the forward's values kept for the gradient's call
    if list(conv.input) != [args[1], filt] or list(read.input) != [args[0]] or \
            list(identity.input)[:1] != [f"{conv.name}:output:0"] or \
            returns[0] != f"{identity.name}:output:0" or \
            not set(returns[1:]) <= {args[1], f"{read.name}:value:0", filt} or \
            not m.is_batched(op.inputs[1]):
        return False
    weight = m.operands.weight(op.inputs[0])
    if weight is None:
        return False
    return _conv2d(m, op, conv, op.inputs[1], filters.of_weight(weight))


@fast_path
def match_grouped_conv1d(m: Context, op: tf.Operation) -> bool:
    """Keras Conv1D(groups=): the XLA function of tf.nn.conv1d (the samples [W, C] and the
    filter [k, C/g, F] expanded to a height of 1, one Conv2D, the height squeezed): a
    reshape to [1, W, C], a grouped conv2d kernel, a reshape to [W', F]."""
    found = _xla_convolution(op, 0)
    if found is None:
        return False
    nodes, args, returns, read, filt, extra = found
    kinds = sorted(n.op for n in nodes.values())
    if kinds != sorted(["Const", "Const", "Conv2D", "ExpandDims", "ExpandDims", "Identity", "NoOp",
                        "ReadVariableOp", "Squeeze", *extra]):
        return False
    conv = next(n for n in nodes.values() if n.op == "Conv2D")
    squeeze = next(n for n in nodes.values() if n.op == "Squeeze")
    identity = next(n for n in nodes.values() if n.op == "Identity")
    expanded = [nodes[name.split(":")[0]] for name in conv.input]  # returned for the gradient
    if [e.op for e in expanded] != ["ExpandDims", "ExpandDims"] or \
            expanded[0].input[0] != args[0] or \
            expanded[1].input[0] != filt or list(read.input) != [args[1]] or \
            list(squeeze.input) != [f"{conv.name}:output:0"] or \
            list(squeeze.attr["squeeze_dims"].list.i) not in ([1], [-3]) or \
            list(identity.input)[:1] != [f"{squeeze.name}:output:0"] or \
            returns[0] != f"{identity.name}:output:0" or \
            not set(returns[1:]) <= {f"{e.name}:output:0" for e in expanded} or \
            not m.is_batched(op.inputs[0]):
        return False
    weight = m.operands.weight(op.inputs[1])
    x_shape, out_shape = static_shape(op.inputs[0]), static_shape(op.outputs[0])
    if weight is None or len(weight.shape) != 3 or len(x_shape) != 3 or len(out_shape) != 3:
        return False
    weight = replace(weight, shape=(1, *weight.shape))
    attrs = _conv2d_attrs(m, op, conv, x_shape[-1], weight)
    if attrs is None:
        return True
    rows = m.add_kernel(f"{op.name}/expand", "reshape", [op.inputs[0]], {"shape": [1, *x_shape[1:]]},
                        [], [], None, output_shape=(1, *x_shape[1:]), source_op=op)
    conv_kernel = m.add_kernel(
        m.scope(op, weight.variable), "conv2d", [rows.name],
        {**attrs, "use_bias": False, "activation": "linear"}, filters.of_weight(weight).params(),
        [], None, output_shape=(1, *out_shape[1:]), source_op=op)
    m.add_kernel(op.name, "reshape", [conv_kernel.name], {"shape": list(out_shape[1:])}, [], [op],
                 op.outputs[0])
    return True


@fast_path
def match_pool(m: Context, op: tf.Operation) -> bool:
    if op.type not in POOLS or not m.is_batched(op.inputs[0]):
        return False
    attrs = pool_attrs(op)
    if isinstance(attrs, str):
        m.reject(op, attrs)
        return True
    m.add_kernel(op.name, POOLS[op.type], [op.inputs[0]], attrs, [], [op], op.outputs[0])
    return True


def pool_attrs(op: tf.Operation) -> dict[str, Any] | str:
    """The pooling kernel's attrs for a MaxPool or AvgPool `op`, or why it has none (the
    weight program's pooling too)."""
    ksize, strides = list(op.get_attr("ksize")), list(op.get_attr("strides"))
    if (op.get_attr("data_format").decode() != "NHWC" or ksize[0] != 1 or ksize[3] != 1
            or strides[0] != 1 or strides[3] != 1):
        return "pooling must be NHWC over height and width only"
    return {"pool_size": [int(ksize[1]), int(ksize[2])],
            "strides": [int(strides[1]), int(strides[2])],
            "padding": op.get_attr("padding").decode()}


def _uniform_01(m: Context, tensor: tf.Tensor) -> list[tf.Operation] | None:
    """The ops drawing `tensor` if it is uniform random numbers in [0, 1) (TF's or Keras'
    sampler) that nothing else reads, else None."""
    op = tensor.op
    if m.value(tensor) is not None:  # already drawn by a `random` kernel
        return None
    if op.type == "RandomUniform":
        return [op]
    if op.type in ("AddV2", "Add"):  # Keras: stateless uniform * (max - min) + min
        mul, low = op.inputs
        if mul.op.type != "Mul" or m.sole_consumer(mul) is not op:
            return None
        raw, span = mul.op.inputs
        lo, sp = m.operands.constant(low), m.operands.constant(span)
        if raw.op.type in ("StatelessRandomUniformV2", "StatelessRandomUniform") and \
                m.sole_consumer(raw) is mul.op and lo is not None and sp is not None and \
                float(lo) == 0.0 and float(sp) == 1.0:
            return [raw.op, mul.op, op]
    return None


@fast_path
def match_dropout(m: Context, op: tf.Operation) -> bool:
    """select(uniform >= rate, x * 1/(1-rate), 0): tf.nn.dropout, Keras Dropout and
    SpatialDropout (their noise_shape broadcasts the mask). A mask of noise_shape [1, ...],
    one for the batch, is left to the generic lowerings: the weight program draws it
    (random_numbers.weight_draws), a select kernel reads it."""
    if op.type != "Mul":
        return False
    data = [t for t in op.inputs if m.is_batched(t)]
    if len(data) != 1:
        return False
    scale = m.operands.constant([t for t in op.inputs if t is not data[0]][0])
    select = m.sole_consumer(op.outputs[0])
    if scale is None or scale.size != 1 or select is None or \
            select.type not in ("SelectV2", "Select") or select.inputs[1] is not op.outputs[0]:
        return False
    cond = select.inputs[0]
    reader = m.sole_consumer(cond)
    if cond.op.type != "GreaterEqual" or reader is None or reader is not select:
        return False
    uniform, rate_t = cond.op.inputs
    rate_c, zero = m.operands.constant(rate_t), m.operands.constant(select.inputs[2])
    mask = _uniform_01(m, uniform) if m.sole_consumer(uniform) is cond.op else None
    if rate_c is None or zero is None or np.any(zero != 0) or mask is None:
        return False
    rate = float(rate_c)
    half = op.outputs[0].dtype == tf.float16  # 1 / (1 - rate) rounded to float16
    if not np.isclose(float(scale), 1.0 / (1.0 - rate), rtol=1e-3 if half else 1e-6):
        return False
    full, noise = static_shape(data[0]), static_shape(uniform)
    if len(noise) == len(full) and noise[0] == 1 != full[0]:
        return False  # one mask for the batch: the weight program's draw, a select reads it
    if len(noise) != len(full) or noise[0] != full[0] or any(
            n not in (1, f) for n, f in zip(noise, full)):
        m.reject(op, f"dropout mask of shape {noise} does not broadcast to the samples {full}")
        return True
    attrs: dict[str, Any] = {"rate": rate}
    if noise != full:
        attrs["noise_shape"] = list(noise[1:])
    m.add_kernel(op.name.rsplit("/", 1)[0] if "/" in op.name else op.name, "dropout",
                 [data[0]], attrs, [], [op, select, cond.op, *mask], select.outputs[0],
                 source_op=op)
    return True


@fast_path
def match_batch_norm(m: Context, op: tf.Operation) -> bool:
    """Batch norm with moving statistics (inference): FusedBatchNormV3, or Keras' and
    tf.nn.batch_normalization's x * (rsqrt(var + eps) * gamma) + (beta - mean * that)."""
    if op.type.startswith("FusedBatchNorm"):
        if op.get_attr("is_training"):
            return _fused_batch_norm_training(m, op)
        x, scale, offset, mean, variance = op.inputs[:5]
        weights = [m.operands.weight(t) for t in (scale, offset, mean, variance)]
        if not m.is_batched(x) or None in weights or op.get_attr("data_format") != b"NHWC":
            return False
        return _batch_norm(m, x, op, weights[2], weights[3], weights[0], weights[1],
                           float(op.get_attr("epsilon")), [op], op.outputs[0], fused=True)
    if op.type != "Mul" or not m.is_batched(op.inputs[0]) or m.is_batched(op.inputs[1]):
        return False
    found = _keras_batch_norm(m, op)
    if found is None:
        return False
    mean, variance, gamma, beta, eps, ops, out = found
    return _batch_norm(m, op.inputs[0], op, mean, variance, gamma, beta, eps, ops, out)


def _keras_batch_norm(m: Context, mul_1: tf.Operation):
    factor = mul_1.inputs[1].op  # rsqrt(var + eps) [* gamma]
    gamma = None
    if factor.type == "Mul":
        rsqrt, g = factor.inputs
        gamma = m.operands.weight(g)
        if gamma is None:
            return None
        rsqrt = rsqrt.op
    else:
        rsqrt = factor
    if rsqrt.type != "Rsqrt" or rsqrt.inputs[0].op.type not in ("AddV2", "Add"):
        return None
    var_t, eps_t = rsqrt.inputs[0].op.inputs
    variance, eps = m.operands.weight(var_t), m.operands.constant(eps_t)
    add = m.sole_consumer(mul_1.outputs[0])
    if variance is None or eps is None or add is None or add.type not in ("AddV2", "Add"):
        return None
    sub = [t for t in add.inputs if t is not mul_1.outputs[0]][0].op
    beta, mean_mul = None, None
    if sub.type == "Sub":
        beta, mean_mul = m.operands.weight(sub.inputs[0]), sub.inputs[1].op
        if beta is None:
            return None
    elif sub.type == "Neg":
        mean_mul = sub.inputs[0].op
    elif sub.type == "Mul" and sub.inputs[0].op.type == "Neg":  # Keras 3 without center
        mean_mul = sub
    if mean_mul is None or mean_mul.type != "Mul" or mean_mul.inputs[1] is not mul_1.inputs[1]:
        return None
    mean_t = mean_mul.inputs[0]
    mean = m.operands.weight(mean_t.op.inputs[0] if mean_mul is sub else mean_t)
    if mean is None:
        return None
    return mean, variance, gamma, beta, float(eps), [mul_1, add], add.outputs[0]


def match_batch_norm_training(m: Context, op: tf.Operation) -> bool:
    """BatchNormalization in training, the one sanctioned group of ops whose samples meet:
    tf.nn.moments of a per-sample tensor over every axis but the last (mean; the mean of
    squared_difference from its stop_gradient) feeding tf.nn.batch_normalization of that
    same tensor and nothing else on the way to the loss (Keras' BatchNormalization with
    training=True builds exactly this). It becomes a batch_norm_training kernel, a batch
    barrier; the moments' values are recorded (`Context.statistics`) for the train_op's
    moving-average updates. Any other reduction over the batch axis stays refused."""
    if op.type != "Mean" or not m.is_batched(op.inputs[0]):
        return False
    found = _moments(m, op)
    if found is None:
        return False
    mean, variance, group = found
    norm = _normalization(m, op.inputs[0], mean, variance)
    if norm is None:
        return False
    gamma, beta, eps, ops, out = norm
    if any(not set(m.consumers(t)) <= set(group + ops) for t in mean + variance):
        return False  # a moment read by anything else: refused as mixing samples
    channels = static_shape(op.inputs[0])[-1]
    params = [ParamRef(role, w.variable, (channels,)) for role, w in
              (("scale", gamma), ("offset", beta)) if w is not None]
    if any(w is not None and w.variable_shape != (channels,) for w in (gamma, beta)):
        return False
    base = m.scope(op, gamma.variable if gamma is not None else "")
    if gamma is None:
        base = op.name.split("/moments/")[0] if "/moments/" in op.name else op.name
    kernel = m.add_kernel(base, "batch_norm_training", [op.inputs[0]], {
        "epsilon": eps, "scale": gamma is not None, "center": beta is not None,
        "mean_rule": "affine", "mean_update": [], "variance_rule": "affine",
        "variance_update": []},
        params, group + ops, out)
    for stat, tensors in (("mean", mean), ("variance", variance)):
        for t in tensors:
            m.statistics[t.name] = (kernel.name, stat)
    return True


def _fused_batch_norm_training(m: Context, op: tf.Operation) -> bool:
    """FusedBatchNormV3 with is_training (tf.compat.v1.nn.fused_batch_norm): the whole
    batch's statistics, its batch_mean and (Bessel-corrected) batch_variance outputs read
    only by the train_op's moving averages."""
    x, scale, offset = op.inputs[:3]
    if not m.is_batched(x):
        return False
    weights = [m.operands.weight(t) for t in (scale, offset)]
    factor = op.get_attr("exponential_avg_factor") \
        if "exponential_avg_factor" in op.node_def.attr else 1.0
    channels = static_shape(x)[-1]
    if op.type != "FusedBatchNormV3" or op.get_attr("data_format") != b"NHWC" or \
            any(w is None or w.variable_shape != (channels,) for w in weights) or factor != 1.0:
        m.reject(op, "fused batch normalization in training is carried out only "
                     + REFUSED[_FUSED])
        return True
    if any(m.consumers(t) or t.name in m.protected for t in op.outputs[1:]):
        m.reject(op, "the batch's mean or variance of fused batch normalization in training is "
                     "read on the way to the loss or by the host: only the train_op's moving "
                     "averages may read them")
        return True
    params = [ParamRef(role, w.variable, (channels,))
              for role, w in zip(("scale", "offset"), weights) if w is not None]
    kernel = m.add_kernel(op.name.rsplit("/", 1)[0] if "/" in op.name else op.name,
                          "batch_norm_training", [x], {
                              "epsilon": float(op.get_attr("epsilon")), "scale": True,
                              "center": True, "fused": True, "mean_rule": "affine",
                              "mean_update": [], "variance_rule": "affine",
                              "variance_update": []}, params, [op], op.outputs[0])
    m.statistics[op.outputs[1].name] = (kernel.name, "mean")
    m.statistics[op.outputs[2].name] = (kernel.name, "variance")
    return True


def _moments(m: Context, mean_op: tf.Operation):
    """tf.nn.moments(x, every axis but the last): ([mean tensors], [variance tensors],
    ops), the tensors being the keepdims moments and their squeezed values."""
    x = mean_op.inputs[0]
    rank = len(static_shape(x))
    axes = m.operands.constant(mean_op.inputs[1])
    if rank < 2 or axes is None or not mean_op.get_attr("keep_dims") or \
            sorted({int(a) % rank for a in np.atleast_1d(axes)}) != list(range(rank - 1)):
        return None
    users = m.consumers(mean_op.outputs[0])
    stop = next((u for u in users if u.type == "StopGradient"), None)
    if stop is None:
        return None
    diff = m.consumers(stop.outputs[0])
    if len(diff) != 1 or diff[0].type != "SquaredDifference" or diff[0].inputs[0] is not x:
        return None
    var_ops = m.consumers(diff[0].outputs[0])
    if len(var_ops) != 1 or var_ops[0].type != "Mean" or not var_ops[0].get_attr("keep_dims"):
        return None
    var_op = var_ops[0]
    var_axes = m.operands.constant(var_op.inputs[1])
    if var_axes is None or sorted({int(a) % rank for a in np.atleast_1d(var_axes)}) != \
            list(range(rank - 1)):
        return None
    group = [mean_op, stop, diff[0], var_op]
    stats = []
    for t, allowed in ((mean_op.outputs[0], {stop}), (var_op.outputs[0], set())):
        tensors = [t]
        squeeze = [u for u in m.consumers(t) if u.type == "Squeeze" and u not in allowed]
        if len(squeeze) == 1 and len(m.consumers(t)) == len(allowed) + 1:
            group.append(squeeze[0])
            tensors.append(squeeze[0].outputs[0])
        stats.append(tensors)
    return stats[0], stats[1], group


def _normalization(m: Context, x: tf.Tensor, mean: list[tf.Tensor], variance: list[tf.Tensor]):
    """tf.nn.batch_normalization(x, mean, variance, beta, gamma, eps), the moments read by
    nothing else on the way to the loss or by the host: (gamma, beta, eps, ops, output)."""
    mean_t, var_t = mean[-1], variance[-1]
    if any(t.name in m.protected for t in mean + variance):
        return None
    add = m.consumers(var_t)
    if len(add) != 1 or add[0].type not in ("AddV2", "Add") or add[0].inputs[0] is not var_t:
        return None
    eps = m.operands.constant(add[0].inputs[1])
    rsqrt = m.consumers(add[0].outputs[0])
    if eps is None or eps.size != 1 or len(rsqrt) != 1 or rsqrt[0].type != "Rsqrt":
        return None
    ops = [add[0], rsqrt[0]]
    inv, gamma = rsqrt[0].outputs[0], None
    users = m.consumers(inv)
    if len(users) == 1 and users[0].type == "Mul":
        gamma = m.operands.weight(users[0].inputs[1])
        if gamma is None or users[0].inputs[0] is not inv:
            return None
        ops.append(users[0])
        inv = users[0].outputs[0]
    users = m.consumers(inv)
    mul_x = [u for u in users if u.type == "Mul" and list(u.inputs) == [x, inv]]
    mul_mean = [u for u in users if u.type == "Mul" and list(u.inputs) == [mean_t, inv]]
    mul_mean += [u for u in users if u.type == "Mul" and u.inputs[1] is inv and  # (-mean) * inv:
                 u.inputs[0].op.type == "Neg" and u.inputs[0].op.inputs[0] is mean_t]  # Keras 3
    if len(users) != 2 or len(mul_x) != 1 or len(mul_mean) != 1:
        return None
    if mul_mean[0].inputs[0] is not mean_t:  # without center: its shift is the product itself
        neg = mul_mean[0].inputs[0].op
        if m.consumers(neg.outputs[0]) != [mul_mean[0]]:
            return None
        mul_mean, shift = [neg], [mul_mean[0]]
    else:
        shift = m.consumers(mul_mean[0].outputs[0])
        if len(shift) != 1 or shift[0].type not in ("Sub", "Neg"):
            return None
    beta = None
    if shift[0].type == "Sub":
        beta = m.operands.weight(shift[0].inputs[0])
        if beta is None or shift[0].inputs[1] is not mul_mean[0].outputs[0]:
            return None
    out = m.consumers(mul_x[0].outputs[0])
    if len(out) != 1 or out[0].type not in ("AddV2", "Add") or \
            set(out[0].inputs) != {mul_x[0].outputs[0], shift[0].outputs[0]} or \
            m.consumers(shift[0].outputs[0]) != out:
        return None
    ops += [mul_x[0], mul_mean[0], shift[0], out[0]]
    if any(t.name in m.protected for op in ops[:-1] for t in op.outputs):
        return None
    return gamma, beta, float(eps), ops, out[0].outputs[0]


def _batch_norm(m, x, op, mean, variance, gamma, beta, eps, ops, out, fused=False) -> bool:
    if not has_kernel("batch_norm_inference"):
        return False
    params = [ParamRef("mean", mean.variable, (mean.variable_shape[-1],), frozen=True),
              ParamRef("variance", variance.variable, (variance.variable_shape[-1],), frozen=True)]
    if gamma is not None:
        params.append(ParamRef("scale", gamma.variable, (gamma.variable_shape[-1],)))
    if beta is not None:
        params.append(ParamRef("offset", beta.variable, (beta.variable_shape[-1],)))
    m.add_kernel(op.name.rsplit("/", 1)[0], "batch_norm_inference", [x],
                 {"epsilon": eps, "scale": gamma is not None, "center": beta is not None,
                  "fused": fused},
                 params, ops, out)
    return True


def _flattened_cross_entropy(m: Context, reshape: tf.Operation) -> bool:
    """tf.nn.(sparse_)softmax_cross_entropy_with_logits on logits of rank > 2 (a loss per
    token): TF flattens logits and labels across the batch, takes the loss and reshapes it
    back; each sample's rows stay its own, so it is the kernel on (..., k) logits."""
    xent = m.sole_consumer(reshape.outputs[0])
    if xent is None or xent.type not in ("SparseSoftmaxCrossEntropyWithLogits",
                                         "SoftmaxCrossEntropyWithLogits"):
        return False
    sparse = xent.type.startswith("Sparse")
    flat_logits, flat_labels = xent.inputs
    reshapes = [t.op for t in (flat_logits, flat_labels)]
    back = m.sole_consumer(xent.outputs[0])
    if any(r.type != "Reshape" or m.sole_consumer(r.outputs[0]) is not xent for r in reshapes) \
            or back is None or back.type != "Reshape" or not m.is_batched(reshapes[0].inputs[0]):
        return False
    logits, labels = (r.inputs[0] for r in reshapes)
    lead = static_shape(logits)[:-1]
    if static_shape(labels) != (lead if sparse else static_shape(logits)) or \
            static_shape(back.outputs[0]) != lead or \
            static_shape(flat_logits) != (int(np.prod(lead)), static_shape(logits)[-1]) or \
            not _batched_labels(m, labels, xent):
        return False
    m.add_kernel(xent.name, "softmax_cross_entropy_with_logits", [logits, labels],
                 {"sparse": sparse}, [], [*reshapes, xent, back], back.outputs[0], source_op=xent)
    return True


def _batched_labels(m: Context, labels: tf.Tensor, xent: tf.Operation) -> bool:
    """Whether a cross-entropy's `labels` are values of the samples, or a constant whose
    first axis is the batch (tf.tile(classes, [batch, 1]), tf.broadcast_to: each sample's
    row its labels), which a sample_constant kernel then gives each sample."""
    if m.is_batched(labels):
        return True
    value = m.operands.shaped_constant(labels)
    if value is None or value.ndim < 1 or value.shape[0] != m.batch_size or \
            value.dtype not in (np.float32, np.int32, np.int64):
        return False
    m.add_kernel(f"{xent.name}/labels", "sample_constant", [m.sample_input()],
                 {"value": value}, [], [], labels, output_shape=value.shape[1:], source_op=xent)
    return True


@fast_path
def match_cross_entropy(m: Context, op: tf.Operation) -> bool:
    if op.type == "Reshape" and m.is_batched(op.inputs[0]):
        return _flattened_cross_entropy(m, op)
    if op.type not in ("SparseSoftmaxCrossEntropyWithLogits", "SoftmaxCrossEntropyWithLogits"):
        return False
    logits, labels = op.inputs
    if not (m.is_batched(logits) and _batched_labels(m, labels, op)):
        return False
    attrs = {"sparse": op.type.startswith("Sparse")}
    m.add_kernel(op.name, "softmax_cross_entropy_with_logits", [logits, labels], attrs, [],
                 [op], op.outputs[0])
    if m.consumers(op.outputs[1]):
        # tf.gradients of the loss in model_fn reads its backprop (second_order.py)
        m.add_kernel(f"{op.name}/backprop", "softmax_cross_entropy_backprop", [logits, labels],
                     attrs, [], [op], op.outputs[1])
    return True
