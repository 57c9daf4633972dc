"""The lowering rules' registry and the narrow context each rule receives.

A generic rule lowers one TF op type: `rule(ctx, op)` adds kernels and returns "", or
returns why it cannot. A fast path `rule(ctx, op) -> bool` fuses the ops starting at `op`
into a library kernel, or declines. Rules join the registry where they are written
(`@generic(...)`, `@fast_path`: lowering.py, fast_paths.py, lowering_spatial.py,
sequences.py); the driver (match.Matcher) implements `Context` and imports the rules, never
the other way round.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Protocol

import tensorflow as tf

from coordinator.compiler.grappler import SessionOps
from coordinator.compiler.ir import KernelNode, ParamRef, UnsupportedOp
from coordinator.compiler.operands import Operands, Weight
from wafer.kernels import KERNELS


class Context(Protocol):
    """What a rule reads and records while lowering the forward graph."""

    batch_size: int
    fold_factors: set[int]  # rows per sample of the folded values so far
    operands: Operands  # weights, constants and views among the op's inputs
    flow: set[tf.Operation]  # the data-flow ops being lowered
    consumed: set[tf.Operation]  # the ops lowered so far
    protected: set[str]  # tensors the host reads: never hidden inside a fused kernel
    # per-sample tensors whose TF layout has a stack axis in front of the batch (leading_stack.py)
    leading: set[str]
    # a batch_norm_training kernel's moments (keepdims and squeezed) -> (kernel, statistic)
    statistics: dict[str, tuple[str, str]]
    session_ops: SessionOps  # the ops TF's Session runs for the mode's fetches

    def is_batched(self, tensor: tf.Tensor) -> bool: ...

    def folds(self, tensor: tf.Tensor) -> int:
        """k for a per-sample value folded into the batch as [B*k, ...] (folded_batch.py), else 1."""

    def axis_shift(self, tensor: tf.Tensor) -> int:
        """1, or 0 for folded rows: `tensor`'s axis a is its per-sample value's a - axis_shift."""

    def sample_shape(self, tensor: tf.Tensor, inputs: Iterable[tf.Tensor | str]) -> tuple[int, ...]:
        """The per-sample shape of `tensor`, computed row by row from `inputs`."""

    def derived_weight(self, tensor: tf.Tensor) -> Weight | None:
        """A weight computed from weights alone (the weight program's value), or None."""

    def weight_problem(self, tensor: tf.Tensor) -> str:
        """Why the weight program cannot compute `tensor`, a value of weights alone ("" if
        it can, or if `tensor` is no such value)."""

    def value(self, tensor: tf.Tensor) -> str | None: ...

    def sample_input(self) -> str:
        """A program input every mode streams (the features): what a kernel reading only the
        micro-batch's size (random numbers) takes."""

    def shape(self, tensor: tf.Tensor) -> tuple[int, ...]: ...

    def kernel_shape(self, name: str) -> tuple[int, ...]: ...

    def consumers(self, tensor: tf.Tensor) -> list[tf.Operation]: ...

    def sole_consumer(self, tensor: tf.Tensor) -> tf.Operation | None: ...

    def scope(self, op: tf.Operation, variable: str = "") -> str: ...

    def add_kernel(self, base: str, type_: str, inputs: list[tf.Tensor | str], attrs: dict[str, Any],
                   params: list[ParamRef], ops: list[tf.Operation], output: tf.Tensor | None,
                   output_shape: tuple[int, ...] | None = None,
                   source_op: tf.Operation | None = None) -> KernelNode: ...

    def alias(self, op: tf.Operation, source: tf.Tensor, output: tf.Tensor | None = None) -> None: ...

    def reject(self, op: tf.Operation, reason: str = "") -> None: ...

    def operand_list(self, op: tf.Operation, tensors: Iterable[tf.Tensor],
                     float_constants: bool = True) -> Any: ...


class TailContext(Context, Protocol):
    """The loss tail's view (loss_tail.py): the ops after the batch reductions."""

    graph: tf.Graph
    ops: list[tf.Operation]  # the data-flow ops, in graph order
    tail: set[str]  # tensors after a batch reduction
    frontier: list[tf.Tensor]  # batched tensors the batch reductions read
    kernels: list[KernelNode]
    unsupported: list[UnsupportedOp]
    step_values: Any  # step_values.StepValues: the schedule kernels of values of the step

    def weight_program_sources(self) -> set[str]:
        """The variables the weight program reads for the kernels so far."""


GenericRule = Callable[[Context, tf.Operation], str]
FastPath = Callable[[Context, tf.Operation], bool]

# TF op type -> the rule lowering it onto generic kernels.
GENERIC: dict[str, GenericRule] = {}
# Library fast paths, tried in this (registration) order.
FAST_PATHS: list[FastPath] = []


def generic(*op_types: str) -> Callable[[GenericRule], GenericRule]:
    """Register `rule` as the lowering of `op_types`."""
    def register(rule: GenericRule) -> GenericRule:
        for op_type in op_types:
            previous = GENERIC.get(op_type)  # the same rule again: its module run as a script
            assert previous is None or previous.__qualname__ == rule.__qualname__, \
                f"{op_type} has two lowerings"
            GENERIC[op_type] = rule
        return rule
    return register


def fast_path(rule: FastPath) -> FastPath:
    FAST_PATHS.append(rule)
    return rule


def has_kernel(name: str) -> bool:
    return name in KERNELS
