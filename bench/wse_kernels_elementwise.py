"""The generic element-wise kernels' forward + backward on one micro-batch next to
TensorFlow computing the same op and its gradient (a tf.function, CPU, the same float32
arrays), as ratios measured side by side in one run (rounds interleaved, best of each).
Shape: micro-batch 64 x 128 x 64 (524,288 values), upstream gradient given.

    python bench/wse_kernels_elementwise.py
"""
from __future__ import annotations

import os
import sys
import time
from typing import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.table import Row, print_table

SHAPE = (64, 128, 64)
ROUNDS, REPEATS = 5, 10


def cases():
    """name -> (kernel type, attrs, inputs, params, TF function of (inputs, weights))."""
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.standard_normal(SHAPE).astype(np.float32)
    y = rng.standard_normal(SHAPE).astype(np.float32)
    bias = rng.standard_normal(SHAPE[-1]).astype(np.float32)
    labels = rng.integers(0, SHAPE[-1], SHAPE[:-1])
    return {
        "activation erf": ("activation", {"function": "erf"}, [x], {}, lambda i, w: tf.math.erf(i[0])),
        "activation rsqrt": ("activation", {"function": "rsqrt"}, [np.abs(x) + 0.1], {},
                             lambda i, w: tf.math.rsqrt(i[0])),
        "binary mul (activations)": ("binary", {"op": "mul", "operands": "ii"}, [x, y], {},
                                     lambda i, w: i[0] * i[1]),
        "binary add (weight, broadcast)": ("binary", {"op": "add", "operands": "ip", "p1": [SHAPE[-1]]},
                                           [x], {"p1": bias}, lambda i, w: i[0] + w["p1"]),
        "binary maximum": ("binary", {"op": "maximum", "operands": "ii"}, [x, y], {},
                           lambda i, w: tf.maximum(i[0], i[1])),
        "select": ("select", {"operands": "iii"}, [x > 0, x, y], {},
                   lambda i, w: tf.where(i[0], i[1], i[2])),
        "sparse softmax cross entropy": (
            "softmax_cross_entropy_with_logits", {"sparse": True}, [x, labels], {},
            lambda i, w: tf.nn.sparse_softmax_cross_entropy_with_logits(labels=i[1], logits=i[0])),
    }


def simulator(kernel_type, attrs, inputs, params) -> Callable[[], None]:
    from wafer.kernels import RunContext, build_kernel

    kernel = build_kernel(kernel_type, "bench", attrs, [a.shape[1:] for a in inputs])
    acc = {role: np.zeros_like(v) for role, v in params.items()}
    ctx = RunContext(training=True, batch_size=SHAPE[0], accumulate=True)

    def step() -> None:
        out, cache = kernel.forward(params, inputs, ctx)
        kernel.backward(params, cache, np.ones_like(out, np.float32), ctx, acc or None)
    return step


def tensorflow(fn, inputs, params) -> Callable[[], None]:
    import tensorflow as tf

    xs = [tf.constant(a) for a in inputs]
    ws = {role: tf.Variable(v) for role, v in params.items()}
    watched = [x for x in xs if x.dtype.is_floating]

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            tape.watch(watched)
            out = fn(xs, ws)
        return tape.gradient(out, [*watched, *ws.values()], output_gradients=tf.ones_like(out))
    step()  # trace
    return lambda: [g.numpy() for g in step()]


def best_seconds(step: Callable[[], None]) -> float:
    start = time.perf_counter()
    for _ in range(REPEATS):
        step()
    return (time.perf_counter() - start) / REPEATS


def measure() -> list[Row]:
    rows: list[Row] = []
    for name, (kind, attrs, inputs, params, fn) in cases().items():
        sim, tf_step = simulator(kind, attrs, inputs, params), tensorflow(fn, inputs, params)
        sim_t, tf_t = float("inf"), float("inf")
        for _ in range(ROUNDS):  # interleaved: the machine's load hits both alike
            sim_t = min(sim_t, best_seconds(sim))
            tf_t = min(tf_t, best_seconds(tf_step))
        rows.append((f"{name}: simulator", sim_t * 1e3, "ms", "forward + backward, one micro-batch"))
        rows.append((f"{name}: simulator / TF", sim_t / tf_t, "ratio", f"TF {tf_t * 1e3:.2f} ms"))
    return rows


if __name__ == "__main__":
    print_table(measure())
