"""The wafer's timing and memory model (docs/design.md, "Fabric and timing model").

One home for the formulas that the compiler's report and placement and the simulator's
step timing both use. Kernels are `wafer.kernels.Kernel` objects (their FLOPs, memory and
parallelism); regions are anything with `x`, `y`, `width` and `height` (the CS API's
Region message, or the compiler's rectangles).

For kernel k on a region of P_k cores (at most max_cores_k of them useful):
    F_k      = 3 x forward FLOPs per sample when training (forward, backward-data,
               backward-weight), 1 x otherwise; (1 + 2 n) x for a kernel the backward passes
               of n losses reach (a step minimizing several: a GAN's)
    t_comp   = F_k / (useful cores x r x f x eta)            (fabric.core_flops_per_sec)
    t_comm   = max(bytes in, bytes out) per sample / (edge cores x 4 B x f)
               data enters a region across its west edge and leaves across its east edge,
               so the edge is the region's height; gradients travel the opposite links
    t_k      = max(t_comp, t_comm)
Steady state X = min(R / max_k t_k, I/O bytes per second / input bytes per sample (4 B a
value, 2 B a float16 input's)) for R
replicas of the network (multireplica: data-parallel copies, each on its own tile, each
taking B / R samples of every batch; R = 1 otherwise).
A step of batch B: (B - R) / X + pipeline fill + the replicas' gradient all-reduce (R > 1,
training) + weight update + shared reads + the weight program, + for each batch barrier
(BatchNormalization in training) passes x (B - R) / X + its reductions.
The weight program (computations on weights alone: wafer.weight_programs) runs once a step,
each of its kernels on the region of the kernel reading its value, as one sample's t_comp
(forward, and backward when training); regions work at once, a region's kernels in turn.
A shared weight's read (a kernel reading a weight held by another's region): once a batch
the weight travels to the reader and, training, its gradient back, each way
    hops / f + bytes / (the reader's height x 4 B x f);
the slowest read adds to the step.
Memory per core: (weights + gradient accumulator + optimizer slots) / P_k + the activations
kept for the backward pass of the samples in flight / P_k.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Protocol, Sequence

import numpy as np

from cs_api.input_spec import InputSpec, program_inputs
from wafer.fabric import Fabric
from wafer.precision import streamed_bytes, value_bytes

BYTES_PER_VALUE = 4  # a float32 value: gradients, optimizer slots; weights and activations of float32 kernels
# (a float16 kernel's weights and activations take wafer.precision's 2 B)
TRAIN_FLOPS_FACTOR = 3  # forward + backward-data + backward-weight
# Optimizer slots per weight (RMSProp: 3 when centered, counted so), and FLOPs per weight of
# one update (wafer.optimizers' operations, a square root counted as one).
OPTIMIZER_SLOTS = {"sgd": 0, "momentum": 1, "adam": 2, "rmsprop": 3, "adagrad": 1, "adamw": 2,
                   "adadelta": 2, "ftrl": 2, "proximal_adagrad": 1, "proximal_sgd": 0}
UPDATE_FLOPS_PER_WEIGHT = {"sgd": 2, "momentum": 4, "adam": 12, "rmsprop": 15, "adagrad": 7,
                           "adamw": 15, "adadelta": 17, "ftrl": 20, "proximal_adagrad": 15,
                           "proximal_sgd": 9}


def costliest(types) -> str:
    """Of several optimizers in one step, the one whose slots and update cost most: the
    model charges every weight with it (an upper bound of memory and update time)."""
    return max(types, key=lambda t: (OPTIMIZER_SLOTS[t], UPDATE_FLOPS_PER_WEIGHT[t]))


# Multireplica: the replicas' weight gradients are summed by a binary tree over the replicas,
# then the sum is sent back down the tree (a reduce, then a broadcast: 2 passes).
ALLREDUCE_PASSES = 2


# A batch barrier (BatchNormalization in training) reduces per-channel sums over its region
# before it releases any micro-batch: this many reductions per pass (forward: the mean, then
# the centred second moment; backward: sum(g) and sum(g xhat)).
BARRIER_REDUCTIONS = 2


class RegionLike(Protocol):
    """A rectangle of cores (read-only: the compiler's frozen Rect)."""

    @property
    def x(self) -> int: ...
    @property
    def y(self) -> int: ...
    @property
    def width(self) -> int: ...
    @property
    def height(self) -> int: ...


@dataclass(frozen=True)
class KernelTiming:
    """One kernel on its region: where its time per sample goes."""

    name: str
    cores: int  # cores of its region
    useful_cores: int  # min(cores, the kernel's max_cores)
    flops_per_sample: float  # F_k (training-scaled)
    t_comp: float  # seconds per sample
    t_comm: float
    update_seconds: float  # applying one batch's gradient to its weights

    @property
    def seconds_per_sample(self) -> float:
        return max(self.t_comp, self.t_comm)

    @property
    def samples_per_sec(self) -> float:
        return 1.0 / self.seconds_per_sample if self.seconds_per_sample > 0 else math.inf


@dataclass(frozen=True)
class Barrier:
    """A batch barrier on its region: the batch queues at it until its last sample arrived
    (forward, and backward when training), then its sums cross the region."""

    name: str
    passes: int  # 2 when training (forward and backward), else 1
    sync_seconds: float  # the reductions (transfers) of all passes
    holds: str = "the whole batch's statistics"  # what it gathers (Kernel.barrier_holds)

    def stall_seconds(self, batch_size: int, samples_per_sec: float, replicas: int = 1) -> float:
        """passes x (B - R) / X + the reductions: what the barrier adds to a step."""
        return (self.passes * max(batch_size - replicas, 0) / samples_per_sec
                + self.sync_seconds)


def barrier(kernel: Any, region: RegionLike, fabric: Fabric, *, training: bool,
            span_hops: int = 0) -> Barrier:
    """Each pass: its transfers (`Kernel.barrier_transfers`; BatchNormalization's:
    BARRIER_REDUCTIONS reductions of the C channels' sums; an in-batch product's: the whole
    batch of an operand or gradient), every one crossing the region to a corner and back
    (2 (width + height) hops; with replicas, the batch's values span them: 2 x `span_hops`
    more) with its values x 4 B through one link."""
    passes = 2 if training else 1
    transfers = kernel.barrier_transfers()
    if transfers is None:
        channels = int(kernel.output_shape[-1]) if kernel.output_shape else 1
        transfers = (channels,) * BARRIER_REDUCTIONS
    cycles = sum(2 * (int(region.width) + int(region.height) + span_hops)
                 + values * BYTES_PER_VALUE / fabric.link_bytes_per_cycle for values in transfers)
    return Barrier(kernel.name, passes, passes * cycles / fabric.clock_hz,
                   kernel.barrier_holds)


@dataclass(frozen=True)
class PipelineTiming:
    """The whole program on the wafer, in layer-pipelined mode (`replicas` copies of it)."""

    kernels: tuple[KernelTiming, ...]  # one replica's
    compute_samples_per_sec: float  # R / max_k t_k
    transmission_samples_per_sec: float  # I/O bound
    fill_seconds: float  # first sample through the pipeline (and back when training)
    update_seconds: float  # slowest kernel's weight update at the end of a batch
    flops_per_sample: float  # sum of F_k
    active_cores: int  # of every replica
    peak_flops_per_core: float  # r x f (no efficiency)
    replicas: int = 1
    allreduce_seconds: float = 0.0  # summing the replicas' gradients (training, R > 1)
    shared_read_seconds: float = 0.0  # the slowest shared weight's read (and gradient back)
    barriers: tuple[Barrier, ...] = ()  # batch barriers (BatchNormalization in training)
    weight_program_seconds: float = 0.0  # the weight program, once a step
    state_write_seconds: float = 0.0  # the batch's values to the state written from them

    @property
    def samples_per_sec(self) -> float:
        return min(self.compute_samples_per_sec, self.transmission_samples_per_sec)

    @property
    def compute_utilization(self) -> float:
        """Fraction of the active cores' peak FLOP rate doing the model's arithmetic."""
        if self.active_cores == 0:
            return 0.0
        return (self.samples_per_sec * self.flops_per_sample
                / (self.active_cores * self.peak_flops_per_core))

    @property
    def replica_samples_per_sec(self) -> float:
        """One replica's share of the steady state."""
        return self.samples_per_sec / self.replicas

    def step_seconds(self, batch_size: int) -> float:
        """Time of one step of `batch_size` samples (B / R per replica, the replicas side by
        side): steady state, fill, the gradients' all-reduce, update, shared reads, the weight
        program, the batch barriers' stalls and the state writes of the batch."""
        return (max(batch_size - self.replicas, 0) / self.samples_per_sec + self.fill_seconds
                + self.allreduce_seconds + self.update_seconds + self.shared_read_seconds
                + self.weight_program_seconds + self.barrier_seconds(batch_size)
                + self.state_write_seconds)

    def barrier_seconds(self, batch_size: int) -> float:
        return sum(b.stall_seconds(batch_size, self.samples_per_sec, self.replicas)
                   for b in self.barriers)


def flops_per_sample(kernel: Any, training: bool) -> float:
    """F_k: the kernel's FLOPs per sample for one pass (training counts the backward, once
    per loss whose backward pass reaches it)."""
    passes = getattr(kernel, "backward_passes", 1)
    return float(kernel.flops_per_sample()) * (
        1 + (TRAIN_FLOPS_FACTOR - 1) * passes if training else 1)


def count_backward_passes(kernels: Sequence[Any], sources: Sequence[Sequence[str]],
                          loss_kernels: Sequence[str]) -> None:
    """Several losses minimized in one step: each kernel's `backward_passes`, the losses
    whose backward pass reaches it through differentiable inputs (at least 1)."""
    if not loss_kernels:
        return
    names = [k.name for k in kernels]
    counts = dict.fromkeys(names, 0)
    for loss in loss_kernels:
        reached = {loss}
        for k in reversed(range(len(kernels))):
            if names[k] in reached:
                counts[names[k]] += 1
                reached.update(s for j, s in enumerate(sources[k])
                               if kernels[k].input_differentiable(j))
    for kernel in kernels:
        kernel.backward_passes = max(counts[kernel.name], 1)


def num_parameters(kernel: Any) -> int:
    return int(sum(math.prod(s) for s in kernel.param_shapes().values()))


def in_flight_samples(position: int, num_kernels: int, training: bool) -> int:
    """Samples whose activations kernel `position` (0-based, topological) holds at once.

    Training keeps a sample's activations from its forward pass until its gradient comes
    back: one sample per downstream stage, both ways. Inference holds one sample.
    """
    return 2 * (num_kernels - position) - 1 if training else 1


def weight_bytes(kernel: Any, optimizer: str, training: bool) -> int:
    """Weights, plus the gradient accumulator and optimizer slots when training."""
    per_weight = value_bytes(kernel)
    if training:  # the float32 gradient accumulator and slots
        per_weight += BYTES_PER_VALUE * (1 + OPTIMIZER_SLOTS[optimizer])
    return num_parameters(kernel) * per_weight


def memory_bytes(kernel: Any, position: int, num_kernels: int, optimizer: str,
                 training: bool, batch_held: int = 0) -> int:
    """Total bytes the kernel keeps on its region. `batch_held`: the samples of a batch a
    batch barrier makes it hold at once (`batch_samples_held`), when more than in flight."""
    samples = max(in_flight_samples(position, num_kernels, training), batch_held)
    activations = (kernel.activation_bytes_per_sample() * value_bytes(kernel) // BYTES_PER_VALUE
                   * samples)
    return weight_bytes(kernel, optimizer, training) + int(activations)


def batch_samples_held(kernels: Sequence[Any], batch_size: int, training: bool) -> list[int]:
    """Per kernel (topological order), the samples a batch barrier makes it hold: the
    barrier holds its copy's whole batch (it releases none before the last arrived), and
    when training so does every kernel before the last barrier (no gradient comes back to
    it before the barrier's backward gathered the whole batch); 0 elsewhere."""
    barriers = [i for i, k in enumerate(kernels) if getattr(k, "batch_barrier", False)]
    last = barriers[-1] if barriers and training else -1
    return [batch_size if i in barriers or i <= last else 0 for i in range(len(kernels))]


def memory_per_core(total_bytes: int, cores: int) -> int:
    return math.ceil(total_bytes / max(cores, 1))


def min_cores_for_memory(total_bytes: int, fabric: Fabric) -> int:
    return max(1, math.ceil(total_bytes / fabric.sram_per_core))


def _shape_bytes(shape: Sequence[int], per_value: int = BYTES_PER_VALUE) -> int:
    return int(math.prod(shape)) * per_value


def input_bytes_per_sample(spec: InputSpec) -> int:
    """Bytes a program input streams per sample (a float16 stream's values at 2 B)."""
    return _shape_bytes(spec.shape, streamed_bytes(spec.dtype))


def edge_bytes_per_sample(kernel: Any) -> int:
    """Bytes crossing the busier edge of a kernel's region per sample (inputs or output;
    a float16 kernel's at 2 B a value)."""
    per_value = value_bytes(kernel)
    bytes_in = sum(_shape_bytes(s, per_value) for s in kernel.input_shapes)
    return max(bytes_in, _shape_bytes(kernel.output_shape, per_value))


def link_bytes_per_sec(fabric: Fabric) -> float:
    """One core's link into its neighbour."""
    return fabric.link_bytes_per_cycle * fabric.clock_hz


def kernel_timing(kernel: Any, region: RegionLike, fabric: Fabric, *, training: bool,
                  optimizer: str = "sgd") -> KernelTiming:
    """t_comp, t_comm and the update time of `kernel` on `region`."""
    cores = int(region.width) * int(region.height)
    useful = max(1, min(cores, int(kernel.max_cores())))
    flops = flops_per_sample(kernel, training)
    t_comp = flops / (useful * fabric.core_flops_per_sec)
    edge_cores = max(int(region.height), 1)
    t_comm = edge_bytes_per_sample(kernel) / (edge_cores * link_bytes_per_sec(fabric))
    update = 0.0
    if training:
        update = (num_parameters(kernel) * UPDATE_FLOPS_PER_WEIGHT[optimizer]
                  / (cores * fabric.core_flops_per_sec))
    return KernelTiming(kernel.name, cores, useful, flops, t_comp, t_comm, update)


def path_hops(path: Sequence[tuple[int, int]]) -> int:
    """Cores a route crosses: the Manhattan length along its (x, y) waypoints."""
    return sum(abs(a[0] - b[0]) + abs(a[1] - b[1]) for a, b in zip(path, path[1:]))


def allreduce_seconds(placed: Sequence[tuple[Any, RegionLike]], fabric: Fabric, replicas: int,
                      span_hops: int) -> float:
    """Summing R replicas' weight gradients and handing the sum back to every replica: a
    binary tree of ceil(log2 R) rounds, ALLREDUCE_PASSES times (reduce, then broadcast). In
    a round every kernel sends its gradient (parameters x 4 B) to its partner replica's copy
    across its region's edge (height cores x link rate), all kernels at once; the rounds'
    routes together cross the replicas' span (`span_hops`, cores) once per pass."""
    if replicas <= 1:
        return 0.0
    rounds = math.ceil(math.log2(replicas))
    link = link_bytes_per_sec(fabric)
    per_round = max((num_parameters(k) * BYTES_PER_VALUE / (max(int(r.height), 1) * link)
                     for k, r in placed), default=0.0)
    return ALLREDUCE_PASSES * (rounds * per_round + span_hops / fabric.clock_hz)


@dataclass(frozen=True)
class SharedRead:
    """A kernel reading a weight another kernel's region holds: its route's length in
    cores, the weight's bytes, the reader region's height (the links it enters by)."""

    hops: int
    bytes_per_batch: int
    edge_cores: int

    def seconds(self, fabric: Fabric, training: bool) -> float:
        """The weight to the reader, and when training its gradient back."""
        one_way = (self.hops / fabric.clock_hz + self.bytes_per_batch
                   / (max(self.edge_cores, 1) * link_bytes_per_sec(fabric)))
        return one_way * (2 if training else 1)


def pipeline_timing(placed: Sequence[tuple[Any, RegionLike]], fabric: Fabric, *,
                    training: bool, input_bytes_per_sample: int, optimizer: str = "sgd",
                    route_hops: int = 0, replicas: int = 1, replica_span_hops: int = 0,
                    shared_reads: Sequence[SharedRead] = (),
                    weight_program: Sequence[tuple[Any, RegionLike]] = ()) -> PipelineTiming:
    """Timing of kernels (topological order) on their regions, `replicas` copies of them.

    `input_bytes_per_sample` is what the host streams per sample (features and labels);
    `route_hops` is the total length, in cores, of one replica's routes between regions
    (the longest replica's; one hop per cycle); `replica_span_hops` the Manhattan distance
    between the farthest replicas; `shared_reads` the shared weights' reads, once a batch;
    `weight_program` its kernels, each on the region of the kernel reading its value.
    """
    timings = tuple(kernel_timing(k, r, fabric, training=training, optimizer=optimizer)
                    for k, r in placed)
    slowest = max((t.seconds_per_sample for t in timings), default=0.0)
    compute = replicas / slowest if slowest > 0 else math.inf
    transmission = (fabric.io_bytes_per_sec / input_bytes_per_sample
                    if input_bytes_per_sample > 0 else math.inf)
    passes = 2 if training else 1
    fill = sum(t.seconds_per_sample for t in timings) + passes * route_hops / fabric.clock_hz
    update = max((t.update_seconds for t in timings), default=0.0)
    return PipelineTiming(
        kernels=timings,
        compute_samples_per_sec=compute,
        transmission_samples_per_sec=transmission,
        fill_seconds=fill,
        update_seconds=update,
        flops_per_sample=sum(t.flops_per_sample for t in timings),
        active_cores=replicas * sum(t.cores for t in timings),
        peak_flops_per_core=fabric.flops_per_cycle * fabric.clock_hz,
        replicas=replicas,
        allreduce_seconds=(allreduce_seconds(placed, fabric, replicas, replica_span_hops)
                           if training else 0.0),
        shared_read_seconds=max((r.seconds(fabric, training) for r in shared_reads), default=0.0),
        barriers=tuple(barrier(k, r, fabric, training=training,
                               span_hops=replica_span_hops if replicas > 1 else 0)
                       for k, r in placed if getattr(k, "batch_barrier", False)),
        weight_program_seconds=weight_program_seconds(weight_program, fabric, training),
    )


def weight_program_seconds(placed: Sequence[tuple[Any, RegionLike]], fabric: Fabric,
                           training: bool) -> float:
    """The weight program's time in a step: each kernel as one sample's t_comp on its
    region; regions work at once, a region's kernels in turn."""
    by_region: dict[tuple[int, int], float] = {}
    for kernel, region in placed:
        key = (int(region.x), int(region.y))
        by_region[key] = by_region.get(key, 0.0) + kernel_timing(
            kernel, region, fabric, training=training).t_comp
    return max(by_region.values(), default=0.0)


def state_write_seconds(writes: Sequence[tuple[int, int]], fabric: Fabric) -> float:
    """The state writes of the batch (wafer.weight_writes' `batch`), after the step's
    updates, one after another: each moves its bytes of the whole batch's values (B x the
    values' bytes per sample) into the region holding the state, across its edge of
    `edge cores` links; (bytes, edge cores) per write. The routes' hops and the write's
    element-wise arithmetic are not charged."""
    link = link_bytes_per_sec(fabric)
    return sum(nbytes / (max(edge, 1) * link) for nbytes, edge in writes)


def program_state_writes(program: Any) -> list[tuple[int, int]]:
    """(bytes per step, edge cores) of each state write of a compiled Program's batch (the
    region of the state's first reader; one link to a weight program's source)."""
    per_sample = {k.name: _shape_bytes(k.output_shape) for k in program.kernels}
    per_sample.update({s.name: input_bytes_per_sample(s) for s in program_inputs(program)})
    writes = []
    for write in program.weight_writes:
        if write.batch:
            edge = next((int(k.region.height) for k in program.kernels
                         if any(p.variable == write.variable for p in k.params)), 1)
            writes.append((program.batch_size * sum(per_sample[n] for n in write.batch), edge))
    return writes


def fabric_bound_samples_per_sec(kernels: Sequence[Any], fabric: Fabric, *,
                                 training: bool) -> float:
    """X_ideal = cores x r x f x eta / sum_k F_k: every core of the wafer busy."""
    total = sum(flops_per_sample(k, training) for k in kernels)
    return fabric.cores * fabric.core_flops_per_sec / total if total > 0 else math.inf


def balanced_bound_samples_per_sec(kernels: Sequence[Any], fabric: Fabric, *,
                                   training: bool, min_cores: Sequence[int] | None = None,
                                   ) -> float:
    """The best balanced pipeline with fractional core counts (no rectangles).

    The largest X such that every kernel reaches X within its useful parallelism and
    sum_k max(min_cores_k, F_k X / rate, E_k X / link rate) <= cores, where E_k is the bytes
    crossing its region's edge (a region is at least as large as its edge is long, and no
    edge is longer than the fabric is high).
    Placement quality is measured against this bound.
    """
    rate = fabric.core_flops_per_sec
    flops = np.array([flops_per_sample(k, training) for k in kernels], dtype=float)
    edges = np.array([edge_bytes_per_sample(k) for k in kernels], dtype=float)
    floor = np.array(min_cores if min_cores is not None else [1] * len(kernels), dtype=float)
    link = link_bytes_per_sec(fabric)
    cap = min([k.max_cores() * rate / f for k, f in zip(kernels, flops) if f > 0]
              + [fabric.height * link / e for e in edges if e > 0], default=math.inf)

    def cores_needed(x: float) -> float:
        return float(np.maximum(np.maximum(floor, flops * x / rate),
                                edges * x / link).sum())

    if cores_needed(0.0) > fabric.cores:
        return 0.0
    if math.isfinite(cap) and cores_needed(cap) <= fabric.cores:
        return cap
    lo, hi = 0.0, cap if math.isfinite(cap) else fabric.cores * rate / max(flops.min(), 1e-30)
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cores_needed(mid) <= fabric.cores else (lo, mid)
    return lo


def program_timing(program: Any, kernels: Sequence[Any], fabric: Fabric, *,
                   training: bool, weight_kernels: Sequence[Any] = ()) -> PipelineTiming:
    """Timing of a compiled CS API Program whose kernels (built by the caller, e.g. with
    `wafer.kernels.build_kernel`, in `program.kernels` order) sit on their regions, with
    its replicas (`num_replicas` copies at `replica_offsets`; the routes name their replica)
    and its weight program's kernels (`weight_kernels`, built likewise)."""
    regions = [k.region for k in program.kernels]
    if len(regions) != len(kernels):
        raise ValueError(f"program has {len(regions)} kernels, {len(kernels)} were given")
    input_bytes = sum(input_bytes_per_sample(spec) for spec in program_inputs(program))
    replicas = max(int(program.num_replicas), 1)
    hops = [0] * replicas
    for route in program.routes:
        if not route.bytes_per_batch:  # a shared weight's read is not on the samples' path
            hops[min(int(route.replica), replicas - 1)] += path_hops([(p.x, p.y) for p in route.path])
    heights = {k.name: k.region.height for k in program.kernels}
    reads = [SharedRead(path_hops([(p.x, p.y) for p in route.path]), route.bytes_per_batch,
                        heights[route.dst])
             for route in program.routes if route.bytes_per_batch]
    placed = pipeline_timing(list(zip(kernels, regions)), fabric, training=training,
                           input_bytes_per_sample=input_bytes,
                           optimizer=costliest([program.optimizer.type or "sgd", *(
                               g.optimizer.type for g in program.optimizer_groups)]),
                           route_hops=max(hops),
                           replicas=replicas, replica_span_hops=replica_span(
                               [(p.x, p.y) for p in program.replica_offsets]),
                           shared_reads=reads,
                           weight_program=list(zip(weight_kernels, [
                               k.region for k in program.weight_program.kernels])))
    if not training:
        return placed
    return replace(placed, state_write_seconds=state_write_seconds(
        program_state_writes(program), fabric))


def replica_span(offsets: Sequence[tuple[int, int]]) -> int:
    """Cores between the farthest two replicas (Manhattan, between their offsets)."""
    if not offsets:
        return 0
    sums = [x + y for x, y in offsets]
    differences = [x - y for x, y in offsets]
    return max(max(sums) - min(sums), max(differences) - min(differences))


def run_utilization(pipeline: PipelineTiming, samples: int, sim_seconds: float) -> float:
    """Fraction of the active cores' peak FLOP rate a run of `samples` in `sim_seconds` of
    simulated time used (fill and update time included)."""
    if sim_seconds <= 0 or pipeline.active_cores == 0:
        return 0.0
    return (samples * pipeline.flops_per_sample
            / (sim_seconds * pipeline.active_cores * pipeline.peak_flops_per_core))
