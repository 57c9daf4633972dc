"""Quantization-aware training: tf.quantization.fake_quant_with_min_max_args (a fixed range),
fake_quant_with_min_max_vars (learned min/max variables) and ..._per_channel, lowered onto
the `fake_quant` kernel (wafer.kernels.quantization: TF's CPU arithmetic bit for bit, its
gradients to x and to min/max). On activations min and max are the kernel's weights or
constants; on weights (a QAT layer's fake-quantized kernel) the op runs in the weight
program (weight_program.py), min and max its inputs (variables, tf.reduce_min(w), ...)."""
from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from coordinator.compiler.rules import Context, generic, has_kernel

# TF op -> the kernel's form (whose arithmetic: args multiplies by the inverse scale, vars
# divides by the scale, per_channel multiplies, min/max per channel of the last axis)
FORMS = {"FakeQuantWithMinMaxArgs": "args", "FakeQuantWithMinMaxVars": "vars",
         "FakeQuantWithMinMaxVarsPerChannel": "per_channel"}

# The README's row: kernel -> the TF ops it starts from.
KERNEL_ROWS = {"fake_quant": (
    "FakeQuantWithMinMaxArgs, FakeQuantWithMinMaxVars, FakeQuantWithMinMaxVarsPerChannel "
    "(quantization-aware training: tf.quantization.fake_quant_with_min_max_args/vars/"
    "vars_per_channel, any num_bits and narrow_range) of activations with constant or "
    "learned (variable) min/max, and of weights in the weight program (min/max variables, "
    "or computed from the weight: tf.reduce_min(w)): TF's CPU kernels bit for bit, the "
    "gradients to min and max as FakeQuantWithMinMaxVarsGradient's")}


def kernel_attrs(op: tf.Operation) -> dict[str, Any]:
    """The fake_quant kernel's attrs of a FakeQuant* op; for the args form its operands too
    (min and max are the op's attrs: constants c1, c2)."""
    attrs: dict[str, Any] = {"num_bits": int(op.get_attr("num_bits")),
                             "narrow_range": bool(op.get_attr("narrow_range")),
                             "form": FORMS[op.type]}
    if op.type == "FakeQuantWithMinMaxArgs":
        attrs.update(operands="icc", c1=np.asarray(op.get_attr("min"), np.float32),
                     c2=np.asarray(op.get_attr("max"), np.float32))
    return attrs


@generic(*FORMS)
def fake_quant(m: Context, op: tf.Operation) -> str:
    """A per-sample value fake-quantized; min/max constants or weights (their gradients the
    batch's sums)."""
    if not has_kernel("fake_quant"):
        return "the CS has no fake_quant kernel"
    attrs = kernel_attrs(op)
    if "operands" in attrs:
        m.add_kernel(op.name, "fake_quant", [op.inputs[0]], attrs, [], [op], op.outputs[0])
        return ""
    found = m.operand_list(op, op.inputs)
    if isinstance(found, str):
        return found
    letters, inputs, operand_attrs, params = found
    if letters[0] != "i" or "i" in letters[1:]:
        return ("fake-quantizes with a min or max computed from the samples (a batch's "
                "range): give min and max as variables (learned) or constants, or use "
                "fake_quant_with_min_max_args")
    m.add_kernel(op.name, "fake_quant", inputs, {**attrs, "operands": letters, **operand_attrs},
                 params, [op], op.outputs[0])
    return ""
