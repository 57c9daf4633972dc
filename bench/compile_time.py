"""Compile time: `run.py --compile_only` against TensorFlow building the same graph.

For FC-MNIST and the transformer text classifier: one process compiles for the CS (extract,
match, place, write the artifacts into a fresh model_dir, so nothing is reused), the other
imports TensorFlow, builds the same training graph and initialises its variables in a
session; medians of a few runs each, side by side in one run. The ratio's aim is <= 2x.

    python bench/compile_time.py
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.table import Row, print_table  # noqa: E402

EXAMPLES = {"FC-MNIST": "fc_mnist", "transformer text": "transformer_text"}
RUNS = 3


def build_and_initialise(example: str) -> None:
    """What the baseline process does: the example's training graph, built and initialised."""
    import importlib

    import tensorflow as tf
    import yaml

    from tf_model.model_fn import batch_signature, call_model_fn, make_dataset, model_graph

    model = importlib.import_module(f"examples.{example}.model")
    data = importlib.import_module(f"examples.{example}.data")
    with open(ROOT / "examples" / example / "configs" / "params.yaml") as f:
        params = yaml.safe_load(f)
    signature = batch_signature(make_dataset(data.train_input_fn, params))
    with model_graph(params) as graph:
        features, labels = signature.placeholders()
        call_model_fn(model.model_fn, features, labels, "train", params)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())


def seconds(argv: list[str], cwd: str) -> float:
    """Wall seconds of one process; RuntimeError with its last error line if it fails."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        raise RuntimeError(lines[-1] if lines else f"exit {done.returncode}")
    return elapsed


def median_seconds(argv_for_run, cwd: str) -> float:
    return statistics.median(seconds(argv_for_run(i), cwd) for i in range(RUNS))


def measure() -> list[Row]:
    rows: list[Row] = []
    note = f"median of {RUNS} processes"
    with TemporaryDirectory() as tmp:
        for label, example in EXAMPLES.items():
            run_py = str(ROOT / "examples" / example / "run.py")
            build = median_seconds(lambda i, example=example: [
                sys.executable, __file__, "--build_and_initialise", example], tmp)
            try:
                compile_s = median_seconds(lambda i, example=example, run_py=run_py: [
                    sys.executable, run_py, "--compile_only", "-o", os.path.join(tmp, f"{example}-{i}")], tmp)
                why = note + ", fresh model_dir each"
            except RuntimeError as error:
                compile_s, why = float("nan"), f"--compile_only failed: {error}"[:100]
            rows += [(f"{label}: run.py --compile_only", compile_s, "s", why),
                     (f"{label}: import TF, build + initialise graph", build, "s", note),
                     (f"{label}: compile / build", compile_s / build, "ratio", "aim <= 2")]
    return rows


def main() -> None:
    print_table(measure())


if __name__ == "__main__":
    if sys.argv[1:2] == ["--build_and_initialise"]:
        build_and_initialise(sys.argv[2])
    else:
        main()
