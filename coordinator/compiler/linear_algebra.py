"""Dense linear algebra of small matrices (`wafer.kernels.linear_systems`,
`wafer.kernels.determinants`): Cholesky (tf.linalg.cholesky), MatrixSolve (tf.linalg.solve),
MatrixTriangularSolve (tf.linalg.triangular_solve, lower or upper, adjoint), MatrixInverse
(tf.linalg.inv: the solve of the identity, TF's gradient alike), LogMatrixDeterminant and
MatrixDeterminant (tf.linalg.slogdet, det) become the `cholesky`, `solve` and `slogdet`
kernels, of a sample's own matrices (a Lagrangian network's Hessian block solved per
sample) here, or of weights in the weight program (a sparse GP's factor of its inducing
points' kernel matrix and its inverse, Glow's log|det W|: weight_program.py)."""
from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from coordinator.compiler.operands import static_shape
from coordinator.compiler.rules import Context, generic

SOLVES = ("MatrixSolve", "MatrixTriangularSolve", "MatrixInverse")
DETERMINANTS = ("LogMatrixDeterminant", "MatrixDeterminant")
OPS = ("Cholesky", *SOLVES, *DETERMINANTS)

# The README's row: kernel -> the TF ops it starts from.
KERNEL_ROWS = {
    "cholesky, solve, slogdet": "Cholesky, MatrixSolve, MatrixTriangularSolve (lower or "
                                "upper, adjoint), MatrixInverse, LogMatrixDeterminant, "
                                "MatrixDeterminant of a sample's own small matrices [batch, "
                                "..., n, n] (tf.linalg.cholesky, solve, triangular_solve, inv, "
                                "slogdet, det: a Lagrangian network's Hessian block "
                                "tf.linalg.solve(h_vv, rhs)) and of weights in the weight "
                                "program (below): computed in float64 and rounded to float32, "
                                "their gradients TF's",
}


def determinant_output(tensor: tf.Tensor) -> str:
    """The `slogdet` kernel's attr output computing `tensor`, an output of DETERMINANTS."""
    if tensor.op.type == "MatrixDeterminant":
        return "determinant"
    return ("sign", "log_abs_det")[tensor.value_index]


def solve_attrs(op: tf.Operation, values: list[Any]) -> tuple[list[Any], dict[str, Any]]:
    """The `solve` kernel's operand values (MatrixInverse's right-hand side the identity)
    and its attrs adjoint and triangle for `op`, one of SOLVES."""
    if op.type == "MatrixInverse":
        values = [values[0], np.eye(static_shape(op.outputs[0])[-1], dtype=np.float32)]
    triangle = ("upper", "lower")[op.get_attr("lower")] if op.type == "MatrixTriangularSolve" \
        else ""
    return values, {"adjoint": bool(op.get_attr("adjoint")), "triangle": triangle}


@generic(*OPS)
def _linear_system(m: Context, op: tf.Operation) -> str:
    """A per-sample matrix's factor, or the solution of its system (constant or weight
    right-hand sides too)."""
    if op.outputs[0].dtype != tf.float32:
        return f"{op.type} of {op.outputs[0].dtype.name} matrices: the CS computes it in float32"
    operands = op.inputs[:1] if op.type not in ("MatrixSolve", "MatrixTriangularSolve") \
        else op.inputs
    if not any(m.is_batched(t) for t in operands):
        return "its input is not a per-sample value"
    if op.type == "Cholesky":
        m.add_kernel(op.name, "cholesky", [op.inputs[0]], {}, [], [op], op.outputs[0])
        return ""
    if op.type in DETERMINANTS:  # a kernel for each output read
        for out in op.outputs:
            if m.consumers(out) or out.name in m.protected:
                output = determinant_output(out)
                m.add_kernel(op.name if out.value_index == 0 else f"{op.name}/{output}",
                             "slogdet", [op.inputs[0]], {"output": output}, [],
                             [op], out)
        return ""
    found = m.operand_list(op, operands)
    if isinstance(found, str):
        return found
    letters, inputs, attrs, params = found
    values, kernel_attrs = solve_attrs(op, [None])
    if op.type == "MatrixInverse":
        letters, attrs = letters + "c", {**attrs, "c1": values[1]}
    m.add_kernel(op.name, "solve", inputs, {"operands": letters, **attrs, **kernel_attrs},
                 params, [op], op.outputs[0])
    return ""
