"""Values of the global step the samples meet: a loss term's weight on a schedule (KL
annealing's beta = tf.minimum(1.0, tf.cast(global_step, tf.float32) / n) in
mean(recon) + beta * mean(kl) or inside the mean, an auxiliary loss's polynomial_decay, a
warm-up with tf.where / tf.cond of the step).

    StepValues(extracted).kernel(m, tensor, reader) -> the `schedule` kernel's name, or why not

Each is lowered as an optimizer's schedule is (schedules.lower_value: the nodes TensorFlow
executes for a step of the mode compiled, Grappler's rewrites included) to a scalar program
of the global step and constants, and becomes a `schedule` kernel (wafer.kernels.step_values)
that the CS evaluates at the step being computed (evaluation: the checkpoint's), giving
every sample the value; the kernels reading it multiply (add, select) per-sample values by
it, so its gradients are TF's. A value that also reads another variable (trainable, or one
the train_op writes) is no schedule: refused in one line saying what to write instead.
"""
from __future__ import annotations

import tensorflow as tf

from coordinator.compiler.extract import ExtractedGraph, data_upstream, op_closure, user_name, user_source
from coordinator.compiler.operands import static_shape
from coordinator.compiler.schedules import (
    Scheduled,
    ScheduleRefused,
    check_increment,
    executed_graph,
    global_step,
    lower_value,
)
from tf_model.estimator_spec import ModeKeys
from wafer.kernels.step_values import STEP_VALUE
from wafer.schedules import programs_attr

KERNEL_ROWS = {"schedule": (
    "a value of the global step given to every sample: a loss term's weight or a factor of "
    "per-sample values computed from the global step and constants (KL annealing's "
    "tf.minimum(1.0, tf.cast(global_step, tf.float32) / n), tf.compat.v1.train."
    "polynomial_decay and the other tf.compat.v1.train schedules, warm-ups with tf.where / "
    "tf.cond), beta * tf.reduce_mean(kl) or inside the mean: its scalar program, lowered from "
    "the graph TF executes, evaluated by the CS at the step computed (evaluation: the "
    "checkpoint's) as TF's CPU kernels compute it")}
REFUSED = {"values of the global step": (
    "read by weights or inside a weight penalty (tf.matmul(x, beta * w), "
    "tf.nn.l2_loss(beta * w)), "
    "of another dtype than float32 or shape than a scalar, or computed from a variable "
    "(one the train_op writes: a loss weight kept in a variable)")}
WRITE_OPS = {"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp", "Assign",
             "AssignAdd", "AssignSub"}
# Why a value of the step that meets weights is refused (the weight program, the loss tail).
ON_WEIGHTS = ("the CS multiplies per-sample values and loss terms by a value of the global "
              "step (loss + beta * tf.reduce_mean(kl), beta * x, beta * tf.nn.l2_loss(w)), "
              "not weights or what a penalty reads: multiply the layer's output, or the "
              "whole penalty")
INSTEAD = ("the CS computes a per-step value from the global step and constants: "
           "tf.minimum(1.0, tf.cast(global_step, tf.float32) / n), tf.compat.v1.train."
           "polynomial_decay (or another tf.compat.v1.train schedule) of global_step, "
           "tf.where / tf.cond of global_step, as a float32 scalar")


class StepValues:
    """The `schedule` kernels of one graph's values of the global step, each made once."""

    def __init__(self, extracted: ExtractedGraph):
        self.x = extracted
        self.step = global_step(extracted.graph)
        self._nodes: dict | None = None
        self._written: dict[str, tf.Operation] | None = None
        self.trainable = {v.op.name for v in extracted.graph.get_collection(
            tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)}
        self.kernels: dict[str, str] = {}  # tensor -> its kernel
        self.problems: dict[str, str] = {}  # tensor -> why it has none

    def written(self, variable: str) -> tf.Operation | None:
        """The train_op's write of `variable` if it is a scalar nothing trains (a per-step
        value kept in a variable: not a schedule), else None."""
        if self._written is None:
            inputs = {self.x.graph.get_tensor_by_name(p).op
                      for p in self.x.placeholders.values()}
            self._written = {name: op for name, op in written_variables(self.x).items()
                             if name not in self.trainable and name != self.step
                             and static_shape(op.inputs[1]) == ()
                             and not inputs & set(data_upstream(op))}  # (batch_writes')
        return self._written.get(variable)

    def written_refusal(self, variable: str) -> str:
        """Why a kernel or the loss cannot read `variable` (written), or ""."""
        write = self.written(variable)
        if write is None:
            return ""
        return (f"reads {variable}, a value the train_op writes every step ({write.type} "
                f"'{user_name(write)}' at {user_source(write)}), not a schedule: {INSTEAD}")

    def reads_step(self, tensor: tf.Tensor) -> bool:
        """Whether `tensor` is computed from the global step."""
        return bool(self.step) and any(op.name == self.step for op in data_upstream(tensor.op))

    def reads_weights(self, tensor: tf.Tensor) -> bool:
        """Whether `tensor` is computed from a trainable variable."""
        return any(op.name in self.trainable for op in data_upstream(tensor.op))

    def kernel(self, m, tensor: tf.Tensor, reader: tf.Operation) -> str | tuple[str]:
        """The name of the `schedule` kernel giving every sample `tensor` (a value of the
        global step read by `reader`), or (why the CS cannot,)."""
        if tensor.name not in self.kernels and tensor.name not in self.problems:
            try:
                program = self._program(tensor, reader)
            except ScheduleRefused as refused:
                self.problems[tensor.name] = str(refused)
            else:
                self.kernels[tensor.name] = m.add_kernel(
                    f"{tensor.op.name}/schedule", "schedule", [m.sample_input()],
                    {"program": programs_attr([program])}, [], [], None, output_shape=(),
                    source_op=tensor.op).name
        return self.kernels.get(tensor.name) or (self.problems[tensor.name],)

    def _program(self, tensor: tf.Tensor, reader: tf.Operation):
        what = f"the value of the global step {tensor.op.name} (read by '{reader.name}')"
        if static_shape(tensor) != () or tensor.dtype.base_dtype != tf.float32:
            raise ScheduleRefused(f"{what} is {tensor.dtype.base_dtype.name} of shape "
                                  f"{static_shape(tensor)} ({tensor.op.type} '{tensor.op.name}' "
                                  f"at {user_source(tensor.op)}): {INSTEAD}, and multiply by it")
        written = written_variables(self.x)
        for op in data_upstream(tensor.op):
            if op.type in ("VarHandleOp", "VariableV2") and op.name != self.step:
                why = "which the train_op writes" if op.name in written else "a variable"
                raise ScheduleRefused(f"{what} reads {op.name}, {why} ({tensor.op.type} "
                                      f"'{user_name(tensor.op)}' at {user_source(tensor.op)}): "
                                      f"{INSTEAD}")
        item = Scheduled(STEP_VALUE, reader, tensor, label=what)
        if self.x.mode == ModeKeys.TRAIN:
            check_increment(self.x, [item])
        if self._nodes is None:
            self._nodes = executed_graph(self.x)
        return lower_value(self.x, self._nodes, item, set())


def written_variables(extracted: ExtractedGraph) -> dict[str, tf.Operation]:
    """The variables the train_op writes, each with a write (none outside training)."""
    train = extracted.spec.train_op
    if train is None or extracted.mode != ModeKeys.TRAIN:
        return {}
    found: dict[str, tf.Operation] = {}
    for op in op_closure(train.op if isinstance(train, tf.Tensor) else train):
        if op.type in WRITE_OPS and op.inputs:
            target = op.inputs[0].op
            while target.type in ("Identity", "ReadVariableOp") and target.inputs:
                target = target.inputs[0].op
            found.setdefault(target.name, op)
    return found
