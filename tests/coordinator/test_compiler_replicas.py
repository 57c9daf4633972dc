"""Multireplica placement and timing: R copies of the network on one wafer, each on a tile of
its own; the steady state scales with R up to the wafer's I/O; the compiler's own choice is
the fastest step among the counts that divide the batch; a model too big to replicate says
so in one line; the wafer picture shows every replica."""
import dataclasses
import io
import math

import pytest
from PIL import Image
from test_compiler_placement import mlp

from common.errors import CSRunError
from coordinator import replicas as rep
from coordinator.compiler import report, wafer_map
from coordinator.compiler.placement import FASTEST_TOLERANCE, Rect, ReplicasDoNotFitError, place, place_replicated
from wafer import timing
from wafer.fabric import get_fabric

CS1 = get_fabric("cs1")
INPUTS = {"features": 784 * 4, "labels": 4}
FC_MNIST = mlp([500, 300, 10], 784)  # 784-500-300-10, cross-entropy, loss
EDGES = [("features", "d0"), ("d0", "d1"), ("d1", "d2"), ("d2", "xent"), ("labels", "xent"),
         ("xent", "loss")]


def replicated(count, batch=256, kernels=FC_MNIST, fabric=CS1):
    return place_replicated(kernels, fabric, training=True, batch_size=batch, replicas=count,
                            optimizer="adam", inputs=INPUTS, edges=EDGES)


def test_replicas_are_copies_of_the_network_each_on_a_tile_of_its_own():
    single, four = replicated(1), replicated(4)
    assert four.replicas == 4 and four.replica_offsets[0] == (0, 0)
    rects = [r for i in range(4) for r in four.replica_regions(i)]
    for r in rects:
        assert 0 <= r.x and r.x + r.width <= CS1.width and 0 <= r.y and r.y + r.height <= CS1.height
    for i, a in enumerate(rects):
        assert not any(a.overlaps(b) for b in rects[i + 1:])
    tile_w, tile_h = four.tile
    for i, (dx, dy) in enumerate(four.replica_offsets):  # each replica inside its own tile
        assert all(dx <= r.x and r.x + r.width <= dx + tile_w and dy <= r.y
                   and r.y + r.height <= dy + tile_h for r in four.replica_regions(i))
        assert [(r.width, r.height) for r in four.replica_regions(i)] == \
            [(r.width, r.height) for r in single.regions]
    # each replica as fast as the network alone; every replica's routes, inputs from the west
    assert four.timing.compute_samples_per_sec == pytest.approx(4 * single.timing.compute_samples_per_sec)
    assert four.timing.active_cores == 4 * single.timing.active_cores
    assert four.memory_per_core == single.memory_per_core
    assert len(four.routes) == 4 * len(single.routes)
    assert {r.replica for r in four.routes} == {0, 1, 2, 3}
    assert all(r.path[0][0] == 0 for r in four.routes if r.src in INPUTS)


def test_the_steady_state_scales_with_the_replicas_up_to_the_wafers_io():
    single = replicated(1).timing
    io_bound = CS1.io_bytes_per_sec / sum(INPUTS.values())
    for count in (2, 4, 8, 16, 64):
        t = replicated(count).timing
        assert t.compute_samples_per_sec == pytest.approx(count * single.compute_samples_per_sec)
        assert t.transmission_samples_per_sec == pytest.approx(io_bound)
        assert t.samples_per_sec == pytest.approx(min(count * single.compute_samples_per_sec, io_bound))
        assert t.compute_utilization == pytest.approx(single.compute_utilization * min(
            1.0, io_bound / (count * single.compute_samples_per_sec)))
    assert replicated(64).timing.samples_per_sec == pytest.approx(io_bound)  # I/O-bound
    # a step of 256: each replica streams 256 / R samples, then the gradients' all-reduce
    two = replicated(2)
    link = CS1.link_bytes_per_cycle * CS1.clock_hz
    per_round = max(timing.num_parameters(k) * 4 / (r.height * link)
                    for k, r in zip(FC_MNIST, two.regions))
    span = sum(abs(a - b) for a, b in zip(*two.replica_offsets))
    allreduce = timing.ALLREDUCE_PASSES * (1 * per_round + span / CS1.clock_hz)
    assert two.timing.allreduce_seconds == pytest.approx(allreduce)
    assert two.timing.step_seconds(256) == pytest.approx(
        254 / two.timing.samples_per_sec + two.timing.fill_seconds + allreduce
        + two.timing.update_seconds)
    assert 256 / two.timing.step_seconds(256) > 1.2 * 256 / single.step_seconds(256)
    inference = place_replicated(FC_MNIST, CS1, training=False, batch_size=256, replicas=2,
                                 inputs=INPUTS, edges=EDGES).timing
    assert inference.allreduce_seconds == 0.0  # nothing to sum without training


def test_without_a_count_the_compiler_takes_the_fastest_step_among_the_batchs_divisors():
    chosen = replicated(None)
    counts = [count for count, _ in chosen.replica_candidates]
    assert counts == rep.divisors(256) and 256 % chosen.replicas == 0
    rates = dict(chosen.replica_candidates)
    assert chosen.replicas > 1
    assert rates[chosen.replicas] * FASTEST_TOLERANCE >= max(rates.values())
    assert all(rate * FASTEST_TOLERANCE < max(rates.values())
               for count, rate in rates.items() if count < chosen.replicas)
    assert rates[chosen.replicas] == pytest.approx(256 / chosen.timing.step_seconds(256))
    assert [c for c, _ in replicated(None, batch=7).replica_candidates] in ([1], [1, 7])


def test_replica_grids_and_counts():
    assert rep.divisors(12) == [1, 2, 3, 4, 6, 12] and rep.divisors(1) == [1]
    assert rep.tile_grids(10, 10, 5) == [(1, 5), (2, 3), (3, 2), (5, 1)]
    assert rep.grid_offsets((3, 2), 2, 3) == ((0, 0), (3, 0), (0, 2))
    assert rep.packed_columns((3, 2), 10, 4, 4) == 2  # 2 x 2 tiles: the squarest that fits
    assert rep.packed_columns((3, 2), 5, 4, 4) is None
    with pytest.raises(CSRunError, match="num_replicas in p.yaml is 0"):
        rep.requested_replicas({"num_replicas": 0}, "p.yaml")
    asked = [rep.requested_replicas(c) for c in (
        {}, {"multireplica": True}, {"multireplica": True, "num_replicas": 1},
        {"num_replicas": -1}, {"num_replicas": 4}, {"multireplica": False, "num_replicas": 1})]
    assert asked == [1, None, None, None, 4, 1]


def test_a_model_too_big_to_replicate_says_so():
    small = dataclasses.replace(CS1, width=16, height=14)  # 224 cores
    floors = [timing.min_cores_for_memory(timing.memory_bytes(k, i, len(FC_MNIST), "adam", True),
                                          small) for i, k in enumerate(FC_MNIST)]
    assert sum(floors) <= small.cores < 2 * sum(floors)  # one copy fits, two do not
    with pytest.raises(ReplicasDoNotFitError) as error:
        replicated(2, fabric=small)
    assert error.value.count == 2 and error.value.floor_cores == sum(floors)
    alone = replicated(None, fabric=small)
    assert alone.replicas == 1 and [c for c, _ in alone.replica_candidates] == [1]
    lines = report.replica_lines(alone, small, 256)
    assert lines == [f"Replicas: 1 (multireplica asked for; the model is too big to replicate: "
                     f"one copy needs {sum(floors)} of the 224 cores of cs1 for its memory alone)"]
    # on a wafer twice as large two copies fit, each on a tile of its own
    double = dataclasses.replace(small, width=32)
    two = replicated(2, fabric=double)
    assert two.replicas == 2 and 2 * two.tile[0] * two.tile[1] <= double.cores
    a, b = two.replica_regions(0), two.replica_regions(1)
    assert not any(r.overlaps(q) for r in a for q in b)


def test_the_wafer_map_draws_every_replica():
    four = replicated(4)
    names = [k.name for k in FC_MNIST]
    png = wafer_map.render(CS1, names, names, four.regions, four.routes, "fc", four.replica_offsets,
                           four.tile)
    image = Image.open(io.BytesIO(png)).convert("RGB")
    used = max(r.x + r.width + dx for r in four.regions for dx, _ in four.replica_offsets)
    used = max(used, max(r.y + r.height + dy for r in four.regions for _, dy in four.replica_offsets))
    scale = wafer_map.PANEL / used
    first = four.regions[0]  # the first dense layer: the largest rectangle of each replica
    for dx, dy in four.replica_offsets:  # in the zoom panel
        x = wafer_map.PANEL + 20 + (first.x + dx + first.width / 4) * scale  # off its routes
        y = 10 + 20 + (first.y + dy + first.height / 4) * scale
        assert image.getpixel((int(x), int(y))) == wafer_map.PALETTE[0]
    one = wafer_map.render(CS1, names, names, four.regions, four.routes[:len(EDGES)], "fc")
    assert png != one


def test_more_copies_than_the_network_alone_leaves_room_for_go_on_the_tiles_of_a_grid():
    """More copies than fit of the one-replica placement's bounding box: each is placed anew on
    a tile of a grid (as fast as the network alone at most)."""
    big = mlp([2048] * 6 + [10], 784)
    single = place(big, CS1, training=True, optimizer="adam")
    box = (max(r.x + r.width for r in single.regions), max(r.y + r.height for r in single.regions))
    count = (CS1.width // box[0]) * (CS1.height // box[1]) + 1  # more than fit at full speed
    edges = [("features", "d0")] + [(f"d{i}", f"d{i + 1}") for i in range(6)] + \
        [("d6", "xent"), ("labels", "xent"), ("xent", "loss")]
    placed = place_replicated(big, CS1, training=True, batch_size=count * 4, replicas=count,
                              optimizer="adam", inputs=INPUTS, edges=edges)
    assert placed.replicas == count and placed.tile[0] * placed.tile[1] < box[0] * box[1]
    assert placed.timing.compute_samples_per_sec <= \
        count * single.timing.compute_samples_per_sec * (1 + 1e-9)
    rects = [Rect(r.x, r.y, r.width, r.height) for i in range(count) for r in placed.replica_regions(i)]
    assert all(r.x + r.width <= CS1.width and r.y + r.height <= CS1.height for r in rects)
    assert not any(a.overlaps(b) for i, a in enumerate(rects) for b in rects[i + 1:])
    assert math.isfinite(placed.timing.step_seconds(count * 4))
