"""The generic lowerings: how each TensorFlow op of the forward graph that no library fast
path (fast_paths.py) takes becomes generic CS kernels (element-wise, broadcasting binary,
reductions, matmul/einsum, softmax, gather, slice, reshape, …), each rule registered for
its op types (`rules.generic`); and the README's "Supported operations" table, generated
from the registry (`python -m coordinator.compiler.lowering`).

Every lowering proves its op is computed per sample (the batch stays the first axis and
no value of one sample reaches another) or refuses it with the reason.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from coordinator.compiler import (
    bincount,
    complex_values,
    cond_reads,
    fast_paths,
    feature_columns,
    in_batch,
    linear_algebra,
    lowering_spatial,
    quantization,
    random_numbers,
    second_order,
    sequences,
    spectra,
    step_values,
    value_selections,
)
from coordinator.compiler.extract import user_source
from coordinator.compiler.grappler import pushed_down, reciprocal
from coordinator.compiler.operands import RANDOM_OPS, static_shape
from coordinator.compiler.rules import GENERIC, Context, generic, has_kernel
from wafer.kernels.activations import FLOAT32_ONLY, INTEGER_FUNCTIONS
from wafer.kernels.elementwise import ARITHMETIC, COMPARISONS

# TF op -> the `activation` kernel's function (element-wise, one input).
UNARY = {"Neg": "neg", "Abs": "abs", "Square": "square", "Sqrt": "sqrt", "Rsqrt": "rsqrt",
         "Exp": "exp", "Expm1": "expm1", "Log": "log", "Log1p": "log1p",
         "Reciprocal": "reciprocal", "Inv": "reciprocal", "Erf": "erf", "Erfc": "erfc",
         "Lgamma": "lgamma", "Digamma": "digamma", "BesselI0e": "bessel_i0e",
         "Sin": "sin", "Cos": "cos", "Tan": "tan", "Asin": "asin", "Acos": "acos", "Atan": "atan",
         "Sign": "sign", "Floor": "floor",
         "Ceil": "ceil", "Round": "round", "Rint": "round", "Softsign": "softsign", "Relu": "relu",
         "Relu6": "relu6", "Elu": "elu", "Selu": "selu", "Tanh": "tanh", "Sigmoid": "sigmoid",
         "Softplus": "softplus", "LeakyRelu": "leaky_relu"}
# TF op -> the `binary` kernel's op (numpy broadcasting = TF's).
BINARY = {"Add": "add", "AddV2": "add", "BiasAdd": "add", "Sub": "sub", "Mul": "mul",
          "RealDiv": "div", "Div": "div", "DivNoNan": "div_no_nan", "FloorDiv": "floor_div", "FloorMod": "floor_mod", "Maximum": "maximum", "Minimum": "minimum",
          "SquaredDifference": "squared_difference", "Pow": "pow", "Greater": "greater",
          "GreaterEqual": "greater_equal", "Less": "less", "LessEqual": "less_equal",
          "Equal": "equal", "NotEqual": "not_equal", "LogicalAnd": "logical_and",
          "LogicalOr": "logical_or", "Xlogy": "xlogy", "Xlog1py": "xlog1py", "Atan2": "atan2"}
REDUCTIONS = {"Sum": "sum", "Mean": "mean", "Max": "max", "Min": "min", "Prod": "prod"}
RESHAPES = ("Reshape", "Squeeze", "ExpandDims")
MATMULS = ("MatMul", "BatchMatMulV2", "BatchMatMulV3")  # tf.matmul of rank 2, of higher ranks
# What the weight program (weight_program.py) computes on weights alone: element-wise ops,
# arithmetic of weights and constants (TF op -> the binary kernel's op), reductions, reshapes,
# transposes, products of matrices, softmax and log_softmax along the last axis, l2_loss,
# stop_gradient (tf.nn.moments' of a weight), convolutions and pooling (a frozen loss
# network on a constant style image) and the views
# users take of weights (slices, splits, constant gathers, concatenations, stacks).
WEIGHT_ARITHMETIC = {op: kind for op, kind in BINARY.items() if kind in ARITHMETIC}
# Comparisons of weights with constants or weights (bool) and tf.where on them or on a
# constant condition (clip_by_norm's guard, SincNet's sinc(0) = 1).
WEIGHT_COMPARISONS = {op: kind for op, kind in BINARY.items() if kind in COMPARISONS}
SELECTS = ("Select", "SelectV2")
WEIGHT_VIEWS = ("StridedSlice", "Slice", "Split", "SplitV", "Unpack", "GatherV2",
                "ResourceGather", "ConcatV2", "Pack", "ReverseV2")
WEIGHT_DIAGONALS = ("MatrixDiagV3", "MatrixDiagPartV3", "MatrixSetDiagV3", "MatrixBandPart")
WEIGHT_PROGRAM_OPS = sorted({*UNARY, *WEIGHT_ARITHMETIC, *WEIGHT_COMPARISONS, *SELECTS, "AddN",
                             *REDUCTIONS, *RESHAPES,
                             "Transpose", *MATMULS, "Einsum", "Softmax", "LogSoftmax", "L2Loss", "StopGradient",
                             "Conv2D", "MaxPool", "AvgPool",
                             "Cast", "Cumsum", *WEIGHT_DIAGONALS, *linear_algebra.OPS, *WEIGHT_VIEWS,
                             *quantization.FORMS})
RECURRENT = {"While", "StatelessWhile", "TensorListReserve", "TensorListFromTensor",
             "TensorListGetItem", "TensorListSetItem", "TensorListStack", "Enter", "Exit",
             "NextIteration", "LoopCond"}
# The README's list of what is refused, with the reason.
REFUSED = {
    **fast_paths.REFUSED,
    "gradients inside the loss": "to a weight (BiasAddGrad, a MatMul over the batch: they "
                                 "mix samples), of a fused softmax cross-entropy on logits of "
                                 "rank > 2 (flattened across the batch; take the gradient of a "
                                 "hand-written log_softmax cross-entropy), gradient ops of "
                                 "other activations (SoftsignGrad, ...), and any op of the "
                                 "gradient in float16 (a mixed_float16 FGSM)",
    "While loops": "whose number of steps is not known when the graph is built (the CS "
                   "pipelines one pass per sample): tf.while_loop whose condition reads the "
                   "batch, a weight or a random value, TensorArrays, tf.map_fn whose "
                   "function TF's pfor (tf.vectorized_map) cannot batch, tf.nn.ctc_loss",
    "ops mixing samples": "reductions, matmuls, gathers or reshapes across the batch axis "
                          "outside the loss, but BatchNormalization's moments, the in-batch "
                          "products, rows of the batch, the batch statistics and the losses of "
                          "the whole batch above (a row of the batch no element-wise op pairs "
                          "with per-sample values: tf.reduce_sum(x[None, :], 0)), two statistics "
                          "combined (min-max scaling's max - min) or a non-linear function of "
                          "batch statistics (h * m / tf.reduce_sum(m ** 2), m = "
                          "tf.reduce_mean(h, 0)) feeding per-sample layers; a loss of the whole "
                          "batch reading a weight, a random number or float16 values; a "
                          "slice, split, roll or concat of the batch axis (x[:k], x[1:] - "
                          "x[:-1]) feeding per-sample layers, weights or predictions",
    **random_numbers.REFUSED,
    **step_values.REFUSED,
    **value_selections.REFUSED,
    "computations on weights": "other than the weight program's (above) before the weight "
                               "meets the samples (e.g. tf.sort(w)), or float16 "
                               "reductions, softmax, l2_loss, cumsum, linear algebra, "
                               "convolutions or pooling of weights (TF sums them in float16); "
                               "a depthwise convolution of weights",
    "dtypes": "bfloat16 and float64 (the CS computes in float32, and in float16 with float32 "
              "accumulation: mixed precision), but a float64 input every reader casts to "
              "float32 first (Keras layers' autocast, tf.cast: streamed as float32, cast on "
              "the input worker as TF's Cast rounds); csconfig.use_cbfloat16",
    **lowering_spatial.REFUSED,
    "special functions": "tf.math.igamma, igammac, betainc, polygamma, zeta, erfinv, ndtri, "
                         "bessel_i1e and the other Bessel functions (no CS kernel); lgamma, "
                         "digamma, bessel_i0e, xlogy and xlog1py in float16 (proven against "
                         "TF's float32 kernels only)",
    "complex values": "other ops than `complex_region`'s (above) on a complex value (tanh, "
                      "sin, sigmoid, cumsum of complex values), a complex value the host "
                      "reads, an FFT, sum, slice, transpose or product along the batch axis "
                      "or of rows folded into it, a concat or pad of per-sample with shared "
                      "complex values, an einsum's diagonal or size-1 broadcast, complex128. "
                      "A spectrum whose bins at TF's FFT rounding level move "
                      "the loss or a gradient beyond 1e-5 on input_fn's first batch (a log of "
                      "noiseless tones on a bin's frequency)",
}


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


def batch_reduction_axes(m: Context, op: tf.Operation) -> tuple[int, ...] | None:
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


def lower_generic(m: Context, op: tf.Operation) -> None:
    handler = GENERIC.get(op.type)
    if op.type in RECURRENT:
        m.reject(op, "a While loop whose number of steps is not known when the graph is "
                     "built (tf.while_loop whose condition reads the batch, a weight or a random "
                     "value, a TensorArray, a tf.map_fn whose function TF's pfor cannot "
                     "batch, or a recurrent layer over sequences of unknown length): the CS "
                     "pipelines one pass per sample; loop over a constant number of steps "
                     "(tf.while_loop, tf.scan over a fixed length, a Python for loop, Keras' "
                     "recurrent layers over fixed-length sequences), which the compiler unrolls")
    elif (op.type in RANDOM_OPS and handler is None) or \
            op.type in random_numbers.CANDIDATE_SAMPLERS:
        m.reject(op, random_numbers.refusal(op.type))
    elif handler is None and (gather := value_selections.selecting_gather(op)) is not None:
        m.reject(op, value_selections.refusal(gather))
    elif handler is None and (op.type == "Where" or op.type.startswith("Sparse")):
        m.reject(op, feature_columns.refusal(op))
    elif op.type in ("If", "StatelessIf") and cond_reads.read_in_its_step(m, op):
        m.reject(op, cond_reads.read_in_its_step(m, op))
    elif handler is None:
        m.reject(op, "no CS kernel computes this op")
    else:
        reason = handler(m, op)
        if reason:
            m.reject(op, reason)


def _operands(m: Context, op: tf.Operation, tensors, kernel: str):
    """The kernel's operands (see Context.operand_list), or why there are none."""
    if not has_kernel(kernel):
        return f"the CS has no {kernel} kernel"
    found = m.operand_list(op, tensors)
    if isinstance(found, str) or kernel not in ("binary", "select"):
        return found
    return _weight_along_the_batch(m, op, tensors, found) or found


def _weight_along_the_batch(m: Context, op: tf.Operation, tensors, found) -> str:
    """Why an element-wise op cannot read a weight operand whose first axis TF pairs with the
    batch's samples (K + noise * tf.eye(batch), a Dense of a constant as long as the batch):
    the CS gives every sample the whole weight. The elementwise kernels refuse the shape too."""
    letters, inputs, attrs, _ = found
    rank = 1 + max([len(m.sample_shape(op.outputs[0], op.inputs))] + [  # the kernel's
        len(m.kernel_shape(t) if isinstance(t, str) else m.shape(t)) for t in inputs])
    for k, t in enumerate(tensors):
        shape = tuple(attrs.get(f"p{k}", ()))
        if letters[k] != "p" or len(shape) < rank or len(shape) == rank and shape[0] == 1:
            continue
        weight = m.operands.weight(t) or m.operands.view(t)
        what = f"weight {weight.variable}" if weight is not None else "a value of weights"
        return (f"reads {what} of shape {shape} ({t.op.type} '{t.op.name}' at "
                f"{user_source(t.op)}), whose first axis TF pairs with the batch's samples: "
                "the CS gives every sample the same weights, computed once for the batch; "
                "compute the value per sample, from the features, or without an axis as long "
                "as the batch (a loss of the whole batch reads weights only through "
                "per-sample values)")
    return ""


def _float32_only(op: tf.Operation) -> str:
    return (f"{op.type} in float16 (mixed precision) is not proven against TF's float16 "
            "kernel on the CS: compute it in float32 (tf.cast the input)")


@generic(*UNARY)
def _unary(m: Context, op: tf.Operation) -> str:
    if not m.is_batched(op.inputs[0]):
        return "its input is not a per-sample value"
    attrs: dict[str, Any] = {"function": UNARY[op.type]}
    if attrs["function"] in FLOAT32_ONLY and op.outputs[0].dtype == tf.float16:
        return _float32_only(op)
    if op.outputs[0].dtype.is_integer and attrs["function"] not in INTEGER_FUNCTIONS:
        return (f"{op.type} of {op.outputs[0].dtype.name} values: the CS computes it of floats "
                f"(and {', '.join(sorted(INTEGER_FUNCTIONS))} of ints); tf.cast to float32 first")
    if op.type == "LeakyRelu":
        attrs["alpha"] = float(op.get_attr("alpha"))
    m.add_kernel(op.name, "activation", [op.inputs[0]], attrs, [], [op], op.outputs[0])
    return ""


def _same_rank(m: Context, op: tf.Operation, inputs: list, rank: int) -> list:
    """Batched operands of lower per-sample rank get leading 1s (TF aligns trailing axes)."""
    out = []
    for t in inputs:
        shape = m.kernel_shape(t) if isinstance(t, str) else m.shape(t)
        if len(shape) < rank:
            kernel = m.add_kernel(f"{op.name}/expand", "reshape", [t],
                                  {"shape": [1] * (rank - len(shape)) + list(shape)}, [], [],
                                  None, output_shape=(1,) * (rank - len(shape)) + tuple(shape),
                                  source_op=op)
            out.append(kernel.name)
        else:
            out.append(t)
    return out


def _batch_meets_sample_axis(m: Context, op: tf.Operation) -> str:
    """Why per-sample operands of different ranks ([B, T, F] + [B, F], labels [B] - y [B, 1])
    are refused: TF aligns trailing axes, so the batch axis of the lower-rank one meets an
    axis of the other's samples (equal to the batch size by chance, or 1: a [B, B] pairing),
    where the CS would pair each sample with itself alone; "" if their ranks agree. (A batch
    statistic, tf.reduce_mean(x, 0), has no batch axis: it is every sample's.)"""
    rows = [t for t in op.inputs if m.is_batched(t) and t.name not in m.leading and
            tuple(static_shape(t)) == (m.batch_size, *m.shape(t))]  # (not a batch statistic)
    if m.batch_size == 1 or len({len(static_shape(t)) for t in rows}) < 2:
        return ""
    return ("combines per-sample values of different ranks (" +
            " and ".join(str(static_shape(t)) for t in rows) +
            "): TF aligns their last axes, so one's batch axis meets an axis of the other's "
            "samples, not its batch; give both the batch axis first at the same rank "
            "(tf.expand_dims(x, 1), tf.squeeze(y, -1)) or draw per sample (tf.random.normal("
            "tf.shape(x)))")


@generic(*BINARY)
def _binary(m: Context, op: tf.Operation) -> str:
    kind = BINARY[op.type]
    if op.type == "BiasAdd" and op.get_attr("data_format") != b"NHWC":
        return "BiasAdd needs NHWC data"
    if op.type == "Div" and not op.outputs[0].dtype.is_floating:
        return "integer division"
    if kind in FLOAT32_ONLY and op.outputs[0].dtype == tf.float16:
        return _float32_only(op)
    if op.type == "Pow":
        exponent = m.operands.constant(op.inputs[1])
        if exponent is not None and exponent.size == 1 and m.is_batched(op.inputs[0]):
            m.add_kernel(op.name, "activation", [op.inputs[0]],
                         {"function": "pow", "exponent": float(exponent)}, [], [op], op.outputs[0])
            return ""
    mixed = _batch_meets_sample_axis(m, op)
    if mixed:
        return mixed
    pushed = pushed_down(m.operands, m.session_ops, op)
    found = _operands(m, op, op.inputs if pushed is None else pushed[:2], "binary")
    if isinstance(found, str):
        return found
    letters, inputs, attrs, params = found
    if pushed is not None:
        kind, attrs["c1"] = pushed[3], pushed[2]
    elif _is_identity(kind, letters, attrs, op):
        m.alias(op, op.inputs[letters.index("i")])
        return ""
    elif kind == "div" and letters[1] == "c" and op.outputs[0].dtype.is_floating:
        kind, attrs["c1"] = "mul", reciprocal(attrs["c1"], op.inputs[1].dtype)
    rank = len(m.sample_shape(op.outputs[0], op.inputs))
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
    return neutral is not None and value.size == 1 and value.item() == neutral


@generic("LogicalNot")
def _logical_not(m: Context, op: tf.Operation) -> str:
    """tf.logical_not of a per-sample bool value (a mask's complement): x == False."""
    if not m.is_batched(op.inputs[0]):
        return "its input is not a per-sample value"
    if not has_kernel("binary"):
        return "the CS has no binary kernel"
    m.add_kernel(op.name, "binary", [op.inputs[0]],
                 {"op": "equal", "operands": "ic", "c1": np.array(False)}, [], [op], op.outputs[0])
    return ""


@generic("AddN")
def _add_n(m: Context, op: tf.Operation) -> str:
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


ROW_SELECT = "tf.compat.v1.where with a vector condition selects whole rows: use tf.where"


def selects_rows(op: tf.Operation) -> bool:
    """A v1 Select of a vector condition and matrices: it picks whole rows (ROW_SELECT)."""
    cond, x, _ = op.inputs
    return op.type == "Select" and cond.shape.rank == 1 and bool(x.shape.rank) and \
        x.shape.rank > 1


@generic("Select", "SelectV2")
def _select(m: Context, op: tf.Operation) -> str:
    if selects_rows(op):
        return ROW_SELECT
    found = _operands(m, op, op.inputs, "select")
    if isinstance(found, str):
        return found
    letters, inputs, attrs, params = found
    inputs = _same_rank(m, op, inputs, len(m.sample_shape(op.outputs[0], op.inputs)))
    m.add_kernel(op.name, "select", inputs, {"operands": letters, **attrs}, params, [op],
                 op.outputs[0])
    return ""


@generic("Cast")
def _cast(m: Context, op: tf.Operation) -> str:
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


@generic("Cumsum", "Cumprod")
def _cumsum(m: Context, op: tf.Operation) -> str:
    axis = m.operands.constant(op.inputs[1])
    rank = len(static_shape(op.inputs[0]))
    kind = op.type.lower()
    if not m.is_batched(op.inputs[0]) or axis is None or int(axis) % rank == 0:
        return (f"{kind} of a per-sample value along one of its own axes (not the batch axis) "
                "with a constant axis is supported")
    m.add_kernel(op.name, kind, [op.inputs[0]], {
        "axis": int(axis) % rank - 1, "exclusive": bool(op.get_attr("exclusive")),
        "reverse": bool(op.get_attr("reverse"))}, [], [op], op.outputs[0])
    return ""


@generic("IsFinite")
def _is_finite(m: Context, op: tf.Operation) -> str:
    if not m.is_batched(op.inputs[0]):
        return "its input is not a per-sample value"
    m.add_kernel(op.name, "is_finite", [op.inputs[0]], {}, [], [op], op.outputs[0])
    return ""


@generic("Bucketize")
def _bucketize(m: Context, op: tf.Operation) -> str:
    if not m.is_batched(op.inputs[0]) or op.inputs[0].dtype != tf.float32:
        return (f"Bucketize of a {op.inputs[0].dtype.name} value"
                f"{'' if m.is_batched(op.inputs[0]) else ' that is not per-sample'}: "
                "the CS bucketizes per-sample float32 values")
    m.add_kernel(op.name, "bucketize", [op.inputs[0]],
                 {"boundaries": [float(b) for b in op.get_attr("boundaries")]}, [], [op],
                 op.outputs[0])
    return ""


@generic("TopKV2")
def _top_k(m: Context, op: tf.Operation) -> str:
    """tf.math.top_k along a sample's last axis: a kernel for the values, and one for the
    indices if anything reads them."""
    k = m.operands.constant(op.inputs[1])
    shape = static_shape(op.inputs[0])
    if not m.is_batched(op.inputs[0]) or len(shape) < 2:
        return ("sorts across the batch (tf.math.top_k, tf.sort or tf.argsort of a [batch] value "
                "ranks the samples against each other): the CS sorts the batch only in the loss, "
                "a [batch] float32 value with a constant k (a Cox partial likelihood's "
                "tf.argsort(tf.cast(time, tf.float32))); else sort along a sample's own last "
                "axis")
    if k is None:
        return "top_k with a k computed at run time: the CS needs a constant k"
    if op.inputs[0].dtype not in (tf.float32, tf.int32):
        return (f"sorts {op.inputs[0].dtype.name} values: the CS sorts float32 and int32; "
                "tf.cast to float32 first")
    for out, indices in zip(op.outputs, (False, True)):
        if not indices or m.consumers(out) or out.name in m.protected:
            m.add_kernel(op.name if not indices else f"{op.name}/indices", "top_k",
                         [op.inputs[0]], {"k": int(k), "indices": indices}, [], [op], out)
    return ""


@generic("ArgMax", "ArgMin")
def _arg_reduce(m: Context, op: tf.Operation) -> str:
    """tf.argmax / tf.argmin along a sample's own axis (any but the batch axis)."""
    constant, shape = m.operands.constant(op.inputs[1]), static_shape(op.inputs[0])
    if not m.is_batched(op.inputs[0]):
        return "its input is not a per-sample value"
    if constant is None:
        return f"{op.type} along an axis computed at run time: the CS needs a constant axis"
    axis = int(constant) % len(shape)
    if axis == 0:
        return (f"{op.type} along the batch axis (axis 0) compares the samples with each other: "
                "the CS computes each sample on its own; take it along a sample's own axis "
                "(axis=-1)")
    m.add_kernel(op.name, "arg_reduce", [op.inputs[0]],
                 {"op": "max" if op.type == "ArgMax" else "min",
                  "axis": axis - m.axis_shift(op.inputs[0]),
                  "output": op.get_attr("output_type").name,
                  "half": op.inputs[0].dtype == tf.float16}, [], [op], op.outputs[0])
    return ""


@generic("StopGradient")
def _stop_gradient(m: Context, op: tf.Operation) -> str:
    if not has_kernel("stop_gradient"):
        return "the CS has no stop_gradient kernel"
    m.add_kernel(op.name, "stop_gradient", [op.inputs[0]], {}, [], [op], op.outputs[0])
    return ""


@generic(*RESHAPES)
def _reshape(m: Context, op: tf.Operation) -> str:
    """A reshape of each sample's elements: the output's first axis the batch, or a multiple
    B*k of it (a per-sample axis folded into the batch, or unfolded back: folded_batch.py)."""
    out, src, batch = static_shape(op.outputs[0]), static_shape(op.inputs[0]), m.batch_size
    if not out or not src or out[0] % batch or out[0] == 0 or src[0] % batch or \
            (out[0] != batch and not m.is_batched(op.inputs[0])):
        return in_batch.row_refusal(m, op) or (
            f"reshapes {src} to {out}: the first axis must be the batch of {batch} or a "
            f"multiple of it (each row one sample's values: tf.reshape(x, [batch_size, -1]), "
            "or [-1, d] of [batch_size, k, d] folding k rows a sample into the batch)")
    shape = out[1:] if out[0] == batch else (out[0] // batch, *out[1:])
    if shape == m.shape(op.inputs[0]) and op.outputs[0].name not in m.protected:
        m.alias(op, op.inputs[0])  # (the host reads folded rows unfolded by a kernel of their own)
        return ""
    m.add_kernel(op.name, "reshape", [op.inputs[0]], {"shape": list(shape)}, [], [op],
                 op.outputs[0], output_shape=shape)
    return ""


@generic("Transpose")
def _transpose(m: Context, op: tf.Operation) -> str:
    perm = m.operands.constant(op.inputs[1])
    if in_batch.transpose(m, op, perm) or in_batch.transposed_operand(m, op):
        return ""
    if perm is None or int(perm[0]) != 0:
        reason = sequences.time_major_unstack(m, op)  # (a time axis of 1 may look like a row)
        if reason and sequences.in_tensordot(op):
            return sequences.TENSORDOT
        return reason and (in_batch.row_refusal(m, op) or reason)
    if not has_kernel("transpose"):
        return "the CS has no transpose kernel"
    shift = m.axis_shift(op.inputs[0])
    m.add_kernel(op.name, "transpose", [op.inputs[0]],
                 {"perm": [int(p) - shift for p in perm[shift:]]}, [], [op], op.outputs[0])
    return ""


@generic("ConcatV2")
def _concat(m: Context, op: tf.Operation) -> str:
    inputs, axis = list(op.inputs[:-1]), m.operands.constant(op.inputs[-1])
    if axis is None or not all(m.is_batched(t) for t in inputs):
        return "concatenates values that are not all per-sample"
    full = int(axis) % op.outputs[0].shape.rank
    if full == 0:
        return ("concatenates along the batch axis into values that feed per-sample layers, "
                "weights or predictions: the CS computes each sample on its own and joins "
                "batches only on the way to the loss; keep the parts apart, or stack them on a "
                "sample axis (tf.stack([z1, z2], 1)); to fold the parts into the batch, stack "
                "them sample-major, tf.reshape(tf.stack(parts, axis=1), [-1, ...]), with labels "
                f"in that order (tf.tile(tf.range({len(inputs)}), [B]), not "
                f"tf.repeat(tf.range({len(inputs)}), B)), and give metrics and predictions "
                f"the rows as tf.reshape(x, [-1, {len(inputs)}, ...])")
    m.add_kernel(op.name, "concat", inputs, {"axis": full - m.axis_shift(inputs[0])}, [], [op],
                 op.outputs[0])
    return ""


@generic(*REDUCTIONS, "Any", "All")
def _reduce(m: Context, op: tf.Operation) -> str:
    """tf.reduce_{sum, mean, max, min} over a sample's axes, and reduce_{any, all} of a bool
    value (Keras' Masking layer)."""
    constant = m.operands.constant(op.inputs[1])
    rank = len(static_shape(op.inputs[0]))
    if constant is None:
        return "reduction axes are not constant"
    if not has_kernel("reduce"):
        return "the CS has no reduce kernel"
    axes = sorted({int(a) % rank for a in np.atleast_1d(constant)})
    shift = m.axis_shift(op.inputs[0])  # a folded value's rows are its own axis 0
    m.add_kernel(op.name, "reduce", [op.inputs[0]],
                 {"op": REDUCTIONS.get(op.type, op.type.lower()), "axes": [a - shift for a in axes],
                  "keepdims": bool(op.get_attr("keep_dims"))}, [], [op], op.outputs[0])
    return ""


@generic("Softmax", "LogSoftmax")
def _softmax(m: Context, op: tf.Operation) -> str:
    if not has_kernel("softmax"):
        return "the CS has no softmax kernel"
    m.add_kernel(op.name, "softmax", [op.inputs[0]],
                 {"axis": -1, "log": op.type == "LogSoftmax"}, [], [op], op.outputs[0])
    return ""


@generic(*MATMULS)
def _matmul(m: Context, op: tf.Operation) -> str:
    a, b = op.inputs
    if op.type == "MatMul":
        flags = (bool(op.get_attr("transpose_a")), bool(op.get_attr("transpose_b")))
        if m.is_batched(a) and (m.is_batched(b) or
                                not any(flags) and in_batch.transposed_sample(m, b)):
            if flags[0] and second_order.in_gradient(op):
                return second_order.WEIGHT_GRADIENT
            return in_batch.product(m, op, *flags)
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


@generic("Einsum")
def _einsum(m: Context, op: tf.Operation) -> str:
    equation = op.get_attr("equation").decode().replace(" ", "")
    lhs, _, out = equation.partition("->")
    terms = lhs.split(",")
    if not out or "." in equation or len(terms) != len(op.inputs):
        return f"einsum {equation!r}: explicit output and no ellipsis needed"
    batch = out[0]
    for term, t in zip(terms, op.inputs):
        if m.is_batched(t) != (term[:1] == batch) or batch in term[1:]:
            return f"einsum {equation!r} does not keep the batch axis {batch!r} first in every per-sample operand"
    if len(terms) == 1:
        return _einsum_of_one(m, op, terms[0], out)
    found = _operands(m, op, op.inputs, "einsum")
    if isinstance(found, str):
        return found
    letters, inputs, attrs, params = found
    if min(m.axis_shift(t) for t in op.inputs) == 0:  # folded rows: the batch letter's axis
        # is each sample's k rows, a letter of its own under a fresh batch letter
        fresh = next(c for c in "ZYXWVUTSRQPONMLKJIHGFEDCBA" if c not in equation)
        equation = ",".join(fresh + term if m.is_batched(t) else term
                            for term, t in zip(terms, op.inputs)) + "->" + fresh + out
    m.add_kernel(op.name, "einsum", inputs, {"equation": equation, "operands": letters, **attrs},
                 params, [op], op.outputs[0])
    return ""


def _einsum_of_one(m: Context, op: tf.Operation, term: str, out: str) -> str:
    """tf.einsum of one operand ('btd->bd', 'bij->bji'): a sum over the letters the output
    drops (a reduce kernel), then the transpose to the output's order."""
    if len(set(term)) != len(term) or not set(out) <= set(term) or len(set(out)) != len(out):
        return f"einsum {term}->{out}: a repeated letter (a diagonal or trace) is not supported"
    kept = [c for c in term if c in out]
    summed = [i for i, c in enumerate(term) if c not in out]
    perm = [kept.index(c) for c in out]
    current: Any = op.inputs[0]
    shift = m.axis_shift(current)  # (folded rows: the batch letter's k rows a sample's axis 0)
    if not summed and perm == sorted(perm):
        m.alias(op, current)
        return ""
    if summed:
        last = perm == sorted(perm)
        shape = tuple(d for i, d in enumerate(static_shape(current)) if i not in summed)[shift:]
        kernel = m.add_kernel(op.name if last else f"{op.name}/sum", "reduce", [current],
                              {"op": "sum", "axes": [a - shift for a in summed], "keepdims": False},
                              [], [op] if last else [], op.outputs[0] if last else None,
                              output_shape=shape, source_op=op)
        if last:
            return ""
        current = kernel.name
    m.add_kernel(op.name, "transpose", [current], {"perm": [p - shift for p in perm[shift:]]},
                 [], [op], op.outputs[0], m.sample_shape(op.outputs[0], op.inputs), op)
    return ""


@generic("GatherV2", "ResourceGather")
def _gather(m: Context, op: tf.Operation) -> str:
    table, ids = op.inputs[0], op.inputs[1]
    if m.is_batched(table):
        return _constant_gather(m, op) if op.type == "GatherV2" and \
            op.get_attr("batch_dims") == 0 and m.operands.constant(ids) is not None \
            else _sample_gather(m, op)
    if op.get_attr("batch_dims") != 0:
        return _gather_from_the_batch_row(m, op)
    if op.type == "GatherV2":
        axis = m.operands.constant(op.inputs[2])
        if axis is None or int(axis) != 0:
            return "gathers along an axis other than the table's first"
    found = _operands(m, op, (table, ids), "gather")
    if isinstance(found, str):
        return found
    letters, inputs, attrs, params = found
    if letters == "ci":  # a per-sample lookup in constants (class weights by label)
        m.add_kernel(op.name, "gather", inputs, {"operands": letters, **attrs}, params, [op],
                     op.outputs[0])
        return ""
    if letters != "pi":
        return "gathers from a constant table by constant indices"
    weight = m.operands.weight(table) or m.operands.view(table) or m.derived_weight(table)
    assert weight is not None, "letter p: _operands found the table's weight"
    m.add_kernel(m.scope(op, weight.variable), "gather", inputs, {"operands": letters, **attrs},
                 params, [op], op.outputs[0])
    return ""


def _gather_from_the_batch_row(m: Context, op: tf.Operation) -> str:
    """tf.gather(c, ids, batch_dims=1) (along axis 1) of a constant c whose rows are the same
    for every sample (an MAE's tf.concat([tf.zeros([B, k]), tf.ones([B, n - k])], 1) restored
    by per-sample ids): each sample's lookup in that one row, a gather kernel of constants."""
    axis = m.operands.constant(op.inputs[2]) if op.type == "GatherV2" else None
    if op.get_attr("batch_dims") != 1 or axis is None or int(axis) != 1 or \
            not m.is_batched(op.inputs[1]):
        return ("gathers with batch_dims from a value that is not per-sample (a weight or a "
                "constant): gather from a weight with batch_dims 0 (an embedding lookup)")
    found = _operands(m, op, op.inputs[:2], "gather")
    if isinstance(found, str):
        return found
    letters, inputs, attrs, params = found
    if letters != "ci":
        return ("gathers with batch_dims=1 from a weight: the CS gives every sample the same "
                "weights; gather from it with batch_dims 0 (an embedding lookup)")
    table = attrs.pop("c0")
    if not (table == table[:1]).all():
        return (f"a constant of shape {table.shape} holds other values for each sample: feed "
                "per-sample values through input_fn")
    row = table[0]
    m.add_kernel(op.name, "gather", inputs, {"operands": letters, "c0": row, **attrs}, params, [op],
                 op.outputs[0])
    return ""


@generic("ResourceGatherNd", "GatherNd")
def _gather_nd(m: Context, op: tf.Operation) -> str:
    """tf.gather_nd of a weight at per-sample indices of r >= 2 coordinates (a CRF's
    transition scores of the gold tag pairs): a gather kernel of depth r, its gradient TF's
    dense ScatterNd."""
    table, ids = op.inputs[0], op.inputs[1]
    depth = static_shape(ids)[-1] if ids.shape.rank else 0
    if m.is_batched(table) or not m.is_batched(ids) or depth < 2:
        return ("gathers by tf.gather_nd other than from a weight at per-sample indices of two "
                "or more coordinates: write tf.gather(w, ids) for rows of a weight, "
                "tf.gather(x, ids, batch_dims=1) or tf.gather_nd(x, ids, batch_dims=1) for a "
                "sample's own rows")
    found = _operands(m, op, (table, ids), "gather")
    if isinstance(found, str):
        return found
    letters, inputs, attrs, params = found
    weight = m.operands.weight(table) or m.operands.view(table) or m.derived_weight(table)
    if letters != "pi" or weight is None or len(weight.shape) < depth:
        return "gathers by tf.gather_nd from a value that is not a weight"
    m.add_kernel(m.scope(op, weight.variable), "gather", inputs,
                 {"operands": letters, "depth": depth, **attrs}, params, [op], op.outputs[0])
    return ""


def _take(m: Context, op: tf.Operation, x: tf.Tensor | str, axis: int, indices: np.ndarray,
          out: tf.Tensor | None, last: bool) -> str:
    """A `take` kernel: x's values at constant `indices` along per-sample `axis` (a reshape
    after it for indices of rank other than 1); the kernel's name."""
    shape = m.kernel_shape(x) if isinstance(x, str) else m.shape(x)
    taken = (*shape[:axis], indices.size, *shape[axis + 1:])
    attrs = {"axis": axis, "indices": [int(i) for i in indices.ravel()]}
    reshaped = (*shape[:axis], *indices.shape, *shape[axis + 1:])
    if indices.ndim == 1:
        return m.add_kernel(op.name if last else f"{op.name}/take_{axis}", "take", [x], attrs, [],
                            [op] if last else [], out if last else None, output_shape=taken,
                            source_op=op).name
    kernel = m.add_kernel(f"{op.name}/take", "take", [x], attrs, [], [], None,
                          output_shape=taken, source_op=op)
    return m.add_kernel(op.name, "reshape", [kernel.name], {"shape": list(reshaped)}, [],
                        [op] if last else [], out if last else None, output_shape=reshaped,
                        source_op=op).name


def _constant_gather(m: Context, op: tf.Operation) -> str:
    """tf.gather(x, indices, axis=k) of a per-sample x at constant indices along one of its
    own axes (k >= 1: tf.signal.frame's windows): a static view of the sample, the gradient
    added back into it index by index (_GatherV2Grad's UnsortedSegmentSum)."""
    x, found = op.inputs[0], m.operands.constant(op.inputs[1])
    constant_axis = m.operands.constant(op.inputs[2])
    rank = len(static_shape(x))
    if constant_axis is None or int(constant_axis) % rank == 0:
        return ("gathers from a per-sample value along the batch axis (or a non-constant axis): "
                "the CS computes each sample on its own; gather along a sample's own axes")
    axis, indices = int(constant_axis) % rank, np.asarray(found, np.int64)
    size = static_shape(x)[axis]
    if indices.size and (indices.min() < 0 or indices.max() >= size):
        return (f"gathers at constant indices outside [0, {size}) of axis {axis} (TensorFlow "
                "fails on them at run time)")
    if not has_kernel("take"):
        return "the CS has no take kernel"
    _take(m, op, x, axis - m.axis_shift(x), indices, op.outputs[0], True)
    return ""


@generic("Roll")
def _roll(m: Context, op: tf.Operation) -> str:
    """tf.roll of a per-sample value by constant shifts along its own axes: one `take` per
    axis at the rolled positions (np.roll; the gradient rolled back, as _RollGrad)."""
    x = op.inputs[0]
    shift, axes = m.operands.constant(op.inputs[1]), m.operands.constant(op.inputs[2])
    rank = len(static_shape(x))
    if not m.is_batched(x) or shift is None or axes is None:
        return "rolls a value that is not per-sample, or by shifts or axes that are not constant"
    total: dict[int, int] = {}
    for s, a in zip(np.atleast_1d(shift).ravel(), np.atleast_1d(axes).ravel()):
        total[int(a) % rank] = total.get(int(a) % rank, 0) + int(s)
    if 0 in total:
        return sequences.SLICES_THE_BATCH
    if not has_kernel("take"):
        return "the CS has no take kernel"
    shape = static_shape(x)
    moves = [(a, s % shape[a]) for a, s in sorted(total.items()) if s % shape[a]]
    if not moves:
        m.alias(op, x)
        return ""
    current: tf.Tensor | str = x
    for k, (a, s) in enumerate(moves):
        current = _take(m, op, current, a - 1, (np.arange(shape[a]) - s) % shape[a],
                        op.outputs[0], k == len(moves) - 1)
    return ""


def _sample_gather(m: Context, op: tf.Operation) -> str:
    """tf.gather(x, ids, axis=a, batch_dims=r) of a per-sample x at per-sample integer ids
    (ids of rank 1 and r = 1 give each sample's own row: a DQN's Q(s, a); r >= 2 picks along
    x's axis r at each position of its first r - 1 sample axes: a mixture's chosen component
    per pixel, tf.gather(means, k, batch_dims=2)); a > r, the ids broadcast over x's axes
    r..a-1 (a QR-DQN's taken action's quantiles, tf.gather(z, actions, axis=2, batch_dims=1)),
    is that gather of x with axis a transposed to r, its result's id axes transposed back
    after x's axes r..a-1 (TF's out shape x[:a] + ids[r:] + x[a+1:])."""
    x, ids = op.inputs[0], op.inputs[1]
    rank, ids_rank = len(static_shape(x)), len(static_shape(ids))
    axis = m.operands.constant(op.inputs[2]) if op.type == "GatherV2" else None
    dims = op.get_attr("batch_dims")
    dims = dims + ids_rank if dims < 0 else dims
    if axis is None or dims < 1 or dims >= rank or int(axis) % rank < dims or \
            static_shape(ids)[:dims] != static_shape(x)[:dims]:
        return ("gathers from a per-sample value other than by tf.gather(x, ids, batch_dims=r) "
                "along an axis a >= r >= 1 (each sample's own values at its own indices): "
                "gather along a sample's own axes, or pick by tf.reduce_sum(x * tf.one_hot(ids, "
                "n), axis)")
    if not m.is_batched(ids):
        return "gathers from a per-sample value at indices that are not per-sample"
    if not has_kernel("sample_gather"):
        return "the CS has no sample_gather kernel"
    at = int(axis) % rank
    # per-sample axes: x's gathered axis a - 1 moved to r - 1, the ids' k = rank(ids) - r
    # own axes moved back after x's axes r - 1..a - 2
    moved = [*range(dims - 1), at - 1, *range(dims - 1, at - 1), *range(at, rank - 1)]
    shape, own = m.shape(x), ids_rank - dims
    source: tf.Tensor | str = x
    if at > dims:
        source = m.add_kernel(f"{op.name}/transpose_in", "transpose", [x], {"perm": moved}, [],
                              [], None, output_shape=tuple(shape[p] for p in moved),
                              source_op=op).name
    last = at == dims or own == 0
    gathered = (*m.shape(ids), *(shape[p] for p in moved[dims:]))
    name = _gather_each_sample(m, op, source, ids, dims, gathered, last)
    if not last:
        back = [*range(dims - 1), *range(dims - 1 + own, at - 1 + own),
                *range(dims - 1, dims - 1 + own), *range(at - 1 + own, rank - 2 + own)]
        m.add_kernel(op.name, "transpose", [name], {"perm": back}, [], [op], op.outputs[0],
                     source_op=op)
    return ""


def _gather_each_sample(m: Context, op: tf.Operation, x: tf.Tensor | str, ids: tf.Tensor,
                        dims: int, out_shape: tuple[int, ...], last: bool) -> str:
    """A `sample_gather` of x along its axis r = dims at per-sample ids (depth r: each id
    with the positions of x's first r - 1 sample axes); op's output if `last`, else a kernel
    of out_shape; the kernel's name."""
    def gather(inputs: list[tf.Tensor | str], attrs: dict[str, int]) -> str:
        return m.add_kernel(op.name if last else f"{op.name}/gather", "sample_gather", inputs,
                            attrs, [], [op] if last else [], op.outputs[0] if last else None,
                            output_shape=None if last else out_shape, source_op=op).name

    if dims == 1:
        return gather([x, ids], {})
    shape = m.shape(ids)
    positions = np.stack(np.meshgrid(*(np.arange(n) for n in shape[:dims - 1]), indexing="ij"), -1)
    positions = positions.reshape(*shape[:dims - 1], *(1,) * (len(shape) - dims + 1), dims - 1)
    grid = np.broadcast_to(positions, (m.batch_size, *shape, dims - 1))
    fixed = m.add_kernel(f"{op.name}/positions", "sample_constant", [m.sample_input()],
                         {"value": np.ascontiguousarray(grid, ids.dtype.as_numpy_dtype)}, [], [],
                         None, output_shape=(*shape, dims - 1), source_op=op)
    column = m.add_kernel(f"{op.name}/expand", "reshape", [ids], {"shape": [*shape, 1]}, [], [],
                          None, output_shape=(*shape, 1), source_op=op)
    coordinates = m.add_kernel(f"{op.name}/coordinates", "concat", [fixed.name, column.name],
                               {"axis": len(shape)}, [], [], None, output_shape=(*shape, dims),
                               source_op=op)
    return gather([x, coordinates.name], {"depth": dims})


@generic("OneHot")
def _one_hot(m: Context, op: tf.Operation) -> str:
    depth, on, off = (m.operands.constant(t) for t in op.inputs[1:4])
    if depth is None or on is None or off is None or op.get_attr("axis") != -1:
        return "one_hot needs a constant depth, on and off values and axis -1"
    if not has_kernel("one_hot"):
        return "the CS has no one_hot kernel"
    m.add_kernel(op.name, "one_hot", [op.inputs[0]], {"depth": int(depth), "on_value": float(on),
                                                     "off_value": float(off)},
                 [], [op], op.outputs[0])
    return ""


def slice_bounds(op: tf.Operation, begin, end, strides,
                 shape: tuple[int, ...] | None = None) -> list[tuple[int, int, int, bool]]:
    """tf.strided_slice's spec resolved against the input's static shape (or `shape`: a
    StridedSliceGrad's): (begin, end, stride, shrink) per input axis, `...` expanded to
    whole axes and tf.newaxis entries dropped (they add unit axes, a reshape of the result)."""
    shape = static_shape(op.inputs[0]) if shape is None else shape
    masks = {k: op.get_attr(k) for k in ("begin_mask", "end_mask", "shrink_axis_mask",
                                         "ellipsis_mask", "new_axis_mask")}
    entries = len(begin)
    new = [masks["new_axis_mask"] >> i & 1 and not masks["ellipsis_mask"] >> i & 1
           for i in range(entries)]
    sliced = entries - sum(new) - sum(masks["ellipsis_mask"] >> i & 1 for i in range(entries))
    bounds: list[tuple[int, int, int, bool]] = []
    for i in range(entries):
        if masks["ellipsis_mask"] >> i & 1:
            bounds += [(0, size, 1, False) for size in shape[len(bounds):len(shape) - sliced]]
            continue
        if new[i]:
            continue
        sliced -= 1
        size, step = shape[len(bounds)], int(strides[i])
        if masks["shrink_axis_mask"] >> i & 1:
            lo = int(begin[i]) + size if int(begin[i]) < 0 else int(begin[i])
            bounds.append((lo, lo + 1, 1, True))
            continue
        # TF's canonical bounds: a masked bound is the whole axis in the stride's direction,
        # a negative one counts from the end, both clamped to [0, size] ([-1, size - 1]
        # going backwards; -1: through the first element)
        low, high = (0, size) if step > 0 else (-1, size - 1)
        lo, hi = (high if step < 0 else low, low if step < 0 else high)
        if not masks["begin_mask"] >> i & 1:
            lo = min(max(int(begin[i]) + size if int(begin[i]) < 0 else int(begin[i]), low), high)
        if not masks["end_mask"] >> i & 1:
            hi = min(max(int(end[i]) + size if int(end[i]) < 0 else int(end[i]), low), high)
        if step < 0 and lo < 0:
            lo = hi = 0  # nothing to take
        bounds.append((lo, hi, step, False))
    return bounds + [(0, size, 1, False) for size in shape[len(bounds):]]


@generic("StridedSlice")
def _strided_slice(m: Context, op: tf.Operation) -> str:
    """tf.strided_slice (x[...], with `...` and tf.newaxis): a slice kernel, then a reshape
    for the unit axes tf.newaxis adds."""
    begin, end, strides = (m.operands.constant(t) for t in op.inputs[1:4])
    if begin is None or end is None or strides is None:
        return "slice bounds are not constant"
    bounds = slice_bounds(op, begin, end, strides)
    shape, out = static_shape(op.inputs[0]), static_shape(op.outputs[0])
    if op.get_attr("new_axis_mask") & 1 and not op.get_attr("ellipsis_mask") & 1:
        return in_batch.row_refusal(m, op) or (
            "puts tf.newaxis before the batch axis of a slice or of a value other than "
            "float32 or integer: the CS computes each sample on its own; add axes after the "
            "batch axis (x[:, tf.newaxis]), or, to pair the batch's samples, broadcast the "
            "whole value's row against per-sample values (sq[:, None] + sq[None, :], "
            "tf.equal(labels[:, None], labels[None, :])) or use in-batch products "
            "(tf.matmul(a, b, transpose_b=True))")
    if bounds[0] != (0, shape[0], 1, False) or not out or out[0] != shape[0]:
        return sequences.SLICES_THE_BATCH
    if not has_kernel("slice"):
        return "the CS has no slice kernel"
    shift = m.axis_shift(op.inputs[0])  # (folded rows: axis 0 whole, each sample's k rows)
    own = bounds[1:] if shift else [(0, m.shape(op.inputs[0])[0], 1, False), *bounds[1:]]
    attrs = {"begin": [b[0] for b in own], "end": [b[1] for b in own],
             "strides": [b[2] for b in own],
             "shrink": [a - shift for a, b in enumerate(bounds) if b[3]]}
    if not op.get_attr("new_axis_mask"):
        m.add_kernel(op.name, "slice", [op.inputs[0]], attrs, [], [op], op.outputs[0])
        return ""
    sliced = tuple(len(range(lo, hi, step)) for lo, hi, step, shrink in own if not shrink)
    kernel = m.add_kernel(f"{op.name}/slice", "slice", [op.inputs[0]], attrs, [], [],
                          None, output_shape=sliced, source_op=op)
    shape = m.sample_shape(op.outputs[0], op.inputs)  # (folded: each sample's k rows first)
    m.add_kernel(op.name, "reshape", [kernel.name], {"shape": list(shape)}, [], [op],
                 op.outputs[0], output_shape=shape)
    return ""


@generic("StridedSliceGrad")
def _strided_slice_grad(m: Context, op: tf.Operation) -> str:
    """The gradient of x[...] inside the loss (tf.gradients(y[:, i], x)): the per-sample
    gradient dy put back at the slice's place among zeros, a `pad` kernel (a reshape first
    for the axes the slice shrank or tf.newaxis added after the batch axis); its own
    gradient is the slice, as TF's."""
    shape, begin, end, strides = (m.operands.constant(t) for t in op.inputs[:4])
    if shape is None or begin is None or end is None or strides is None or \
            not m.is_batched(op.inputs[4]) or \
            op.get_attr("new_axis_mask") & 1 and not op.get_attr("ellipsis_mask") & 1:
        return ("the gradient of a slice with bounds computed at run time, tf.newaxis before "
                "the batch axis, or of a value that is not per-sample")
    bounds = slice_bounds(op, begin, end, strides, tuple(int(d) for d in shape))
    if bounds[0] != (0, int(shape[0]), 1, False) or any(b[2] != 1 for b in bounds):
        return ("the gradient of a slice of the batch axis or of a strided slice: the CS puts "
                "back a slice of a sample's own axes with stride 1")
    dy: Any = op.inputs[4]
    sliced = tuple(hi - lo for lo, hi, _, _ in bounds[1:])
    if any(b[3] for b in bounds) or op.get_attr("new_axis_mask"):
        dy = m.add_kernel(f"{op.name}/unshrunk", "reshape", [dy], {"shape": list(sliced)}, [],
                          [], None, output_shape=sliced, source_op=op).name
    paddings = [p for (lo, hi, _, _), size in zip(bounds[1:], shape[1:]) for p in (lo, int(size) - hi)]
    m.add_kernel(op.name, "pad", [dy], {"paddings": paddings}, [], [op], op.outputs[0])
    return ""


@generic("Slice")
def _slice(m: Context, op: tf.Operation) -> str:
    begin, size = m.operands.constant(op.inputs[1]), m.operands.constant(op.inputs[2])
    shape = static_shape(op.inputs[0])
    if begin is None or size is None:
        return "slice bounds are not constant"
    end = [shape[a] if int(s) < 0 else int(b) + int(s) for a, (b, s) in enumerate(zip(begin, size))]
    if int(begin[0]) != 0 or end[0] != shape[0]:
        return sequences.SLICES_THE_BATCH
    if not has_kernel("slice"):
        return "the CS has no slice kernel"
    m.add_kernel(op.name, "slice", [op.inputs[0]],
                 {"begin": [int(b) for b in begin[1:]], "end": end[1:], "strides": [1] * (len(shape) - 1),
                  "shrink": []}, [], [op], op.outputs[0])
    return ""


@generic("Pad", "PadV2", "MirrorPad")
def _pad(m: Context, op: tf.Operation) -> str:
    """tf.pad: CONSTANT (Pad, PadV2), REFLECT and SYMMETRIC (MirrorPad)."""
    paddings = m.operands.constant(op.inputs[1])
    value = m.operands.constant(op.inputs[2]) if op.type == "PadV2" else np.float32(0)
    if paddings is None or value is None or np.any(paddings[0] != 0):
        return "pads the batch axis or with non-constant paddings"
    if not has_kernel("pad"):
        return "the CS has no pad kernel"
    attrs = {"paddings": [int(p) for p in paddings[1:].ravel()], "value": float(value)}
    if op.type == "MirrorPad":
        attrs["mode"] = op.get_attr("mode").decode()
    m.add_kernel(op.name, "pad", [op.inputs[0]], attrs, [], [op], op.outputs[0])
    return ""


@generic("IdentityN")
def _identity_n(m: Context, op: tf.Operation) -> str:
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
            m.alias(op, source, output=out)
    return ""


def supported_op_types() -> set[str]:
    """TF op types the compiler lowers (generic table and library fast paths)."""
    return set(GENERIC) | {"Conv2D", "MaxPool", "AvgPool", "FusedBatchNormV3", "Identity",
                           "Snapshot", "SparseSoftmaxCrossEntropyWithLogits",
                           "SoftmaxCrossEntropyWithLogits"}


def supported_table() -> str:
    """The README's 'Supported operations' section, generated from the tables above
    (`python -m coordinator.compiler.lowering` prints it; a test keeps the README equal)."""
    spatial = {op for op, rule in GENERIC.items() if rule.__module__ == lowering_spatial.__name__}
    gradient_ops = {*second_order.OPS, "StridedSliceGrad", "AvgPoolGrad"}
    others = sorted(set(GENERIC) - set(UNARY) - set(BINARY) - spatial - random_numbers.DRAWN_OPS
                    - gradient_ops - set(quantization.FORMS))
    from coordinator.compiler import (
        batch_tail,  # (it lowers with the weight program's rules)
        candidate_sampling,  # (it reads random_numbers' samplers)
        folded_batch,  # (it reads the op sets above)
    )
    lines = ["| kernel | TensorFlow ops / patterns |", "|---|---|"]
    lines += [f"| `{kernel}` (library) | {ops} |" for kernel, ops in
              {**fast_paths.KERNEL_ROWS, **lowering_spatial.KERNEL_ROWS,
               **random_numbers.KERNEL_ROWS, **in_batch.KERNEL_ROWS,
               **feature_columns.KERNEL_ROWS, **quantization.KERNEL_ROWS,
               **step_values.KERNEL_ROWS, **batch_tail.KERNEL_ROWS, **bincount.KERNEL_ROWS,
               **folded_batch.KERNEL_ROWS, **spectra.KERNEL_ROWS,
               **complex_values.KERNEL_ROWS, **linear_algebra.KERNEL_ROWS,
               **candidate_sampling.KERNEL_ROWS}.items()]
    lines.append("| `activation` (element-wise) | " + ", ".join(sorted(UNARY)) + ", Pow with a "
                 "constant exponent |")
    lines.append("| `binary` (broadcasting, with activations, constants or weights) | "
                 + ", ".join(sorted(BINARY)) + " |")
    lines.append("| generic | " + ", ".join(others) + " |")
    lines.append("| `gather`, `sample_gather`, `take` | GatherV2, ResourceGather: an embedding lookup in a "
                 "weight (axis 0; Keras Embedding, tf.nn.embedding_lookup), or in a constant (class "
                 "weights: tf.gather(weights, labels)); GatherNd, ResourceGatherNd of a weight at "
                 "per-sample indices of two or more coordinates (a CRF's gold transitions "
                 "tf.gather_nd(trans, pairs): its gradient TF's dense ScatterNd); tf.gather(x, ids, "
                 "batch_dims=1) of a per-sample value at per-sample indices (BERT's masked "
                 "positions; a repeated index adds its gradients; one index per sample: a DQN's "
                 "tf.gather(q_values, actions, batch_dims=1)); tf.gather(x, ids, batch_dims=r) "
                 "along axis r >= 2 at per-sample ids (a mixture's component per pixel, "
                 "tf.gather(means, k, batch_dims=2)), or along an axis a > r, the ids "
                 "broadcast over the axes between (a QR-DQN's or IQN's taken action's "
                 "quantiles, tf.gather(z, actions, axis=2, batch_dims=1): transposes around "
                 "the sample_gather); tf.gather(x, indices, axis=k) "
                 "of a per-sample value at constant indices along its own axis k >= 1 "
                 "(tf.signal.frame's overlapping windows: a repeated index adds its gradients in "
                 "TF's order); Roll by constant shifts along a sample's axes (tf.roll: a take "
                 "per axis) |")
    lines.append("| `slice`, `top_k`, `arg_reduce`, `is_finite` | StridedSlice with `...`, "
                 "tf.newaxis after the batch axis (a reshape after the slice) and negative "
                 "strides (x[:, ::-1]); TopKV2 along a sample's last axis (tf.math.top_k, "
                 "tf.sort: largest first, equal values by lower index), its values and indices; "
                 "ArgMax, ArgMin along any axis of a sample (tf.argmax, tf.argmin: int32 or int64, "
                 "the first index of the extreme, NaN never chosen, as TF's CPU kernel; no "
                 "gradient; float16 too); IsFinite (tf.reduce_logsumexp's guard) |")
    lines.append("| `loss` (the batch reduction) | any sum or mean over the batch of per-sample "
                 "values (tf.compat.v1.losses.* with constant weights, label smoothing, "
                 "hand-written MSE) plus L2/L1 penalties of single weights (tf.nn.l2_loss, "
                 "Keras regularizers), proven linear by the compiler; divided by a count or sum "
                 "of the batch computed from its inputs and labels alone (tf.compat.v1.losses' "
                 "default SUM_BY_NONZERO_WEIGHTS and MEAN with per-sample weights: class weights "
                 "by label, a padding mask; sum(l * mask) / sum(mask)) or a scalar function of "
                 "such sums (tf.maximum(sum(mask), 1.0), + 1e-8, count_nonzero, "
                 "tf.clip_by_value, tf.math.divide_no_nan, tf.sqrt: TF's float32 bit for bit), "
                 "known before the batch streams through; terms weighted by scalars of weights "
                 "plus such scalars (multi-task uncertainty weighting: tf.exp(-s) * mean + s) "
                 "or by values of the global step (`schedule`); any scalar of weights alone "
                 "the weight program computes added to the loss, divided or not, or times a "
                 "value of the global step (a KL of q(u), annealed or not, an orthogonality "
                 "penalty, a log-determinant) |")
    lines.append("| weights (shared, viewed) | a weight read by several kernels (tied input/output "
                 "embeddings, a Keras layer called twice, an unrolled LSTM's cell at every step) "
                 "lives in one region, its uses' gradients summed before the one update; a "
                 "static view of a weight (a slice, a gather by constant indices, a transpose or "
                 "reshape: pos_table[:n]) is read as such, its gradient scattered back |")
    lines.append("| `broadcast` (a weight given to every sample) | a weight, a view or the weight "
                 "program's value tiled over the batch: Tile (ViT's class token "
                 "tf.tile(cls, [tf.shape(x)[0], 1, 1]), a tile within the sample after it), "
                 "BroadcastTo, tf.repeat(w[None], batch, 0), tf.ones_like(x[:, :1]) * w; its "
                 "gradient the batch's sum |")
    lines.append("| `activation_grad`, `pad`, `softmax_cross_entropy_backprop` (a gradient "
                 "inside the loss) | tf.gradients(u, x) of "
                 "per-sample values in model_fn (a physics-informed network's u_x, u_xx, a "
                 "gradient penalty, double backprop, a Jacobian penalty, Sobolev training, a "
                 "Hamiltonian network, FGSM adversarial training): its seed given to each "
                 "sample, " + ", ".join(sorted(gradient_ops)) + " per sample (StridedSliceGrad "
                 "of tf.newaxis slices after the batch axis too; a Conv2D's "
                 "input gradient, Conv2DBackpropInput, as the transposed convolution; a fused "
                 "(Sparse)SoftmaxCrossEntropyWithLogits' backprop output, softmax - labels), "
                 "trained with TF's second-order gradient |")
    lines.append("| weight program (computations on weights before they meet the samples) | "
                 + ", ".join(WEIGHT_PROGRAM_OPS) + " of weights, constants and random draws "
                 "(`random` above: noise on weights) (tf.nn.l2_normalize"
                 "(w, 0) of a cosine classifier, weight normalization's g * v / tf.norm(v), a "
                 "learned temperature's tf.exp(t), tf.nn.softplus(w), w * mask, a low-rank kernel "
                 "tf.matmul(u, v), a soft decision tree's tf.nn.softmax(leaf_logits), a conv "
                 "kernel standardised with tf.nn.moments, SINDy's mask w * tf.cast(tf.abs(w) > "
                 "t, tf.float32), a frozen loss network's Conv2D, BiasAdd, MaxPool and AvgPool "
                 "on a constant style image (`conv2d` by a weight or a value of weights: its "
                 "second input; `max_pool`, `avg_pool`: Johnson et al.'s style targets), "
                 "Glow's log|det W| by tf.linalg.slogdet (`slogdet`) or its LU "
                 "form by tf.linalg.diag/diag_part/set_diag/band_part, a sparse GP's Cholesky "
                 "factor of its inducing points' kernel matrix and its inverse by "
                 "tf.linalg.triangular_solve (`cholesky`, `solve`); views: slices "
                 "with any masks and negative strides, tf.split/unstack, tf.gather at constant "
                 "indices, tf.concat/stack of weights (and float32 constants: a hand-built "
                 "Cholesky factor's zeros), as Keras GRU(reset_after=False)'s "
                 "recurrent_kernel[:, 2 * units:]): run on the CS once a step before the batch, "
                 "the gradient taken back through the same kernels to the weights (a view's "
                 "scattered back); under Keras' mixed_float16, a layer's weight autocast to "
                 "float16 where a float32 op meets it (a float32 RMSNorm's scale, "
                 "RMSNormalization's), element-wise float16 ops on it (PReLU's -alpha, a "
                 "gate's sigmoid) and products (a low-rank u @ v): rounded to float16 as TF's casts and ops, their gradients too |")
    lines.append("| sequences | Keras LSTM, GRU, SimpleRNN, ConvLSTM1D/2D/3D over "
                 "fixed-length sequences (return_sequences either way): their While loop "
                 "unrolled, every step reading the cell's shared weights (ConvLSTM: convolution "
                 "kernels reading its kernels' tf.split gates), masked (Keras Masking, Embedding mask_zero, "
                 "a mask= argument: each step's states and outputs selected by its mask, "
                 "Bidirectional's outputs returning sequences zeroed at masked steps) or not; hand-written loops of a number of steps known when the graph is built "
                 "(tf.while_loop whose condition reads only constants and its own counters, "
                 "tf.scan over a fixed length: unrolled, the unrolled graph proven to compute "
                 "the user's loss and gradients); Bidirectional (ReverseV2 along a sample's "
                 "axes); TimeDistributed (its time-major x[i] per step, x[-1]); time-major "
                 "sequences (tf.scan's) sliced along time (em_t[1:], x[::-1]), concatenated "
                 "with single steps (tf.concat([x, v[None]], 0)) or summed whole into the "
                 "loss; Pack, Split, SplitV, Unpack along a sample's axes; "
                 "tf.stack(values, axis=0) in front of the batch (two heads, MC samples), held per "
                 "sample with the stack axis first, as are a transpose moving a sample's axis "
                 "first and the batch second (timm's tf.transpose(qkv, [2, 0, 3, 1, 4])), a "
                 "draw of shape [K, batch, ...] (a VIB's K Monte Carlo samples) and x[None] "
                 "read by element-wise ops (tf.broadcast_to(x[None], [K, batch, ...]) too: an "
                 "IWAE's targets); read by element-wise ops and selects, casts, softmax, a Keras "
                 "Dense, reshapes keeping the stack and batch axes, reductions "
                 "over axis 0 or a sample's axes (tf.reduce_mean / reduce_std(stacked, 0)), "
                 "stacked[i], tf.unstack and transposes, a loss summing or averaging it over "
                 "the stack and batch axes, predicted in TF's layout; "
                 "(sparse_)softmax_cross_entropy_with_logits on logits of rank > 2 (a tagger's "
                 "tf.compat.v1.losses.softmax_cross_entropy of one-hot labels per token) |")
    lines.append("| functions applied to each sample | tf.map_fn(fn, x) and tf.map_fn(fn, (x, "
                 "y)) (tf.compat.v1's too) run as tf.vectorized_map of fn (TF's pfor: each op "
                 "batched, no loop), a user's tf.vectorized_map, and tf.concat(pieces, 0) or "
                 "tf.stack(pieces) of the batch's samples in order, each the same ops on its "
                 "own rows (tf.split(x, B), tf.unstack(x), k[i]: CondConv's "
                 "tf.nn.conv2d(x_i, k_i)): model_fn built again so and proven to compute the "
                 "user's loss and gradients; a convolution by per-sample filters (CondConv, a "
                 "dynamic filter network, a hypernetwork's generated filters) as each "
                 "sample's tf.image.extract_patches times its own filter (an einsum over the "
                 "batch); pieces put back in another order or combined with another sample's "
                 "stay the split of the batch, refused |")
    lines.append("| mixed precision (any kernel, `precision` float16) | float16 ops of a Keras "
                 "mixed_float16 policy or casts by hand: float32 weights read through Cast, "
                 "float16 operands and results, float32 accumulation (docs/design.md; "
                 "a depthwise convolution rounds each multiply-add, as TF's float16 kernel); "
                 "float16 features from input_fn (streamed at 2 B a value); a static "
                 "loss scale (loss * S, MixedPrecisionLossScaleOptimizer with a number) or "
                 "TF's dynamic one ('dynamic', DynamicLossScale: a non-finite step skipped, the "
                 "scale halved; doubled after N finite steps) or the CS-1's "
                 "(examples/modelzoo_loss_scale: a step with a non-finite global norm skipped; "
                 "the scale halved past an overflow tolerance, clipped to [min, max]); the "
                 "global step counts the applied steps, as TF's graph does |")
    lines += ["", "Refused, with the reason:", ""]
    lines += [f"- **{what}**: {why}" for what, why in {**REFUSED, **folded_batch.REFUSED}.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(supported_table(), end="")
