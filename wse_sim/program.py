"""A loaded program, checked: its kernels built from the library, their shapes and dtypes
chained from the program's inputs, and the weights and optimizer state complete and of the
right shapes. Every refusal names the kernel or tensor and both shapes."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Collection, Mapping, Sequence

import numpy as np

from cs_api import cs_api_pb2 as pb
from cs_api.attrs import from_attr
from cs_api.input_spec import InputSpec
from cs_api.tensors import from_tensor
from wafer.conditional_updates import ConditionalUpdate
from wafer.conditional_updates import problem as conditional_problem
from wafer.grad_transforms import GradientTransform
from wafer.kernels import Kernel, KernelError, build_kernel
from wafer.loss_scaling import Rule, of_program
from wafer.loss_scaling import problem as loss_scaling_problem
from wafer.moving_averages import FACTOR, MovingAverage
from wafer.optimizers import (
    SCHEDULABLE,
    Optimizer,
    OptimizerConfig,
    OptimizerGroup,
    Reupdate,
    config_problem,
    make_optimizer,
    make_optimizers,
    slot_name,
)
from wafer.precision import PRECISIONS, wafer_dtype
from wafer.regularizers import Regularizer
from wafer.schedules import Schedule, schedule_problem
from wafer.timing import count_backward_passes
from wafer.weight_programs import WeightProgram, WeightStep
from wafer.weight_writes import WeightWrite, write_problem
from wse_sim.errors import invalid
from wse_sim.view_slices import whole_rows_problem

Shape = tuple[int, ...]


@dataclass(frozen=True)
class ParamSpec:
    """How the CS trains one TF variable (its Param message)."""

    frozen: bool = False  # never updated (gradients still flow through its kernel)
    regularizers: tuple[Regularizer, ...] = ()
    update: str = "dense"  # or "sparse": TF's rule for an IndexedSlices gradient


UPDATES = ("dense", "sparse")
# kernels whose weight gradient TF computes as IndexedSlices: type -> the tables' roles;
# a sparse weight operand (p<k>) of another generic kernel is a table TF gathers whole,
# e.g. Keras position embeddings: every row once, in order
SPARSE_GRADIENT_KERNELS = {"gather": ("p0",), "embedding_bag": ("p0",),
                           "sampled_logits": ("weights", "biases")}


@dataclass(frozen=True)
class WeightUse:
    """One kernel's read of a variable: its param `role` of kernel `kernel` (program index),
    seen through `view` (flat indices into the variable, shaped like the param) or, with
    None, the variable itself reshaped to `shape`."""

    kernel: int
    role: str
    shape: Shape
    view: np.ndarray | None = None


@dataclass(frozen=True)
class SharedWeight:
    """A variable read by several kernels, or through a static view: it lives once (in the
    region of its first use); the other uses read it, and their gradients are summed into
    its one gradient (wse_sim.shared_weights)."""

    variable: str
    shape: Shape  # the variable's (TF's) shape
    uses: tuple[WeightUse, ...]  # program order; the first holds the variable


@dataclass(frozen=True)
class Objective:
    """One of several losses minimized in one step: its loss kernel seeds a backward pass
    whose gradients its variables take (wse_sim.pipeline)."""

    loss_kernel: str
    variables: frozenset[str]


@dataclass(frozen=True)
class CheckedProgram:
    """What the executor needs, in program order."""

    message: pb.Program
    inputs: tuple[InputSpec, ...]
    kernels: tuple[Kernel, ...]
    sources: tuple[tuple[str, ...], ...]
    variables: tuple[dict[str, str], ...]  # role -> TF variable name, per kernel
    optimizer: OptimizerConfig | None
    params: dict[str, ParamSpec] = field(default_factory=dict)  # by TF variable name
    transforms: tuple[GradientTransform, ...] = ()
    views: Mapping[str, tuple[Shape, Shape]] = field(default_factory=dict)  # var -> (TF, kernel) shapes
    schedules: tuple[Schedule, ...] = ()  # hyper-parameters computed before every training step
    moving_averages: tuple[MovingAverage, ...] = ()  # updated after every training step

    @property
    def state_variables(self) -> dict[str, str]:
        """State besides weights and optimizer state: shadow -> its weight, accumulator -> its
        weight, and the schedules' variables (-> "")."""
        schedules = (*self.schedules, *(m.factor for m in self.moving_averages))
        dynamic = self.dynamic_loss_scale
        conditional = self.conditional_update
        return {**{m.shadow: m.variable for m in self.moving_averages},
                **{v: "" for s in schedules for v in s.variables},
                **{w.variable: "" for w in self.weight_writes if w.carried_dtype},
                **({v: "" for v in dynamic.state} if dynamic else {}),
                **({a: v for v, a in conditional.accumulators} if conditional else {})}
    shared: Mapping[str, SharedWeight] = field(default_factory=dict)  # by variable
    dynamic_loss_scale: Rule | None = None  # its variables are state
    step_counts_applied: bool = False  # (dynamic loss scaling) a skipped step does not count
    # the weight program (None: none) and the derived weights its kernels compute, by name
    weight_program: WeightProgram | None = None
    derived: Mapping[str, Shape] = field(default_factory=dict)
    weight_writes: tuple[WeightWrite, ...] = ()  # a weight's writes besides its update
    optimizer_groups: tuple[OptimizerGroup, ...] = ()  # further optimizers and their variables
    objectives: tuple[Objective, ...] = ()  # several losses minimized in one step (a GAN's)
    conditional_update: ConditionalUpdate | None = None  # the updates run when its predicate holds
    reupdates: tuple[Reupdate, ...] = ()  # weights further optimizers update again, in order

    def make_optimizer(self) -> Optimizer | None:
        """The step's optimizer (with groups, one updating each variable by its group's)."""
        return None if self.optimizer is None else make_optimizers(self.optimizer,
                                                                   self.optimizer_groups)

    def state_dtype(self, name: str) -> np.dtype:
        """float32, but a dynamic loss scale's counters are TF's int64 and a carried
        state's (a ring pointer) its own."""
        carried = next((w.carried_dtype for w in self.weight_writes
                        if w.carried_dtype and w.variable == name), "")
        if carried:
            return np.dtype(carried)
        dynamic = self.dynamic_loss_scale
        return np.dtype(dynamic.state.get(name, np.float32) if dynamic else np.float32)

    @property
    def num_parameters(self) -> int:
        return sum(math.prod(shape) for shape in self.variable_shapes().values())

    def variable_shapes(self) -> dict[str, Shape]:
        """Every weight's shape as TF (and the state Load takes and Snapshot gives) has it."""
        shapes = {var: self.shared[var].shape if var in self.shared else
                  self.views[var][0] if var in self.views else tuple(k.param_shapes()[role])
                  for k, names in zip(self.kernels, self.variables) for role, var in names.items()
                  if var not in self.derived}
        return {**shapes, **{var: w.shape for var, w in self.shared.items()}}

    def reshaped(self, state: Mapping[str, np.ndarray], to_kernels: bool) -> dict[str, np.ndarray]:
        """`state` with viewed weights and their slots ("<var>/<suffix>") in their kernel's
        shape (to_kernels), or back in TF's."""
        out = dict(state)
        for name, array in state.items():
            var = name if name in self.views else \
                self.state_variables.get(name) or name.rsplit("/", 1)[0]
            if var in self.views:
                tf_shape, kernel_shape = self.views[var]
                out[name] = array.reshape(kernel_shape if to_kernels else tf_shape)
        return out


def check_program(program: pb.Program) -> CheckedProgram:
    """Build every kernel; refuse unknown kernels and shapes that do not chain."""
    if program.batch_size <= 0 or program.micro_batch_size <= 0 or \
            program.batch_size % program.micro_batch_size:
        raise invalid(f"program {program.name!r}: batch size {program.batch_size} is not a "
                      f"multiple of micro-batch size {program.micro_batch_size}")
    shapes: dict[str, Shape] = {}
    dtypes: dict[str, np.dtype] = {}
    inputs = []
    for spec in program.inputs:
        try:
            inputs.append(InputSpec.from_proto(spec))
        except ValueError:
            raise invalid(f"program input {spec.name!r} has no dtype") from None
        shapes[spec.name], dtypes[spec.name] = inputs[-1].shape, wafer_dtype(inputs[-1].dtype)
    if not inputs:
        raise invalid(f"program {program.name!r} has no inputs")
    kernels: list[Kernel] = []
    sources: list[tuple[str, ...]] = []
    variables: list[dict[str, str]] = []
    params: dict[str, ParamSpec] = {}
    views: dict[str, tuple[Shape, Shape]] = {}
    uses: dict[str, list[WeightUse]] = {}
    tf_shapes: dict[str, Shape] = {}
    for message in program.kernels:
        if message.name in shapes:
            raise invalid(f"kernel {message.name!r}: the name is used twice")
        missing = [s for s in message.inputs if s not in shapes]
        if missing or not message.inputs:
            raise invalid(f"kernel {message.name!r} ({message.type}): input {missing[0] if missing else '(none)'!r} "
                          f"is neither a program input nor an earlier kernel")
        input_shapes = [shapes[s] for s in message.inputs]
        attrs = {}
        for key, value in message.attrs.items():
            try:
                attrs[key] = from_attr(value)
            except ValueError as error:
                raise invalid(f"kernel {message.name!r} ({message.type}): attribute {key!r}: "
                              f"{error}") from None
        if attrs.get("precision", "float32") not in PRECISIONS:
            raise invalid(f"kernel {message.name!r} ({message.type}): precision "
                          f"{attrs['precision']!r}; the CS computes in {', '.join(PRECISIONS)}")
        try:
            kernel = build_kernel(message.type, message.name, attrs, input_shapes)
            out = tuple(kernel.output_shape)
            expected_params = kernel.param_shapes()
            dtype = kernel.output_dtype([dtypes[s] for s in message.inputs])
        except KernelError as error:
            raise invalid(f"{error} (inputs {', '.join(map(str, input_shapes))})") from None
        declared = tuple(int(d) for d in message.output_shape)
        if declared != out:
            raise invalid(f"kernel {message.name!r} ({message.type}): output shape {declared} in the "
                          f"program, the kernel computes {out} from inputs {input_shapes}")
        roles = {}
        for param in message.params:
            tf_shape = () if param.scalar_variable else tuple(param.variable_shape) or tuple(param.shape)
            view = _view(message, param, tf_shape)
            if view is None and math.prod(tf_shape) != math.prod(param.shape):
                raise invalid(f"kernel {message.name!r}: param {param.variable!r} of shape "
                              f"{tf_shape} cannot be viewed as {tuple(param.shape)}")
            if view is None and tf_shape != tuple(param.shape):
                views[param.variable] = (tf_shape, tuple(param.shape))
            if tf_shapes.setdefault(param.variable, tf_shape) != tf_shape:
                raise invalid(f"kernel {message.name!r}: variable {param.variable!r} is "
                              f"{tf_shape} here, {tf_shapes[param.variable]} in an earlier kernel")
            uses.setdefault(param.variable, []).append(
                WeightUse(len(kernels), param.role, tuple(param.shape), view))
            if param.role not in expected_params:
                raise invalid(f"kernel {message.name!r} ({message.type}): unknown param role "
                              f"{param.role!r}; it has {sorted(expected_params) or 'none'}")
            if tuple(param.shape) != tuple(expected_params[param.role]):
                raise invalid(f"kernel {message.name!r}: param {param.variable!r} is "
                              f"{tuple(param.shape)} in the program, the kernel needs "
                              f"{tuple(expected_params[param.role])}")
            roles[param.role] = param.variable
            trains = param_spec(message, kernel, param)
            if params.setdefault(param.variable, trains) != trains:
                raise invalid(f"kernel {message.name!r}: variable {param.variable!r} is read by "
                              f"an earlier kernel that trains it otherwise ({params[param.variable]} "
                              f"there, {trains} here)")
        if set(roles) != set(expected_params):
            raise invalid(f"kernel {message.name!r} ({message.type}): params "
                          f"{sorted(expected_params)} needed, the program names {sorted(roles)}")
        shapes[message.name], dtypes[message.name] = out, dtype
        kernels.append(kernel)
        sources.append(tuple(message.inputs))
        variables.append(roles)
    names = {k.name: k for k in kernels}
    if program.loss_kernel and (program.loss_kernel not in names or
                                not names[program.loss_kernel].is_loss):
        raise invalid(f"program {program.name!r}: loss kernel {program.loss_kernel!r} is not a "
                      f"loss kernel of the program")
    reported = program.reported_loss_kernel
    if reported and (reported not in names or not names[reported].is_loss or
                     reported == program.loss_kernel or not program.loss_kernel
                     or program.objectives):
        raise invalid(f"program {program.name!r}: reported loss kernel {reported!r} is not a "
                      f"loss kernel of the program besides the loss kernel (with no objectives)")
    ahead = {*ahead_kernels(kernels, sources, program.loss_kernel),
             *ahead_kernels(kernels, sources, reported)}
    for k, roles in zip(kernels, variables):
        if k.name in ahead and (roles or k.draws_random or k.draws_in_inference):
            raise invalid(f"program {program.name!r}: kernel {k.name!r} computes a denominator of "
                          f"the loss from weights or random numbers: a denominator depends on "
                          f"the program's inputs alone")
    for name in program.outputs:
        if name not in shapes:
            raise invalid(f"program {program.name!r}: output {name!r} is neither an input nor a kernel")
    optimizer = None
    if program.HasField("optimizer") and program.optimizer.type:
        optimizer = OptimizerConfig.from_message(program.optimizer)
        problem = config_problem(optimizer)
        if problem:
            raise invalid(f"program {program.name!r}: {problem}")
    weights, derived = check_weight_program(program, params, tf_shapes, uses)
    shared = {var: SharedWeight(var, tf_shapes[var], tuple(found)) for var, found in uses.items()
              if var not in derived and (weights is not None and var in weights.sources
                                         or len(found) > 1 or found[0].view is not None)}
    for var, weight in shared.items():
        views.pop(var, None)
        problem = sparse_problem(weight, params[var], kernels)
        if problem:
            raise invalid(f"variable {var!r}: {problem}")
    return CheckedProgram(program, tuple(inputs), tuple(kernels), tuple(sources),
                          tuple(variables), optimizer, params, check_transforms(program, params),
                          views, check_schedules(program, optimizer, params),
                          check_moving_averages(program, params), shared,
                          check_dynamic_loss_scale(program, optimizer), program.step_counts_applied,
                          weights, derived, check_weight_writes(program, params, derived),
                          check_optimizer_groups(program, optimizer, params),
                          check_objectives(program, names, params, sources, derived),
                          check_conditional_update(program, optimizer, params),
                          check_reupdates(program, params, derived))


def check_reupdates(program: pb.Program, params: Mapping[str, ParamSpec],
                    derived: Collection[str]) -> tuple[Reupdate, ...]:
    """Weights updated again by further optimizers: each a trained weight (no weight write
    or gradient transform to order around the second update, no penalty), by one of the program's
    optimizers with its own slots (as many as that optimizer keeps, no name of another's),
    from one of two objectives or more."""
    reupdates = tuple(Reupdate.from_message(m) for m in program.reupdates)
    optimizers = [OptimizerConfig.from_message(program.optimizer),
                  *(OptimizerConfig.from_message(g.optimizer) for g in program.optimizer_groups)]
    written = {w.variable for w in program.weight_writes}
    taken: set[str] = set()
    for index, r in enumerate(reupdates):
        spec = params.get(r.variable)
        problem = ""
        if spec is None or spec.frozen or r.variable in derived:
            problem = f"{r.variable!r} is not a trained weight of the program"
        elif r.variable in written or spec.regularizers:
            problem = f"{r.variable!r} is written besides its update or penalized"
        elif not 0 <= r.optimizer < len(optimizers):
            problem = f"optimizer {r.optimizer} is none of the program's {len(optimizers)}"
        elif not 0 <= r.objective < len(program.objectives):
            problem = f"objective {r.objective} is none of the program's {len(program.objectives)}"
        elif len(r.slots) != len(make_optimizer(optimizers[r.optimizer]).slot_suffixes) or \
                taken & set(r.slots):
            problem = f"its slots {', '.join(r.slots)} are not its optimizer's, each once"
        elif program.gradient_transforms or program.HasField("conditional_update") or \
                program.HasField("dynamic_loss_scale") or \
                program.HasField("cs1_dynamic_loss_scale"):
            problem = "gradient transforms, a conditional update or loss scaling beside it"
        if problem:
            raise invalid(f"program {program.name!r}: reupdate {index}: {problem}")
        taken.update(r.slots)
    return reupdates


def ahead_kernels(kernels: Sequence[Kernel], sources: Sequence[Sequence[str]],
                  loss_kernel: str) -> list[str]:
    """The kernels the loss's denominators are computed from (wafer.kernels.losses'
    BatchLoss), in program order: the executor runs them over the whole batch before the
    batch streams through, as they depend on the program's inputs alone."""
    names = [k.name for k in kernels]
    if loss_kernel not in names:
        return []
    loss = names.index(loss_kernel)
    needed = {sources[loss][j] for j in getattr(kernels[loss], "denominator_inputs", ())}
    for k in reversed(range(len(kernels))):
        if names[k] in needed:
            needed.update(sources[k])
    return [name for name in names if name in needed]


def check_weight_program(program: pb.Program, params: dict[str, ParamSpec],
                         tf_shapes: dict[str, Shape], uses: dict[str, list[WeightUse]],
                         ) -> tuple[WeightProgram | None, dict[str, Shape]]:
    """The weight program (wafer.weight_programs): its sources are variables (added to
    `params`, `tf_shapes` and `uses`, with no use of their own when no kernel reads them
    directly), its kernels weightless float32 kernels over them (or bool: a comparison
    tf.where reads); every kernel param naming one of its kernels (a derived weight) reads
    that kernel's float32 value, whole; a kernel with no
    input draws random numbers (a `random` kernel: the step's draw)."""
    if not program.HasField("weight_program"):
        return None, {}
    message = program.weight_program
    where = f"program {program.name!r}: weight program"
    shapes: dict[str, Shape] = {}
    dtypes: dict[str, np.dtype] = {}
    for source in message.sources:
        shape = tuple(int(d) for d in source.shape)
        update = source.update or "dense"
        regularizers = tuple(Regularizer(r.kind, r.scale, not r.unreported) for r in source.regularizers)
        problem = next((r.problem() for r in regularizers if r.problem()), "")
        if update != "dense" or problem or source.variable in shapes:
            raise invalid(f"{where}: source {source.variable!r}: "
                          f"{problem or 'read twice, or with a sparse update'}")
        spec = ParamSpec(source.frozen, regularizers, update)
        if tf_shapes.setdefault(source.variable, shape) != shape or \
                params.setdefault(source.variable, spec) != spec:
            raise invalid(f"{where}: source {source.variable!r} is {shape} ({spec}), a kernel "
                          f"reads it as {tf_shapes[source.variable]} ({params[source.variable]})")
        uses.setdefault(source.variable, [])
        shapes[source.variable], dtypes[source.variable] = shape, np.dtype(np.float32)
    steps = []
    for kernel_message in message.kernels:
        name = kernel_message.name
        missing = [s for s in kernel_message.inputs if s not in shapes]
        if name in shapes or missing or kernel_message.params or \
                not kernel_message.inputs and kernel_message.type != "random":
            raise invalid(f"{where}: kernel {name!r} must have a new name, no params and "
                          f"inputs among its sources and earlier kernels (none: a draw)")
        try:
            attrs = {key: from_attr(value) for key, value in kernel_message.attrs.items()}
            kernel = build_kernel(kernel_message.type, name, attrs,
                                  [shapes[s] for s in kernel_message.inputs])
            dtype = kernel.output_dtype([dtypes[s] for s in kernel_message.inputs])
        except (KernelError, ValueError) as error:
            raise invalid(f"{where}: {error}") from None
        out = tuple(kernel.output_shape)
        if tuple(kernel_message.output_shape) != out or dtype not in (np.float32, np.bool_) \
                or kernel.param_shapes():
            raise invalid(f"{where}: kernel {name!r} ({kernel_message.type}) computes a "
                          f"{dtype.name} {out}, the program says float32 (or bool) "
                          f"{tuple(kernel_message.output_shape)}, with no weights")
        shapes[name], dtypes[name] = out, dtype
        steps.append(WeightStep(kernel, tuple(kernel_message.inputs)))
    weights = WeightProgram([s.variable for s in message.sources], steps)
    derived = {name: shapes[name] for name in weights.names}
    for var, found in uses.items():
        if var in derived and (dtypes[var] != np.float32 or any(
                use.view is not None or use.shape != derived[var] for use in found)):
            raise invalid(f"{where}: a kernel reads its {dtypes[var].name} value {var!r} "
                          f"{derived[var]} other than whole or as a weight")
    return weights, derived


def check_dynamic_loss_scale(program: pb.Program, optimizer: OptimizerConfig | None) -> Rule | None:
    """The program's dynamic loss scale: valid, on a program that trains."""
    if program.HasField("dynamic_loss_scale") and program.HasField("cs1_dynamic_loss_scale"):
        raise invalid(f"program {program.name!r}: two dynamic loss scales (TF's and the CS-1's)")
    scaling = of_program(program)
    if scaling is None:
        if program.step_counts_applied and not program.conditional_update.finite:
            raise invalid(f"program {program.name!r}: step_counts_applied without a dynamic "
                          "loss scale or a finite test (only their skipped steps leave the "
                          "global step)")
        return None
    seeded = [k for k in program.kernels if k.name == program.loss_kernel and k.type == "loss"]
    problem = (loss_scaling_problem(scaling) or
               ("" if optimizer is not None and seeded else "the program does not train from "
                "a loss kernel (type 'loss') it could seed"))
    if problem:
        raise invalid(f"program {program.name!r}: dynamic loss scale: {problem}")
    return scaling


def check_conditional_update(program: pb.Program, optimizer: OptimizerConfig | None,
                             params: Mapping[str, ParamSpec]) -> ConditionalUpdate | None:
    """The program's update cond: valid (wafer.conditional_updates), on a program that
    trains, with no dynamic loss scale or moving average, and weight writes or objectives
    only beside updates the predicate gates variable by variable (no accumulators)."""
    if not program.HasField("conditional_update"):
        return None
    update = ConditionalUpdate.from_message(program.conditional_update)
    trained = {var: spec.update for var, spec in params.items() if not spec.frozen}
    problem = ("the program does not train" if optimizer is None else
               "with dynamic loss scaling or moving averages"
               if of_program(program) or program.moving_averages else
               "weight writes or objectives with updates the predicate does not gate variable "
               "by variable" if (program.weight_writes or program.objectives) and not update.both
               else conditional_problem(update, trained))
    if problem:
        raise invalid(f"program {program.name!r}: conditional update: {problem}")
    return update


def check_moving_averages(program: pb.Program,
                          params: Mapping[str, ParamSpec]) -> tuple[MovingAverage, ...]:
    """The program's moving averages: each of a weight of the program, once, its shadow no
    other tensor's name, its factor a valid schedule."""
    averages: list[MovingAverage] = []
    taken = set(params)
    for index, message in enumerate(program.moving_averages):
        average = MovingAverage.from_message(message)
        where = f"program {program.name!r}: moving average {index} ({average.shadow})"
        if average.variable not in params:
            raise invalid(f"{where}: {average.variable!r} is not a weight of the program")
        if not average.shadow or average.shadow in taken:
            raise invalid(f"{where}: its shadow's name is empty or taken")
        if average.step_offset not in (0, 1) or average.factor.hyper_parameter != FACTOR:
            raise invalid(f"{where}: a factor schedule of {FACTOR!r} and a step offset of 0 "
                          "or 1 needed")
        problem = schedule_problem(average.factor)
        if problem:
            raise invalid(f"{where}: {problem}")
        for var in average.factor.variables:
            if var in params:
                raise invalid(f"{where}: its factor reads {var!r}, a weight of the program")
        taken.add(average.shadow)
        averages.append(average)
    return tuple(averages)


def check_weight_writes(program: pb.Program, params: Mapping[str, ParamSpec],
                        derived: Mapping[str, Shape]) -> tuple[WeightWrite, ...]:
    """The program's weight writes: each of a weight of the program (not derived), once,
    its steps and factors valid (wafer.weight_writes); a trained weight's reading no other
    weight, a frozen weight's reading trained weights no write writes (a soft update)."""
    writes: list[WeightWrite] = []
    written = {message.variable for message in program.weight_writes}
    for index, message in enumerate(program.weight_writes):
        write = WeightWrite.from_message(message)
        where = f"program {program.name!r}: weight write {index} ({write.variable})"
        spec = params.get(write.variable)
        carried = {m.variable for m in program.weight_writes if m.carried_dtype}
        if write.carried_dtype:
            if spec is not None or not any(write.variable in m.sources
                                           for m in program.weight_writes if m.batch):
                raise invalid(f"{where}: a carried state is no weight of the program and "
                              "a source of a write of the batch")
        elif spec is None or spec.frozen != bool(write.sources or write.batch) or \
                write.variable in derived:
            raise invalid(f"{where}: not a trained weight of the program, or a frozen one "
                          "read by its write with trained weights or the batch's values")
        held = {k.name for k in program.kernels} | {i.name for i in program.inputs}
        unknown = next((name for name in write.batch if name not in held), None)
        if unknown is not None:
            raise invalid(f"{where}: its batch value {unknown!r} is no kernel or input of the "
                          "program")
        for source in write.sources if write.batch else ():
            if source not in carried:
                raise invalid(f"{where}: its source {source!r} is no carried state of the "
                              "program")
        for source in write.sources if not write.batch else ():
            source_spec = params.get(source)
            if source_spec is None or source_spec.frozen or source in derived or \
                    source in written:
                raise invalid(f"{where}: its source {source!r} is not a trained weight of "
                              "the program no write writes")
        if write.variable in {w.variable for w in writes}:
            raise invalid(f"{where}: the weight is written twice")
        problem = write_problem(write)
        if problem:
            raise invalid(f"{where}: {problem}")
        writes.append(write)
    return tuple(writes)


def check_objectives(program: pb.Program, kernels: Mapping[str, Kernel],
                     params: Mapping[str, ParamSpec], sources: Sequence[Sequence[str]],
                     derived: Collection[str]) -> tuple[Objective, ...]:
    """Several losses minimized in one step: two or more, each a loss kernel (no loss scale
    or denominator: one seed of its own), their variables every trained weight (not the
    weight program's values: `derived`), each once; the kernels' backward passes counted (the
    timing model's)."""
    objectives = [Objective(m.loss_kernel, frozenset(m.variables)) for m in program.objectives]
    named = [var for m in program.objectives for var in m.variables]
    trained = {var for var, spec in params.items() if not spec.frozen and var not in derived}
    problem = ""
    if not objectives:
        return ()
    if len(objectives) < 2:
        problem = "one objective: the loss kernel's gradients need none"
    elif program.HasField("dynamic_loss_scale") or program.HasField("cs1_dynamic_loss_scale"):
        problem = "dynamic loss scaling with several objectives"
    for o in objectives:
        kernel = kernels.get(o.loss_kernel)
        if problem:
            break
        if kernel is None or not kernel.is_loss:
            problem = f"{o.loss_kernel!r} is not a loss kernel of the program"
        elif kernel.attrs.get("loss_scale", 1.0) != 1.0 or \
                getattr(kernel, "denominator_inputs", ()):
            problem = f"loss kernel {o.loss_kernel!r} has a loss scale or a denominator"
    if not problem and (len(set(named)) != len(named) or set(named) != trained):
        problem = "the objectives' variables are not the trained weights, each once"
    if problem:
        raise invalid(f"program {program.name!r}: objectives: {problem}")
    count_backward_passes(list(kernels.values()), sources, [o.loss_kernel for o in objectives])
    return tuple(objectives)


def check_optimizer_groups(program: pb.Program, optimizer: OptimizerConfig | None,
                           params: Mapping[str, ParamSpec]) -> tuple[OptimizerGroup, ...]:
    """The further optimizers: each a valid one of trained weights no other group names, and
    none with dynamic loss scaling."""
    groups: list[OptimizerGroup] = []
    named: set[str] = set()
    for index, message in enumerate(program.optimizer_groups):
        group = OptimizerGroup.from_message(message)
        where = f"program {program.name!r}: optimizer group {index}"
        problem = config_problem(group.config) if optimizer is not None else "no optimizer"
        if not problem and (program.HasField("dynamic_loss_scale")
                            or program.HasField("cs1_dynamic_loss_scale")):
            problem = "dynamic loss scaling with several optimizers"
        for var in group.variables:
            if problem:
                break
            if var not in params or params[var].frozen:
                problem = f"{var!r} is not a trained weight of the program"
            elif var in named:
                problem = f"{var!r} is named twice"
            named.add(var)
        if problem or not group.variables and not any(
                r.optimizer == index + 1 for r in program.reupdates):
            raise invalid(f"{where}: {problem or 'names no variable'}")
        groups.append(group)
    scalars = [n for g in groups for n in make_optimizer(g.config).scalar_names]
    if optimizer is not None and groups:
        scalars += make_optimizer(optimizer).scalar_names
    if len(set(scalars)) != len(scalars):
        raise invalid(f"program {program.name!r}: two optimizers keep the scalars "
                      f"{', '.join(scalars)}")
    return tuple(groups)


def check_schedules(program: pb.Program, optimizer: OptimizerConfig | None,
                    params: Mapping[str, ParamSpec]) -> tuple[Schedule, ...]:
    """The program's schedules: each of a hyper-parameter its optimizer (the program's or an
    optimizer group's) may change per step, once, its ops well-typed, its variables not
    weights of the program."""
    schedules: list[Schedule] = []
    optimizers = [optimizer, *(OptimizerConfig.from_message(g.optimizer)
                               for g in program.optimizer_groups)]
    for index, message in enumerate(program.schedules):
        schedule = Schedule.from_message(message)
        where = f"program {program.name!r}: schedule {index} ({schedule.hyper_parameter})"
        if optimizer is None:
            raise invalid(f"{where}: the program has no optimizer")
        if not 0 <= schedule.optimizer < len(optimizers):
            raise invalid(f"{where}: optimizer {schedule.optimizer} is none of the program's "
                          f"{len(optimizers)}")
        config = optimizers[schedule.optimizer]
        assert config is not None
        allowed = SCHEDULABLE.get(config.type, ())
        if schedule.hyper_parameter not in allowed:
            raise invalid(f"{where}: the {config.type} optimizer's schedules may compute "
                          f"{', '.join(allowed)}")
        if any((s.optimizer, s.hyper_parameter) == (schedule.optimizer, schedule.hyper_parameter)
               for s in schedules):
            raise invalid(f"{where}: a second schedule of {schedule.hyper_parameter}")
        problem = schedule_problem(schedule)
        if problem:
            raise invalid(f"{where}: {problem}")
        for var in schedule.variables:
            if var in params:
                raise invalid(f"{where}: it reads {var!r}, a weight of the program")
        schedules.append(schedule)
    return tuple(schedules)


def _view(message: pb.Kernel, param: pb.Param, tf_shape: Shape) -> np.ndarray | None:
    """A param's static view of its variable (flat indices shaped like the param), checked."""
    if not param.HasField("view"):
        return None
    where = f"kernel {message.name!r}: param {param.variable!r}"
    try:
        view = from_tensor(param.view)
    except ValueError as error:
        raise invalid(f"{where}: view: {error}") from None
    if view.dtype != np.int64 or tuple(view.shape) != tuple(param.shape):
        raise invalid(f"{where}: its view is {view.dtype.name} {tuple(view.shape)}, it must be "
                      f"int64 {tuple(param.shape)} (the param's shape)")
    if view.size and (view.min() < 0 or view.max() >= math.prod(tf_shape)):
        raise invalid(f"{where}: its view indexes outside the variable's "
                      f"{math.prod(tf_shape)} elements")
    return view


def sparse_problem(weight: SharedWeight, spec: ParamSpec, kernels: list[Kernel]) -> str:
    """Why a shared or viewed weight cannot take TF's sparse update here ("" if it can):
    each use must be an embedding lookup of the whole table, or every use the one view of a
    gather's whole rows (wse_sim.view_slices)."""
    if spec.update != "sparse" or spec.frozen:
        return ""
    views = [use.view for use in weight.uses]
    if views[0] is not None:
        if not all(v is not None and np.array_equal(v, views[0]) for v in views):
            return ("a sparse (IndexedSlices) update of a viewed table needs every read to be "
                    "the one view")
        return whole_rows_problem(views[0], math.prod(weight.shape[1:]))
    for use in weight.uses:  # (a lookup's table, or the table read whole: [None] of it too)
        if use.view is not None or math.prod(use.shape) != math.prod(weight.shape) or \
                kernels[use.kernel].type_name not in SPARSE_GRADIENT_KERNELS and \
                "operands" not in kernels[use.kernel].attrs:
            return (f"a sparse (IndexedSlices) update needs every read to be a lookup in the "
                    f"whole table; kernel {kernels[use.kernel].name!r} reads a view of it")
    return ""


def param_spec(kernel_message: pb.Kernel, kernel: Kernel, param: pb.Param) -> ParamSpec:
    """A Param's training attributes, or the refusal naming what the CS cannot do."""
    where = f"kernel {kernel_message.name!r} ({kernel_message.type}): param {param.variable!r}"
    update = param.update or "dense"
    if update not in UPDATES:
        raise invalid(f"{where}: unknown update {param.update!r}; the CS system has "
                      f"{', '.join(UPDATES)}")
    tables = SPARSE_GRADIENT_KERNELS.get(kernel.type_name)
    whole = tables is None and "operands" in kernel.attrs and param.role.startswith("p")
    if update == "sparse" and (param.role not in (tables or ()) or getattr(kernel, "depth", 1) > 1) \
            and not whole:
        raise invalid(f"{where}: a sparse update needs the table of a gather kernel (an "
                      f"embedding lookup) or a weight operand TF gathers whole, not the "
                      f"{param.role!r} of a {kernel.type_name}")
    regularizers = tuple(Regularizer(r.kind, r.scale, not r.unreported) for r in param.regularizers)
    for r in regularizers:
        if r.problem():
            raise invalid(f"{where}: {r.problem()}")
    if update == "sparse" and regularizers and not param.frozen:
        raise invalid(f"{where}: a regularized weight's gradient is dense in TensorFlow (the "
                      f"regularizer's gradient is added to the lookup's): its update is dense")
    return ParamSpec(param.frozen, regularizers, update)


def check_transforms(program: pb.Program,
                     params: Mapping[str, ParamSpec]) -> tuple[GradientTransform, ...]:
    """The program's gradient transforms, each naming trained variables of the program."""
    transforms = []
    for index, message in enumerate(program.gradient_transforms):
        where = f"program {program.name!r}: gradient transform {index} ({message.kind})"
        try:
            transform = GradientTransform.from_message(message)
        except ValueError as error:
            raise invalid(f"{where}: {error}") from None
        unknown = next((w for w in transform.weights if w not in params), None)
        if unknown is not None:
            raise invalid(f"{where}: it reads {unknown!r}, not a variable of the program")
        for var in transform.variables:
            if var not in params:
                raise invalid(f"{where}: {var!r} is not a variable of the program")
            if params[var].frozen:
                raise invalid(f"{where}: {var!r} is frozen (not trained): it has no gradient")
        transforms.append(transform)
    return tuple(transforms)


def state_shapes(checked: CheckedProgram) -> dict[str, Shape]:
    """Every tensor a job's state may hold (float32): the weights, their optimizer slots
    and the optimizer's scalars."""
    shapes = checked.variable_shapes()
    optimizer = checked.make_optimizer()
    expected: dict[str, Shape] = dict(shapes)
    for var, shape in shapes.items():
        suffixes = optimizer.for_variable(var).slot_suffixes if optimizer else ()
        expected.update({slot_name(var, suffix): shape for suffix in suffixes})
    if optimizer:
        expected.update({name: () for name in optimizer.scalar_names})
    expected.update({slot: shapes[r.variable] for r in checked.reupdates for slot in r.slots})
    expected.update({name: shapes[var] if var else () for name, var
                     in checked.state_variables.items()})
    return expected


def check_state(checked: CheckedProgram, tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The complete job state: every weight given with its shape; optimizer slots and
    scalars may be missing (they start as TF starts them: wafer.optimizers)."""
    shapes = checked.variable_shapes()
    expected = state_shapes(checked)
    for name, array in tensors.items():
        if name not in expected:
            raise invalid(f"tensor {name!r} {tuple(array.shape)} is not a weight or optimizer "
                          f"slot of the program")
        if tuple(array.shape) != expected[name]:
            raise invalid(f"tensor {name!r} is {tuple(array.shape)}, the program needs "
                          f"{expected[name]}")
        if array.dtype != checked.state_dtype(name):
            raise invalid(f"tensor {name!r} is {array.dtype.name}, the program needs "
                          f"{checked.state_dtype(name).name}")
    missing = [var for var in [*shapes, *checked.state_variables] if var not in tensors]
    if missing:
        raise invalid(f"weight {missing[0]!r} {expected[missing[0]]} is missing"
                      + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    return checked.reshaped(tensors, to_kernels=True)
