"""Place: give each kernel a rectangle of cores so that the slowest kernel is as fast as
possible, within per-core memory and each kernel's useful parallelism.

Sizes: for a target throughput X, kernel k needs max(memory floor_k, F_k X / rate) cores
and a region at least E_k X / link rate cores high for its data; the largest X whose
rectangles still fit is found by bisection (X is capped by the kernels' parallelism).
Layouts keep kernels in topological order so consecutive kernels touch: serpentine bands
of every height (left to right, then right to left), and a slicing layout (split the
sequence and the area in proportion, recursively). Of those that fit, the fastest, then
the most compact, is kept.

Multireplica (`place_replicated`): R copies of the network, each on its own tile of the
wafer: copies of the one-replica placement's bounding box when R of them fit (each replica as
fast as one alone), else the placement on the largest tile of a grid of at least R tiles. When
the compiler chooses R, it takes the count (a divisor of the batch) whose modelled step of the
batch is fastest, the fewest replicas among those within FASTEST_TOLERANCE.

`place_model` is the compiler's place pass: a matched model's library kernels, placed.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from common.errors import CSRunError
from coordinator import replicas as rep
from coordinator.compiler.ir import MatchedModel
from tf_model.estimator_spec import ModeKeys
from wafer import timing
from wafer.fabric import Fabric
from wafer.kernels import KernelError, build_kernel
from wafer.precision import value_bytes, wafer_dtype

# Search parameters (docs/design.md, "Placement"): they bound the search, not the model.
BISECTION_TOLERANCE = 1e-4  # relative gap at which the bisection on the target rate stops
MAX_BANDS = 64  # band layouts try every height that divides the fabric into 1..MAX_BANDS bands
SMALL_BAND_HEIGHTS = 16  # and every height 1..SMALL_BAND_HEIGHTS
SLICE_BUDGET = 4000  # recursive calls of one slicing layout
SLICE_BOTH_AXES_DEPTH = 6  # depth to which the slicing layout tries both cut axes
FASTEST_TOLERANCE = 1.001  # layouts this close to the fastest count as fastest


@dataclass(frozen=True)
class Rect:
    x: int
    y: int
    width: int
    height: int

    @property
    def cores(self) -> int:
        return self.width * self.height

    @property
    def center(self) -> tuple[int, int]:
        return self.x + self.width // 2, self.y + self.height // 2

    def overlaps(self, other: "Rect") -> bool:
        return not (self.x + self.width <= other.x or other.x + other.width <= self.x
                    or self.y + self.height <= other.y or other.y + other.height <= self.y)


@dataclass(frozen=True)
class RouteSpec:
    src: str
    dst: str
    path: tuple[tuple[int, int], ...]  # waypoints of an L-shaped route
    bytes_per_sample: int
    replica: int = 0
    bytes_per_batch: int = 0  # a shared weight's read: the weight (and its gradient back)

    @property
    def hops(self) -> int:
        return timing.path_hops(self.path)


@dataclass(frozen=True)
class Placement:
    regions: tuple[Rect, ...]  # one per kernel, topological order (replica 0's)
    routes: tuple[RouteSpec, ...]  # every replica's
    timing: timing.PipelineTiming
    memory_bytes: tuple[int, ...]  # per kernel, total
    memory_per_core: tuple[int, ...]
    balanced_bound: float  # best balanced pipeline (fractional cores), x the replicas
    fabric_bound: float  # cores x rate / FLOPs per sample
    # multireplica: replica r's regions are `regions` shifted by offsets[r], in a tile each
    replica_offsets: tuple[tuple[int, int], ...] = ((0, 0),)
    tile: tuple[int, int] | None = None  # a replica's tile (width, height); None: the wafer
    # the replica counts the compiler weighed (count, modelled samples/s of a step)
    replica_candidates: tuple[tuple[int, float], ...] = ()
    weight_regions: tuple[Rect, ...] = ()  # the weight program's kernels' (replica 0's)

    @property
    def replicas(self) -> int:
        return len(self.replica_offsets)

    @property
    def quality(self) -> float:
        """Achieved compute throughput as a fraction of the balanced-pipeline bound."""
        return self.timing.compute_samples_per_sec / self.balanced_bound

    def replica_regions(self, replica: int) -> tuple[Rect, ...]:
        dx, dy = self.replica_offsets[replica]
        return tuple(Rect(r.x + dx, r.y + dy, r.width, r.height) for r in self.regions)


class TooLargeError(ValueError):
    """The model's weights, optimizer state and activations exceed the fabric's SRAM."""

    def __init__(self, needed_bytes: int, fabric: Fabric, worst: str):
        self.needed_bytes = needed_bytes
        self.fabric = fabric
        self.worst = worst
        super().__init__(f"needs {needed_bytes} bytes, fabric has {fabric.sram_bytes}")


class ReplicasDoNotFitError(ValueError):
    """`count` copies of the model do not fit on the fabric (one does)."""

    def __init__(self, count: int, floor_cores: int, placed_cores: int, fabric: Fabric):
        self.count = count
        self.floor_cores = floor_cores  # one copy's cores for its memory alone
        self.placed_cores = placed_cores  # one copy's cores placed alone on the wafer
        super().__init__(f"{count} replicas do not fit on {fabric.name}")


@dataclass(frozen=True)
class _Costs:
    flops: tuple[float, ...]
    caps: tuple[int, ...]
    floors: tuple[int, ...]
    memory: tuple[int, ...]
    edges: tuple[int, ...]  # bytes per sample across a region's edge


def _costs(kernels: Sequence[Any], fabric: Fabric, training: bool, optimizer: str,
           batch_size: int = 1) -> _Costs:
    n = len(kernels)
    held = timing.batch_samples_held(kernels, batch_size, training)
    memory = tuple(timing.memory_bytes(k, i, n, optimizer, training, held[i])
                   for i, k in enumerate(kernels))
    return _Costs(
        flops=tuple(timing.flops_per_sample(k, training) for k in kernels),
        caps=tuple(max(1, int(k.max_cores())) for k in kernels),
        floors=tuple(timing.min_cores_for_memory(m, fabric) for m in memory),
        memory=memory, edges=tuple(timing.edge_bytes_per_sample(k) for k in kernels))


@dataclass(frozen=True)
class Demand:
    """What a kernel needs for a target throughput: cores, and an edge (height) that long."""

    cores: int
    height: int


def _demands(costs: _Costs, x: float, rate: float, link: float) -> list[Demand]:
    """Each kernel's memory floor, compute (up to its useful parallelism) and edge for x
    samples/s."""
    out = []
    for f, cap, floor, e in zip(costs.flops, costs.caps, costs.floors, costs.edges):
        height = max(1, math.ceil(e * x / link))
        out.append(Demand(max(floor, min(cap, math.ceil(f * x / rate)), height), height))
    return out


def band_layout(demands: Sequence[Demand], fabric: Fabric, band_height: int) -> list[Rect] | None:
    """Serpentine bands of `band_height` rows, or None if the demands do not fit."""
    bands = fabric.height // band_height
    rects: list[Rect] = []
    band, used = 0, 0
    for d in demands:
        height = min(band_height, d.cores)
        width = math.ceil(d.cores / height)
        if width > fabric.width or height < d.height:
            return None
        if used + width > fabric.width:
            band, used = band + 1, 0
        if band >= bands:
            return None
        y = band * band_height
        x = used if band % 2 == 0 else fabric.width - used - width
        rects.append(Rect(x, y, width, height))
        used += width
    return rects


def slice_layout(demands: Sequence[Demand], fabric: Fabric) -> list[Rect] | None:
    """Slicing layout: split the kernel sequence where its demand halves and the area across
    its longer side in proportion, recursively (consecutive kernels stay neighbours)."""
    budget = [SLICE_BUDGET]

    def go(lo: int, hi: int, area: Rect, depth: int) -> list[Rect] | None:
        budget[0] -= 1
        if budget[0] < 0:
            return None
        if hi - lo == 1:
            d = demands[lo]
            if area.cores < d.cores or area.height < d.height:
                return None
            height = area.height
            return [Rect(area.x, area.y, min(area.width, math.ceil(d.cores / height)), height)]
        sizes = [d.cores for d in demands[lo:hi]]
        total, run, k = sum(sizes), 0, lo + 1
        for i, size in enumerate(sizes[:-1]):
            run += size
            k = lo + i + 1
            if run >= total / 2:
                break
        left = sum(sizes[:k - lo])
        right = total - left
        cuts = ("x", "y") if area.width >= area.height else ("y", "x")
        for axis in cuts if depth < SLICE_BOTH_AXES_DEPTH else cuts[:1]:
            long_side = area.width if axis == "x" else area.height
            short_side = area.height if axis == "x" else area.width
            low, high = math.ceil(left / short_side), long_side - math.ceil(right / short_side)
            if low > high:
                continue
            cut = min(high, max(low, round(long_side * left / total)))
            if axis == "x":
                a, b = Rect(area.x, area.y, cut, area.height), Rect(
                    area.x + cut, area.y, area.width - cut, area.height)
            else:
                a, b = Rect(area.x, area.y, area.width, cut), Rect(
                    area.x, area.y + cut, area.width, area.height - cut)
            first = go(lo, k, a, depth + 1)
            second = go(k, hi, b, depth + 1) if first is not None else None
            if first is not None and second is not None:
                return first + second
        return None

    if not demands:
        return []
    return go(0, len(demands), Rect(0, 0, fabric.width, fabric.height), 0)


def _layouts(demands: Sequence[Demand], fabric: Fabric, first_only: bool):
    """Candidate layouts that fit, band layouts first."""
    if sum(d.cores for d in demands) > fabric.cores:
        return
    for h in _band_heights(fabric):
        rects = band_layout(demands, fabric, h)
        if rects is not None:
            yield rects
            if first_only:
                return
    rects = slice_layout(demands, fabric)
    if rects is not None:
        yield rects


def _fit(demands: Sequence[Demand], fabric: Fabric) -> list[Rect] | None:
    """Some layout of `demands` that fits, or None."""
    return next(_layouts(demands, fabric, first_only=True), None)


def _best_layout(kernels: Sequence[Any], demands: Sequence[Demand], fabric: Fabric,
                 training: bool) -> list[Rect] | None:
    """Of the layouts that fit, one whose slowest kernel (compute or links) is fastest;
    among those (within 0.1 %), the most compact (squarest bounding box: short routes)."""
    candidates = []
    for rects in _layouts(demands, fabric, first_only=False):
        slowest = max(timing.kernel_timing(k, r, fabric, training=training).seconds_per_sample
                      for k, r in zip(kernels, rects))
        width = max(r.x + r.width for r in rects)
        height = max(r.y + r.height for r in rects)
        candidates.append((slowest, (max(width, height), width * height), rects))
    if not candidates:
        return None
    fastest = min(c[0] for c in candidates)
    return min((c for c in candidates if c[0] <= fastest * FASTEST_TOLERANCE), key=lambda c: c[1])[2]


def _band_heights(fabric: Fabric) -> list[int]:
    """Candidate band heights: every height dividing the fabric into 1..MAX_BANDS bands, and
    the small ones."""
    heights = {fabric.height // b for b in range(1, MAX_BANDS + 1)} | \
        set(range(1, SMALL_BAND_HEIGHTS + 1))
    return sorted((h for h in heights if h >= 1), reverse=True)


def place(kernels: Sequence[Any], fabric: Fabric, *, training: bool, optimizer: str = "sgd",
          inputs: Mapping[str, int] | None = None,
          edges: Sequence[tuple[str, str]] = (), batch_size: int = 1) -> Placement:
    """Rectangles for `kernels` (built wse_sim kernels, topological order); `batch_size`
    the samples of a batch one copy takes (what its batch barriers hold).

    `inputs` are the program's inputs with the bytes each streams per sample; they enter
    at the wafer's west edge. `edges` are (src, dst) data paths between kernels or from
    inputs. Raises TooLargeError when the kernels' memory does not fit on the fabric.
    """
    inputs = inputs or {}
    costs = _costs(kernels, fabric, training, optimizer, batch_size)
    if sum(costs.floors) > fabric.cores:
        worst = max(range(len(kernels)), key=lambda i: costs.memory[i])
        raise TooLargeError(sum(costs.memory), fabric, kernels[worst].name)
    rate, link = fabric.core_flops_per_sec, timing.link_bytes_per_sec(fabric)
    cap = min([c * rate / f for c, f in zip(costs.caps, costs.flops) if f > 0]
              + [fabric.height * link / e for e in costs.edges if e > 0], default=1.0)
    target = cap
    if _fit(_demands(costs, cap, rate, link), fabric) is None:
        if _fit([Demand(f, 1) for f in costs.floors], fabric) is None:
            worst = max(range(len(kernels)), key=lambda i: costs.memory[i])
            raise TooLargeError(sum(costs.memory), fabric, kernels[worst].name)
        lo, hi = 0.0, cap
        while hi - lo > BISECTION_TOLERANCE * hi:
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if _fit(_demands(costs, mid, rate, link), fabric) is not None else (lo, mid)
        target = lo
    rects = _best_layout(kernels, _demands(costs, target, rate, link), fabric, training)
    return _finish(kernels, rects, costs, fabric, training, optimizer, inputs, edges)


def _finish(kernels, rects, costs, fabric, training, optimizer, inputs, edges,
            offsets: tuple[tuple[int, int], ...] = ((0, 0),),
            tile: tuple[int, int] | None = None) -> Placement:
    """`rects` (replica 0's) with their routes and timing, for each replica at `offsets`:
    program inputs enter at the wafer's west edge, on the row of the region they feed."""
    routes = []
    for replica, (dx, dy) in enumerate(offsets):
        by_name = {k.name: (k, Rect(r.x + dx, r.y + dy, r.width, r.height))
                   for k, r in zip(kernels, rects)}
        for src, dst in edges:
            kernel, rect = by_name[dst]
            cx, cy = rect.center
            if src in inputs:
                start = (0, cy)
                nbytes = inputs[src]
            else:
                start = by_name[src][1].center
                nbytes = math.prod(by_name[src][0].output_shape) * value_bytes(by_name[src][0])
            path = (start, (cx, start[1]), (cx, cy))
            routes.append(RouteSpec(src, dst, path, int(nbytes), replica))
    hops = [0] * len(offsets)
    for route in routes:
        hops[route.replica] += route.hops
    pipeline = timing.pipeline_timing(list(zip(kernels, rects)), fabric, training=training,
                                      input_bytes_per_sample=sum(inputs.values()),
                                      optimizer=optimizer, route_hops=max(hops),
                                      replicas=len(offsets),
                                      replica_span_hops=timing.replica_span(offsets))
    region_fabric = fabric if tile is None else dataclasses.replace(
        fabric, width=tile[0], height=tile[1])
    return Placement(
        regions=tuple(rects), routes=tuple(routes), timing=pipeline,
        memory_bytes=costs.memory,
        memory_per_core=tuple(timing.memory_per_core(m, r.cores)
                              for m, r in zip(costs.memory, rects)),
        balanced_bound=len(offsets) * timing.balanced_bound_samples_per_sec(
            kernels, region_fabric, training=training, min_cores=costs.floors),
        fabric_bound=timing.fabric_bound_samples_per_sec(kernels, fabric, training=training),
        replica_offsets=tuple(offsets), tile=tile)


def place_replicated(kernels: Sequence[Any], fabric: Fabric, *, training: bool,
                     batch_size: int, replicas: int | None, optimizer: str = "sgd",
                     inputs: Mapping[str, int] | None = None,
                     edges: Sequence[tuple[str, str]] = ()) -> Placement:
    """`replicas` copies of `kernels` (None: the count, a divisor of `batch_size`, whose
    modelled step of `batch_size` samples is fastest), each on its own tile.

    Raises TooLargeError when one copy does not fit, ReplicasDoNotFitError when `replicas`
    copies do not (the caller checks that `replicas` divides the batch)."""
    inputs = inputs or {}
    single = place(kernels, fabric, training=training, optimizer=optimizer, inputs=inputs,
                   edges=edges, batch_size=batch_size)
    if replicas == 1:
        return single

    def copies(count: int) -> tuple[_Costs, int]:  # a copy's barriers hold its share
        costs = _costs(kernels, fabric, training, optimizer, batch_size // count)
        return costs, sum(costs.floors)

    if replicas is not None:
        costs, floor = copies(replicas)
        if replicas * floor > fabric.cores:
            raise ReplicasDoNotFitError(replicas, floor, single.timing.active_cores, fabric)
        placed = _replicate(kernels, single, costs, fabric, replicas, training, optimizer,
                            inputs, edges, batch_size)
        if placed is None:
            raise ReplicasDoNotFitError(replicas, floor, single.timing.active_cores, fabric)
        return placed
    candidates = [single]
    for count in rep.divisors(batch_size)[1:]:
        costs, floor = copies(count)
        if count * floor > fabric.cores:
            break
        placed = _replicate(kernels, single, costs, fabric, count, training, optimizer,
                            inputs, edges, batch_size)
        if placed is None:  # more copies have smaller tiles still
            break
        candidates.append(placed)
    rates = [batch_size / p.timing.step_seconds(batch_size) for p in candidates]
    best = max(rates)
    chosen = next(p for p, rate in zip(candidates, rates) if rate * FASTEST_TOLERANCE >= best)
    return dataclasses.replace(chosen, replica_candidates=tuple(
        (p.replicas, rate) for p, rate in zip(candidates, rates)))


def _replicate(kernels, single: Placement, costs: _Costs, fabric: Fabric, count: int,
               training: bool, optimizer: str, inputs, edges,
               batch_size: int) -> Placement | None:
    """`count` copies: of `single`'s bounding box when they fit (each copy as fast as one
    alone), else the fastest of the placements on the tiles of each grid of at least
    `count` tiles (the most compact among equals); None when no tile holds a copy."""
    box = (max(r.x + r.width for r in single.regions), max(r.y + r.height for r in single.regions))
    columns = rep.packed_columns(box, fabric.width, fabric.height, count)
    if columns is not None:
        return _finish(kernels, single.regions, costs, fabric, training, optimizer, inputs,
                       edges, rep.grid_offsets(box, columns, count), box)
    options = []
    for columns, rows in rep.tile_grids(fabric.width, fabric.height, count):
        tile = (fabric.width // columns, fabric.height // rows)
        try:
            placed = place(kernels, dataclasses.replace(fabric, width=tile[0], height=tile[1]),
                           training=training, optimizer=optimizer,
                           batch_size=max(batch_size // count, 1))
        except TooLargeError:
            continue
        rows_used = math.ceil(count / columns)
        options.append((placed.timing.compute_samples_per_sec,
                        max(columns * tile[0], rows_used * tile[1]), placed.regions, tile, columns))
    if not options:
        return None
    fastest = max(o[0] for o in options)
    _, _, rects, tile, columns = min((o for o in options if o[0] * FASTEST_TOLERANCE >= fastest),
                                     key=lambda o: o[1])
    return _finish(kernels, rects, costs, fabric, training, optimizer, inputs, edges,
                   rep.grid_offsets(tile, columns, count), tile)


def equal_area_samples_per_sec(kernels: Sequence[Any], fabric: Fabric, *, training: bool,
                               cores: int | None = None) -> float:
    """The baseline: every kernel gets the same share of `cores` (default: the wafer)."""
    share = max(1, (fabric.cores if cores is None else cores) // max(len(kernels), 1))
    side = max(1, math.isqrt(share))
    region = Rect(0, 0, max(1, share // side), side)
    slowest = max(timing.kernel_timing(k, region, fabric, training=training).seconds_per_sample
                  for k in kernels)
    return 1.0 / slowest


@dataclass(frozen=True)
class PlacedModel:
    """The place pass's result: the matched model, its library kernels and their rectangles."""

    model: MatchedModel
    fabric: Fabric
    mode: str
    kernels: tuple[Any, ...]  # the built library kernels, in model.kernels' order
    placement: Placement


def build_kernels(model: MatchedModel) -> list:
    """The library kernels of `model` (their cost model is what placement reads), built with
    the dtypes flowing from the inputs, as the CS builds them at Load: what validates, loads."""
    built = []
    dtypes = {spec.name: wafer_dtype(spec.dtype) for spec in model.inputs}
    for node in model.kernels:
        try:
            kernel = build_kernel(node.type, node.name, node.attrs, node.input_shapes)
            dtypes[node.name] = kernel.output_dtype([dtypes[i] for i in node.inputs])
        except KernelError as error:
            raise CSRunError(f"kernel {node.name} ({node.type}) at {node.source}: {error}",
                             "change the layer's configuration to one the kernel supports") from None
        if tuple(kernel.output_shape) != tuple(node.output_shape):
            raise RuntimeError(f"kernel {node.name}: library output shape {kernel.output_shape} "
                               f"differs from TensorFlow's {node.output_shape}")
        built.append(kernel)
    timing.count_backward_passes(built, [node.inputs for node in model.kernels], [
        o.loss_kernel for o in (model.training.objectives if model.training else ())])
    return built


def shared_reads(model: MatchedModel) -> list[tuple[str, str, int]]:
    """(holder, reader, bytes) of every weight a kernel reads from another's region: a
    variable lives with its first reader, in program order."""
    holder: dict[str, str] = {}
    reads = []
    for node in model.kernels:
        for p in node.params:
            first = holder.setdefault(p.variable, node.name)
            if first != node.name:
                reads.append((first, node.name, math.prod(p.shape) * timing.BYTES_PER_VALUE))
    return reads


def with_shared_reads(placement: Placement, kernels: Sequence[Any],
                      reads: Sequence[tuple[str, str, int]], fabric: Fabric,
                      training: bool) -> Placement:
    """`placement` with a route from each shared weight's holder to each reader (in every
    replica) and the slowest read in its step time."""
    if not reads:
        return placement
    routes, seconds = [], 0.0
    for replica, (dx, dy) in enumerate(placement.replica_offsets):
        rect = {k.name: Rect(r.x + dx, r.y + dy, r.width, r.height)
                for k, r in zip(kernels, placement.regions)}
        for src, dst, nbytes in reads:
            (sx, sy), (cx, cy) = rect[src].center, rect[dst].center
            route = RouteSpec(src, dst, ((sx, sy), (cx, sy), (cx, cy)), 0, replica, int(nbytes))
            routes.append(route)
            seconds = max(seconds, timing.SharedRead(route.hops, route.bytes_per_batch,
                                                     rect[dst].height).seconds(fabric, training))
    return dataclasses.replace(placement, routes=placement.routes + tuple(routes),
                               timing=dataclasses.replace(placement.timing,
                                                          shared_read_seconds=seconds))


def weight_program_regions(model: MatchedModel, regions: Sequence[Rect]) -> tuple[Rect, ...]:
    """Where each kernel of the weight program runs: on the region of the first kernel (in
    program order) reading a value it computes or leads to."""
    program = model.weight_program
    if program is None:
        return ()
    readers: dict[str, int] = {}
    for i, node in enumerate(model.kernels):
        for p in node.params:
            readers.setdefault(p.variable, i)
    first: dict[str, int] = {}
    for k in reversed(program.kernels):
        first[k.name] = min(([readers[k.name]] if k.name in readers else []) + [
            first[c.name] for c in program.kernels if k.name in c.inputs and c.name in first])
    return tuple(regions[first[k.name]] for k in program.kernels)


def with_weight_program(placement: Placement, model: MatchedModel, fabric: Fabric,
                        training: bool) -> Placement:
    """`placement` with the weight program's kernels on their regions, charged once a step."""
    if model.weight_program is None:
        return placement
    regions = weight_program_regions(model, placement.regions)
    kernels = [build_kernel(k.type, k.name, k.attrs, k.input_shapes)
               for k in model.weight_program.kernels]
    seconds = timing.weight_program_seconds(list(zip(kernels, regions)), fabric, training)
    return dataclasses.replace(placement, weight_regions=regions, timing=dataclasses.replace(
        placement.timing, weight_program_seconds=seconds))


def with_state_writes(placement: Placement, model: MatchedModel, fabric: Fabric,
                      batch_size: int) -> Placement:
    """`placement` with the state writes of the batch (batch_writes.py) in its step time:
    each moves the whole batch's values it reads into the region of the state's first
    reader."""
    writes = [w for w in (model.training.weight_writes if model.training else ()) if w.batch]
    if not writes:
        return placement
    per_sample = {k.name: math.prod(k.output_shape) * timing.BYTES_PER_VALUE for k in model.kernels}
    per_sample.update({s.name: timing.input_bytes_per_sample(s) for s in model.inputs})
    heights = [next((r.height for node, r in zip(model.kernels, placement.regions)
                     if any(p.variable == w.variable for p in node.params)), 1)
               for w in writes]  # (1: a weight program's source, through one link)
    moved = [(batch_size * sum(per_sample[n] for n in w.batch), h)
             for w, h in zip(writes, heights)]
    return dataclasses.replace(placement, timing=dataclasses.replace(
        placement.timing, state_write_seconds=timing.state_write_seconds(moved, fabric)))


def place_model(model: MatchedModel, fab: Fabric, mode: str, *, batch_size: int = 1,
                replicas: int | None = 1) -> PlacedModel:
    """Build the kernels of `model` and place them on `fab`, `replicas` copies of them (None:
    as many as make the step of `batch_size` fastest); CSRunError if they do not fit."""
    kernels = build_kernels(model)
    training = mode == ModeKeys.TRAIN
    optimizer = "sgd" if model.training is None else timing.costliest(
        [model.training.optimizer.type, *(g.config.type for g in model.training.optimizer_groups)])
    edges = [(src, node.name) for node in model.kernels for src in node.inputs]
    inputs = {s.name: timing.input_bytes_per_sample(s) for s in model.inputs}
    if replicas is not None and replicas > 1 and batch_size % replicas:
        raise CSRunError(f"runconfig.num_replicas {replicas} does not divide the batch size "
                         f"{batch_size}: every replica takes an equal share of each batch",
                         f"use a batch size that is a multiple of {replicas}, or another "
                         "num_replicas (multireplica: true lets the compiler choose)")
    try:
        placement = with_state_writes(with_weight_program(with_shared_reads(
            place_replicated(kernels, fab, training=training, batch_size=batch_size,
                             replicas=replicas, optimizer=optimizer, inputs=inputs, edges=edges),
            kernels, shared_reads(model), fab, training), model, fab, training), model, fab,
            batch_size)
    except TooLargeError as error:
        gb = 2 ** 30
        raise CSRunError(
            f"the model does not fit on {fab.name}: it needs {error.needed_bytes / gb:,.2f} GB of "
            f"SRAM for {model.num_parameters:,} parameters (weights, gradients"
            f"{', ' + optimizer + ' slots' if optimizer != 'sgd' else ''} and activations in "
            f"flight; largest kernel {error.worst}), the fabric has {fab.sram_bytes / gb:,.2f} GB "
            f"({fab.width} x {fab.height} cores x {fab.sram_per_core // 1024} KB)",
            "pipelined mode is for models below about a billion parameters: make the model "
            "smaller") from None
    except ReplicasDoNotFitError as error:
        raise CSRunError(
            f"runconfig.num_replicas {error.count}: {error.count} copies of the model do not fit "
            f"on {fab.name} ({fab.cores:,} cores): one copy needs {error.floor_cores:,} cores for "
            f"its memory alone and is placed on {error.placed_cores:,} when alone",
            "ask for fewer replicas, or set multireplica: true to let the compiler choose") from None
    return PlacedModel(model, fab, mode, tuple(kernels), placement)

