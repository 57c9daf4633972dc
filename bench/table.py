"""The one table every benchmark prints: rows of (measure, value, unit, note).

A benchmark script exposes `measure() -> list[Row]` and prints `print_table(measure())`
from its `main()`; `bench/run_all.py` runs every script's `measure()` and prints one table.
Ratios are measured side by side in one run (the machines are shared and noisy).
"""
from __future__ import annotations

from typing import Sequence

Row = tuple[str, float, str, str]  # measure, value, unit ("ratio", "samples/s", ...), note


def format_value(value: float) -> str:
    if value != value:  # NaN
        return "n/a"
    return f"{value:,.3f}" if abs(value) < 100 else f"{value:,.0f}"


def print_table(rows: Sequence[Row], title: str | None = None) -> None:
    if title:
        print(f"\n== {title} ==")
    cells = [(name, format_value(value), unit, note) for name, value, unit, note in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells])
              for i, h in enumerate(("measure", "value", "unit", "note"))]
    line = "  ".join("{:<%d}" % w if i != 1 else "{:>%d}" % w for i, w in enumerate(widths))
    print(line.format("measure", "value", "unit", "note"))
    print("  ".join("-" * w for w in widths))
    for cell in cells:
        print(line.format(*cell), flush=True)
