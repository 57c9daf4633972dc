"""The compiler's intermediate form: what each pass hands to the next (no TensorFlow here)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Shape = tuple[int, ...]


@dataclass(frozen=True)
class InputSpec:
    """A streamed program input: "features", "features.<key>" or "labels"."""

    name: str
    dtype: str  # numpy dtype name: float32, int32, ...
    shape: Shape  # per sample
    tf_tensor: str  # the placeholder it replaces in the user's graph


@dataclass(frozen=True)
class ParamRef:
    role: str  # kernel, bias, p<k> (a generic kernel's weight operand), ...
    variable: str  # TF variable name (checkpoint key)
    shape: Shape  # as the kernel sees it
    dtype: str = "float32"
    variable_shape: Shape | None = None  # the variable's own shape, when it is viewed reshaped
    frozen: bool = False  # not updated (not in the train_op's var_list, or moving statistics)
    regularizers: tuple[tuple[str, float], ...] = ()  # (l2 | l1, scale) terms of the loss


@dataclass(frozen=True)
class KernelNode:
    """One library kernel matched in the user's graph."""

    name: str
    type: str
    inputs: tuple[str, ...]  # program inputs or earlier kernels
    input_shapes: tuple[Shape, ...]
    attrs: dict[str, Any]
    params: tuple[ParamRef, ...]
    output_shape: Shape
    tf_tensor: str  # the user's tensor holding this kernel's output
    source: str  # user file:line
    ops: tuple[str, ...]  # TF op names grouped into this kernel


@dataclass(frozen=True)
class UnsupportedOp:
    type: str
    name: str
    source: str
    reason: str = ""

    def line(self) -> str:
        why = f" ({self.reason})" if self.reason else ""
        return f"{self.type} '{self.name}' at {self.source}{why}"


@dataclass(frozen=True)
class OptimizerSpec:
    type: str  # sgd, momentum, adam
    learning_rate: float
    momentum: float = 0.0
    use_nesterov: bool = False
    beta1: float = 0.0
    beta2: float = 0.0
    epsilon: float = 0.0


@dataclass(frozen=True)
class MatchedModel:
    """The user's model as library kernels (match's result)."""

    inputs: tuple[InputSpec, ...]
    kernels: tuple[KernelNode, ...]  # topological order
    loss_kernel: str  # "" in predict mode
    outputs: tuple[str, ...]  # kernels/inputs streamed back to the host
    optimizer: OptimizerSpec | None
    unsupported: tuple[UnsupportedOp, ...] = field(default=())

    @property
    def num_parameters(self) -> int:
        total = 0
        for kernel in self.kernels:
            for p in kernel.params:
                n = 1
                for d in p.shape:
                    n *= d
                total += n
        return total
