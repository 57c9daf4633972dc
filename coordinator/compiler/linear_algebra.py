"""Dense linear algebra of small matrices (`wafer.kernels.linear_systems`): Cholesky
(tf.linalg.cholesky), MatrixSolve (tf.linalg.solve), MatrixTriangularSolve
(tf.linalg.triangular_solve, lower or upper, adjoint) and MatrixInverse (tf.linalg.inv: the
solve of the identity, TF's gradient alike) become the `cholesky` and `solve` kernels, of a
sample's own matrices (a Lagrangian network's Hessian block solved per sample) here, or of
weights in the weight program (a sparse GP's factor of its inducing points' kernel matrix
and its inverse, weight_program.py). Their gradient ops inside the loss (a second
derivative through a solve) have no kernel and are refused, naming the op."""
from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from coordinator.compiler.operands import static_shape
from coordinator.compiler.rules import Context, generic

SOLVES = ("MatrixSolve", "MatrixTriangularSolve", "MatrixInverse")
OPS = ("Cholesky", *SOLVES)

# The README's row: kernel -> the TF ops it starts from.
KERNEL_ROWS = {
    "cholesky, solve": "Cholesky, MatrixSolve, MatrixTriangularSolve (lower or upper, "
                       "adjoint), MatrixInverse of a sample's own small matrices [batch, ..., "
                       "n, n] (tf.linalg.cholesky, solve, triangular_solve, inv: a Lagrangian "
                       "network's Hessian block tf.linalg.solve(h_vv, rhs)) and of weights in "
                       "the weight program (below): computed in float64 and rounded to float32, "
                       "their gradients TF's",
}


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
    operands = op.inputs[:1] if op.type in ("Cholesky", "MatrixInverse") else op.inputs
    if not any(m.is_batched(t) for t in operands):
        return "its input is not a per-sample value"
    if op.type == "Cholesky":
        m.add_kernel(op.name, "cholesky", [op.inputs[0]], {}, [], [op], op.outputs[0])
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
