"""Training throughput of the simulator on FC-MNIST (784-500-300-10, batch 256, SGD) next
to TensorFlow on the CPU (a plain v1 Session training the same model on the same batches)
and next to the machine's matmul bound (the same forward + backward GEMMs at full batch in
numpy, BLAS with one thread per usable CPU), as ratios measured side by side in one run
(rounds interleaved, best of each). The executor runs on one thread and on one per usable
CPU (`wse_sim serve --threads`' default), at the compiler's micro-batch size (256) and at
64 for comparison.

    make bench BENCH=wse_sim_throughput      # or: python bench/wse_sim_throughput.py
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from typing import Callable

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.table import Row, print_table  # noqa: E402
from examples import mlp as m  # noqa: E402  (FC-MNIST)

BATCH = 256
STEPS = 60
ROUNDS = 3
PARAMS = {"batch_size": BATCH, "hidden": [500, 300], "optimizer": "sgd", "learning_rate": 0.01}


def batches(count: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [{"features": rng.normal(size=(BATCH, 784)).astype(np.float32),
             "labels": rng.integers(0, 10, BATCH).astype(np.int32)} for _ in range(count)]


def simulator_step(program, weights, threads: int, micro: int):
    """The CS system's executor, in process (no gRPC): `run` trains one step."""
    from wafer.optimizers import make_optimizer
    from wse_sim.pipeline import Pipeline
    from wse_sim.program import check_program, check_state

    checked = check_program(program)
    return Pipeline(checked.kernels, checked.sources, checked.variables,
                    check_state(checked, weights), batch_size=program.batch_size,
                    micro_batch_size=micro, loss_kernel=program.loss_kernel,
                    optimizer=make_optimizer(checked.optimizer), seed=0, threads=threads)


def tensorflow_step(weights) -> tuple[Callable[[dict], None], Callable[[], None]]:
    import tensorflow as tf

    from tf_model.model_fn import batch_signature, call_model_fn, make_dataset, model_graph

    signature = batch_signature(make_dataset(m.input_fn, PARAMS))
    with model_graph(PARAMS) as graph:
        features, labels = signature.placeholders()
        spec = call_model_fn(m.keras_mlp, features, labels, "train", PARAMS)
        variables = {v.op.name: v for v in tf.compat.v1.global_variables()}
        session = tf.compat.v1.Session(graph=graph)
        session.run(tf.compat.v1.global_variables_initializer())
        for name, value in weights.items():
            variables[name].load(value, session)
    fetches = [spec.loss, spec.train_op]
    return (lambda b: session.run(fetches, {features: b["features"], labels: b["labels"]}),
            session.close)


def matmul_bound_step() -> tuple[Callable[[dict], None], float]:
    """The model's forward + backward GEMMs at full batch (no bias, activation or update),
    BLAS on every usable CPU (threadpoolctl's limit around the call)."""
    sizes = [784, 500, 300, 10]
    rng = np.random.default_rng(1)
    ws = [rng.normal(size=(a, b)).astype(np.float32) for a, b in zip(sizes, sizes[1:])]
    acts = [np.empty((BATCH, s), np.float32) for s in sizes]
    grads = [np.empty((BATCH, s), np.float32) for s in sizes]
    wgrads = [np.empty_like(w) for w in ws]
    flops = sum(2 * BATCH * a * b * (3 if i else 2) for i, (a, b) in enumerate(zip(sizes, sizes[1:])))

    def step(batch):
        acts[0][...] = batch["features"]
        for i, w in enumerate(ws):
            np.matmul(acts[i], w, out=acts[i + 1])
        grads[-1][...] = acts[-1]
        for i in reversed(range(len(ws))):
            np.matmul(acts[i].T, grads[i + 1], out=wgrads[i])
            if i:
                np.matmul(grads[i + 1], ws[i].T, out=grads[i])

    return step, flops


def steps_per_sec(step: Callable[[dict], None], data: list[dict]) -> float:
    for batch in data[:3]:
        step(batch)
    start = time.perf_counter()
    for batch in data:
        step(batch)
    return len(data) / (time.perf_counter() - start)


def measure() -> list[Row]:
    from threadpoolctl import ThreadpoolController

    from coordinator.compiler import compile_model
    from wse_sim.stages import usable_cpus

    with tempfile.TemporaryDirectory() as tmp:
        compiled = compile_model(m.keras_mlp, m.input_fn, PARAMS, tmp, fabric="cs2")
    data = batches(STEPS)
    threads = usable_cpus()
    chosen = compiled.program.micro_batch_size
    other = 256 if chosen == 64 else 64
    configs = [(1, chosen), (threads, chosen), (threads, other)]
    pipelines = {config: simulator_step(compiled.program, compiled.initial_weights, *config)
                 for config in configs}
    tf_step, tf_close = tensorflow_step(compiled.initial_weights)
    bound, flops = matmul_bound_step()

    blas = ThreadpoolController()  # (threadpool_limits would scan the libraries every step)

    def bound_step(batch):
        with blas.limit(limits=threads, user_api="blas"):
            bound(batch)

    steps = {**{config: (lambda b, p=p: p.run(b, training=True)) for config, p in pipelines.items()},
             "tf": tf_step, "bound": bound_step}
    best = dict.fromkeys(steps, 0.0)
    try:
        for _ in range(ROUNDS):
            for name, step in steps.items():
                best[name] = max(best[name], steps_per_sec(step, data))
    finally:
        tf_close()
        for p in pipelines.values():
            p.close()
    one, many = best[1, chosen], best[threads, chosen]
    est = compiled.program.estimate.samples_per_sec / BATCH
    rows: list[Row] = [
        ("TensorFlow v1 Session, same model", best["tf"], "steps/s", "CPU path, feed_dict batches"),
        ("numpy GEMM bound, same FLOPs", best["bound"], "steps/s",
         f"{flops / 1e6:.0f} MFLOP/step at {best['bound'] * flops / 1e9:.0f} GFLOP/s"),
    ]
    for (count, micro), p in pipelines.items():
        mark = " (the compiler's)" if micro == chosen else ""
        rows.append((f"wse_sim executor, {p.threads} thread(s), micro {micro}", best[count, micro],
                     "steps/s", f"{p.stages} stage(s), micro-batches of {micro}{mark}, SGD"))
    return rows + [
        ("wse_sim / TensorFlow", many / best["tf"], "ratio", f"{threads} threads; aim >= 1.2"),
        ("wse_sim / GEMM bound", many / best["bound"], "ratio", f"{threads} threads; aim >= 0.85"),
        (f"wse_sim {threads} threads / 1 thread", many / one, "ratio", f"{threads} usable CPUs"),
        ("simulated CS-2 (compile estimate)", est, "steps/s", "what the wafer would do"),
    ]


def main() -> None:
    print_table(measure(), "wse_sim training throughput (FC-MNIST)")


if __name__ == "__main__":
    main()
