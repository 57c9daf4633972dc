"""Place: give each kernel a rectangle of cores so that the slowest kernel is as fast as
possible, within per-core memory and each kernel's useful parallelism.

Sizes: for a target throughput X, kernel k needs max(memory floor_k, F_k X / rate) cores;
the largest X whose rectangles still fit is found by bisection (X is capped by the kernels'
parallelism). Layout: kernels in topological order fill horizontal bands of height h,
left to right in even bands and right to left in odd ones (a serpentine), so consecutive
kernels touch; every band height is tried and the first that fits is kept.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from wse_sim import timing
from wse_sim.fabric import Fabric


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

    @property
    def hops(self) -> int:
        return sum(abs(a[0] - b[0]) + abs(a[1] - b[1]) for a, b in zip(self.path, self.path[1:]))


@dataclass(frozen=True)
class Placement:
    regions: tuple[Rect, ...]  # one per kernel, topological order
    routes: tuple[RouteSpec, ...]
    timing: timing.PipelineTiming
    memory_bytes: tuple[int, ...]  # per kernel, total
    memory_per_core: tuple[int, ...]
    balanced_bound: float  # best balanced pipeline (fractional cores)
    fabric_bound: float  # cores x rate / FLOPs per sample

    @property
    def quality(self) -> float:
        """Achieved compute throughput as a fraction of the balanced-pipeline bound."""
        return self.timing.compute_samples_per_sec / self.balanced_bound


class TooLargeError(ValueError):
    """The model's weights, optimizer state and activations exceed the fabric's SRAM."""

    def __init__(self, needed_bytes: int, fabric: Fabric, worst: str):
        self.needed_bytes = needed_bytes
        self.fabric = fabric
        self.worst = worst
        super().__init__(f"needs {needed_bytes} bytes, fabric has {fabric.sram_bytes}")


@dataclass(frozen=True)
class _Costs:
    flops: tuple[float, ...]
    caps: tuple[int, ...]
    floors: tuple[int, ...]
    memory: tuple[int, ...]


def _costs(kernels: Sequence[Any], fabric: Fabric, training: bool, optimizer: str) -> _Costs:
    n = len(kernels)
    memory = tuple(timing.memory_bytes(k, i, n, optimizer, training) for i, k in enumerate(kernels))
    return _Costs(
        flops=tuple(timing.flops_per_sample(k, training) for k in kernels),
        caps=tuple(max(1, int(k.max_cores())) for k in kernels),
        floors=tuple(timing.min_cores_for_memory(m, fabric) for m in memory),
        memory=memory)


def _sizes(costs: _Costs, x: float, rate: float) -> list[int]:
    """Cores each kernel needs to reach x samples/s (its floor, at most its cap beyond it)."""
    return [max(floor, min(cap, math.ceil(f * x / rate)))
            for f, cap, floor in zip(costs.flops, costs.caps, costs.floors)]


def layout(sizes: Sequence[int], fabric: Fabric, band_height: int) -> list[Rect] | None:
    """Serpentine band layout of `sizes` cores, or None if it does not fit."""
    bands = fabric.height // band_height
    rects: list[Rect] = []
    band, used = 0, 0
    for size in sizes:
        height = min(band_height, size)
        width = math.ceil(size / height)
        if width > fabric.width:
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


def _fit(sizes: Sequence[int], fabric: Fabric) -> list[Rect] | None:
    """Some band layout of `sizes` that fits, or None."""
    if sum(sizes) > fabric.cores:
        return None
    for h in _band_heights(fabric):
        rects = layout(sizes, fabric, h)
        if rects is not None:
            return rects
    return None


def _best_layout(kernels: Sequence[Any], sizes: Sequence[int], fabric: Fabric,
                 training: bool) -> list[Rect] | None:
    """Of the band layouts that fit, one whose slowest kernel (compute or links) is fastest;
    among those (within 0.1 %), the most compact (squarest bounding box: short routes)."""
    candidates = []
    for h in _band_heights(fabric):
        rects = layout(sizes, fabric, h)
        if rects is None:
            continue
        slowest = max(timing.kernel_timing(k, r, fabric, training=training).seconds_per_sample
                      for k, r in zip(kernels, rects))
        width = max(r.x + r.width for r in rects)
        height = max(r.y + r.height for r in rects)
        candidates.append((slowest, (max(width, height), width * height), rects))
    if not candidates:
        return None
    fastest = min(c[0] for c in candidates)
    return min((c for c in candidates if c[0] <= fastest * 1.001), key=lambda c: c[1])[2]


def _band_heights(fabric: Fabric) -> list[int]:
    """Candidate band heights: every height dividing the fabric into 1..64 bands, and small ones."""
    heights = {fabric.height // b for b in range(1, 65)} | set(range(1, 17))
    return sorted((h for h in heights if h >= 1), reverse=True)


def place(kernels: Sequence[Any], fabric: Fabric, *, training: bool, optimizer: str = "sgd",
          input_bytes_per_sample: int = 0, input_names: Sequence[str] = (),
          edges: Sequence[tuple[str, str]] = ()) -> Placement:
    """Rectangles for `kernels` (built wse_sim kernels, topological order).

    `edges` are (src, dst) data paths between kernels or from program inputs (names in
    `input_names`, which enter at the wafer's west edge). Raises TooLargeError when the
    kernels' memory does not fit on the fabric.
    """
    costs = _costs(kernels, fabric, training, optimizer)
    if sum(costs.floors) > fabric.cores:
        worst = max(range(len(kernels)), key=lambda i: costs.memory[i])
        raise TooLargeError(sum(costs.memory), fabric, kernels[worst].name)
    rate = fabric.core_flops_per_sec
    cap = min(c * rate / f for c, f in zip(costs.caps, costs.flops) if f > 0) \
        if any(costs.flops) else 1.0
    target = cap
    if _fit(_sizes(costs, cap, rate), fabric) is None:
        if _fit(list(costs.floors), fabric) is None:
            worst = max(range(len(kernels)), key=lambda i: costs.memory[i])
            raise TooLargeError(sum(costs.memory), fabric, kernels[worst].name)
        lo, hi = 0.0, cap
        while hi - lo > 1e-4 * hi:
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if _fit(_sizes(costs, mid, rate), fabric) is not None else (lo, mid)
        target = lo
    rects = _best_layout(kernels, _sizes(costs, target, rate), fabric, training)
    return _finish(kernels, rects, costs, fabric, training, optimizer, input_bytes_per_sample,
                   input_names, edges)


def _finish(kernels, rects, costs, fabric, training, optimizer, input_bytes, input_names,
            edges) -> Placement:
    by_name = {k.name: (k, r) for k, r in zip(kernels, rects)}
    routes = []
    for src, dst in edges:
        kernel, rect = by_name[dst]
        cx, cy = rect.center
        if src in input_names:
            start = (0, cy)
            nbytes = math.prod(kernel.input_shapes[0]) * timing.BYTES_PER_VALUE
        else:
            start = by_name[src][1].center
            nbytes = math.prod(by_name[src][0].output_shape) * timing.BYTES_PER_VALUE
        path = (start, (cx, start[1]), (cx, cy))
        routes.append(RouteSpec(src, dst, path, int(nbytes)))
    hops = sum(r.hops for r in routes)
    pipeline = timing.pipeline_timing(list(zip(kernels, rects)), fabric, training=training,
                                      input_bytes_per_sample=input_bytes, optimizer=optimizer,
                                      route_hops=hops)
    return Placement(
        regions=tuple(rects), routes=tuple(routes), timing=pipeline,
        memory_bytes=costs.memory,
        memory_per_core=tuple(timing.memory_per_core(m, r.cores)
                              for m, r in zip(costs.memory, rects)),
        balanced_bound=timing.balanced_bound_samples_per_sec(
            kernels, fabric, training=training, min_cores=costs.floors),
        fabric_bound=timing.fabric_bound_samples_per_sec(kernels, fabric, training=training))


def equal_area_samples_per_sec(kernels: Sequence[Any], fabric: Fabric, *, training: bool,
                               cores: int | None = None) -> float:
    """The baseline: every kernel gets the same share of `cores` (default: the wafer)."""
    share = max(1, (fabric.cores if cores is None else cores) // max(len(kernels), 1))
    side = max(1, math.isqrt(share))
    region = Rect(0, 0, max(1, share // side), side)
    slowest = max(timing.kernel_timing(k, region, fabric, training=training).seconds_per_sample
                  for k in kernels)
    return 1.0 / slowest
