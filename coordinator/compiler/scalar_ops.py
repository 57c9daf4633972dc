"""Scalar ops: the TensorFlow ops a scalar program of wafer.schedules computes (a schedule
of the global step, a loss divisor of the batch's sums), by the name of their scalar op."""
from __future__ import annotations

import tensorflow as tf

UNARY = {"Identity": "identity", "Snapshot": "identity", "StopGradient": "identity",
         "Neg": "neg", "Abs": "abs", "Floor": "floor", "Ceil": "ceil", "Sqrt": "sqrt",
         "Rsqrt": "rsqrt", "Square": "square", "Reciprocal": "reciprocal", "Inv": "reciprocal",
         "Exp": "exp", "Log": "log", "Log1p": "log1p", "Expm1": "expm1", "Cos": "cos", "Sin": "sin", "LogicalNot": "logical_not"}
BINARY = {"Add": "add", "AddV2": "add", "Sub": "sub", "Mul": "mul", "RealDiv": "div",
          "Div": "div", "FloorDiv": "floordiv", "FloorMod": "floormod", "Pow": "pow",
          "Minimum": "minimum", "Maximum": "maximum", "Less": "less", "LessEqual": "less_equal",
          "Greater": "greater", "GreaterEqual": "greater_equal", "Equal": "equal",
          "NotEqual": "not_equal", "LogicalAnd": "logical_and", "LogicalOr": "logical_or",
          "SquaredDifference": "squared_difference"}
BOOL_RESULTS = {"less", "less_equal", "greater", "greater_equal", "equal", "not_equal",
                "logical_and", "logical_or", "logical_not"}
DTYPES = {tf.float32: "float32", tf.int64: "int64", tf.int32: "int32", tf.bool: "bool"}
