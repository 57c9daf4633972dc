"""The weight program's lowering: the ops that compute on weights alone before the weights
meet the samples (tf.nn.l2_normalize(w, 0) of a cosine classifier, weight normalization's
g * v / ||v||, a learned temperature's tf.exp(t), tf.nn.softplus(w), w * mask, a low-rank
kernel tf.matmul(u, v), weight standardization's tf.nn.moments) become generic library
kernels run on a batch of one (`wafer.weight_programs`): the CS computes them once a step
before the batch, and takes the gradient its readers accumulate back through the same
kernels (their backward, TF's gradient functions) to the variables.

Only element-wise ops, broadcasting arithmetic with constants or other weights, reductions,
transposes, reshapes, products of matrices (MatMul, BatchMatMulV2/V3: a Gram matrix of
feature maps), convolutions and pooling (Conv2D, MaxPool, AvgPool: a loss network, frozen or
not, on a constant style image, as the samples' conv2d and pooling kernels; the filter, a
weight or a value of weights, the conv2d kernel's second input; a constant image a
sample_constant kernel), softmax and log_softmax (a soft decision tree's
tf.nn.softmax(leaf_logits)), tf.nn.l2_loss, stop_gradient, fake quantization (QAT),
comparisons and tf.where on them or on a constant condition (SincNet's sinc(0) = 1; a
comparison's bool value never meets the samples, but its float32 cast may: a mask
w * tf.cast(tf.abs(w) > t, tf.float32)) and views (strided slices with any
masks, tf.split/unstack, tf.gather at constant indices, tf.concat/stack of weights and
float32 constants (a hand-built Cholesky factor's zeros): Keras
GRU's recurrent_kernel[:, 2 * units:], a tied embedding's transposed table) and numbers
drawn for the batch (random_numbers.weight_draws: a `random` kernel with no input, drawn
once a step: Bayes by backprop's mu + softplus(rho) * eps, a random phase, a dropout mask
shared by the batch, read by a select as its float32 0/1 cast) are lowered; a
view's gradient is scattered back into its input's shape, and the gradients of a weight's
views summed, as TF's. Under Keras' mixed_float16 a weight's AutoCast float16 copy (a
float32 RMSNorm's scale, PReLU's alpha) is a float16 cast kernel, float16 element-wise ops
on it float16 kernels (attr precision: their values and gradients rounded, as TF's). Any other op on the way from a weight to the samples is refused,
naming it and its source line.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from coordinator.compiler import linear_algebra, precision, quantization, random_numbers
from coordinator.compiler.extract import data_downstream, user_name, user_source
from coordinator.compiler.fast_paths import POOLS, conv2d_attrs, pool_attrs
from coordinator.compiler.ir import KernelNode, ParamRef, WeightProgram
from coordinator.compiler.lowering import (
    MATMULS,
    REDUCTIONS,
    ROW_SELECT,
    SELECTS,
    UNARY,
    WEIGHT_ARITHMETIC,
    WEIGHT_COMPARISONS,
    WEIGHT_DIAGONALS,
    WEIGHT_PROGRAM_OPS,
    WEIGHT_VIEWS,
    selects_rows,
    slice_bounds,
)
from coordinator.compiler.operands import Operands, Weight, static_shape
from coordinator.compiler.schedules import global_step
from coordinator.compiler.step_values import ON_WEIGHTS
from wafer.kernels import KernelError, build_kernel

PASS_THROUGH = {"Identity", "ReadVariableOp", "Snapshot"}
# Float16 ops TF accumulates in float16 (Eigen::half sums), the weight program in float32.
HALF_REFUSED = frozenset({*REDUCTIONS, "Softmax", "LogSoftmax", "L2Loss", "Cumsum", "Cholesky", "Einsum",
                          *linear_algebra.SOLVES, *linear_algebra.DETERMINANTS, "Conv2D", *POOLS})


def _to_half(op: tf.Operation) -> bool:
    """A cast of a float32 value to float16 (Keras' AutoCastVariable read: a rounding)."""
    return op.type == "Cast" and (op.get_attr("SrcT"), op.get_attr("DstT")) == (
        tf.float32, tf.float16)


def _operand_attrs(values: list[Any]) -> dict[str, Any]:
    """A generic kernel's operands attr for kernels (`i`) and constants (`c<k>`)."""
    return {"operands": "".join("i" if isinstance(v, str) else "c" for v in values),
            **{f"c{k}": np.asarray(v) for k, v in enumerate(values) if not isinstance(v, str)}}


def one_sample_equation(equation: str, kernels: list[bool]) -> str:
    """An einsum `equation` ('A,B->C') for the einsum kernel on a batch of one: a letter of
    its own prefixed to the output and to the terms of the operands that are `kernels`."""
    lhs, _, out = equation.partition("->")
    one = next(c for c in "ZYXWVUTSRQPONMLKJIHGFEDCBAzyxwvutsrqponmlkjihgfedcba"
               if c not in equation)
    marked = ",".join(one + t if kernel else t for t, kernel in zip(lhs.split(","), kernels))
    return f"{marked}->{one}{out}"


class _Unfit(Exception):
    """A supported op whose operands the library's kernel does not take."""


class WeightProgramBuilder:
    """Lowers the weight-only values the samples meet, each once (by tensor), into kernels
    over the variables they read."""

    SUBJECT = "computes on weights"  # (what a refusal says the values lowered do)
    PLACE = "on weights"  # (where they are computed)

    def __init__(self, operands: Operands, flow: set[tf.Operation]):
        self.operands = operands
        self.flow = flow
        self.sources: dict[str, ParamRef] = {}  # variable -> its read (TF's shape)
        self.kernels: list[KernelNode] = []
        self.values: dict[str, str | np.ndarray] = {}  # tensor -> kernel, variable or constant
        self.problems: dict[str, str] = {}  # tensor -> why it cannot be lowered
        self.kernel_less: dict[str, tf.Operation] = {}  # a problem -> the op it names
        self._step_readers_at: tuple[int, set[tf.Operation]] = (-1, set())

    def _step_readers(self) -> set[tf.Operation]:
        """The ops computed from the global step (found once per graph version: a walk per
        op would be quadratic in the graph's size)."""
        graph = self.operands.graph
        if self._step_readers_at[0] != graph.version:
            step = global_step(graph)
            self._step_readers_at = (graph.version, data_downstream(
                [graph.get_operation_by_name(step)] if step else []))
        return self._step_readers_at[1]

    def derive(self, tensor: tf.Tensor, condition: bool = False) -> Weight | str:
        """The derived weight `tensor` is (its kernel's name as the variable), or why the CS
        cannot compute it. A `condition` (tf.where's, of a select kernel) may be bool: its
        float32 cast, 0 or 1 (a dropout mask drawn once a step: uniform >= rate)."""
        value = self._lower(tensor)
        if not isinstance(value, str):
            return self.problems.get(tensor.name, "its value is a constant")
        if condition and tensor.dtype.base_dtype == tf.bool:
            key = f"{tensor.name}/as_float"  # (one cast however many selects read it)
            if key not in self.values:
                self.values[key] = self._add(tensor.op, None, "cast", [value],
                                             {"dtype": "float32"}, suffix="/as_float")
            shape = static_shape(tensor)
            return Weight(str(self.values[key]), shape, shape, "float32")
        if tensor.dtype.base_dtype not in (tf.float32, tf.float16):  # (tf.where's condition)
            op = tensor.op
            return (f"{self.SUBJECT} with {op.type} '{user_name(op)}' at {user_source(op)}: its "
                    f"{tensor.dtype.base_dtype.name} value meets the samples (the CS computes "
                    "float32 weights)")
        shape = static_shape(tensor)
        return Weight(value, shape, shape, "float32")

    def program(self, read: set[str]) -> WeightProgram | None:
        """The kernels computing the derived weights in `read` (what the kernels read) and
        the variables they read; None if they read none."""
        needed: set[str] = set()
        for kernel in reversed(self.kernels):
            if kernel.name in read or kernel.name in needed:
                needed.update(kernel.inputs)
                needed.add(kernel.name)
        kernels = tuple(k for k in self.kernels if k.name in needed)
        if not kernels:
            return None
        sources = tuple(p for var, p in self.sources.items() if var in needed)
        return WeightProgram(sources, kernels)

    # ---- lowering, by tensor ----
    def _lower(self, tensor: tf.Tensor) -> str | np.ndarray | None:
        """The value computing `tensor`: a kernel's or variable's name, a constant, or None
        (then `problems` says why)."""
        if tensor.name in self.values:
            return self.values[tensor.name]
        if tensor.name in self.problems:
            return None
        try:
            value = self._lower_new(tensor)
        except _Unfit as why:
            op = tensor.op
            value = self._refuse(tensor, f"{self.SUBJECT} with {op.type} '{op.name}' at "
                                         f"{user_source(op)}: {why}")
        if value is not None:
            self.values[tensor.name] = value
        return value

    def _refuse(self, tensor: tf.Tensor, reason: str) -> str | None:
        """None, having recorded why `tensor` cannot be lowered."""
        self.problems[tensor.name] = reason
        return None

    def _lower_new(self, tensor: tf.Tensor) -> str | np.ndarray | None:
        op = tensor.op
        constant = self.operands.constant(tensor)
        if constant is not None:
            return constant.astype(np.float32) if constant.dtype.kind == "f" else constant
        where = f"{op.type} '{user_name(op)}' at {user_source(op)}"
        if op in self.flow:
            return self._refuse(tensor, f"computes on weights and samples at {where}")
        if op in self._step_readers():
            return self._refuse(tensor, f"computes on weights with a value of the global step "
                                        f"({where}): {ON_WEIGHTS}")
        dtype = tensor.dtype.base_dtype
        if dtype not in ((tf.bool,) if op.type in WEIGHT_COMPARISONS else (tf.float32, tf.float16)):
            return self._refuse(tensor, f"computes on weights in {dtype.name} ({where}): the "
                                        "CS's weight program computes in float32 and float16")
        if dtype == tf.float16 and op.type in HALF_REFUSED:
            return self._refuse(tensor, f"computes on weights in float16 with {where}: TF "
                                        "accumulates it in float16, the CS's weight program in "
                                        "float32; tf.cast the weight to float32 before it (a Keras "
                                        "layer: dtype='float32')")
        weight = None if _to_half(op) else self.operands.weight(tensor)  # (AutoCast: rounds)
        if weight is not None:
            return self._source(tensor, weight)
        if op.type in random_numbers.DRAWS:
            return self._draw(op, tensor, where)
        return self._lower_op(op, tensor, where)

    def _draw(self, op: tf.Operation, tensor: tf.Tensor, where: str) -> str | None:
        """Numbers drawn for the batch (random_numbers.weight_draws): a `random` kernel with
        no input, drawing the op's raw numbers once a step; its scale and shift are kernels
        after it."""
        found = random_numbers.drawn(self.operands, op)
        if isinstance(found, str):
            return self._refuse(tensor, f"{where}: {found}")
        distribution, shape = found
        return self._add(op, tensor, "random", [], {"distribution": distribution,
                                                    "shape": list(shape)})

    def _lower_op(self, op: tf.Operation, tensor: tf.Tensor, where: str) -> str | np.ndarray | None:
        """`tensor`, the output of `op` (at `where`), from its inputs' values."""
        if op.type in PASS_THROUGH or op.type == "Cast" and (op.inputs[0].dtype == tensor.dtype or (
                op.inputs[0].dtype, tensor.dtype) == (tf.float16, tf.float32)):  # (exact)
            inner = self._lower(op.inputs[0])
            if inner is None:
                return self._refuse(tensor, self.problems[op.inputs[0].name])
            return inner
        if op.type in WEIGHT_VIEWS:
            return self._view(op, tensor)
        if op.type not in WEIGHT_PROGRAM_OPS:
            reason = (f"{self.SUBJECT} with {where}, which the CS cannot run {self.PLACE} (it "
                      "runs element-wise ops, arithmetic, reductions, transposes, reshapes, "
                      "products, convolutions and pooling of them)")
            self.kernel_less[reason] = op
            return self._refuse(tensor, reason)
        inputs = [self._lower(t) for t in op.inputs]
        bad = next((t for t, v in zip(op.inputs, inputs) if v is None), None)
        if bad is not None:
            return self._refuse(tensor, self.problems[bad.name])
        if not isinstance(inputs[0], str) and op.type not in (
                *WEIGHT_ARITHMETIC, *WEIGHT_COMPARISONS, *SELECTS, "AddN", *MATMULS,
                "Einsum", *linear_algebra.SOLVES, "Conv2D"):
            return self._refuse(tensor, f"{self.SUBJECT} with {where}: its first input "
                                        "is a constant")
        return self._kernel(op, tensor, inputs)

    def _source(self, tensor: tf.Tensor, weight: Weight) -> str | None:
        if weight.dtype != "float32":
            return self._refuse(tensor, f"weight {weight.variable} is {weight.dtype}: the CS's "
                                        "weight program computes in float32")
        self.sources.setdefault(weight.variable, ParamRef(
            "source", weight.variable, weight.variable_shape))
        if weight.shape == weight.variable_shape:
            return weight.variable
        return self._add(tensor.op, tensor, "reshape", [weight.variable],
                         {"shape": list(weight.shape)})

    def _kernel(self, op: tf.Operation, tensor: tf.Tensor, inputs: list[Any]) -> str:
        """The kernel(s) of a supported op (_Unfit: its operands do not fit them)."""
        out = static_shape(tensor)
        if op.type in UNARY:
            attrs: dict[str, Any] = {"function": UNARY[op.type]}
            if op.type == "LeakyRelu":
                attrs["alpha"] = float(op.get_attr("alpha"))
            return self._add(op, tensor, "activation", inputs[:1], attrs)
        if op.type in WEIGHT_ARITHMETIC or op.type in WEIGHT_COMPARISONS or op.type == "AddN":
            return self._arithmetic(op, tensor, inputs, out)
        if op.type in SELECTS:  # tf.where: TF's gradient to the branch chosen, zeros to the other
            if selects_rows(op):
                raise _Unfit(ROW_SELECT)
            return self._elementwise(op, tensor, "select", inputs, {}, "", "0", out)
        if op.type == "StopGradient":
            return self._add(op, tensor, "stop_gradient", inputs[:1], {})
        if op.type in linear_algebra.DETERMINANTS:  # Glow's log|det W|; the sign, no gradient
            return self._add(op, tensor, "slogdet", inputs[:1],
                             {"output": linear_algebra.determinant_output(tensor)})
        if op.type in WEIGHT_DIAGONALS:
            return self._diagonals(op, tensor, inputs, out)
        if op.type == "Cholesky":  # a sparse GP's factor of its inducing points' kernel matrix
            return self._add(op, tensor, "cholesky", inputs[:1], {})
        if op.type in linear_algebra.SOLVES:  # and the factor's inverse: a triangular solve
            values, attrs = linear_algebra.solve_attrs(op, inputs)
            return self._add(op, tensor, "solve", [v for v in values if isinstance(v, str)],
                             {**_operand_attrs(values), **attrs})
        if op.type == "Cast":  # to float16 (rounding: attr precision), or of a comparison:
            # a mask, tf.cast(tf.abs(w) > t, tf.float32)
            return self._add(op, tensor, "cast", inputs[:1], {"dtype": "float32"})
        if op.type == "L2Loss":  # tf.nn.l2_loss: sum(x ** 2) / 2 (TF's L2LossGrad: x * g)
            square = self._add(op, None, "activation", inputs[:1], {"function": "square"},
                               suffix="/square")
            total = self._add(op, None, "reduce", [square], {
                "op": "sum", "keepdims": False,
                "axes": list(range(len(static_shape(op.inputs[0]))))}, suffix="/sum")
            return self._add(op, tensor, "binary", [total], {
                "op": "mul", "operands": "ic", "c1": np.asarray(0.5, np.float32)})
        if op.type in ("Softmax", "LogSoftmax"):  # a soft tree's leaf distributions
            return self._add(op, tensor, "softmax", inputs[:1],
                             {"axis": -1, "log": op.type == "LogSoftmax"})
        if op.type in quantization.FORMS:  # a QAT layer's fake-quantized kernel
            attrs = quantization.kernel_attrs(op)
            if "operands" not in attrs:  # min and max: variables, their values, constants
                attrs["operands"] = "".join("i" if isinstance(v, str) else "c" for v in inputs)
                attrs.update({f"c{k}": np.asarray(v, np.float32) for k, v in enumerate(inputs)
                              if not isinstance(v, str)})
            return self._add(op, tensor, "fake_quant", [v for v in inputs if isinstance(v, str)],
                             attrs)
        if op.type in MATMULS:  # a product of matrices: one sample's, by the matmul kernel
            flips = ("transpose_a", "transpose_b") if op.type == "MatMul" else ("adj_x", "adj_y")
            attrs = {**_operand_attrs(inputs), "transpose_a": bool(op.get_attr(flips[0])),
                     "transpose_b": bool(op.get_attr(flips[1]))}  # (real: adjoint = transpose)
            return self._add(op, tensor, "matmul", [v for v in inputs if isinstance(v, str)],
                             attrs)
        if op.type == "Einsum":
            return self._einsum_of_weights(op, tensor, inputs)
        if op.type == "Conv2D":
            return self._convolution(op, tensor, inputs)
        if op.type in POOLS:
            pooling = pool_attrs(op)
            if isinstance(pooling, str):
                raise _Unfit(pooling)
            return self._add(op, tensor, POOLS[op.type], inputs[:1], pooling)
        if op.type in REDUCTIONS:
            axes = inputs[1]
            if isinstance(axes, str):
                raise _Unfit("its reduction axes are not constant")
            rank = len(static_shape(op.inputs[0]))
            return self._add(op, tensor, "reduce", inputs[:1], {
                "op": REDUCTIONS[op.type], "keepdims": bool(op.get_attr("keep_dims")),
                "axes": sorted({int(a) % rank for a in np.atleast_1d(axes)}) if rank else []})
        if op.type == "Cumsum":  # ordinal cut-points: tf.cumsum(tf.nn.softplus(raw))
            return self._scan(op, tensor, inputs, "cumsum")
        if op.type == "Transpose":
            if isinstance(inputs[1], str):
                raise _Unfit("its permutation is not constant")
            return self._add(op, tensor, "transpose", inputs[:1],
                             {"perm": [int(p) for p in inputs[1]]})
        return self._add(op, tensor, "reshape", inputs[:1], {"shape": list(out)})

    def _einsum_of_weights(self, op: tf.Operation, tensor: tf.Tensor, inputs: list[Any]) -> str:
        """tf.einsum of two weights, or a weight and a constant (T5's relative-position bias
        tf.einsum('qkn,nh->hqk', one_hot, table)): the einsum kernel on the program's batch of
        one, a letter of its own for that one sample prefixed to the weights' terms and the
        output; its gradients are einsums, TF's."""
        equation = op.get_attr("equation").decode().replace(" ", "")
        lhs, _, out = equation.partition("->")
        terms = lhs.split(",")
        if len(terms) != 2 or not out or "." in equation:
            raise _Unfit("the CS runs an einsum of two operands with an explicit output and "
                         "no ellipsis on weights")
        alone = sorted({c for a, b in (terms, terms[::-1]) for c in a if c not in b + out})
        if alone or any(len(set(t)) != len(t) for t in (*terms, out)):
            raise _Unfit(f"einsum {equation!r} sums over a letter of one operand only "
                         f"({', '.join(alone)}) or repeats a letter (a diagonal): tf.reduce_sum "
                         "that operand first, or take the diagonal by tf.linalg.diag_part")
        return self._add(op, tensor, "einsum", [v for v in inputs if isinstance(v, str)], {
            **_operand_attrs(inputs),
            "equation": one_sample_equation(equation, [isinstance(v, str) for v in inputs])})

    def _convolution(self, op: tf.Operation, tensor: tf.Tensor, inputs: list[Any]) -> str:
        """tf.nn.conv2d of weights and constants (a frozen loss network on a constant style
        image): the conv2d kernel on the program's batch of one, its images TF's [N, H, W, C]
        (N convolved on their own), its filter a constant it holds or its second input (a
        weight or a value of weights: its gradient TF's Conv2DBackpropFilter); a constant
        image is a `sample_constant` kernel reading the filter."""
        image, kernel = inputs
        attrs = conv2d_attrs(op.node_def, static_shape(op.inputs[0])[-1],
                             static_shape(op.inputs[1]))
        if isinstance(attrs, str):
            raise _Unfit(attrs)
        attrs.update(use_bias=False, activation="linear")
        if not isinstance(kernel, str):
            return self._add(op, tensor, "conv2d", [image],
                             {**attrs, "filter": np.asarray(kernel, np.float32)})
        if not isinstance(image, str):
            image = self._constant(op, image, kernel, "/image")
        return self._add(op, tensor, "conv2d", [image, kernel], attrs)

    def _diagonals(self, op: tf.Operation, tensor: tf.Tensor, inputs: list[Any],
                   out: tuple[int, ...]) -> str:
        """tf.linalg.diag, diag_part, set_diag (the main diagonal) and band_part of weights: a
        select between the value and zeros (or the diagonal) by a constant mask, a take of
        the flattened diagonal; their gradients are TF's (the mask's part, the diagonal's)."""
        if op.type == "MatrixBandPart":
            lower, upper = (int(v) if not isinstance(v, str) else None for v in inputs[1:])
            if lower is None or upper is None:
                raise _Unfit("its band's bounds are not constant")
            rows, cols = out[-2:]
            i, j = np.arange(rows)[:, None], np.arange(cols)[None, :]
            band = (lower < 0) | (i - j <= lower)
            band &= (upper < 0) | (j - i <= upper)
            return self._elementwise(op, tensor, "select", [band, inputs[0], np.float32(0)],
                                     {}, "", "0", out)
        k, *rest = inputs[1:] if op.type != "MatrixSetDiagV3" else inputs[2:]
        if isinstance(k, str) or np.any(k != 0) or any(isinstance(v, str) for v in rest) or \
                op.type == "MatrixDiagV3" and (np.any(rest[0] != -1) or np.any(rest[1] != -1)
                                               or np.any(rest[2] != 0)):
            raise _Unfit("it is not of the main diagonal (k = 0, TF's rows, columns and "
                         "padding 0)")
        n = out[-1]
        if op.type == "MatrixDiagPartV3":
            shape = static_shape(op.inputs[0])
            if shape[-2] != n:
                raise _Unfit("its matrix is not square")
            return self._main_diagonal(op, tensor, inputs[0], shape)
        diagonal = inputs[1] if op.type == "MatrixSetDiagV3" else inputs[0]
        if not isinstance(diagonal, str):
            raise _Unfit("its diagonal is a constant")
        row = self._add(op, None, "reshape", [diagonal], {"shape": [*out[:-2], 1, n]},
                        suffix="/row")
        other = inputs[0] if op.type == "MatrixSetDiagV3" else np.float32(0)
        return self._elementwise(op, tensor, "select", [np.eye(out[-2], n, dtype=bool), row,
                                                        other], {}, "", "0", out)

    def _main_diagonal(self, op: tf.Operation, tensor: tf.Tensor, value: str,
                       shape: tuple[int, ...]) -> str:
        """The main diagonal of `value`'s square matrices (..., n, n): a take of their
        flattened entries i * (n + 1)."""
        n = shape[-1]
        flat = self._add(op, None, "reshape", [value], {"shape": [*shape[:-2], n * n]},
                         suffix="/flat")
        return self._add(op, tensor, "take", [flat], {"axis": len(shape) - 2,
                                                      "indices": list(range(0, n * n, n + 1))})

    def _scan(self, op: tf.Operation, tensor: tf.Tensor, inputs: list[Any], kind: str) -> str:
        """tf.cumsum or tf.math.cumulative_logsumexp (`kind`'s kernel) along a constant axis."""
        if isinstance(inputs[1], str):
            raise _Unfit("its axis is not constant")
        return self._add(op, tensor, kind, inputs[:1], {
            "axis": int(inputs[1]) % len(static_shape(tensor)),
            "exclusive": bool(op.get_attr("exclusive")), "reverse": bool(op.get_attr("reverse"))})

    def _view(self, op: tf.Operation, tensor: tf.Tensor) -> str | None:
        """A view of weights: slice, take, concat or reshape kernels (_Unfit: constant
        bounds, indices or axes missing, a constant among concatenated weights)."""
        kind = op.type
        inputs = list(op.inputs)
        data, rest = {"Split": (inputs[1:], inputs[:1]), "ConcatV2": (inputs[:-1], inputs[-1:]),
                      "Pack": (inputs, [])}.get(kind, (inputs[:1], inputs[1:]))
        found = [self.operands.constant(t) for t in rest]
        args = [a for a in found if a is not None]
        if len(args) != len(found):
            raise _Unfit("its bounds, indices or axis are not constant")
        table = self.operands.weight(data[0]) if kind == "ResourceGather" else None
        if kind == "ResourceGather":  # tf.gather of a variable's handle: axis 0
            if table is None:
                raise _Unfit("it gathers from a handle that is no variable's")
            kind, args = "GatherV2", [args[0], np.asarray(0)]
        values = [self._source(data[0], table) if table is not None else self._lower(t)
                  for t in data]
        bad = next((t for t, v in zip(data, values) if v is None), None)
        if bad is not None:
            return self._refuse(tensor, self.problems[bad.name])
        if kind in ("ConcatV2", "Pack") and any(isinstance(v, str) for v in values):
            values = self._constants_among(op, values)  # (a hand-built Cholesky's zeros)
        if not all(isinstance(v, str) for v in values):
            raise _Unfit("it mixes weights and constants")
        names: list[str] = values  # type: ignore[assignment]  # (all kernels or variables)
        shape = table.variable_shape if table is not None else static_shape(data[0])
        out = static_shape(tensor)
        if kind in ("ConcatV2", "Pack"):
            axis = int(args[0]) if kind == "ConcatV2" else int(op.get_attr("axis"))
            rank = len(out)
            if kind == "Pack":
                names = [self._add(op, None, "reshape", [n], {"shape": [
                    *shape[:axis % rank], 1, *shape[axis % rank:]]}, suffix=f"/expand_{k}")
                    for k, n in enumerate(names)]
            if len(names) == 1:
                return self._add(op, tensor, "reshape", names, {"shape": list(out)})
            return self._add(op, tensor, "concat", names, {"axis": axis % rank})
        if kind == "ReverseV2":  # tf.reverse (a symmetric filter's mirrored half): takes
            axes = sorted({int(a) % len(shape) for a in np.ravel(args[0])})  # in reverse order
            current = names[0]
            for k, axis in enumerate(axes):
                last = k == len(axes) - 1
                current = self._add(op, tensor if last else None, "take", [current],
                                    {"axis": axis, "indices": list(range(shape[axis] - 1, -1, -1))},
                                    suffix="" if last else f"/reverse_{axis}")
            return current if axes else self._add(op, tensor, "reshape", names, {"shape": list(out)})
        if kind == "GatherV2":
            if op.get_attr("batch_dims") != 0:
                raise _Unfit("it gathers with batch_dims")
            indices, axis = np.asarray(args[0]), int(args[1]) % len(shape)
            size = shape[axis]
            flat = [int(i) % size if -size <= int(i) < size else int(i)
                    for i in indices.reshape(-1)]
            attrs = {"axis": axis, "indices": flat}
            if indices.ndim == 1:
                return self._add(op, tensor, "take", names, attrs)
            taken = self._add(op, None, "take", names, attrs, suffix="/take")
            return self._add(op, tensor, "reshape", [taken], {"shape": list(out)})
        bounds = self._bounds(op, tensor, shape, args)
        sliced = tuple(len(range(lo, hi, step)) for lo, hi, step, shrink in bounds
                       if not shrink)
        attrs = {"begin": [b[0] for b in bounds], "end": [b[1] for b in bounds],
                 "strides": [b[2] for b in bounds],
                 "shrink": [a for a, b in enumerate(bounds) if b[3]]}
        if sliced == out:
            return self._add(op, tensor, "slice", names, attrs)
        piece = self._add(op, None, "slice", names, attrs, suffix="/slice")
        return self._add(op, tensor, "reshape", [piece], {"shape": list(out)})

    def _constants_among(self, op: tf.Operation, values: list[Any]) -> list[Any]:
        """The float32 constants stacked or concatenated with weights as `sample_constant`
        kernels (their value, no gradient) reading a weight of the same stack for its size:
        tf.stack([w, 0.0]) is a value of weights (its gradient w's part of TF's)."""
        reader = next(v for v in values if isinstance(v, str))
        return [v if isinstance(v, str) or np.asarray(v).dtype != np.float32 else
                self._constant(op, v, reader, f"/constant_{k}") for k, v in enumerate(values)]

    def _constant(self, op: tf.Operation, value: np.ndarray, reader: str, suffix: str) -> str:
        """A float32 constant as a `sample_constant` kernel (its value, no gradient) reading
        the weight value `reader` for the program's batch of one."""
        return self._add(op, None, "sample_constant", [reader],
                         {"value": np.asarray(value, np.float32)[None]}, suffix=suffix)

    def _bounds(self, op: tf.Operation, tensor: tf.Tensor, shape: tuple[int, ...],
                args: list[np.ndarray]) -> list[tuple[int, int, int, bool]]:
        """(begin, end, stride, shrink) per axis of the viewed weight, TF's bounds resolved."""
        kind = op.type
        if kind == "StridedSlice":
            return slice_bounds(op, args[0], args[1], args[2])
        whole = [(0, d, 1, False) for d in shape]
        if kind == "Slice":
            begin, size = (a.astype(np.int64) for a in args)
            return [(int(b), d if int(n) < 0 else int(b) + int(n), 1, False)
                    for b, n, d in zip(begin, size, shape)]
        if kind == "Unpack":
            axis = int(op.get_attr("axis")) % len(shape)
            whole[axis] = (tensor.value_index, tensor.value_index + 1, 1, True)
            return whole
        axis = int(args[0] if kind == "Split" else args[1]) % len(shape)
        sizes = [static_shape(o)[axis] for o in op.outputs]
        lo = sum(sizes[:tensor.value_index])
        whole[axis] = (lo, lo + sizes[tensor.value_index], 1, False)
        return whole

    def _arithmetic(self, op: tf.Operation, tensor: tf.Tensor, inputs: list[Any],
                    out: tuple[int, ...]) -> str:
        """Binary kernels (AddN: a chain of them) over weights (`i`, rank-aligned to the
        result's) and constants (`c`)."""
        kind = "add" if op.type == "AddN" else {**WEIGHT_ARITHMETIC, **WEIGHT_COMPARISONS}[op.type]
        current = inputs[0]
        for index, value in enumerate(inputs[1:]):
            last = index == len(inputs) - 2
            current = self._elementwise(op, tensor if last else None, "binary", [current, value],
                                        {"op": kind}, "" if last else f"/partial_{index}",
                                        str(index), out)
        return current

    def _elementwise(self, op: tf.Operation, tensor: tf.Tensor | None, kind: str,
                     values: list[Any], attrs: dict[str, Any], suffix: str, tag: str,
                     out: tuple[int, ...]) -> str:
        """A `kind` kernel over broadcast operands: weights (`i`, rank-aligned to the result's)
        and constants (`c`)."""
        letters, names, attrs = "", [], dict(attrs)
        for k, v in enumerate(values):
            if isinstance(v, str):
                letters += "i"
                names.append(self._expanded(op, v, len(out), f"{tag}_{k}"))
            else:
                letters += "c"
                attrs[f"c{k}"] = np.asarray(v)
        return self._add(op, tensor, kind, names, {**attrs, "operands": letters}, suffix=suffix)

    def _expanded(self, op: tf.Operation, value: str, rank: int, k: str) -> str:
        """`value` with leading 1s up to `rank` axes (TF aligns trailing axes)."""
        shape = self._shape(value)
        if len(shape) >= rank:
            return value
        return self._add(op, None, "reshape", [value],
                         {"shape": [1] * (rank - len(shape)) + list(shape)}, suffix=f"/expand_{k}")

    def _shape(self, value: str) -> tuple[int, ...]:
        if value in self.sources:
            return tuple(self.sources[value].shape)
        return next(k.output_shape for k in self.kernels if k.name == value)

    def _add(self, op: tf.Operation, tensor: tf.Tensor | None, kind: str, inputs: list[str],
             attrs: dict[str, Any], suffix: str = "") -> str:
        """A kernel computing `tensor` (None: a step toward it); _Unfit if the library's
        kernel refuses it."""
        name = op.name + suffix if tensor is None or tensor.value_index == 0 else \
            f"{op.name}:{tensor.value_index}"
        shapes = [self._shape(v) for v in inputs]
        if precision.tensor_precision(op.outputs[0]):  # rounds its value and its gradient
            attrs = {**attrs, "precision": precision.FLOAT16}
        try:
            kernel = build_kernel(kind, name, attrs, shapes)
            shape = tuple(kernel.output_shape)
        except KernelError as error:
            raise _Unfit(str(error)) from None
        if tensor is not None and shape != static_shape(tensor):
            raise _Unfit(f"the {kind} kernel computes {shape}, TensorFlow {static_shape(tensor)}")
        self.kernels.append(KernelNode(
            name=name, type=kind, inputs=tuple(inputs), input_shapes=tuple(shapes), attrs=attrs,
            params=(), output_shape=shape, tf_tensor=tensor.name if tensor is not None else "",
            source=user_source(op), ops=(op.name,) if tensor is not None else ()))
        return name
