"""The structural kernels' forward + backward on one micro-batch of 64 next to TensorFlow
computing the same op and its gradient (a tf.function, CPU, the same float32 arrays), as
ratios measured side by side in one run (rounds interleaved, best of each; the simulator
with one BLAS thread, as the pipeline runs it, TF with its own threads); and the
embedding gradient's in-order scatter-add (embedding.scatter_add) next to np.add.at.
Shapes: a transformer block's (sequence 128, 4 heads of 32, model 128; vocabulary 30,000).

    python bench/wse_kernels_structural.py
"""
from __future__ import annotations

import os
import sys
from typing import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.table import Row, print_table
from bench.wse_kernels_elementwise import best_seconds, simulator, tensorflow

MICRO, SEQ, HEADS, HEAD, MODEL, VOCAB = 64, 128, 4, 32, 128, 30_000
ROUNDS = 5


def cases():
    """name -> (kernel type, attrs, inputs, params, TF function of (inputs, weights))."""
    import tensorflow as tf

    rng = np.random.default_rng(0)

    def normal(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    q, k = normal(MICRO, HEADS, SEQ, HEAD), normal(MICRO, HEADS, SEQ, HEAD)
    x, w = normal(MICRO, SEQ, MODEL), normal(MODEL, MODEL)
    scores = normal(MICRO, HEADS, SEQ, SEQ)
    ids = rng.integers(0, VOCAB, (MICRO, SEQ))
    table = normal(VOCAB, MODEL)
    bn = {"mean": normal(MODEL), "variance": np.abs(normal(MODEL)) + 0.5,
          "scale": normal(MODEL), "offset": normal(MODEL)}
    return {
        "matmul q k^T (activations)": (
            "matmul", {"operands": "ii", "transpose_b": True}, [q, k], {},
            lambda i, _: tf.matmul(i[0], i[1], transpose_b=True)),
        "matmul x w (weight)": ("matmul", {"operands": "ip", "p1": [MODEL, MODEL]}, [x], {"p1": w},
                                lambda i, v: tf.matmul(i[0], v["p1"])),
        "softmax": ("softmax", {"axis": -1}, [scores], {}, lambda i, _: tf.nn.softmax(i[0])),
        "reduce mean (sequence)": ("reduce", {"op": "mean", "axes": [0]}, [x], {},
                                   lambda i, _: tf.reduce_mean(i[0], axis=1)),
        "reduce max (model)": ("reduce", {"op": "max", "axes": [1]}, [x], {},
                               lambda i, _: tf.reduce_max(i[0], axis=2)),
        "transpose heads": ("transpose", {"perm": [1, 0, 2]}, [q], {},
                            lambda i, _: tf.transpose(i[0], [0, 2, 1, 3])),
        "slice [:, ::2]": ("slice", {"begin": [0, 0], "end": [SEQ, MODEL], "strides": [2, 1]},
                           [x], {}, lambda i, _: i[0][:, ::2]),
        "batch_norm_inference": ("batch_norm_inference", {"epsilon": 1e-3}, [x], bn,
                                 lambda i, v: tf.nn.batch_normalization(
                                     i[0], v["mean"], v["variance"], v["offset"], v["scale"],
                                     1e-3)),
        "gather (embedding)": ("gather", {"operands": "pi", "p0": [VOCAB, MODEL]}, [ids],
                               {"p0": table}, None),
    }


def tensorflow_gather(ids: np.ndarray, table: np.ndarray) -> Callable[[], None]:
    """TF's lookup and its table gradient made dense (what a dense update applies)."""
    import tensorflow as tf

    variable, indices = tf.Variable(table), tf.constant(ids)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            out = tf.nn.embedding_lookup(variable, indices)
        return tf.convert_to_tensor(tape.gradient(out, variable, output_gradients=tf.ones_like(out)))
    step()
    return lambda: step().numpy()


def scatter_add_against_add_at(ids: np.ndarray, table_shape) -> list[Row]:
    from wafer.kernels.embedding import scatter_add

    values = np.ones((ids.size, table_shape[1]), np.float32)
    flat = ids.reshape(-1)
    acc = np.zeros(table_shape, np.float32)
    ours, theirs = float("inf"), float("inf")
    for _ in range(ROUNDS):
        ours = min(ours, best_seconds(lambda: scatter_add(acc, flat, values)))
        theirs = min(theirs, best_seconds(lambda: np.add.at(acc, flat, values)))
    return [("embedding gradient: scatter_add", ours * 1e3, "ms",
             f"{ids.size} rows of {table_shape[1]} into {table_shape[0]}"),
            ("embedding gradient: np.add.at / scatter_add", theirs / ours, "ratio",
             f"np.add.at {theirs * 1e3:.2f} ms, the same bits")]


def measure() -> list[Row]:
    from wse_sim.stages import one_blas_thread

    rows: list[Row] = []
    for name, (kind, attrs, inputs, params, fn) in cases().items():
        sim = simulator(kind, attrs, inputs, params)
        tf_step = tensorflow_gather(inputs[0], params["p0"]) if fn is None else \
            tensorflow(fn, inputs, params)
        sim_t, tf_t = float("inf"), float("inf")
        for _ in range(ROUNDS):  # interleaved: the machine's load hits both alike
            with one_blas_thread():  # as the pipeline runs its kernels
                sim_t = min(sim_t, best_seconds(sim))
            tf_t = min(tf_t, best_seconds(tf_step))
        rows.append((f"{name}: simulator", sim_t * 1e3, "ms", "forward + backward, one micro-batch"))
        rows.append((f"{name}: simulator / TF", sim_t / tf_t, "ratio", f"TF {tf_t * 1e3:.2f} ms"))
        if kind == "gather":
            rows += scatter_add_against_add_at(inputs[0], params["p0"].shape)
    return rows


if __name__ == "__main__":
    print_table(measure())
