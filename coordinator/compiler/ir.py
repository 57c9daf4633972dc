"""The compiler's intermediate form: what each pass hands to the next (no TensorFlow here)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from cs_api.input_spec import InputSpec

if TYPE_CHECKING:
    from wafer.conditional_updates import ConditionalUpdate
    from wafer.grad_transforms import GradientTransform
    from wafer.loss_scaling import Rule
    from wafer.moving_averages import MovingAverage
    from wafer.optimizers import OptimizerConfig, OptimizerGroup, Reupdate
    from wafer.schedules import Schedule
    from wafer.weight_writes import WeightWrite

Shape = tuple[int, ...]


@dataclass(frozen=True)
class ParamRef:
    role: str  # kernel, bias, p<k> (a generic kernel's weight operand), ...
    variable: str  # TF variable name (checkpoint key)
    shape: Shape  # as the kernel sees it
    dtype: str = "float32"
    variable_shape: Shape | None = None  # the variable's own shape, when it is viewed reshaped
    frozen: bool = False  # not updated (not in the train_op's var_list, or moving statistics)
    regularizers: tuple[tuple[str, float], ...] = ()  # (l2 | l1, scale) terms of the loss
    penalty_reported: bool = True  # False: the terms are the minimized loss's alone (not reported)
    # a static view of the variable: each element's flat index into it (pos_table[:n])
    view: np.ndarray | None = field(default=None, compare=False)


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
    layer: str = ""  # the Keras layer class (or TF function) the user wrote, if known
    scope: str = ""  # that layer's name scope (the ops of one layer share it)
    layer_source: str = ""  # the user's line of that layer (of the batch reduction it reads)

    def line(self) -> str:
        why = f" ({self.reason})" if self.reason else ""
        return f"{self.type} '{self.name}' at {self.source}{why}"


@dataclass(frozen=True)
class TrainedVariable:
    """A variable the train_op updates."""

    name: str  # TF variable name
    update: str  # dense (Apply*) or sparse (an IndexedSlices gradient: embedding lookups)
    slots: tuple[str, ...]  # its optimizer slots' TF names, in wafer.optimizers' order
    source: str  # user file:line of its update


@dataclass(frozen=True)
class StatisticAverage:
    """A moving statistic the train_op moves toward a batch statistic (BatchNormalization's
    moving mean and variance), as wafer.kernels.normalization's MOVING_UPDATES say."""

    variable: str  # TF variable name
    statistic: str  # the tensor it moves toward (a batch_norm_training kernel's moment)
    update: str  # affine: v * a + s * b; delta: v - (v - s) * d
    constants: tuple[float, ...]  # (a, b) or (d,), float32 values
    shape: Shape
    source: str  # user file:line of the assign op
    op: str = ""  # the assign op (else a state write of the batch: batch_writes.py)


@dataclass(frozen=True)
class Objective:
    """One of several losses the train_op minimizes in one step (a GAN's discriminator and
    generator losses) and the variables whose gradients are its."""

    loss: str  # the TF tensor
    variables: tuple[str, ...]
    source: str  # user file:line of the loss
    loss_kernel: str = ""  # its loss kernel (match)


@dataclass(frozen=True)
class GatedStateWrite:
    """A write of frozen state from the batch under a tf.cond on the global step
    (training/copies.py): written on the steps `predicate` is 1."""

    op: str  # the assign op imported from the cond's branch
    cond: str  # the user's tf.cond (the step's reads it waits for order the write)
    predicate: Schedule
    step_offset: int  # 1: the predicate reads the global step after its increment


@dataclass(frozen=True)
class TrainingSpec:
    """What the train_op does, proven from the graph (coordinator.compiler.training)."""

    optimizer: OptimizerConfig
    variables: tuple[TrainedVariable, ...]  # by name; every other variable is frozen
    transforms: tuple[GradientTransform, ...] = ()  # applied in order to d(loss)/d(var)
    # further optimizers of the loss and their variables (`optimizer`: every other variable)
    optimizer_groups: tuple[OptimizerGroup, ...] = ()
    statistic_averages: tuple[StatisticAverage, ...] = ()  # batch norm's moving statistics
    # a float16 program's loss scale S: the backward is seeded with S x the loss's gradient
    # (the transforms then hold the optimizer's 1 / S); float32 programs fold S away (1.0)
    loss_scale: float = 1.0
    schedules: tuple[Schedule, ...] = ()  # hyper-parameters computed per step (these override)
    moving_averages: tuple[MovingAverage, ...] = ()  # ExponentialMovingAverage.apply
    weight_writes: tuple[WeightWrite, ...] = ()  # decoupled weight decay written by hand
    # dynamic loss scaling (loss_scale is then the scale's initial value)
    dynamic_loss_scale: Rule | None = None
    step_counts_applied: bool = False  # its skipped steps leave the global step (TF's wrapper)
    # several losses minimized in one step, in the order of their first update: each
    # variable takes its objective's gradient (none: every gradient is the loss's)
    objectives: tuple[Objective, ...] = ()
    # the updates run inside a tf.cond on a value of the global step (gradient accumulation)
    conditional_update: ConditionalUpdate | None = None
    # writes of frozen state from the step's values (the assign ops: batch_writes.py)
    state_writes: tuple[str, ...] = ()
    gated_state_writes: tuple[GatedStateWrite, ...] = ()  # those under a tf.cond
    # weights further optimizers update again after their first update, in TF's order
    reupdates: tuple[Reupdate, ...] = ()

    @property
    def state_variables(self) -> tuple[str, ...]:
        """Variables the CS holds besides the weights: the average's shadows, what the
        schedules read, carried states (a ring pointer) and a dynamic loss scale's variables
        (loaded with the weights, checkpointed under their TF names)."""
        schedules = (*self.schedules, *(m.factor for m in self.moving_averages))
        dynamic = self.dynamic_loss_scale
        return tuple(dict.fromkeys([*(m.shadow for m in self.moving_averages),
                                    *(v for s in schedules for v in s.variables),
                                    *(w.variable for w in self.weight_writes
                                      if w.carried_dtype),
                                    *(dynamic.state if dynamic else ()),
                                    *(a for _, a in (self.conditional_update.accumulators
                                                     if self.conditional_update else ()))]))

    @property
    def trained(self) -> frozenset[str]:
        return frozenset(v.name for v in self.variables)

    def update(self, variable: str) -> str:
        """"dense" or "sparse" for a trained variable, "" for a frozen one."""
        for v in self.variables:
            if v.name == variable:
                return v.update
        return ""


@dataclass(frozen=True)
class WeightProgram:
    """Computations on weights alone before they meet the samples (wafer.weight_programs):
    generic kernels run on a batch of one over `sources`; a kernel param whose variable is
    one of its kernels' names reads that value (a derived weight)."""

    sources: tuple[ParamRef, ...]  # the variables it reads (TF's shape)
    kernels: tuple[KernelNode, ...]  # inputs: sources' variables or earlier kernels

    @property
    def derived(self) -> frozenset[str]:
        return frozenset(k.name for k in self.kernels)

    def sources_of(self, name: str) -> tuple[str, ...]:
        """The variables the value `name` is computed from."""
        nodes = {k.name: k for k in self.kernels}
        seen, stack = {name}, [name]
        while stack:
            value = stack.pop()
            if value in nodes:
                fresh = [v for v in nodes[value].inputs if v not in seen]
                seen.update(fresh)
                stack.extend(fresh)
        return tuple(sorted(v for v in seen if v not in nodes))


@dataclass(frozen=True)
class MatchedModel:
    """The user's model as library kernels (match's result)."""

    inputs: tuple[InputSpec, ...]
    kernels: tuple[KernelNode, ...]  # topological order
    loss_kernel: str  # "" in predict mode
    outputs: tuple[str, ...]  # kernels/inputs streamed back to the host
    training: TrainingSpec | None  # None unless in train mode
    unsupported: tuple[UnsupportedOp, ...] = field(default=())
    weight_program: WeightProgram | None = None
    # the loss model_fn returns when the optimizer minimizes another (loss_kernel's): reported
    reported_loss_kernel: str = ""
    # regularized Keras weights whose penalty model_fn never computes (tf_model.keras_regularizers)
    unpenalized_regularizers: tuple[str, ...] = ()

    @property
    def optimizer(self) -> OptimizerConfig | None:
        return None if self.training is None else self.training.optimizer

    @property
    def num_parameters(self) -> int:
        """The variables the kernels and the weight program hold, each once (a shared
        weight is one; a derived weight is none)."""
        program = self.weight_program
        derived = program.derived if program is not None else frozenset()
        shapes = {p.variable: p.variable_shape or p.shape for k in self.kernels for p in k.params
                  if p.variable not in derived}
        shapes.update({p.variable: p.shape for p in (program.sources if program else ())})
        return sum(int(np.prod(shape)) for shape in shapes.values())
