"""Training throughput of the simulator on FC-MNIST (784-500-300-10, batch 256, SGD) next
to TensorFlow on the CPU (a plain v1 Session training the same model on the same batches)
and next to the machine's matmul bound (the same forward + backward GEMMs at full batch in
numpy, BLAS with one thread per usable CPU). Every configuration runs once per round, the
rounds interleaved; each ratio is the median over the rounds of that round's ratio (the
machine is shared: a ratio of two runs side by side drifts less than either), and the load
average before and after says how loaded the machine was. The executor runs on one thread
and on one per usable CPU (`wse_sim serve --threads`' default), with its affine tiles
compiled (wafer.compiled: no GIL) and, as the A/B, in numpy; and the same model under
Keras' mixed_float16 policy (float16 rounding inside the tiles) against float32.

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
STEPS = 30
ROUNDS = int(os.environ.get("BENCH_ROUNDS", 7))
PARAMS = {"batch_size": BATCH, "hidden": [500, 300], "optimizer": "sgd", "learning_rate": 0.01}


def batches(count: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [{"features": rng.normal(size=(BATCH, 784)).astype(np.float32),
             "labels": rng.integers(0, 10, BATCH).astype(np.int32)} for _ in range(count)]


def simulator_step(program, weights, threads: int, micro: int, compiled: bool = True):
    """The CS system's executor, in process (no gRPC): `run` trains one step; not
    `compiled`: its affine tiles in numpy (the A/B)."""
    from wafer.optimizers import make_optimizer
    from wse_sim.pipeline import Pipeline
    from wse_sim.program import check_program, check_state

    checked = check_program(program)
    pipeline = Pipeline(checked.kernels, checked.sources, checked.variables,
                        check_state(checked, weights), batch_size=program.batch_size,
                        micro_batch_size=micro, loss_kernel=program.loss_kernel,
                        optimizer=make_optimizer(checked.optimizer), seed=0, threads=threads)
    for region in pipeline.regions:
        affine = getattr(region.kernel, "affine", None)
        if affine is not None and not compiled:
            affine.code = -1
    return pipeline


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


def median_ratio(rates: dict, a, b) -> float:
    """The median over the rounds of rates[a] / rates[b] in the same round."""
    return float(np.median([x / y for x, y in zip(rates[a], rates[b])]))


def measure() -> list[Row]:
    from threadpoolctl import ThreadpoolController

    from coordinator.compiler import compile_model
    from wse_sim.stages import usable_cpus

    with tempfile.TemporaryDirectory() as tmp:
        compiled = compile_model(m.keras_mlp, m.input_fn, PARAMS, tmp, fabric="cs2")
        mixed = compile_model(m.mixed_float16(m.keras_mlp), m.input_fn, PARAMS, tmp + "/mixed", fabric="cs2")
    data = batches(STEPS)
    threads = usable_cpus()
    micro = compiled.program.micro_batch_size
    configs = {"1 compiled": (compiled, 1, True), "1 numpy": (compiled, 1, False),
               "T compiled": (compiled, threads, True), "T numpy": (compiled, threads, False),
               "T mixed": (mixed, threads, True), "T mixed numpy": (mixed, threads, False)}
    pipelines = {name: simulator_step(c.program, c.initial_weights, count,
                                      c.program.micro_batch_size, tiles)
                 for name, (c, count, tiles) in configs.items()}
    tf_step, tf_close = tensorflow_step(compiled.initial_weights)
    bound, flops = matmul_bound_step()

    blas = ThreadpoolController()  # (threadpool_limits would scan the libraries every step)

    def bound_step(batch):
        with blas.limit(limits=threads, user_api="blas"):
            bound(batch)

    steps = {**{name: (lambda b, p=p: p.run(b, training=True)) for name, p in pipelines.items()},
             "tf": tf_step, "bound": bound_step}
    rates: dict[str, list[float]] = {name: [] for name in steps}
    load_before = os.getloadavg()
    try:
        for _ in range(ROUNDS):
            for name, step in steps.items():
                rates[name].append(steps_per_sec(step, data))
    finally:
        tf_close()
        for p in pipelines.values():
            p.close()
    load_after = os.getloadavg()
    median = {name: float(np.median(r)) for name, r in rates.items()}
    est = compiled.program.estimate.samples_per_sec / BATCH
    load = (f"load average (1/5/15 min) before {'/'.join(f'{x:.1f}' for x in load_before)}, "
            f"after {'/'.join(f'{x:.1f}' for x in load_after)}")
    rows: list[Row] = [
        ("TensorFlow v1 Session, same model", median["tf"], "steps/s", "CPU path, feed_dict batches"),
        ("numpy GEMM bound, same FLOPs", median["bound"], "steps/s",
         f"{flops / 1e6:.0f} MFLOP/step at {median['bound'] * flops / 1e9:.0f} GFLOP/s"),
    ]
    for name, p in pipelines.items():
        rows.append((f"wse_sim {name}, {p.threads} thread(s)", median[name], "steps/s",
                     f"{p.stages} stage(s), micro-batches of {micro}"))
    return rows + [
        ("wse_sim / TensorFlow", median_ratio(rates, "T compiled", "tf"), "ratio",
         f"{threads} threads, compiled tiles; aim >= 1.2"),
        ("wse_sim / GEMM bound", median_ratio(rates, "T compiled", "bound"), "ratio",
         f"{threads} threads; aim >= 0.8"),
        ("wse_sim compiled / numpy tiles (A/B)", median_ratio(rates, "T compiled", "T numpy"),
         "ratio", f"{threads} threads"),
        ("wse_sim compiled / numpy tiles, 1 thread", median_ratio(rates, "1 compiled", "1 numpy"),
         "ratio", "1 thread"),
        (f"wse_sim {threads} threads / 1 thread", median_ratio(rates, "T compiled", "1 compiled"),
         "ratio", f"{threads} usable CPUs, compiled tiles"),
        (f"wse_sim {threads} threads / 1 thread, numpy tiles",
         median_ratio(rates, "T numpy", "1 numpy"), "ratio", "the GIL-bound figure"),
        ("wse_sim mixed_float16 / float32", median_ratio(rates, "T mixed", "T compiled"), "ratio",
         "compiled tiles; aim >= 1"),
        ("wse_sim mixed_float16 / float32, numpy tiles",
         median_ratio(rates, "T mixed numpy", "T numpy"), "ratio", "rounding compiled in both"),
        ("simulated CS-2 (compile estimate)", est, "steps/s", "what the wafer would do"),
        ("rounds", ROUNDS, "count", f"{STEPS} steps each; medians; {load}"),
    ]


def main() -> None:
    print_table(measure(), "wse_sim training throughput (FC-MNIST)")


if __name__ == "__main__":
    main()
