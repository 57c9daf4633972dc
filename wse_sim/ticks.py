"""A batch's tick schedule through the pipeline's regions (`wse_sim.pipeline`): the tick
at which each region runs each micro-batch's forward and backward pass, in tick order, and
each stage's share of it.

A batch of B samples streams through as M = B / micro_batch_size micro-batches. At tick t
the region at topological position k runs the forward pass of micro-batch t - k and the
backward pass of micro-batch t - 2(K - 1) + k (K regions; the loss region turns a
micro-batch around in the tick it sees it), so region k works on micro-batch i + 1 while
region k + 1 works on micro-batch i, and gradients flow back the same way. A batch barrier
(BatchNormalization in training: `Kernel.batch_barrier`) starts M - 1 ticks later, forward
and backward, so that it has every micro-batch's input (output gradient) before it
releases the first: it computes the whole batch's statistics, and the regions after it
start that much later too."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Sequence

if TYPE_CHECKING:
    from wse_sim.pipeline import Region


class Task(NamedTuple):
    forward: bool  # else backward
    region: Region
    micro: int


@dataclass(frozen=True)
class Stage:
    """A stage's regions and its share of a batch's tick schedule."""

    regions: tuple[Region, ...]
    tasks: tuple[Task, ...]


def plan(regions: Sequence[Region], groups: Sequence[range], m_count: int,
         backward: bool) -> tuple[Stage, ...]:
    """The batch's tick schedule of M = `m_count` micro-batches, split into the stages of
    `groups` (ranges of region positions)."""
    forward_start, backward_start = starts(regions, m_count, backward)
    schedule = []
    last_tick = max(forward_start + backward_start, default=0) + m_count - 1
    for tick in range(last_tick + 1):
        for region in regions:
            i = tick - forward_start[region.position]
            if 0 <= i < m_count:
                schedule.append(Task(True, region, i))
            i = tick - backward_start[region.position]
            if backward and region.backward and 0 <= i < m_count:
                schedule.append(Task(False, region, i))
    return tuple(Stage(tuple(regions[k] for k in group),
                       tuple(t for t in schedule if t.region.position in group))
                 for group in groups)


def starts(regions: Sequence[Region], m_count: int,
           backward: bool) -> tuple[list[int], list[int]]:
    """The tick of each region's forward and backward pass of micro-batch 0. A region
    starts a tick after the region before it (the loss turns around in its own tick), and
    a batch barrier M - 1 ticks later still: its input's last micro-batch arrives before
    it releases the first (backward: its output gradient's)."""
    hold = m_count - 1
    forward_start: list[int] = []
    for region in regions:
        start = forward_start[-1] + 1 if forward_start else 0
        forward_start.append(start + hold * region.kernel.batch_barrier)
    backward_start = list(forward_start)
    if regions and regions[-1].kernel.batch_barrier and backward and regions[-1].backward:
        backward_start[-1] += hold  # (a loss of the whole batch: every forward first)
    for region in reversed(regions[:-1]):
        k = region.position
        backward_start[k] = backward_start[k + 1] + 1 + \
            hold * (region.kernel.batch_barrier and backward and region.backward)
    return forward_start, backward_start
