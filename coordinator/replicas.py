"""Multireplica: how many data-parallel copies of the network the user asks for, which
counts can split a batch, and where the copies' tiles lie on the wafer.

The original installation's `runconfig.multireplica: True` (run.py `--multireplica`) lets
the compiler choose the number of replicas; `runconfig.num_replicas` asks for a number
(-1: the compiler chooses; 1 with multireplica: the compiler chooses, as the original's
runner reads it). Each replica takes batch_size / R samples of every batch, so R divides the
batch size. A replica's tile is a rectangle of the wafer; copies are laid out row by row.
"""
from __future__ import annotations

import math
from typing import Mapping

from common.errors import CSRunError

Offset = tuple[int, int]


def requested_replicas(runconfig: Mapping, where: str = "") -> int | None:
    """The replicas `runconfig` (read from `where`) asks for: 1 (one copy, the default), a
    number, or None (as many as fit: the compiler chooses)."""
    multireplica = runconfig.get("multireplica") or False
    count = runconfig.get("num_replicas")
    at = f" in {where}" if where else ""
    if not isinstance(multireplica, bool):
        raise CSRunError(f"runconfig.multireplica{at} is {multireplica!r}, not true or false")
    if count is None:
        return None if multireplica else 1
    if isinstance(count, bool) or not isinstance(count, int) or count == 0 or count < -1:
        raise CSRunError(f"runconfig.num_replicas{at} is {count!r}, not a whole number >= 1 or -1",
                         "give the number of copies of the network, or -1 (or multireplica: "
                         "true) to let the compiler choose")
    if count == -1 or (count == 1 and multireplica):
        return None
    return count


def divisors(n: int) -> list[int]:
    """The replica counts that split a batch of n samples evenly, ascending."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def grid_offsets(tile: tuple[int, int], columns: int, count: int) -> tuple[Offset, ...]:
    """`count` tiles of `tile` (width, height) laid out row by row, `columns` to a row."""
    width, height = tile
    return tuple(((i % columns) * width, (i // columns) * height) for i in range(count))


def packed_columns(tile: tuple[int, int], width: int, height: int, count: int) -> int | None:
    """Columns of the squarest grid of `count` tiles that fits a `width` x `height` fabric,
    or None."""
    tw, th = tile
    best = None
    for columns in range(1, min(count, width // max(tw, 1)) + 1):
        rows = math.ceil(count / columns)
        if rows * th > height:
            continue
        side = max(columns * tw, rows * th)
        if best is None or side < best[0]:
            best = (side, columns)
    return None if best is None else best[1]


def tile_grids(width: int, height: int, count: int) -> list[tuple[int, int]]:
    """(columns, rows) grids of at least `count` tiles cutting a `width` x `height` fabric,
    none with both more columns and more rows than another (each tile as large as it can be)."""
    grids: list[tuple[int, int]] = []
    for columns in range(1, min(count, width) + 1):
        rows = math.ceil(count / columns)
        if rows > height or (grids and grids[-1][1] == rows):
            continue
        grids.append((columns, rows))
    return grids
