"""`make bench`: every benchmark in bench/ (each script's `measure()`), one table each.

    python bench/run_all.py [NAME ...]     # NAME: a script's name without .py
"""
from __future__ import annotations

import importlib
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from bench.table import print_table  # noqa: E402

NOT_BENCHMARKS = {"run_all", "table", "__init__"}


def scripts() -> list[str]:
    return sorted(f[:-3] for f in os.listdir(HERE)
                  if f.endswith(".py") and f[:-3] not in NOT_BENCHMARKS)


def main(argv: list[str]) -> int:
    names = argv or scripts()
    unknown = sorted(set(names) - set(scripts()))
    if unknown:
        print(f"run_all: error: no benchmark {', '.join(unknown)} (hint: one of {', '.join(scripts())})",
              file=sys.stderr)
        return 2
    for name in names:
        start = time.perf_counter()
        module = importlib.import_module(f"bench.{name}")
        print_table(module.measure(), title=f"{name} ({module.__doc__.strip().splitlines()[0]})")
        print(f"({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
