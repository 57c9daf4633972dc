"""The layer-pipelined executor: every kernel of the program is resident on its region for
the whole job, owning its weights, gradient accumulator and optimizer slots.

A batch of B samples streams through as M = B / micro_batch_size micro-batches on a clock
of ticks (`wse_sim.ticks`: region k + 1 works on micro-batch i while region k works on
i + 1, gradients flow back the same way, a batch barrier holds M - 1 ticks). Each region
adds its micro-batches' weight gradients into its accumulator and updates its weights in
place once its backward pass of the batch ends. The result is ordinary mini-batch training; `wafer.timing` says how long
the wafer would take.

Training follows the train op, not just the loss: only a region whose output reaches the
loss, with a trained weight at or upstream of it (through differentiable inputs), runs
backward; frozen weights pass gradients on but never move. Once a batch's gradients are
complete, regularizer gradients are added (once per batch), the program's gradient
transforms run over all of them (after every stage finished its backward pass), then the
optimizer updates every trained weight (an embedding table by TF's sparse rule, from the
batch's IndexedSlices). Dropout and random numbers draw from a stream of (seed, position,
global step).

Multireplica: R copies of the network each take B / R consecutive samples of the batch (a
whole number of micro-batches). On the host the replicas' micro-batches run through the
same regions in batch order; each replica's weight gradients accumulate apart, and at each
replica's last micro-batch a region adds them to the replicas' sum in replica order
((g_0 + g_1) + g_2 ...), so the one update sees the sum of the replicas' gradients: a
one-replica run's gradient up to the order of its float32 additions.

On the host, consecutive regions are grouped into stages balanced by their FLOPs
(`wse_sim.stages`), each stage a thread working through its regions' share of the tick
schedule, in tick order, waiting for the activations and gradients its neighbours hand it.
Every region therefore sees its micro-batches in the same order, and a gradient fed by
several consumers is summed in the same order (the later consumer first), whatever the
number of stages. A kernel splits its large GEMMs into tiles fixed by their shapes; a
thread waiting for its neighbours, or with no stage of its own, computes tiles of the
others (so the largest region no longer bounds the batch). The arithmetic is therefore
bit-identical whatever the number of threads.
"""
from __future__ import annotations

import types
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Callable, Mapping, Sequence

import numpy as np

from wafer.conditional_updates import ConditionalUpdate, accumulate
from wafer.grad_transforms import GradientTransform, apply_transforms
from wafer.kernels import Kernel, RunContext
from wafer.kernels.losses import BatchLoss
from wafer.loss_scaling import Rule, all_finite
from wafer.moving_averages import MovingAverage
from wafer.moving_averages import update as update_average
from wafer.optimizers import Optimizer, Reupdate, finish_updated, slot_name
from wafer.precision import is_half, round_half, round_half_, round_half_into, widened
from wafer.schedules import Schedule, evaluate
from wafer.weight_programs import WeightProgram
from wafer.weight_writes import WeightWrite
from wafer.weight_writes import apply as write_weight
from wse_sim import ticks
from wse_sim.program import (
    SPARSE_GRADIENT_KERNELS,
    CheckedProgram,
    Objective,
    ParamSpec,
    SharedWeight,
    ahead_kernels,
)
from wse_sim.shared_weights import HeldGradient, SharedWeights
from wse_sim.stages import Board, StageThreads, one_blas_thread, partition

# A thread (a stage's or a helper's) pays off only with this much work per micro-batch (a
# multiply-add counts 2): below it, handing activations over and taking turns on the GIL
# cost more than the second core gives (measured: the 8x8 CNN example, ~0.2 MFLOP per
# sample, is slower on two threads; FC-MNIST, ~3 MFLOP per sample of training, is faster).
MIN_STAGE_FLOPS = 16e6
# A dense weight's update is split into ranges of rows of at least this many elements.
UPDATE_TILE_ELEMENTS = 1 << 17


@dataclass
class Region:
    """One kernel on its rectangle of cores, with everything it keeps for the job."""

    kernel: Kernel
    position: int
    sources: tuple[str, ...]  # program inputs or earlier kernels
    variables: dict[str, str]  # role -> TF variable name
    params: dict[str, np.ndarray]  # role -> weights (updated in place)
    specs: dict[str, ParamSpec]  # role -> how it trains
    rng: np.random.Generator | None = None  # this step's own stream (dropout, random)
    backward: bool = False  # runs a backward pass (see Pipeline._mark_backward)
    trained: tuple[str, ...] = ()  # roles the optimizer updates (a shared weight's: none)
    collects: tuple[str, ...] = ()  # roles whose IndexedSlices pieces it collects (lookups)
    grads: dict[str, np.ndarray] = field(default_factory=dict)  # gradient accumulators
    slots: dict[str, list[np.ndarray]] = field(default_factory=dict)  # role -> optimizer slots
    scratch: dict[str, list[np.ndarray]] = field(default_factory=dict)  # role -> 2 arrays
    # sparse roles: the batch's IndexedSlices pieces (ids, values), then the whole batch's
    pieces: dict[str, list[tuple[np.ndarray, np.ndarray]]] = field(default_factory=dict)
    slices: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    accumulated: bool = False  # the accumulators hold a micro-batch of this batch (replica)
    statistics: tuple = ()  # a batch barrier's statistics of this batch (RunContext.batch)
    # multireplica: the replicas' gradient sum so far (role -> array), and whether it has one
    replica_sum: dict[str, np.ndarray] = field(default_factory=dict)
    summed: bool = False
    input_grads: tuple[bool, ...] = ()
    # the consumers' gradients it sums, as (consumer position, input index), in tick order
    inflow: tuple[tuple[int, int], ...] = ()
    half: bool = False  # computes in float16 (wafer.precision)
    # computes a denominator of the loss from the program's inputs alone: runs over the
    # whole batch before the batch streams through (wse_sim.program.ahead_kernels)
    ahead: bool = False
    # the operands its kernel reads: `params`, or when half their float16 rounding (made at
    # Load, then by each update's tiles from the updated float32 master weights)
    compute: dict[str, np.ndarray] = field(default_factory=dict)
    # its backward's weight-gradient tiles still running (`Board.share`'s `later`): done
    # before its next backward and before anything reads its accumulators (`_settle`)
    pending: list = field(default_factory=list)


@dataclass
class _Again:
    """A reupdate (wafer.optimizers.Reupdate) of a region's weight (`region`, `role`) or a
    shared one (`region` None): its slots, and its objective's gradient (dense, or an
    embedding's IndexedSlices) kept from that objective's pass."""

    reupdate: Reupdate
    region: Region | None
    role: str
    slots: list[np.ndarray]
    scratch: list[np.ndarray]
    gradient: HeldGradient | None = None


@dataclass(frozen=True)
class StepOutput:
    loss: float
    outputs: dict[str, np.ndarray]  # requested kernel or input values, batch first
    applied: bool = True  # the update ran (dynamic loss scaling skips a non-finite step)


class Pipeline:
    """A program's kernels resident on their regions; runs batches in pipelined ticks, on
    up to `threads` threads, each with MIN_STAGE_FLOPS of work per micro-batch: as many
    stages (at most one per region), the others helping with the stages' GEMM tiles.

    `params` (by TF variable, default: dense, trained, unregularized) says which weights
    the optimizer updates and how; `transforms` change the batch's gradients before any
    update. Tensors of `state` that no region holds (e.g. slots of a frozen weight from an
    earlier run) are kept and handed back by `state()` unchanged."""

    def __init__(self, kernels: Sequence[Kernel], sources: Sequence[Sequence[str]],
                 variables: Sequence[Mapping[str, str]], state: Mapping[str, np.ndarray], *,
                 batch_size: int, micro_batch_size: int, loss_kernel: str,
                 optimizer: Optimizer | None, seed: int, threads: int = 1,
                 min_stage_flops: float = MIN_STAGE_FLOPS,
                 params: Mapping[str, ParamSpec] | None = None,
                 transforms: Sequence[GradientTransform] = (), replicas: int = 1,
                 schedules: Sequence[Schedule] = (),
                 moving_averages: Sequence[MovingAverage] = (),
                 shared: Mapping[str, SharedWeight] | None = None,
                 dynamic_loss_scale: Rule | None = None,
                 weight_program: WeightProgram | None = None,
                 weight_writes: Sequence[WeightWrite] = (),
                 objectives: Sequence[Objective] = (),
                 conditional_update: ConditionalUpdate | None = None,
                 reported_loss_kernel: str = "", reupdates: Sequence[Reupdate] = ()):
        self.batch_size = batch_size
        self.micro = micro_batch_size
        self.replicas = replicas
        self.replica_micros = batch_size // replicas // micro_batch_size  # micro-batches each
        self.loss_kernel = loss_kernel
        # the loss model_fn returns when the optimizer minimizes another: reported, not seeded
        self.reported_loss_kernel = reported_loss_kernel or loss_kernel
        self.optimizer = optimizer
        # several losses minimized in one step: a backward pass each (see `run`)
        self.objectives = tuple(objectives)
        self._objective: Objective | None = None  # the pass's (None: the loss's)
        self._held: dict[str, HeldGradient] = {}  # the earlier passes' gradients of theirs
        self.seed = seed % 2 ** 64  # SeedSequence entropy is non-negative
        self.transforms = tuple(t for t in transforms if t.kind not in ("zero", "noise_floor"))
        # (the exact 0s come last in program order: applied after the other transforms and
        # the finite test read TF's gradient; `zero` at the update, the noise floor, which
        # reads every gradient, once they are all complete)
        self.zeroed = frozenset(v for t in transforms if t.kind == "zero" for v in t.variables)
        self.floor = tuple(t for t in transforms if t.kind == "noise_floor")
        self.schedules = tuple(schedules)
        self.moving_averages = tuple(moving_averages)
        self.writes = {w.variable: w for w in weight_writes}
        self._step = 0  # the global step the running batch trains from
        self.dynamic = dynamic_loss_scale
        self._applying = True  # this step's update runs (dynamic loss scaling skips some)
        self.condition = conditional_update  # (or its predicate does not hold)
        self._penalty = 0.0  # the batch's weight penalties (in its loss)
        self._skipped: frozenset[str] = frozenset()  # variables the step does not update
        self._before: dict[str, np.ndarray] = {}  # sources' values before the step's updates
        self._after: dict[str, np.ndarray] = {}  # and after them
        self._scale = np.float32(1.0)  # the step's dynamic loss scale
        specs = params or {}
        self.shared = SharedWeights(shared or {}, specs, state, weight_program)
        self.regions: list[Region] = []
        for position, (kernel, srcs, names) in enumerate(zip(kernels, sources, variables)):
            weights = {role: self.shared.param(var, position, role) if var in self.shared else
                       np.array(state[var], dtype=np.float32, order="C")
                       for role, var in names.items()}
            self.regions.append(Region(kernel, position, tuple(srcs), dict(names), weights,
                                       {role: specs.get(var, ParamSpec())
                                        for role, var in names.items()},
                                       half=is_half(kernel.attrs) and not kernel.is_loss))
        self.by_name = {r.kernel.name: r for r in self.regions}
        for name in {*ahead_kernels(kernels, sources, loss_kernel),
                     *ahead_kernels(kernels, sources, self.reported_loss_kernel)}:
            self.by_name[name].ahead = True
        self.ahead = tuple(r for r in self.regions if r.ahead)
        for region in self.regions:
            region.compute = ({role: round_half(p) for role, p in region.params.items()}
                              if region.half else region.params)
        # a float16 program's loss scale S, seeded into its backward (wafer.kernels.losses)
        self.loss_scale = float(self.by_name[loss_kernel].kernel.attrs.get("loss_scale", 1.0)) \
            if loss_kernel in self.by_name else 1.0
        self._mark_backward()
        self.shared.bind(self.regions, optimizer, state, {
            region.variables[role] for region in self.regions if region.backward
            for role, spec in region.specs.items() if not spec.frozen})
        held: set[str] = set(self.shared.state(optimizer))
        for region in self.regions:
            held.update(region.variables.values())
            if optimizer is None or not region.backward:
                continue
            for role, var in region.variables.items():
                shape = region.params[role].shape
                region.grads[role] = np.zeros(shape, np.float32)
                if replicas > 1:
                    region.replica_sum[role] = np.zeros(shape, np.float32)
                if role not in region.trained:
                    continue
                if region.specs[role].update == "dense":
                    region.scratch[role] = [np.empty(shape, np.float32) for _ in range(2)]
                rule = optimizer.for_variable(var)
                region.slots[role] = [
                    np.array(state.get(slot_name(var, suffix), np.full(shape, initial, np.float32)),
                             dtype=np.float32, order="C")
                    for suffix, initial in zip(rule.slot_suffixes, rule.slot_initial_values)]
                held.update(slot_name(var, suffix) for suffix in rule.slot_suffixes)
        if optimizer is not None:
            optimizer.load_scalars(state)
            held.update(optimizer.scalar_names)
        self.reupdates = tuple(self._again(r, state) for r in reupdates) \
            if optimizer is not None else ()
        held.update(slot for r in reupdates for slot in r.slots)
        self.carried = {name: np.array(a) for name, a in state.items() if name not in held}
        costs = [self._cost(r) * micro_batch_size for r in self.regions]
        self.groups = partition(costs, threads) if self.regions else ()
        while len(self.groups) > 1 and \
                min(sum(costs[k] for k in group) for group in self.groups) < min_stage_flops:
            self.groups = partition(costs, len(self.groups) - 1)
        useful = int(sum(costs) // min_stage_flops) if min_stage_flops > 0 else threads
        self.threads = max(len(self.groups), min(threads, useful))
        self._threads = (StageThreads(self.threads, len(self.groups), "wse-pipeline")
                         if self.threads > 1 else None)
        self._plans: dict[tuple[int, bool, bool], tuple[ticks.Stage, ...]] = {}

    def _again(self, reupdate: Reupdate, state: Mapping[str, np.ndarray]) -> _Again:
        """A reupdate's weight (its region and role, or shared), its slots from `state` (or
        as TF starts them)."""
        var = reupdate.variable
        found = None if var in self.shared else next(
            (r, role) for r in self.regions for role, name in r.variables.items()
            if name == var and role in r.trained)
        value = self.shared.variables[var].value if found is None else found[0].params[found[1]]
        rule = self.optimizer.member(reupdate.optimizer).for_variable(var)  # type: ignore[union-attr]
        slots = [np.array(state.get(name, np.full(value.shape, initial, np.float32)),
                          dtype=np.float32, order="C")
                 for name, initial in zip(reupdate.slots, rule.slot_initial_values)]
        return _Again(reupdate, found and found[0], found[1] if found else "", slots,
                      [np.empty(value.shape, np.float32) for _ in range(2)])

    def _reupdate(self) -> None:
        """The reupdates, in TF's order, after every first update: each weight updated again
        by its optimizer from its objective's kept gradient, with its own slots."""
        for again in self.reupdates:
            r, region = again.reupdate, again.region
            rule = self.optimizer.member(r.optimizer).for_variable(r.variable)  # type: ignore[union-attr]
            if region is None:
                self.shared.reupdate(r.variable, rule, again.gradient, again.slots, again.scratch)
                continue
            var, gradient = region.params[again.role], again.gradient
            if isinstance(gradient, tuple):
                rule.apply_sparse(var, *gradient, again.slots)
            else:
                assert gradient is not None  # (its objective's pass kept it)
                rule.apply(var, gradient, again.slots, again.scratch)
            if region.half:
                round_half_into(var, region.compute[again.role])

    @classmethod
    def load(cls, checked: CheckedProgram, state: Mapping[str, np.ndarray], *, threads: int = 1,
             min_stage_flops: float = MIN_STAGE_FLOPS) -> "Pipeline":
        """The executor of a checked program and its checked state (check_state)."""
        program = checked.message
        return cls(checked.kernels, checked.sources, checked.variables, state,
                   batch_size=program.batch_size, micro_batch_size=program.micro_batch_size,
                   loss_kernel=program.loss_kernel,
                   optimizer=checked.make_optimizer(),
                   seed=program.seed, threads=threads, min_stage_flops=min_stage_flops,
                   params=checked.params, transforms=checked.transforms,
                   replicas=max(program.num_replicas, 1),
                   schedules=checked.schedules, moving_averages=checked.moving_averages,
                   shared=checked.shared, dynamic_loss_scale=checked.dynamic_loss_scale,
                   weight_program=checked.weight_program, weight_writes=checked.weight_writes,
                   objectives=checked.objectives,
                   conditional_update=checked.conditional_update,
                   reported_loss_kernel=program.reported_loss_kernel,
                   reupdates=checked.reupdates)

    def _mark_backward(self) -> None:
        """A region runs backward iff its output reaches the loss and a trained weight is
        at or upstream of it, both through differentiable inputs only (a frozen layer
        between trained ones passes gradients on; one with nothing trained upstream, or a
        stop_gradient, ends the backward pass). Its trained roles are its non-frozen ones."""
        if not self.loss_kernel:
            return
        trained_upstream: dict[str, bool] = {}
        for region in self.regions:
            trained_upstream[region.kernel.name] = \
                any(not spec.frozen for spec in region.specs.values()) or \
                any(trained_upstream.get(s, False) and region.kernel.input_differentiable(j)
                    for j, s in enumerate(region.sources))
        reaches = {o.loss_kernel for o in self.objectives} or {self.loss_kernel}
        for region in reversed(self.regions):
            if region.kernel.name in reaches:
                reaches.update(s for j, s in enumerate(region.sources)
                               if region.kernel.input_differentiable(j))
        for region in self.regions:
            name = region.kernel.name
            region.backward = name in reaches and trained_upstream[name]
            region.trained = tuple(role for role, spec in region.specs.items()
                                   if region.backward and not spec.frozen
                                   and region.variables[role] not in self.shared)
            region.collects = tuple(
                role for role, spec in region.specs.items() if region.backward
                and not spec.frozen and spec.update == "sparse"
                and region.kernel.type_name in SPARSE_GRADIENT_KERNELS)
        for region in self.regions:
            region.input_grads = tuple(
                s in self.by_name and self.by_name[s].backward
                and region.kernel.input_differentiable(j)
                for j, s in enumerate(region.sources))
        for region in self.regions:  # the later consumer's backward comes first
            region.inflow = tuple(sorted(
                ((c.position, j) for c in self.regions if c.backward
                 for j, (s, wanted) in enumerate(zip(c.sources, c.input_grads))
                 if wanted and s == region.kernel.name),
                key=lambda cj: (-cj[0], cj[1])))

    def _cost(self, region: Region) -> float:
        """A region's FLOPs per sample of training: forward, weight gradient, input gradient."""
        flops = region.kernel.flops_per_sample()
        if self.optimizer is None or not region.backward:
            return flops
        return flops * (1 + bool(region.params) + any(region.input_grads))

    @property
    def stages(self) -> int:
        return len(self.groups)

    def _plan(self, m_count: int, backward: bool, staged: bool) -> tuple[ticks.Stage, ...]:
        """The batch's tick schedule, split by stage (or whole, for one stage)."""
        key = (m_count, backward, staged)
        if key not in self._plans:
            groups = self.groups if staged else (range(len(self.regions)),)
            self._plans[key] = ticks.plan(self.regions, groups, m_count, backward)
        return self._plans[key]

    # ---- running batches ----
    def run(self, batch: Mapping[str, np.ndarray], *, training: bool,
            outputs: Sequence[str] = (), step: int = 0, index: int = 0) -> StepOutput:
        """One batch: forward (and when training, backward and update) through the pipeline.
        `step` is the global step the batch trains from: with the program's seed and a
        region's position it makes the region's random stream for the step (dropout,
        random), so a job resumed at step n draws what an unbroken one draws. Evaluation and
        prediction (whose step stays the checkpoint's) draw from a stream of the batch's
        `index` in the input too, apart from the training streams."""
        m_count = self.batch_size // self.micro
        backward = training and self.optimizer is not None and bool(self.loss_kernel)
        self._step = step
        if self.shared.program is not None and self.shared.program.draws:
            self._redraw(training, step, index)
        self._before = {var: value.copy() for var, value in self._sources(True).items()} \
            if backward else {}
        self._penalty = self._regularization() if self.loss_kernel else 0.0
        if backward and self.dynamic is not None:
            self._seed_scale(np.float32(self.carried[self.dynamic.scale_variable]))
        if backward and self.condition is not None:  # (a finite test: decided in the step)
            holds = self.condition.finite != "" or self.condition.runs(step, self.carried)
            self._applying = holds or self.condition.both
            self._skipped = self.condition.skipped(holds)
        if backward and self.schedules and self.optimizer is not None:
            values: dict[int, dict[str, np.float32]] = {}
            for s in self.schedules:  # (a schedule's variables are carried state)
                values.setdefault(s.optimizer, {})[s.hyper_parameter] = evaluate(
                    s, step, self.carried)
            for index, hyper_parameters in values.items():
                self.optimizer.member(index).set_hyper_parameters(hyper_parameters)
        # Several losses (a GAN's): a backward pass of each objective, seeded at its loss
        # kernel, each keeping its variables' gradients; the last pass's update applies them
        # all. The host recomputes the forward pass for each (the same weights and random
        # streams: the same activations, bit for bit) instead of holding them.
        self._held = {}
        for objective in (self.objectives if backward else ()) or (None,):
            self._objective = objective
            board = self._pass(batch, m_count, training, backward, step, index)
        self._objective = None
        if backward and self.optimizer is not None and self._applying:
            self._reupdate()
            finish_updated(self.optimizer, self._trained(), self._skipped,
                           (a.reupdate for a in self.reupdates))
            self._write_after_updates()
            self._write_state(board, m_count)
            self._update_averages(step)
        applied = not backward or self.dynamic is None and self.condition is None or self._applying
        if backward and self.dynamic is not None:
            self.carried.update(self.dynamic.advance(self.carried, self._applying))
        loss = self._loss(board, m_count) if self.loss_kernel else 0.0
        return StepOutput(loss, {name: np.concatenate([board.items["v", name, i]
                                                       for i in range(m_count)])
                                 for name in outputs}, applied)

    def _loss(self, board: Board, m_count: int) -> float:
        """The batch's loss: its (reported) loss kernel's values summed, and the weights'
        own (reported) terms."""
        return float(sum(np.sum(board.items["v", self.reported_loss_kernel, i], dtype=np.float32)
                         for i in range(m_count))) + self._penalty

    def _pass(self, batch: Mapping[str, np.ndarray], m_count: int, training: bool,
              backward: bool, step: int, index: int) -> Board:
        """The batch's forward pass through the pipeline, and when training its backward
        pass and (but in an objective's pass before the last) the update; its board."""
        board = Board(self.threads)
        for name, streamed in batch.items():
            array = widened(streamed)  # (a float16 stream's values, as float32)
            for i in range(m_count):
                board.items["v", name, i] = array[i * self.micro:(i + 1) * self.micro]
        for region in self.regions:
            region.accumulated = region.summed = False
            region.pieces.clear()
            region.slices.clear()
            region.pending.clear()  # (a failed batch's)
            if training and region.kernel.draws_random:
                region.rng = np.random.Generator(np.random.PCG64(
                    np.random.SeedSequence([self.seed, region.position, step])))
            elif region.kernel.draws_in_inference:
                region.rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(
                    [self.seed, region.position, step, index], spawn_key=(1,))))
        if self.loss_kernel:
            self._run_ahead(board, m_count, training)

        def work(stage: int, board: Board) -> None:
            if self.dynamic is None and (self.condition is None or not self.condition.finite):
                self._run_stage(stage, plan, board, training, backward)
                return
            with np.errstate(over="ignore", invalid="ignore"):  # a scale that overflows
                self._run_stage(stage, plan, board, training, backward)  # (then skipped)

        with one_blas_thread():
            plan = self._plan(m_count, backward, staged=True)
            if self._threads is None or not self._threads.run(work, board):
                plan = self._plan(m_count, backward, staged=False)  # one thread (or closed)
                board.threads = 1
                work(0, board)
        return board

    def _run_ahead(self, board: Board, m_count: int, training: bool) -> None:
        """The loss's denominators of the batch: the regions they are computed from (from
        the program's inputs alone) run every micro-batch first, leaving their values on the
        board for the pipeline, and the loss kernel (and the reported one) takes the whole
        batch's inputs."""
        losses = [self.by_name[name] for name in dict.fromkeys(
            (self.loss_kernel, self.reported_loss_kernel))]
        losses = [r for r in losses if isinstance(r.kernel, BatchLoss)
                  and r.kernel.denominator_inputs]
        if not losses:
            return
        ctx = RunContext(training=training, batch_size=self.batch_size, step=self._step)
        for region in self.ahead:
            if region.kernel.batch_barrier:  # (a row of the batch's labels)
                self._batch_statistics(region, m_count, board, ctx)
            for i in range(m_count):
                self._forward(region, i, board, ctx)
        ctx.batch = ()
        for loss in losses:
            assert isinstance(loss.kernel, BatchLoss)
            loss.kernel.set_batch([np.concatenate([board.get(("v", loss.sources[j], i))
                                                   for i in range(m_count)])
                                   for j in loss.kernel.denominator_inputs])

    def _batch_statistics(self, region: Region, m_count: int, board: Board,
                          ctx: RunContext) -> None:
        """A batch barrier's forward: the whole batch of every input first, then its
        statistics (the batch's, for every micro-batch's forward)."""
        wholes = [np.concatenate([board.get(("v", source, j)) for j in range(m_count)])
                  for source in region.sources]
        region.statistics = ctx.batch = (
            region.kernel.batch_statistics(region.params, wholes, ctx),)

    def _forward(self, region: Region, i: int, board: Board, ctx: RunContext) -> object:
        """Micro-batch i's forward pass through `region`: its output on the board, its cache
        returned."""
        ctx.rng, ctx.offset = region.rng, i * self.micro
        out, cache = region.kernel.forward(
            region.compute, [board.get(("v", s, i)) for s in region.sources], ctx)
        if region.half and out.dtype == np.float32 and not region.kernel.rounds_own_output:
            out = round_half(out)
        board.put(("v", region.kernel.name, i), out)
        return cache

    def _seed_scale(self, scale: np.float32) -> None:
        """Dynamic loss scaling: this step's backward carries the scale S (its seed and a
        weight penalty's gradient; the gradients are unscaled by 1 / S before the
        transforms: `_unscale`)."""
        assert self.dynamic is not None
        seed = self.dynamic.seed(scale)
        loss = self.by_name[self.loss_kernel].kernel
        assert isinstance(loss, BatchLoss), "check_program: a dynamic loss scale seeds a loss kernel"
        loss.set_loss_scale(seed)
        self.loss_scale = float(seed)
        self._scale = np.float32(scale)

    def _unscale(self) -> None:
        """Dynamic loss scaling: every gradient times 1 / S (float32, TF's reciprocal), and
        whether the update runs: the gradients the optimizer would apply are finite (the
        rule's test)."""
        assert self.dynamic is not None
        gradients = self._gradients()
        reciprocal = np.float32(1.0) / self._scale
        for grad in gradients.values():
            np.multiply(grad, reciprocal, out=grad)
        if self.transforms:
            apply_transforms(self.transforms, gradients, self._weights())
        self._applying = self.dynamic.finite(gradients.values())

    def _written(self, variable: str, weight: np.ndarray, before: bool) -> bool:
        """Whether the program writes `variable` besides its update at this time (before or
        after the update), having written `weight` in place."""
        write = self.writes.get(variable)
        if write is None or write.batch or write.carried_dtype or \
                (write.before_update and not write.sources) != before:
            return False  # (a frozen weight's write: after the updates, its sources as read)
        step = self._step + write.step_offset
        if write.predicate is not None and not evaluate(write.predicate, step, self.carried):
            return False
        read = self._before if write.before_update else self._after
        write_weight(write, weight, [evaluate(f, step, self.carried) for f in write.factors],
                     tuple(read[var] for var in write.sources))
        return True

    def _weights(self) -> dict[str, np.ndarray]:
        """Every weight's value by its TensorFlow name."""
        weights = {var: region.params[role] for region in self.regions
                   for role, var in region.variables.items()}
        weights.update({var: v.value for var, v in self.shared.variables.items()})
        return weights

    def _sources(self, before: bool) -> dict[str, np.ndarray]:
        """The trained weights the frozen weights' writes read before (or after) the step's
        updates, by name."""
        names = {var for write in self.writes.values() if write.before_update == before
                 and not write.batch for var in write.sources}
        if not names:
            return {}
        weights = self._weights()
        return {var: weights[var] for var in names}

    def _write_after_updates(self) -> None:
        """The weights' writes after the step's updates (decoupled weight decay), float16
        kernels' rounded copies and the shared weights' views and derived weights after."""
        if not self.writes:
            return
        self._after = self._sources(False)
        for region in self.regions:
            for role, var in region.variables.items():
                if var not in self.shared and (role in region.trained or var in self.writes
                                               and bool(self.writes[var].sources)) \
                        and self._written(var, region.params[role], before=False) and region.half:
                    round_half_into(region.params[role], region.compute[role])
        written = {var for var, v in self.shared.variables.items()
                   if self._written(var, v.value, before=False)}
        if written:
            self.shared.rewritten(written)
            self._round_shared()

    def _write_state(self, board: Board, m_count: int) -> None:
        """The writes of frozen state from the step's values of the whole batch (every
        micro-batch of every replica, in batch order), after the updates; each kernel
        holding the state (and its float16 copy, a shared weight's uses) takes the value. A
        carried state (a ring pointer) is written after the writes reading it."""
        for write in self.writes.values():  # (in program order: a source's write after)
            step = self._step + write.step_offset
            if write.predicate is not None and not evaluate(write.predicate, step, self.carried):
                continue  # (a write of the batch under a tf.cond: not this step)
            factors = [evaluate(f, step, self.carried) for f in write.factors]
            if write.carried_dtype:
                write_weight(write, self.carried[write.variable], factors)
                continue
            if not write.batch:
                continue
            batch = tuple(np.concatenate([board.items["v", name, i] for i in range(m_count)])
                          for name in write.batch)
            sources = tuple(self.carried[var] for var in write.sources)
            if write.variable in self.shared:
                write_weight(write, self.shared.variables[write.variable].value, factors,
                             sources, batch)
                self.shared.rewritten({write.variable})
                self._round_shared()
                continue
            value: np.ndarray | None = None
            for region in self.regions:
                for role, var in region.variables.items():
                    if var != write.variable:
                        continue
                    if value is None:
                        write_weight(write, region.params[role], factors, sources, batch)
                        value = region.params[role]
                    else:
                        np.copyto(region.params[role], value)
                    if region.half:
                        round_half_into(region.params[role], region.compute[role])

    def _update_averages(self, step: int) -> None:
        """The moving averages of the weights after the step's updates (their shadows are
        carried state)."""
        if not self.moving_averages:
            return
        weights = self._weights()
        for average in self.moving_averages:
            factor = evaluate(average.factor, step + average.step_offset, self.carried)
            update_average(self.carried[average.shadow], weights[average.variable], factor)

    def _redraw(self, training: bool, step: int, index: int) -> None:
        """A drawing weight program's values for the batch: one draw a training step (in
        evaluation and prediction, a batch), from a stream of the step apart from the
        regions' (a resumed run draws what an unbroken one draws)."""
        entropy, key = ([self.seed, step], 2) if training else ([self.seed, step, index], 3)
        self.shared.redraw(np.random.Generator(np.random.PCG64(
            np.random.SeedSequence(entropy, spawn_key=(key,)))))
        self._round_shared()

    def _round_shared(self) -> None:
        """Float16 kernels read a rounded copy of the shared and derived weights' values."""
        for region in self.regions:
            for role, var in region.variables.items():
                if region.half and var in self.shared:
                    round_half_into(region.params[role], region.compute[role])

    def _regularization(self) -> float:
        """The weights' own loss terms, at the weights the batch runs with."""
        return float(sum((reg.loss(r.params[role]) for r in self.regions
                          for role, spec in r.specs.items() for reg in spec.regularizers
                          if reg.reported
                          if r.variables[role] not in self.shared),
                         np.float32(0))) + self.shared.regularization()

    def _run_stage(self, index: int, plan: tuple[ticks.Stage, ...], board: Board, training: bool,
                   backward: bool) -> None:
        """A stage's tasks in tick order; training: its regions' gradients completed, every
        stage's gradients transformed (stage 0, once all are complete), its regions' updates."""
        stage = plan[index]
        ctx = RunContext(training=training, batch_size=self.batch_size, run_tiles=board.share,
                         step=self._step, replay=self._objective is not None
                         and self._objective is not self.objectives[0])
        caches: dict[tuple[int, int], object] = {}
        m_count = self.batch_size // self.micro
        for forward, region, i in stage.tasks:
            ctx.batch = region.statistics
            if forward:
                if region.kernel.batch_barrier and i == 0:
                    self._batch_statistics(region, m_count, board, ctx)
                if not region.ahead:  # (else its value is on the board: _run_ahead)
                    caches[region.position, i] = self._forward(region, i, board, ctx)
            else:
                if region.kernel.batch_barrier and i == 0:
                    self._gradient_statistics(region, m_count, caches, board, ctx)
                    ctx.batch = region.statistics
                self._backward(region, i, caches.pop((region.position, i)), board, ctx)
                if self.replicas > 1 and (i + 1) % self.replica_micros == 0:
                    _settle(region, board)
                    self._add_replica(region, last=(i + 1) * self.micro == self.batch_size)
        ctx.batch = ()
        if not backward or self.optimizer is None:  # (a backward step has an optimizer)
            return
        for region in stage.regions:
            _settle(region, board)
            self._complete_gradients(region)
        if self._reads_all_gradients():  # every stage's gradients first
            if index == 0:
                for other in range(1, len(plan)):
                    board.get(("gradients complete", other))
                self.shared.gather_gradients()
                if self.dynamic is not None:
                    self._unscale()
                elif self.transforms:
                    apply_transforms(self.transforms, self._gradients(), self._weights())
                if self.condition is not None and self.condition.finite:
                    self._applying = bool(np.isfinite(self._loss(board, m_count))) \
                        if self.condition.finite == "loss" else all_finite(self._gradients().values())
                if self.floor and (self._applying or self.condition is not None):
                    self._apply_floor()  # (an accumulated gradient: every step's)
                if self.condition is not None:
                    accumulate(self.condition, self._gradients(), self.carried, self._applying)
                board.put(("transformed",), True)
            else:
                board.put(("gradients complete", index), True)
                board.get(("transformed",))
        if self._objective is not None and self._keep(stage, index):
            return  # (an objective's pass before the last: no update yet)
        if not self._applying:  # a skipped step (dynamic loss scaling): no update
            return
        updates = []
        for region in stage.regions:
            for role in region.trained:
                if region.variables[role] in self._skipped:
                    continue
                if region.variables[role] in self.zeroed and role in region.grads:
                    np.multiply(region.grads[role], np.float32(0), out=region.grads[role])
                if region.variables[role] not in self.shared:
                    self._written(region.variables[role], region.params[role], before=True)
                rule = self.optimizer.for_variable(region.variables[role])
                if role in region.slices:
                    rule.apply_sparse(region.params[role], *region.slices.pop(role),
                                      region.slots[role])
                    if region.half:
                        round_half_into(region.params[role], region.compute[role])
                else:
                    updates += _update_tiles(rule, region, role,
                                             self._rounds_in_update(region, role))
        if index == 0 and self.shared:
            for var, grad in self.shared.gradients().items():
                if var in self.zeroed:
                    np.multiply(grad, np.float32(0), out=grad)
            updates.append(partial(self.shared.update, self.optimizer,
                                   partial(self._written, before=True), self._skipped))
        board.share(updates)
        if index == 0 and self.shared:  # float16 kernels read a rounded copy of the new values
            self._round_shared()

    def _keep(self, stage: ticks.Stage, index: int) -> bool:
        """An objective's pass ended its backward pass through the stage: its variables'
        gradients kept (copies), and in the last pass the earlier passes' put back for the
        update. Whether the pass is one before the last."""
        assert self._objective is not None
        mine, last = self._objective.variables, self._objective is self.objectives[-1]
        for again in self.reupdates:  # (before the last pass puts the first updates' back)
            if self.objectives[again.reupdate.objective] is not self._objective:
                continue
            region, role = again.region, again.role
            if region is None and index == 0:
                again.gradient = self.shared.held(frozenset({again.reupdate.variable}))[
                    again.reupdate.variable]
            elif region is not None and any(region is r for r in stage.regions):
                again.gradient = (region.slices[role][0].copy(), region.slices[role][1].copy()) \
                    if role in region.slices else region.grads[role].copy()
        for region in stage.regions:
            for role in region.trained:
                var = region.variables[role]
                if var in mine and not last:
                    self._held[var] = (region.slices[role][0].copy(), region.slices[role][1].copy()) \
                        if role in region.slices else region.grads[role].copy()
                elif var not in mine and last:
                    held = self._held[var]
                    if isinstance(held, tuple):
                        region.slices[role] = held
                    else:
                        np.copyto(region.grads[role], held)
        if index == 0 and self.shared:
            if last:
                self.shared.restore(self._held)
            else:
                self._held.update(self.shared.held(mine))
        return not last

    @staticmethod
    def _add_replica(region: Region, last: bool) -> None:
        """A replica's backward pass through `region` ended: add its gradients to the
        replicas' sum (the first replica's are copied), and after the last replica hand the
        sum to the accumulators the update reads."""
        if region.accumulated:
            for role, grad in region.grads.items():
                if region.summed:
                    region.replica_sum[role] += grad
                else:
                    np.copyto(region.replica_sum[role], grad)
            region.summed = True
        region.accumulated = False  # the next replica starts its own accumulation
        if last and region.summed:
            for role, total in region.replica_sum.items():
                np.copyto(region.grads[role], total)
            region.accumulated, region.summed = True, False

    def _complete_gradients(self, region: Region) -> None:
        """The batch's gradients of the region's trained weights: regularizer gradients
        added (once per batch), sparse ones assembled into one IndexedSlices in batch order."""
        if not region.accumulated:  # no micro-batch's gradient reached it: zero
            for grad in region.grads.values():
                grad.fill(0)
        if region.half and region.kernel.type_name not in SPARSE_GRADIENT_KERNELS:
            for role, var in region.variables.items():  # a float16 use of a shared weight:
                if var in self.shared and role in region.grads:  # TF's float16 gradient of
                    round_half_(region.grads[role])  # the use (an overflow: inf), then cast
        for role in region.trained:
            spec = region.specs[role]
            if region.half and not self._rounds_in_update(region, role):
                round_half_(region.grads[role])  # TF's float16 gradient of the whole batch
            for reg in spec.regularizers:
                if self.loss_scale == 1.0:
                    reg.add_gradient(region.params[role], region.grads[role])
                else:  # the backward holds S x the loss's gradient: the penalty's too
                    term = np.zeros_like(region.grads[role])
                    reg.add_gradient(region.params[role], term)
                    region.grads[role] += term * np.float32(self.loss_scale)
            if spec.update != "sparse":
                continue
            if region.kernel.type_name not in SPARSE_GRADIENT_KERNELS:
                # a weight TF reads whole through a gather (position embeddings): every row
                # once, in order, as that gather's IndexedSlices
                grad = region.grads[role]
                region.slices[role] = np.arange(grad.shape[0]), grad
                continue
            pieces = region.pieces.pop(role, [])
            if pieces:
                region.slices[role] = (np.concatenate([ids for ids, _ in pieces]),
                                       np.concatenate([values for _, values in pieces]))
            else:
                region.slices[role] = (np.zeros(0, np.int64),
                                       np.zeros((0,) + region.params[role].shape[1:], np.float32))

    def _rounds_in_update(self, region: Region, role: str) -> bool:
        """Whether a float16 region's weight gradient (TF's: float16, of the whole batch,
        cast to float32) is rounded by its update's tiles, rows by rows on the batch's
        threads, instead of whole before: when nothing else reads it (no regularizer, no
        gradient transform, no loss scaling)."""
        spec = region.specs[role]
        return region.half and spec.update == "dense" and not spec.regularizers and \
            not self._reads_all_gradients()

    def _apply_floor(self) -> None:
        """The noise floor over the batch's gradients; of several losses, over the pass's
        objective's (their largest its scale: the gradients its loss's call computes)."""
        gradients, floor = self._gradients(), self.floor
        if self._objective is not None:
            mine = self._objective.variables
            gradients = {v: g for v, g in gradients.items() if v in mine}
            floor = tuple(replace(t, variables=tuple(v for v in t.variables if v in mine))
                          for t in floor if mine.intersection(t.variables))
        apply_transforms(floor, gradients)

    def _reads_all_gradients(self) -> bool:
        """Whether the step reads the batch's complete gradients, every stage's, before any
        update (gradient transforms, shared weights, dynamic loss scaling, accumulation)."""
        return bool(self.transforms or self.floor or self.shared or self.dynamic
                    or self.condition and (self.condition.accumulators or self.condition.finite))

    def _trained(self) -> list[str]:
        """Every trained variable's TF name."""
        return [*(region.variables[role] for region in self.regions for role in region.trained),
                *(v.weight.variable for v in self.shared.trained())]

    def _gradients(self) -> dict[str, np.ndarray]:
        """The batch's gradients of every trained variable (sparse ones: the values of
        their IndexedSlices, as TF's transforms see them), by TF name."""
        return {**{region.variables[role]: (region.slices[role][1] if role in region.slices
                                            else region.grads[role])
                   for region in self.regions for role in region.trained},
                **self.shared.gradients()}

    def _upstream(self, region: Region, i: int, board: Board) -> np.ndarray | None:
        """Micro-batch i's output gradient: its consumers' summed in `inflow`'s order."""
        upstream = None
        for consumer, index in region.inflow:
            grad = board.get(("g", region.kernel.name, i, consumer, index), pop=True)
            if grad is not None:
                upstream = grad if upstream is None else upstream + grad
        if region.half and upstream is not None:
            upstream = round_half(upstream)
        return upstream

    def _gradient_statistics(self, region: Region, m_count: int, caches, board: Board,
                             ctx: RunContext) -> None:
        """A batch barrier's backward: every micro-batch's output gradient first (a
        micro-batch no path reached contributes zeros), then the batch's statistics."""
        grads = []
        for j in range(m_count):
            upstream = self._upstream(region, j, board)
            if upstream is None:
                upstream = np.zeros((self.micro, *region.kernel.output_shape), np.float32)
            board.put(("upstream", region.kernel.name, j), upstream)
            grads.append(upstream)
        region.statistics = (region.statistics[0], region.kernel.gradient_statistics(
            region.compute, [caches[region.position, j] for j in range(m_count)], grads, ctx))

    def _backward(self, region: Region, i: int, cache, board: Board, ctx: RunContext) -> None:
        upstream = None
        if region.kernel.batch_barrier:
            upstream = board.get(("upstream", region.kernel.name, i), pop=True)
            if region.kernel.is_loss:  # (a loss of the whole batch: it seeds, or does nothing)
                upstream = None
        elif not region.kernel.is_loss:
            upstream = self._upstream(region, i, board)
        input_grads: Sequence[np.ndarray | None] = [None] * len(region.sources)
        # A micro-batch whose output reached the loss by no path has no backward; of several
        # objectives' losses, the pass's own seeds it; a reported loss never does.
        seeds = region.kernel.is_loss and (self._objective is None or
                                           region.kernel.name == self._objective.loss_kernel) \
            and not region.kernel.name == self.reported_loss_kernel != self.loss_kernel
        if upstream is not None or seeds:
            for role in region.collects:
                if upstream is not None:  # (a gather: never the loss)
                    region.pieces.setdefault(role, []).append(
                        region.kernel.table_slices(cache, upstream, role))
            _settle(region, board)  # its previous micro-batch's weight gradient
            ctx.input_grads, ctx.accumulate = region.input_grads, region.accumulated
            ctx.run_tiles = partial(_share, board, region.pending)
            input_grads, _ = region.kernel.backward(region.compute, cache, upstream, ctx,
                                                    region.grads or None)
            ctx.input_grads, ctx.accumulate, ctx.run_tiles = None, True, board.share
            region.accumulated = True
        for index, (source, wanted, grad) in enumerate(zip(region.sources, region.input_grads,
                                                           input_grads)):
            if wanted:
                board.put(("g", source, i, region.position, index), grad)

    def close(self) -> None:
        """Join the stage threads (a later batch runs as one stage in the caller's thread)."""
        if self._threads is not None:
            self._threads.close()

    # ---- state ----
    def state(self) -> dict[str, np.ndarray]:
        """Weights, optimizer slots and scalars by their TensorFlow names."""
        out: dict[str, np.ndarray] = {}
        for region in self.regions:
            for role, var in region.variables.items():
                if var in self.shared.derived:  # computed from its sources, not state
                    continue
                out[var] = region.params[role]
                if role in region.slots:
                    suffixes = self.optimizer.for_variable(var).slot_suffixes  # type: ignore[union-attr]
                    for suffix, slot in zip(suffixes, region.slots[role]):
                        out[slot_name(var, suffix)] = slot
        out.update(self.shared.state(self.optimizer))
        out.update({name: slot for again in self.reupdates
                    for name, slot in zip(again.reupdate.slots, again.slots)})
        if self.optimizer is not None:
            out.update(self.optimizer.scalars)
        out.update(self.carried)
        return out


def _share(board: Board, pending: list, tiles: Sequence[Callable[[], None]],
           later: Sequence[Callable[[], None]] = ()) -> None:
    """A backward pass's tiles on the board; those of `later` still running are kept in
    `pending` (its region's)."""
    handle = board.share(tiles, later)
    if handle is not None:
        pending.append(handle)


def _settle(region: Region, board: Board) -> None:
    """Until the region's weight-gradient tiles still running are done."""
    while region.pending:
        board.finish(region.pending.pop(0))


def _update_tiles(optimizer: Optimizer, region: Region, role: str,
                  round_gradient: bool) -> list[Callable[[], None]]:
    """A dense update in ranges of the weight's rows (it is element-wise: the ranges change
    nothing in the result); `round_gradient`: each range's gradient rounded to float16
    first."""
    var, grad = region.params[role], region.grads[role]
    arrays = [var, grad, *region.slots[role], *region.scratch[role]]
    slots = len(region.slots[role])
    count = max(1, min(len(var) if var.ndim > 1 else 1, var.size // UPDATE_TILE_ELEMENTS))
    bounds = [len(var) * k // count for k in range(count + 1)] if var.ndim else []
    spans: list[slice | types.EllipsisType] = [slice(a, b) for a, b in zip(bounds, bounds[1:])]
    spans = spans or [Ellipsis]  # a scalar weight: one tile
    half = region.compute[role] if region.half else None
    return [partial(_apply_rows, optimizer, arrays, slots, rows, half, round_gradient)
            for rows in spans]


def _apply_rows(optimizer: Optimizer, arrays: list[np.ndarray], slots: int,
                rows: slice | types.EllipsisType,
                half: np.ndarray | None, round_gradient: bool) -> None:
    """The update of some rows; for a float16 region, their float16 operands for the next
    batch too (`Optimizer.apply_fused`: SGD's is one compiled pass)."""
    var, grad, *rest = (a[rows] for a in arrays)
    optimizer.apply_fused(var, grad, rest[:slots], rest[slots:],
                          None if half is None else half[rows], round_gradient)
