"""Gradient programs: a transform of one variable's summed gradient that is none of the
recognised kinds (gradient centralization's g - mean(g), adaptive clipping's per-unit
g * min(1, c * max(||w||, eps) / ||g||), sign(g), tf.where(tf.math.is_finite(g), g, 0),
g * mask, g * c) is lowered by the weight program's builder (weight_program.py: element-wise
ops, arithmetic with constants and weights, reductions, comparisons, tf.where, views), with
the gradient as one more source ("<variable>:grad"), into a wafer.grad_transforms "program"
the CS runs on the batch's gradient before the update. It reads that gradient, weights
(their values before the update, as TF's transform reads them: every update waits for its
gradient) and constants; a value of the batch (the loss, an activation, another value of
the backward pass), another variable's gradient or the global step is refused, naming the op.
numbers.py then compares TF's transform with the program's on random gradients."""
from __future__ import annotations

from typing import Callable

import numpy as np
import tensorflow as tf

from coordinator.compiler.extract import ExtractedGraph, data_downstream, user_name, user_source
from coordinator.compiler.ir import ParamRef
from coordinator.compiler.operands import Operands, static_shape
from coordinator.compiler.program import weight_program_message
from coordinator.compiler.training.graph import Refused
from coordinator.compiler.weight_program import WeightProgramBuilder
from cs_api import cs_api_pb2 as pb
from wafer.grad_transforms import GRADIENT

ONLY = ("the CS transforms a gradient with itself, weights, constants and the ops of the "
        "weight program")

TRANSFORM_HINT = ("transform each gradient with itself, weights and constants only "
                  "(tf.clip_by_norm(g, c), g * mask); to combine several losses' gradients, "
                  "minimize their weighted sum with one optimizer")


class _Builder(WeightProgramBuilder):
    """The weight program's builder, reading one gradient of the backward pass as a source."""

    PLACE = "on a gradient"

    def __init__(self, operands: Operands, flow: set[tf.Operation], variable: str,
                 backward: Callable[[tf.Operation], bool]):
        super().__init__(operands, flow)
        self.SUBJECT = f"the gradient of {variable} is transformed"
        self.variable = variable
        self.backward = backward
        self.leaf: tf.Tensor | None = None

    def _lower_new(self, tensor: tf.Tensor) -> str | np.ndarray | None:
        op = tensor.op
        where = f"{op.type} '{user_name(op)}' at {user_source(op)}"
        if self.backward(op):
            if self.leaf is not None and self.leaf.name != tensor.name:
                return self._refuse(tensor, f"{self.SUBJECT} with a second value of the "
                                            f"backward pass ({where}): {ONLY}")
            self.leaf = tensor
            name = self.variable + GRADIENT
            self.sources[name] = ParamRef("gradient", name, static_shape(tensor))
            return name
        if op in self.flow:
            return self._refuse(tensor, f"{self.SUBJECT} with a value of the batch ({where}): "
                                        f"{ONLY}")
        if op in self._step_readers():
            return self._refuse(tensor, f"{self.SUBJECT} with a value of the global step "
                                        f"({where}): the CS's gradient programs read no step "
                                        "values (under SGD or Momentum a factor of the step on "
                                        "every gradient is a learning-rate schedule: write it so)")
        if op.type in ("ZerosLike", "OnesLike"):
            return np.full(static_shape(tensor), op.type == "OnesLike", np.float32)
        if op.type == "IsFinite":  # |x| < inf: false for NaN and infinities, as TF's
            value = self._lower(op.inputs[0])
            if not isinstance(value, str):
                return self._refuse(tensor, self.problems.get(op.inputs[0].name,
                                                              f"{where}: a constant"))
            magnitude = self._add(op, None, "activation", [value], {"function": "abs"},
                                  suffix="/abs")
            return self._elementwise(op, tensor, "binary", [magnitude, np.float32(np.inf)],
                                     {"op": "less"}, "", "0", static_shape(tensor))
        return super()._lower_new(tensor)

    def _draw(self, op: tf.Operation, tensor: tf.Tensor, where: str) -> str | None:
        return self._refuse(tensor, f"{self.SUBJECT} with random numbers ({where}): gradient "
                                    "noise draws TensorFlow's own numbers, which the CS does "
                                    "not reproduce; train without it")


class GradientPrograms:
    """Lowers the transforms of a graph's gradients (the values of the batch found once)."""

    def __init__(self, extracted: ExtractedGraph, backward: Callable[[tf.Operation], bool]):
        self.extracted = extracted
        self.backward = backward
        self._operands: Operands | None = None

    def _values_of_the_batch(self) -> Operands:
        """The graph's operands, its flow the ops computed from the batch other than through
        the backward pass (found once, when a program is first lowered)."""
        if self._operands is None:
            graph = self.extracted.graph
            inputs = [graph.get_tensor_by_name(name).op
                      for name in self.extracted.placeholders.values()]
            gradients = [op for op in graph.get_operations() if self.backward(op)]
            self._operands = Operands(graph, data_downstream(inputs) - data_downstream(gradients))
        return self._operands

    def lower(self, tensor: tf.Tensor, variable: str) -> tuple[pb.WeightProgram, tf.Tensor]:
        """The program computing `tensor` from `variable`'s gradient and the gradient it
        reads (tf.gradients' output); Refused naming the op it cannot lower."""
        operands = self._values_of_the_batch()
        builder = _Builder(operands, operands.flow, variable, self.backward)
        value = builder._lower(tensor)
        op = tensor.op
        if value is None:
            raise Refused(builder.problems[tensor.name], TRANSFORM_HINT)
        if builder.leaf is None or not isinstance(value, str) or \
                tensor.dtype.base_dtype != tf.float32:
            raise Refused(f"the gradient applied to {variable} is not computed from the "
                          f"loss's gradient as a float32 value ({op.type} '{op.name}' at "
                          f"{user_source(op)})")
        program = builder.program({value})
        if program is None:  # (no kernel: `tensor` is the gradient itself)
            raise Refused(f"the gradient of {variable} is passed through {op.type} '{op.name}' "
                          f"at {user_source(op)}, which the compiler does not follow")
        return weight_program_message(program), builder.leaf
