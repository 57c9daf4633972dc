"""In-batch products on the simulated CS (wafer/kernels/in_batch.py): in_batch_matmul,
batch_transpose and sample_constant in the pipeline, batch barriers whose every micro-batch
computes its rows of the whole batch's product, forward and backward, against the float64
closed form (q d^T; dq = g d, dd = g^T q) for several micro-batch splits and thread counts."""
from __future__ import annotations

import numpy as np
import pytest

from cs_api import pb
from tests.wafer.test_timing import Rect
from tests.wafer.test_wse_kernels_elementwise import program, randn
from wafer import timing
from wafer.fabric import get_fabric
from wafer.kernels import KernelError, RunContext, build_kernel
from wafer.optimizers import make_optimizer
from wse_sim.pipeline import Pipeline
from wse_sim.program import check_program

BATCH, N = 8, 5
ROWS = np.arange(BATCH * BATCH, dtype=np.float32).reshape(BATCH, BATCH) / 10  # rows differ


def near(actual: np.ndarray, expected: np.ndarray, rtol: float) -> None:
    """float32 `actual` within `rtol` of the float64 `expected` (relative to its largest
    value: the products' sums of terms of either sign)."""
    assert actual.dtype == np.float32
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * np.abs(expected).max())


def in_batch_program(micro: int) -> pb.Program:
    """q = features * wq, d = labels * wd; the logits q d^T, transposed, times a per-sample
    constant, summed: loss = sum((q d^T)^T * ROWS)."""
    message = program([
        ("q", "binary", ["features"], {"op": "mul", "operands": "ip", "p1": [N]}, (N,)),
        ("d", "binary", ["labels"], {"op": "mul", "operands": "ip", "p1": [N]}, (N,)),
        ("logits", "in_batch_matmul", ["q", "d"], {"transpose_b": True, "batch_size": BATCH},
         (BATCH,)),
        ("other_way", "batch_transpose", ["logits"], {"batch_size": BATCH}, (BATCH,)),
        ("rows", "sample_constant", ["features"], {"value": ROWS}, (BATCH,)),
        ("weighted", "binary", ["other_way", "rows"], {"op": "mul", "operands": "ii"}, (BATCH,)),
        ("loss", "loss", ["weighted"], {"scale": 1.0}, ()),
    ], inputs=(("features", "float32", (N,)), ("labels", "float32", (N,))))
    message.batch_size, message.micro_batch_size = BATCH, micro
    for index, var in ((0, "wq"), (1, "wd")):
        message.kernels[index].params.add(role="p1", variable=var, shape=[N], dtype=pb.FLOAT32)
    message.loss_kernel = "loss"
    message.optimizer.CopyFrom(pb.Optimizer(type="sgd", learning_rate=1.0))
    return message


@pytest.mark.parametrize("micro, threads", [(8, 1), (4, 1), (2, 2), (1, 2)])
def test_in_batch_product_and_transpose_compute_the_whole_batchs_product(micro, threads):
    checked = check_program(in_batch_program(micro))
    state = {"wq": randn(N, low=0.5, high=2.0), "wd": randn(N, low=0.5, high=2.0)}
    pipeline = Pipeline(checked.kernels, checked.sources, checked.variables, state,
                        batch_size=BATCH, micro_batch_size=micro, loss_kernel="loss",
                        optimizer=make_optimizer(checked.optimizer), seed=0, threads=threads,
                        min_stage_flops=0, params=checked.params)
    try:
        x, y = randn(BATCH, N), randn(BATCH, N)
        step = pipeline.run({"features": x, "labels": y}, training=True,
                            outputs=["logits", "other_way", "rows"])
        after = pipeline.state()
    finally:
        pipeline.close()
    wq, wd = (state[k].astype(np.float64) for k in ("wq", "wd"))
    q, d = x * wq, y * wd
    logits = q @ d.T
    g = ROWS.T.astype(np.float64)  # d loss / d logits
    dq, dd = g @ d, g.T @ q
    near(step.outputs["logits"], logits, rtol=1e-6)
    near(step.outputs["other_way"], logits.T, rtol=1e-6)
    np.testing.assert_array_equal(step.outputs["rows"], ROWS)
    terms = logits.T * ROWS
    assert step.loss == pytest.approx(float(terms.sum()), abs=1e-6 * float(np.abs(terms).sum()))
    near(state["wq"] - after["wq"], (dq * x).sum(axis=0), rtol=1e-5)  # SGD at rate 1
    near(state["wd"] - after["wd"], (dd * y).sum(axis=0), rtol=1e-5)


def test_a_product_of_a_batch_by_batch_value_mixes_the_batchs_rows():
    """tf.matmul(p, v): row i of p [B, B] mixes every sample's v; dp = g v^T, dv = p^T g."""
    kernel = build_kernel("in_batch_matmul", "mix", {"transpose_b": False, "batch_size": 4},
                          [(4,), (3,)])
    p, v, g = randn(4, 4), randn(4, 3), randn(4, 3)
    ctx = RunContext(training=True, batch_size=4)
    ctx.batch = (kernel.batch_statistics({}, [p, v], ctx),)
    halves = (slice(0, 2), slice(2, 4))
    caches, outs = [], []
    for rows in halves:
        ctx.offset = rows.start
        out, cache = kernel.forward({}, [p[rows]], ctx)
        outs.append(out)
        caches.append(cache)
    near(np.concatenate(outs), p.astype(np.float64) @ v, rtol=1e-6)
    ctx.batch += (kernel.gradient_statistics({}, caches, [g[r] for r in halves], ctx),)
    grads = [kernel.backward({}, c, g[r], ctx)[0] for c, r in zip(caches, halves)]
    near(np.concatenate([dp for dp, _ in grads]), g.astype(np.float64) @ v.T, rtol=1e-6)
    near(np.concatenate([dv for _, dv in grads]), p.T.astype(np.float64) @ g, rtol=1e-6)


@pytest.mark.parametrize("kind, attrs, shapes, message", [
    ("in_batch_matmul", {"transpose_b": True, "batch_size": 4}, [(3,), (2,)], "two rank-1"),
    ("in_batch_matmul", {"transpose_b": False, "batch_size": 4}, [(3,), (2,)], "two rank-1"),
    ("in_batch_matmul", {"transpose_b": True}, [(3,), (3,)], "attr batch_size"),
    ("batch_transpose", {"batch_size": 4}, [(3,)], r"per-sample shape \(B,\)"),
    ("sample_constant", {}, [(3,)], "attr value"),
])
def test_in_batch_kernels_refuse_bad_shapes_and_attrs_naming_the_kernel(kind, attrs, shapes, message):
    with pytest.raises(KernelError, match=rf"'bad' \({kind}\).*{message}"):
        build_kernel(kind, "bad", attrs, shapes)


@pytest.mark.parametrize("training", [True, False])
def test_an_in_batch_products_barrier_moves_the_whole_batchs_operand_across_its_region(training):
    """Each pass: the batch queues at the barrier, then the whole other operand (B x n
    values) and the whole output gradient (B x B) cross the region and back."""
    fabric = get_fabric("cs1")
    product = build_kernel("in_batch_matmul", "mm", {"transpose_b": True, "batch_size": 16},
                           [(6,), (6,)])
    p = timing.pipeline_timing([(product, Rect(0, 0, 3, 2))], fabric, training=training,
                               input_bytes_per_sample=48)
    passes = 2 if training else 1
    hops = 2 * (3 + 2)
    sync = passes * ((hops + 16 * 6 * 4 / fabric.link_bytes_per_cycle)
                     + (hops + 16 * 16 * 4 / fabric.link_bytes_per_cycle)) / fabric.clock_hz
    assert [(b.name, b.passes, b.holds) for b in p.barriers] == \
        [("mm", passes, "the whole batch's operand")]
    assert p.barriers[0].sync_seconds == pytest.approx(sync)
