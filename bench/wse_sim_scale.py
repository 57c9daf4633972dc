"""Scale: training samples/s of the simulator next to TensorFlow as the batch grows (64, 256, 1024) on FC-MNIST and the CNN example, and the simulator's peak RSS as the model grows.

Every simulator run is a process of its own that imports no TensorFlow: it loads the
compiled program and its initial weights as `wse_sim serve` does (Pipeline.load, one
thread per usable CPU), trains the same random batches as TensorFlow, and reports its best
steps/s and its peak RSS (VmHWM: ru_maxrss would count the parent's, kept across exec)
next to its RSS before the Load. TensorFlow trains
the same model on the same batches in a v1 Session in this process (feed_dict, its
default threads). Rounds are interleaved, best of each. Prints the README's markdown table.

    make bench BENCH=wse_sim_scale      # or: python bench/wse_sim_scale.py
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.table import Row, print_table  # noqa: E402

BATCHES = (64, 256, 1024)
SAMPLES = 4096  # per timed run, whatever the batch: the same work at every batch size
ROUNDS = 2


@dataclass(frozen=True)
class Model:
    name: str
    model_fn: Callable
    input_fn: Callable
    params: Callable[[int], dict]  # batch size -> params
    batches: tuple[int, ...] = BATCHES


def fc_params(hidden: list[int]) -> Callable[[int], dict]:
    return lambda batch: {"batch_size": batch, "hidden": hidden, "optimizer": "sgd",
                          "learning_rate": 0.01, "runconfig": {"tf_random_seed": 1}}


def cnn_params(batch: int) -> dict:
    import yaml

    with open(os.path.join(ROOT, "examples", "cnn_digits", "configs", "params.yaml")) as f:
        params = yaml.safe_load(f)
    params["train_input"]["batch_size"] = batch
    return params


def models() -> list[Model]:
    from examples import mlp as m
    from examples.cnn_digits import data as cnn_data
    from examples.cnn_digits import model as cnn_model

    return [Model("FC-MNIST 784-500-300-10", m.keras_mlp, m.input_fn, fc_params([500, 300])),
            Model("CNN example (8x8 digits)", cnn_model.model_fn, cnn_data.train_input_fn,
                  cnn_params),
            Model("FC 784-2000-1000-10", m.keras_mlp, m.input_fn, fc_params([2000, 1000]), (256,)),
            Model("FC 784-4000-4000-10", m.keras_mlp, m.input_fn, fc_params([4000, 4000]), (256,))]


def random_batches(program, count: int) -> list[dict[str, np.ndarray]]:
    """Features uniform in [0, 1), integer labels in [0, 10), shaped as the program takes."""
    from cs_api.tensors import dtype_of

    rng = np.random.default_rng(0)
    out = []
    for _ in range(count):
        batch = {}
        for spec in program.inputs:
            shape = (program.batch_size, *spec.shape)
            dtype = dtype_of(spec.dtype)
            batch[spec.name] = (rng.integers(0, 10, shape).astype(dtype) if dtype.kind == "i"
                                else rng.random(shape, dtype=np.float32))
        out.append(batch)
    return out


def steps_per_sec(step: Callable[[dict], None], data: list[dict]) -> float:
    for batch in data[:2]:
        step(batch)
    start = time.perf_counter()
    for batch in data:
        step(batch)
    return len(data) / (time.perf_counter() - start)


# ---- the simulator, in a process of its own ----
def child(directory: str) -> None:
    """Load the program in `directory`, train its batches ROUNDS times, print JSON."""
    from cs_api import pb
    from wse_sim.pipeline import Pipeline
    from wse_sim.program import check_program, check_state
    from wse_sim.stages import usable_cpus

    assert "tensorflow" not in sys.modules
    with open(os.path.join(directory, "program.pb"), "rb") as f:
        program = pb.Program.FromString(f.read())
    weights = dict(np.load(os.path.join(directory, "weights.npz")))
    stored = np.load(os.path.join(directory, "batches.npz"))
    names = sorted({k.split("/", 1)[1] for k in stored})
    data = [{n: stored[f"{i}/{n}"] for n in names} for i in range(len(stored) // len(names))]
    before = rss_mb()
    checked = check_program(program)
    pipeline = Pipeline.load(checked, check_state(checked, weights), threads=usable_cpus())
    best = 0.0
    try:
        for _ in range(ROUNDS):
            best = max(best, steps_per_sec(lambda b: pipeline.run(b, training=True), data))
    finally:
        pipeline.close()
    print(json.dumps({"steps_per_sec": best, "rss_before_mb": before, "peak_rss_mb": rss_mb("VmHWM"),
                      "threads": pipeline.threads, "stages": pipeline.stages}))


def rss_mb(field: str = "VmRSS") -> float:
    """This process's resident set (or with "VmHWM", its peak) in MB."""
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith(field + ":"))
    return int(line.split()[1]) / 1024


def simulator(program, weights, data) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "program.pb"), "wb") as f:
            f.write(program.SerializeToString())
        np.savez(os.path.join(tmp, "weights.npz"), **weights)
        np.savez(os.path.join(tmp, "batches.npz"),
                 **{f"{i}/{n}": a for i, b in enumerate(data) for n, a in b.items()})
        out = subprocess.run([sys.executable, "-m", "bench.wse_sim_scale", "--child", tmp],
                             cwd=ROOT, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


# ---- TensorFlow ----
def tensorflow(model: Model, params: dict, data) -> float:
    import tensorflow as tf

    from tf_model.model_fn import batch_signature, call_model_fn, make_dataset, model_graph

    signature = batch_signature(make_dataset(model.input_fn, params))
    with model_graph(params) as graph:
        features, labels = signature.placeholders()
        spec = call_model_fn(model.model_fn, features, labels, "train", params)
        init = tf.compat.v1.global_variables_initializer()
    names = list(data[0])  # the program's inputs: features first, then labels
    with tf.compat.v1.Session(graph=graph) as session:
        session.run(init)
        return steps_per_sec(lambda b: session.run(
            spec.train_op, {features: b[names[0]], labels: b[names[1]]}), data)


def measure() -> list[Row]:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from coordinator.compiler import compile_model

    results = []
    for model in models():
        for batch in model.batches:
            params = model.params(batch)
            with tempfile.TemporaryDirectory() as tmp:
                compiled = compile_model(model.model_fn, model.input_fn, params, tmp)
            program = compiled.program
            data = random_batches(program, max(4, SAMPLES // batch))
            sim, tf_steps = {}, 0.0
            for _ in range(ROUNDS):
                run = simulator(program, compiled.initial_weights, data)
                if run["steps_per_sec"] > sim.get("steps_per_sec", 0):
                    sim = run
                tf_steps = max(tf_steps, tensorflow(model, params, data))
            size = sum(a.nbytes for a in compiled.initial_weights.values()) / 2 ** 20
            results.append((model.name, size, batch, sim, tf_steps))
    print_markdown(results)
    rows: list[Row] = []
    for name, size, batch, sim, tf_steps in results:
        ratio = sim["steps_per_sec"] / tf_steps
        rows.append((f"{name}, batch {batch}: wse_sim / TensorFlow", ratio, "ratio",
                     f"{sim['steps_per_sec'] * batch:,.0f} vs {tf_steps * batch:,.0f} samples/s; "
                     f"peak RSS {sim['peak_rss_mb']:.0f} MB for {size:.1f} MB of weights"))
    return rows


def print_markdown(results) -> None:
    print("| model | weights (MB) | batch | wse_sim samples/s | TensorFlow samples/s | "
          "wse_sim / TF | wse_sim peak RSS (MB) | RSS above start (MB) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, size, batch, sim, tf_steps in results:
        print(f"| {name} | {size:.1f} | {batch} | {sim['steps_per_sec'] * batch:,.0f} | "
              f"{tf_steps * batch:,.0f} | {sim['steps_per_sec'] / tf_steps:.2f} | "
              f"{sim['peak_rss_mb']:.0f} | {sim['peak_rss_mb'] - sim['rss_before_mb']:.0f} |")


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2])
        return
    print_table(measure(), "wse_sim scale")


if __name__ == "__main__":
    main()
