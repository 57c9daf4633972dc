"""How each TensorFlow op of the forward graph becomes a CS kernel: the library fast paths
(dense, conv2d, pooling, dropout, batch norm, softmax cross-entropy) and the table of
generic lowerings. The tables here are also what the README lists as supported.

Every lowering proves its op is computed per sample (the batch stays the first axis and
no value of one sample reaches another) or refuses it with the reason. The one exception
is BatchNormalization in training (`match_batch_norm_training`): exactly tf.nn.moments over
every axis but the last feeding tf.nn.batch_normalization, carried out as a batch barrier.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import tensorflow as tf

from coordinator.compiler import lowering_spatial, sequences
from coordinator.compiler.ir import ParamRef
from coordinator.compiler.operands import RANDOM_OPS, static_shape
from wafer.kernels import KERNELS

if TYPE_CHECKING:
    from coordinator.compiler.match import Matcher

# TF op -> the `activation` kernel's function (element-wise, one input).
UNARY = {"Neg": "neg", "Abs": "abs", "Square": "square", "Sqrt": "sqrt", "Rsqrt": "rsqrt",
         "Exp": "exp", "Expm1": "expm1", "Log": "log", "Log1p": "log1p",
         "Reciprocal": "reciprocal", "Inv": "reciprocal", "Erf": "erf", "Erfc": "erfc",
         "Sin": "sin", "Cos": "cos", "Sign": "sign", "Softsign": "softsign", "Relu": "relu",
         "Relu6": "relu6", "Elu": "elu", "Selu": "selu", "Tanh": "tanh", "Sigmoid": "sigmoid",
         "Softplus": "softplus", "LeakyRelu": "leaky_relu"}
# Fused into a dense or conv2d kernel (leaky_relu keeps its own kernel for its alpha).
FUSABLE_ACTIVATIONS = {"Relu": "relu", "Relu6": "relu6", "Elu": "elu", "Selu": "selu",
                       "Tanh": "tanh", "Sigmoid": "sigmoid", "Softplus": "softplus"}
# TF op -> the `binary` kernel's op (numpy broadcasting = TF's).
BINARY = {"Add": "add", "AddV2": "add", "BiasAdd": "add", "Sub": "sub", "Mul": "mul",
          "RealDiv": "div", "Div": "div", "Maximum": "maximum", "Minimum": "minimum",
          "SquaredDifference": "squared_difference", "Pow": "pow", "Greater": "greater",
          "GreaterEqual": "greater_equal", "Less": "less", "LessEqual": "less_equal",
          "Equal": "equal", "NotEqual": "not_equal", "LogicalAnd": "logical_and",
          "LogicalOr": "logical_or"}
REDUCTIONS = {"Sum": "sum", "Mean": "mean", "Max": "max", "Min": "min"}
RESHAPES = ("Reshape", "Squeeze", "ExpandDims")
RECURRENT = {"While", "StatelessWhile", "TensorListReserve", "TensorListFromTensor",
             "TensorListGetItem", "TensorListSetItem", "TensorListStack", "Enter", "Exit",
             "NextIteration", "LoopCond"}
# Library fast paths, by the TF ops they start from (for the README's table).
FAST_PATHS = {
    "dense": "MatMul / BatchMatMulV2 / Keras Tensordot with a weight [+ BiasAdd] [+ activation]",
    "conv2d": "Conv2D (NHWC, SAME/VALID, strides) [+ BiasAdd] [+ activation]",
    "max_pool, avg_pool": "MaxPool, AvgPool (NHWC, over height and width)",
    "dropout": "tf.nn.dropout, Keras Dropout / SpatialDropout (random mask, rate, noise_shape)",
    "batch_norm_inference": "BatchNormalization with training=False, FusedBatchNormV3 (inference)",
    "batch_norm_training": "BatchNormalization with training=True, tf.nn.moments + "
                           "tf.nn.batch_normalization, FusedBatchNormV3 with is_training: the "
                           "whole batch's statistics (a batch barrier), moving statistics as "
                           "the train_op's assign ops move them",
    "softmax_cross_entropy_with_logits": "SparseSoftmaxCrossEntropyWithLogits, "
                                         "SoftmaxCrossEntropyWithLogits",
    **lowering_spatial.KERNEL_ROWS,
}
_FUSED = "FusedBatchNormV3 in training, other than"
REFUSED = {
    _FUSED: "on NHWC data with scale and offset weights and exponential_avg_factor 1 "
            "(tf.compat.v1.nn.fused_batch_norm's default): compute the moving averages with "
            "assign ops of its batch_mean and batch_variance",
    "While loops": "tf.while_loop (the CS pipelines one pass per sample; Keras' LSTM, GRU and "
                   "SimpleRNN over fixed-length sequences are unrolled by the compiler)",
    "ops mixing samples": "reductions, matmuls, gathers or reshapes across the batch axis "
                          "outside the loss",
    "random numbers": "other than a dropout mask",
    "computations on weights": "a weight changed by anything but a static view (slice, "
                               "constant gather, transpose, reshape) before it meets the samples",
    "dtypes": "bfloat16 and float64 (the CS computes in float32, and in float16 with float32 "
              "accumulation: mixed precision); csconfig.use_cbfloat16",
    **lowering_spatial.REFUSED,
}


def has_kernel(name: str) -> bool:
    return name in KERNELS


def mixes_samples(op: tf.Operation, batch: int) -> str:
    name = op.name.lower()
    if "batch_norm" in name or "batchnorm" in name or "/moments/" in f"/{name}":
        return ("combines values of different samples in a batch normalization the CS does not "
                "recognise: it carries out BatchNormalization in training as tf.nn.moments over "
                "every axis but the last feeding tf.nn.batch_normalization (Keras' "
                "BatchNormalization, channels last), or FusedBatchNormV3")
    return ("combines values of different samples (a reduction over the batch axis feeding "
            "per-sample computation): the CS computes each sample on its own; reduce over "
            "non-batch axes, or only in the loss")


def batch_reduction_axes(m: "Matcher", op: tf.Operation) -> tuple[int, ...] | None:
    """The axes of a reduction over the batch axis of a batched tensor (the loss's), else None."""
    if not op.inputs or not m.is_batched(op.inputs[0]):
        return None
    rank = len(static_shape(op.inputs[0]))
    if op.type == "L2Loss":
        return tuple(range(rank))
    if op.type not in REDUCTIONS and op.type != "Prod":
        return None
    constant = m.operands.constant(op.inputs[1])
    if constant is None:
        return None
    axes = tuple(sorted({int(a) % rank for a in np.atleast_1d(constant)})) if rank else ()
    return axes if 0 in axes or rank == 0 else None


# ---- fast paths ----
def _bias_and_activation(m: "Matcher", out: tf.Tensor, channels: int, ops: list[tf.Operation],
                         params: list[ParamRef]) -> tuple[tf.Tensor, str]:
    nxt = m.sole_consumer(out)
    if nxt is not None and nxt.type in ("BiasAdd", "Add", "AddV2") and \
            (nxt.type != "BiasAdd" or nxt.get_attr("data_format") == b"NHWC"):
        other = [t for t in nxt.inputs if t is not out]
        bias = m.operands.weight(other[0]) if len(other) == 1 else None
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


def _dense(m: "Matcher", x: tf.Tensor | str, weight, ops: list[tf.Operation], out: tf.Tensor,
           first: tf.Operation) -> bool:
    if weight.dtype != "float32" or len(weight.shape) != 2:
        return False
    units = weight.shape[1]
    params = [ParamRef("kernel", weight.variable, weight.shape, variable_shape=weight.variable_shape)]
    out, activation = _bias_and_activation(m, out, units, ops, params)
    m.add_kernel(m.scope(first, weight.variable), "dense", [x],
                 {"units": units, "use_bias": len(params) == 2, "activation": activation},
                 params, ops, out)
    return True


def match_dense(m: "Matcher") -> Callable[[tf.Operation], bool]:
    def match(op: tf.Operation) -> bool:
        if op.type == "MatMul":
            x, w = op.inputs
            weight = m.operands.weight(w)
            if weight is None or not m.is_batched(x) or op.get_attr("transpose_a") or \
                    op.get_attr("transpose_b"):
                return False
            return _dense(m, x, weight, [op], op.outputs[0], op)
        if op.type in ("BatchMatMulV2", "BatchMatMulV3"):
            x, w = op.inputs
            weight = m.operands.weight(w)
            if weight is None or not m.is_batched(x) or op.get_attr("adj_x") or op.get_attr("adj_y"):
                return False
            return _dense(m, x, weight, [op], op.outputs[0], op)
        if op.type == "Reshape" and m.is_batched(op.inputs[0]):
            return _tensordot(m, op)
        return False
    return match


def _tensordot(m: "Matcher", reshape: tf.Operation) -> bool:
    """Keras Dense on rank > 2 inputs: Reshape (B*T, n) -> MatMul weight -> Reshape (B, T, m)."""
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
    return _dense(m, x, weight, [reshape, matmul, back], back.outputs[0], matmul)


def match_conv2d(m: "Matcher") -> Callable[[tf.Operation], bool]:
    def match(op: tf.Operation) -> bool:
        if op.type != "Conv2D":
            return False
        x, w = op.inputs
        weight = m.operands.weight(w)
        if weight is None or not m.is_batched(x):
            return False
        padding = op.get_attr("padding").decode()
        strides = list(op.get_attr("strides"))
        if op.get_attr("data_format").decode() != "NHWC" or padding not in ("SAME", "VALID"):
            m.reject(op, "conv2d needs NHWC data and SAME or VALID padding")
            return True
        if list(op.get_attr("dilations")) != [1, 1, 1, 1] or strides[0] != 1 or strides[3] != 1:
            m.reject(op, "dilated convolutions are not supported")
            return True
        kh, kw, _, filters = weight.shape
        params = [ParamRef("kernel", weight.variable, weight.shape,
                           variable_shape=weight.variable_shape)]
        ops = [op]
        out, activation = _bias_and_activation(m, op.outputs[0], filters, ops, params)
        m.add_kernel(m.scope(op, weight.variable), "conv2d", [x], {
            "filters": int(filters), "kernel_size": [int(kh), int(kw)],
            "strides": [int(strides[1]), int(strides[2])], "padding": padding,
            "use_bias": len(params) == 2, "activation": activation}, params, ops, out)
        return True
    return match


def match_pool(m: "Matcher") -> Callable[[tf.Operation], bool]:
    def match(op: tf.Operation) -> bool:
        if op.type not in ("MaxPool", "AvgPool") or not m.is_batched(op.inputs[0]):
            return False
        ksize, strides = list(op.get_attr("ksize")), list(op.get_attr("strides"))
        if (op.get_attr("data_format").decode() != "NHWC" or ksize[0] != 1 or ksize[3] != 1
                or strides[0] != 1 or strides[3] != 1):
            m.reject(op, "pooling must be NHWC over height and width only")
            return True
        m.add_kernel(op.name, "max_pool" if op.type == "MaxPool" else "avg_pool",
                     [op.inputs[0]], {"pool_size": [int(ksize[1]), int(ksize[2])],
                                      "strides": [int(strides[1]), int(strides[2])],
                                      "padding": op.get_attr("padding").decode()},
                     [], [op], op.outputs[0])
        return True
    return match


def _uniform_01(m: "Matcher", tensor: tf.Tensor) -> bool:
    """Whether `tensor` is uniform random numbers in [0, 1) (TF's or Keras' sampler)."""
    op = tensor.op
    if op.type == "RandomUniform":
        return True
    if op.type in ("AddV2", "Add"):  # Keras: stateless uniform * (max - min) + min
        mul, low = op.inputs
        if mul.op.type != "Mul":
            return False
        raw, span = mul.op.inputs
        lo, sp = m.operands.constant(low), m.operands.constant(span)
        return raw.op.type in ("StatelessRandomUniformV2", "StatelessRandomUniform") and \
            lo is not None and sp is not None and float(lo) == 0.0 and float(sp) == 1.0
    return False


def match_dropout(m: "Matcher") -> Callable[[tf.Operation], bool]:
    """select(uniform >= rate, x * 1/(1-rate), 0): tf.nn.dropout, Keras Dropout and
    SpatialDropout (their noise_shape broadcasts the mask)."""
    def match(op: tf.Operation) -> bool:
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
        if cond.op in m.flow or cond.op.type != "GreaterEqual":
            return False
        uniform, rate_t = cond.op.inputs
        rate_c, zero = m.operands.constant(rate_t), m.operands.constant(select.inputs[2])
        if rate_c is None or zero is None or np.any(zero != 0) or not _uniform_01(m, uniform):
            return False
        rate = float(rate_c)
        half = op.outputs[0].dtype == tf.float16  # 1 / (1 - rate) rounded to float16
        if not np.isclose(float(scale), 1.0 / (1.0 - rate), rtol=1e-3 if half else 1e-6):
            return False
        full, noise = static_shape(data[0]), static_shape(uniform)
        if len(noise) != len(full) or noise[0] != full[0] or any(
                n not in (1, f) for n, f in zip(noise, full)):
            m.reject(op, f"dropout mask of shape {noise} does not broadcast to the samples {full}")
            return True
        attrs: dict[str, Any] = {"rate": rate}
        if noise != full:
            attrs["noise_shape"] = list(noise[1:])
        m.add_kernel(op.name.rsplit("/", 1)[0] if "/" in op.name else op.name, "dropout",
                     [data[0]], attrs, [], [op, select], select.outputs[0])
        return True
    return match


def match_batch_norm(m: "Matcher") -> Callable[[tf.Operation], bool]:
    """Batch norm with moving statistics (inference): FusedBatchNormV3, or Keras' and
    tf.nn.batch_normalization's x * (rsqrt(var + eps) * gamma) + (beta - mean * that)."""
    def match(op: tf.Operation) -> bool:
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
    return match


def _keras_batch_norm(m: "Matcher", mul_1: tf.Operation):
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
    if mean_mul is None or mean_mul.type != "Mul" or mean_mul.inputs[1] is not mul_1.inputs[1]:
        return None
    mean = m.operands.weight(mean_mul.inputs[0])
    if mean is None:
        return None
    return mean, variance, gamma, beta, float(eps), [mul_1, add], add.outputs[0]


def match_batch_norm_training(m: "Matcher") -> Callable[[tf.Operation], bool]:
    """BatchNormalization in training, the one sanctioned group of ops whose samples meet:
    tf.nn.moments of a per-sample tensor over every axis but the last (mean; the mean of
    squared_difference from its stop_gradient) feeding tf.nn.batch_normalization of that
    same tensor and nothing else on the way to the loss (Keras' BatchNormalization with
    training=True builds exactly this). It becomes a batch_norm_training kernel, a batch
    barrier; the moments' values are recorded (`Matcher.statistics`) for the train_op's
    moving-average updates. Any other reduction over the batch axis stays refused."""
    def match(op: tf.Operation) -> bool:
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
    return match


def _fused_batch_norm_training(m: "Matcher", op: tf.Operation) -> bool:
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


def _moments(m: "Matcher", mean_op: tf.Operation):
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


def _normalization(m: "Matcher", x: tf.Tensor, mean: list[tf.Tensor], variance: list[tf.Tensor]):
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
    if len(users) != 2 or len(mul_x) != 1 or len(mul_mean) != 1:
        return None
    shift = m.consumers(mul_mean[0].outputs[0])
    beta = None
    if len(shift) != 1 or shift[0].type not in ("Sub", "Neg"):
        return None
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


def _flattened_cross_entropy(m: "Matcher", reshape: tf.Operation) -> bool:
    """tf.nn.sparse_softmax_cross_entropy_with_logits on logits of rank > 2 (a loss per
    token): TF flattens logits and labels across the batch, takes the loss and reshapes it
    back; each sample's rows stay its own, so it is the kernel on (..., k) logits."""
    xent = m.sole_consumer(reshape.outputs[0])
    if xent is None or xent.type != "SparseSoftmaxCrossEntropyWithLogits":
        return False
    flat_logits, flat_labels = xent.inputs
    reshapes = [t.op for t in (flat_logits, flat_labels)]
    back = m.sole_consumer(xent.outputs[0])
    if any(r.type != "Reshape" or m.sole_consumer(r.outputs[0]) is not xent or
           not m.is_batched(r.inputs[0]) for r in reshapes) or back is None or \
            back.type != "Reshape":
        return False
    logits, labels = (r.inputs[0] for r in reshapes)
    lead = static_shape(logits)[:-1]
    if static_shape(labels) != lead or static_shape(back.outputs[0]) != lead or \
            static_shape(flat_logits) != (int(np.prod(lead)), static_shape(logits)[-1]):
        return False
    m.add_kernel(xent.name, "softmax_cross_entropy_with_logits", [logits, labels],
                 {"sparse": True}, [], [*reshapes, xent, back], back.outputs[0], source_op=xent)
    return True


def match_cross_entropy(m: "Matcher") -> Callable[[tf.Operation], bool]:
    def match(op: tf.Operation) -> bool:
        if op.type == "Reshape" and m.is_batched(op.inputs[0]):
            return _flattened_cross_entropy(m, op)
        if op.type not in ("SparseSoftmaxCrossEntropyWithLogits", "SoftmaxCrossEntropyWithLogits"):
            return False
        logits, labels = op.inputs
        if not (m.is_batched(logits) and m.is_batched(labels)):
            return False
        m.add_kernel(op.name, "softmax_cross_entropy_with_logits", [logits, labels],
                     {"sparse": op.type.startswith("Sparse")}, [], [op], op.outputs[0])
        return True
    return match


# ---- generic lowerings ----
def lower_generic(m: "Matcher", op: tf.Operation) -> None:
    handler = GENERIC.get(op.type)
    if op.type in RECURRENT:
        m.reject(op, "a While loop (tf.while_loop, or a recurrent layer over sequences of "
                     "unknown length): the CS pipelines one pass per sample; unroll it in Python "
                     "(a for loop over the steps) or use Keras' LSTM, GRU or SimpleRNN over "
                     "fixed-length sequences, which the compiler unrolls")
    elif op.type in RANDOM_OPS:
        m.reject(op, "random numbers are supported only as a dropout mask")
    elif handler is None:
        m.reject(op, "no CS kernel computes this op")
    else:
        reason = handler(m, op)
        if reason:
            m.reject(op, reason)


def _operands(m: "Matcher", op: tf.Operation, tensors, kernel: str):
    """The kernel's operands (see Matcher.operand_list), or why there are none."""
    if not has_kernel(kernel):
        return f"the CS has no {kernel} kernel"
    return m.operand_list(op, tensors)


def _unary(m: "Matcher", op: tf.Operation) -> str:
    if not m.is_batched(op.inputs[0]):
        return "its input is not a per-sample value"
    attrs: dict[str, Any] = {"function": UNARY[op.type]}
    if op.type == "LeakyRelu":
        attrs["alpha"] = float(op.get_attr("alpha"))
    m.add_kernel(op.name, "activation", [op.inputs[0]], attrs, [], [op], op.outputs[0])
    return ""


def _same_rank(m: "Matcher", op: tf.Operation, inputs: list, rank: int) -> list:
    """Batched operands of lower per-sample rank get leading 1s (TF aligns trailing axes)."""
    out = []
    for t in inputs:
        name = t if isinstance(t, str) else m.values[t.name]
        shape = m.kernel_shape(name) if isinstance(t, str) else m.shape(t)
        if len(shape) < rank:
            kernel = m.add_kernel(f"{op.name}/expand", "reshape", [t],
                                  {"shape": [1] * (rank - len(shape)) + list(shape)}, [], [],
                                  None, output_shape=(1,) * (rank - len(shape)) + tuple(shape),
                                  source_op=op)
            out.append(kernel.name)
        else:
            out.append(t)
    return out


def _binary(m: "Matcher", op: tf.Operation) -> str:
    kind = BINARY[op.type]
    if op.type == "BiasAdd" and op.get_attr("data_format") != b"NHWC":
        return "BiasAdd needs NHWC data"
    if op.type == "Div" and not op.outputs[0].dtype.is_floating:
        return "integer division"
    if op.type == "Pow":
        exponent = m.operands.constant(op.inputs[1])
        if exponent is not None and exponent.size == 1 and m.is_batched(op.inputs[0]):
            m.add_kernel(op.name, "activation", [op.inputs[0]],
                         {"function": "pow", "exponent": float(exponent)}, [], [op], op.outputs[0])
            return ""
    found = _operands(m, op, op.inputs, "binary")
    if isinstance(found, str):
        return found
    letters, inputs, attrs, params = found
    if _is_identity(kind, letters, attrs, op):
        m.alias(op, op.inputs[letters.index("i")])
        return ""
    rank = len(static_shape(op.outputs[0])) - 1
    inputs = _same_rank(m, op, inputs, rank)
    m.add_kernel(op.name, "binary", inputs, {"op": kind, "operands": letters, **attrs}, params,
                 [op], op.outputs[0])
    return ""


def _is_identity(kind: str, letters: str, attrs: dict, op: tf.Operation) -> bool:
    """x * 1, x / 1, x + 0, x - 0 of the same shape (tf.compat.v1.losses' unit weights)."""
    if letters not in ("ic", "ci") or not isinstance(op.inputs[letters.index("i")], tf.Tensor) or \
            op.outputs[0].shape != op.inputs[letters.index("i")].shape:
        return False
    value = attrs[f"c{letters.index('c')}"]
    neutral = {"mul": 1, "div": 1, "add": 0, "sub": 0}.get(kind)
    if kind in ("div", "sub") and letters == "ci":
        return False
    return neutral is not None and value.size == 1 and float(value) == neutral


def _add_n(m: "Matcher", op: tf.Operation) -> str:
    tensors = list(op.inputs)
    if not all(m.is_batched(t) for t in tensors):
        return "AddN of values that are not all per-sample"
    current: Any = tensors[0]
    for i, t in enumerate(tensors[1:]):
        last = i == len(tensors) - 2
        kernel = m.add_kernel(op.name if last else f"{op.name}/partial", "binary", [current, t],
                              {"op": "add", "operands": "ii"}, [], [op] if last else [],
                              op.outputs[0] if last else None, output_shape=m.shape(t),
                              source_op=op)
        current = kernel.name
    return ""


def _select(m: "Matcher", op: tf.Operation) -> str:
    cond, x, _ = op.inputs
    if op.type == "Select" and cond.shape.rank == 1 and x.shape.rank and x.shape.rank > 1:
        return "tf.compat.v1.where with a vector condition selects whole rows: use tf.where"
    found = _operands(m, op, op.inputs, "select")
    if isinstance(found, str):
        return found
    letters, inputs, attrs, params = found
    inputs = _same_rank(m, op, inputs, len(static_shape(op.outputs[0])) - 1)
    m.add_kernel(op.name, "select", inputs, {"operands": letters, **attrs}, params, [op],
                 op.outputs[0])
    return ""


def _cast(m: "Matcher", op: tf.Operation) -> str:
    source, target = op.get_attr("SrcT"), op.get_attr("DstT")
    if source == target or (source, target) == (tf.float16, tf.float32):
        m.alias(op, op.inputs[0])  # float16 values travel as float32 already (wafer.precision)
        return ""
    if not has_kernel("cast"):
        return "the CS has no cast kernel"
    # to float16: a float32 cast whose kernel rounds (attr precision, set by add_kernel)
    dtype = "float32" if target == tf.float16 else tf.as_dtype(target).name
    m.add_kernel(op.name, "cast", [op.inputs[0]], {"dtype": dtype}, [], [op], op.outputs[0])
    return ""


def _stop_gradient(m: "Matcher", op: tf.Operation) -> str:
    if not has_kernel("stop_gradient"):
        return "the CS has no stop_gradient kernel"
    m.add_kernel(op.name, "stop_gradient", [op.inputs[0]], {}, [], [op], op.outputs[0])
    return ""


def _reshape(m: "Matcher", op: tf.Operation) -> str:
    out, src = static_shape(op.outputs[0]), static_shape(op.inputs[0])
    if not out or not src or out[0] != m.x.batch_size or src[0] != m.x.batch_size:
        return (f"reshapes {src} to {out}: the batch must stay the first axis "
                "(e.g. tf.reshape(x, [batch_size, -1]))")
    m.add_kernel(op.name, "reshape", [op.inputs[0]], {"shape": list(out[1:])}, [], [op],
                 op.outputs[0])
    return ""


def _transpose(m: "Matcher", op: tf.Operation) -> str:
    perm = m.operands.constant(op.inputs[1])
    if perm is None or int(perm[0]) != 0:
        return sequences.time_major_unstack(m, op)
    if not has_kernel("transpose"):
        return "the CS has no transpose kernel"
    m.add_kernel(op.name, "transpose", [op.inputs[0]], {"perm": [int(p) - 1 for p in perm[1:]]},
                 [], [op], op.outputs[0])
    return ""


def _concat(m: "Matcher", op: tf.Operation) -> str:
    inputs, axis = list(op.inputs[:-1]), m.operands.constant(op.inputs[-1])
    if axis is None or not all(m.is_batched(t) for t in inputs):
        return "concatenates values that are not all per-sample"
    full = int(axis) % op.outputs[0].shape.rank
    if full == 0:
        return "concatenates along the batch axis"
    m.add_kernel(op.name, "concat", inputs, {"axis": full - 1}, [], [op], op.outputs[0])
    return ""


def _reduce(m: "Matcher", op: tf.Operation) -> str:
    constant = m.operands.constant(op.inputs[1])
    rank = len(static_shape(op.inputs[0]))
    if constant is None:
        return "reduction axes are not constant"
    if not has_kernel("reduce"):
        return "the CS has no reduce kernel"
    axes = sorted({int(a) % rank for a in np.atleast_1d(constant)})
    m.add_kernel(op.name, "reduce", [op.inputs[0]],
                 {"op": REDUCTIONS[op.type], "axes": [a - 1 for a in axes],
                  "keepdims": bool(op.get_attr("keep_dims"))}, [], [op], op.outputs[0])
    return ""


def _softmax(m: "Matcher", op: tf.Operation) -> str:
    if not has_kernel("softmax"):
        return "the CS has no softmax kernel"
    m.add_kernel(op.name, "softmax", [op.inputs[0]],
                 {"axis": -1, "log": op.type == "LogSoftmax"}, [], [op], op.outputs[0])
    return ""


def _matmul(m: "Matcher", op: tf.Operation) -> str:
    a, b = op.inputs
    if op.type == "MatMul":
        flags = (bool(op.get_attr("transpose_a")), bool(op.get_attr("transpose_b")))
        if m.is_batched(a) and m.is_batched(b):
            return ("multiplies two per-sample matrices of rank 2 (a [batch, n] x [n, batch] "
                    "product mixes samples); use tf.matmul on [batch, m, n] tensors")
        if flags[0] and m.is_batched(a) or flags[1] and m.is_batched(b):
            return "transposes the batch axis of a per-sample operand"
    else:
        flags = (bool(op.get_attr("adj_x")), bool(op.get_attr("adj_y")))
        for t in (a, b):
            if m.is_batched(t) and t.shape.rank < 3:
                return "a per-sample operand of a batched matmul must have rank >= 3"
    found = _operands(m, op, (a, b), "matmul")
    if isinstance(found, str):
        return found
    letters, inputs, attrs, params = found
    m.add_kernel(op.name, "matmul", inputs, {"operands": letters, "transpose_a": flags[0],
                                              "transpose_b": flags[1], **attrs},
                 params, [op], op.outputs[0])
    return ""


def _einsum(m: "Matcher", op: tf.Operation) -> str:
    equation = op.get_attr("equation").decode().replace(" ", "")
    lhs, _, out = equation.partition("->")
    terms = lhs.split(",")
    if not out or "." in equation or len(terms) != len(op.inputs):
        return f"einsum {equation!r}: explicit output and no ellipsis needed"
    batch = out[0]
    for term, t in zip(terms, op.inputs):
        if m.is_batched(t) != (term[:1] == batch) or batch in term[1:]:
            return f"einsum {equation!r} does not keep the batch axis {batch!r} first in every per-sample operand"
    found = _operands(m, op, op.inputs, "einsum")
    if isinstance(found, str):
        return found
    letters, inputs, attrs, params = found
    m.add_kernel(op.name, "einsum", inputs, {"equation": equation, "operands": letters, **attrs},
                 params, [op], op.outputs[0])
    return ""


def _gather(m: "Matcher", op: tf.Operation) -> str:
    table, ids = op.inputs[0], op.inputs[1]
    if m.is_batched(table):
        return "gathers from a per-sample value (only embedding lookups in a weight are supported)"
    if op.type == "GatherV2":
        axis = m.operands.constant(op.inputs[2])
        if axis is None or int(axis) != 0 or op.get_attr("batch_dims") != 0:
            return "gathers along an axis other than the table's first"
    found = _operands(m, op, (table, ids), "gather")
    if isinstance(found, str):
        return found
    letters, inputs, attrs, params = found
    if letters != "pi":
        return "gathers from a constant table"
    weight = m.operands.weight(table) or m.operands.view(table)
    assert weight is not None, "letter p: _operands found the table's weight"
    m.add_kernel(m.scope(op, weight.variable), "gather", inputs, {"operands": letters, **attrs},
                 params, [op], op.outputs[0])
    return ""


def _one_hot(m: "Matcher", op: tf.Operation) -> str:
    depth, on, off = (m.operands.constant(t) for t in op.inputs[1:4])
    if depth is None or on is None or off is None or op.get_attr("axis") != -1:
        return "one_hot needs a constant depth, on and off values and axis -1"
    if not has_kernel("one_hot"):
        return "the CS has no one_hot kernel"
    m.add_kernel(op.name, "one_hot", [op.inputs[0]], {"depth": int(depth), "on_value": float(on),
                                                     "off_value": float(off)},
                 [], [op], op.outputs[0])
    return ""


def _strided_slice(m: "Matcher", op: tf.Operation) -> str:
    begin, end, strides = (m.operands.constant(t) for t in op.inputs[1:4])
    if begin is None or end is None or strides is None:
        return "slice bounds are not constant"
    if op.get_attr("ellipsis_mask") or op.get_attr("new_axis_mask"):
        return "slices with ... or tf.newaxis are not supported"
    shape = static_shape(op.inputs[0])
    masks = {k: op.get_attr(k) for k in ("begin_mask", "end_mask", "shrink_axis_mask")}
    b_out, e_out, s_out, shrink = [], [], [], []
    for axis, size in enumerate(shape):
        if axis < len(begin):
            step = int(strides[axis])
            lo = 0 if masks["begin_mask"] >> axis & 1 else int(begin[axis])
            hi = size if masks["end_mask"] >> axis & 1 else int(end[axis])
            if masks["shrink_axis_mask"] >> axis & 1:
                lo = lo % size
                hi, step = lo + 1, 1
                shrink.append(axis)
            if step < 0:
                return "slices with a negative stride are not supported"
            lo, hi = (lo % size if lo < 0 else min(lo, size)), (hi % size if hi < 0 else min(hi, size))
        else:
            lo, hi, step = 0, size, 1
        b_out.append(lo)
        e_out.append(hi)
        s_out.append(step)
    if b_out[0] != 0 or e_out[0] != shape[0] or s_out[0] != 1 or 0 in shrink:
        return "slices the batch axis"
    if not has_kernel("slice"):
        return "the CS has no slice kernel"
    m.add_kernel(op.name, "slice", [op.inputs[0]],
                 {"begin": b_out[1:], "end": e_out[1:], "strides": s_out[1:],
                  "shrink": [a - 1 for a in shrink]}, [], [op], op.outputs[0])
    return ""


def _slice(m: "Matcher", op: tf.Operation) -> str:
    begin, size = m.operands.constant(op.inputs[1]), m.operands.constant(op.inputs[2])
    shape = static_shape(op.inputs[0])
    if begin is None or size is None:
        return "slice bounds are not constant"
    end = [shape[a] if int(s) < 0 else int(b) + int(s) for a, (b, s) in enumerate(zip(begin, size))]
    if int(begin[0]) != 0 or end[0] != shape[0]:
        return "slices the batch axis"
    if not has_kernel("slice"):
        return "the CS has no slice kernel"
    m.add_kernel(op.name, "slice", [op.inputs[0]],
                 {"begin": [int(b) for b in begin[1:]], "end": end[1:], "strides": [1] * (len(shape) - 1),
                  "shrink": []}, [], [op], op.outputs[0])
    return ""


def _pad(m: "Matcher", op: tf.Operation) -> str:
    paddings = m.operands.constant(op.inputs[1])
    value = m.operands.constant(op.inputs[2]) if op.type == "PadV2" else np.float32(0)
    if paddings is None or value is None or np.any(paddings[0] != 0):
        return "pads the batch axis or with non-constant paddings"
    if not has_kernel("pad"):
        return "the CS has no pad kernel"
    m.add_kernel(op.name, "pad", [op.inputs[0]], {"paddings": [int(p) for p in paddings[1:].ravel()],
                                                 "value": float(value)}, [], [op], op.outputs[0])
    return ""


def _identity_n(m: "Matcher", op: tf.Operation) -> str:
    """tf.custom_gradient's IdentityN: the CS differentiates the forward ops, so a custom
    gradient is refused, except TF's silu/swish (x * sigmoid(beta x)), whose custom gradient
    is the derivative of exactly those ops."""
    y, x = op.inputs[0], op.inputs[1]
    beta = m.operands.constant(op.inputs[2]) if len(op.inputs) == 3 else None
    mul = y.op
    sigmoid = next((t.op for t in mul.inputs if t.op.type == "Sigmoid"), None) \
        if mul.type == "Mul" else None
    scaled = sigmoid.inputs[0].op if sigmoid is not None else None
    if beta is None or x not in list(mul.inputs) or scaled is None or scaled.type != "Mul" or \
            x not in list(scaled.inputs) or not m.is_batched(y):
        return ("a custom gradient (tf.custom_gradient): the CS computes the gradient of the "
                "forward ops, which may differ from the custom one")
    for out, source in zip(op.outputs, op.inputs):
        if m.is_batched(source):
            m.values[out.name], m.shapes[out.name] = m.values[source.name], m.shape(source)
    m.consumed.add(op)
    return ""


GENERIC: dict[str, Callable[["Matcher", tf.Operation], str]] = {
    **{k: _unary for k in UNARY}, **{k: _binary for k in BINARY},
    "AddN": _add_n, "Select": _select, "SelectV2": _select, "Cast": _cast,
    "StopGradient": _stop_gradient, **{k: _reshape for k in RESHAPES}, "Transpose": _transpose,
    "ConcatV2": _concat, **{k: _reduce for k in REDUCTIONS}, "Softmax": _softmax,
    "LogSoftmax": _softmax, "MatMul": _matmul, "BatchMatMulV2": _matmul,
    "BatchMatMulV3": _matmul, "Einsum": _einsum, "GatherV2": _gather, "ResourceGather": _gather,
    "OneHot": _one_hot, "StridedSlice": _strided_slice, "Slice": _slice, "Pad": _pad,
    "PadV2": _pad, "IdentityN": _identity_n, "Unpack": sequences.unpack, "Split": sequences.split,
    "SplitV": sequences.split, "Pack": sequences.pack,
    **lowering_spatial.GENERIC,
}


def supported_op_types() -> set[str]:
    """TF op types the compiler lowers (generic table and library fast paths)."""
    return set(GENERIC) | {"Conv2D", "MaxPool", "AvgPool", "FusedBatchNormV3", "Identity",
                           "Snapshot", "SparseSoftmaxCrossEntropyWithLogits",
                           "SoftmaxCrossEntropyWithLogits"}


def supported_table() -> str:
    """The README's 'Supported operations' section, generated from the tables above
    (`python -m coordinator.compiler.lowering` prints it; a test keeps the README equal)."""
    generic = sorted(set(GENERIC) - set(UNARY) - set(BINARY) - set(lowering_spatial.GENERIC))
    lines = ["| kernel | TensorFlow ops / patterns |", "|---|---|"]
    lines += [f"| `{kernel}` (library) | {ops} |" for kernel, ops in FAST_PATHS.items()]
    lines.append("| `activation` (element-wise) | " + ", ".join(sorted(UNARY)) + ", Pow with a "
                 "constant exponent |")
    lines.append("| `binary` (broadcasting, with activations, constants or weights) | "
                 + ", ".join(sorted(BINARY)) + " |")
    lines.append("| generic | " + ", ".join(generic) + " |")
    lines.append("| `loss` (the batch reduction) | any sum or mean over the batch of per-sample "
                 "values (tf.compat.v1.losses.* with constant weights, label smoothing, "
                 "hand-written MSE) plus L2/L1 penalties of single weights (tf.nn.l2_loss, "
                 "Keras regularizers), proven linear by the compiler |")
    lines.append("| weights (shared, viewed) | a weight read by several kernels (tied input/output "
                 "embeddings, a Keras layer called twice, an unrolled LSTM's cell at every step) "
                 "lives in one region, its uses' gradients summed before the one update; a "
                 "static view of a weight (a slice, a gather by constant indices, a transpose or "
                 "reshape: pos_table[:n]) is read as such, its gradient scattered back |")
    lines.append("| sequences | Keras LSTM, GRU, SimpleRNN over fixed-length sequences "
                 "(return_sequences either way): their While loop unrolled, every step reading "
                 "the cell's shared weights; Pack, Split, SplitV, Unpack along a sample's axes; "
                 "sparse_softmax_cross_entropy_with_logits on logits of rank > 2 |")
    lines.append("| mixed precision (any kernel, `precision` float16) | float16 ops of a Keras "
                 "mixed_float16 policy or casts by hand: float32 weights read through Cast, "
                 "float16 operands and results, float32 accumulation (docs/design.md); a static "
                 "loss scale (loss * S, MixedPrecisionLossScaleOptimizer with a number) or "
                 "TF's dynamic one ('dynamic', DynamicLossScale: a non-finite step skipped, the "
                 "scale halved; doubled after N finite steps) |")
    lines += ["", "Refused, with the reason:", ""]
    lines += [f"- **{what}**: {why}" for what, why in REFUSED.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(supported_table(), end="")
