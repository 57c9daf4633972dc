"""What the training analysis adds to compiling FC-MNIST (784-500-300-10, batch 256, Adam).

Side by side in one process, medians of REPEATS: extract (model_fn built on placeholders,
input_fn's first batch read) against analyze_training (train_op structure, the Session.run
on the first batch comparing gradients, the random-gradient transform check).
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from bench.table import Row, print_table  # noqa: E402

REPEATS = 3


def measure() -> list[Row]:
    from coordinator.compiler.extract import extract
    from coordinator.compiler.training import analyze_training
    from examples.fc_mnist.data import train_input_fn
    from examples.fc_mnist.model import model_fn

    config = yaml.safe_load((ROOT / "examples/fc_mnist/configs/params.yaml").read_text())
    params = {**config, "batch_size": config["train_input"]["batch_size"]}
    extracting, analysing = [], []
    for _ in range(REPEATS):
        start = time.perf_counter()
        extracted = extract(model_fn, train_input_fn, params)
        middle = time.perf_counter()
        analyze_training(extracted)
        extracting.append(middle - start)
        analysing.append(time.perf_counter() - middle)
    e, a = statistics.median(extracting), statistics.median(analysing)
    return [("FC-MNIST extract", e, "s", "build model_fn, read the first batch"),
            ("FC-MNIST analyze_training", a, "s", "incl. one Session.run on the first batch"),
            ("analyze_training / extract", a / e, "ratio", "side by side, one process")]


def main() -> None:
    print_table(measure())


if __name__ == "__main__":
    main()
