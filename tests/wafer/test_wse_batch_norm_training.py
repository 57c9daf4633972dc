"""BatchNormalization in training on the simulated CS: the batch_norm_training kernel in the
pipeline (a batch barrier) normalises every micro-batch with the statistics of the whole
batch, its gradients use the whole batch's sums, and the moving statistics follow the
batch's as TF's assign ops move them: against TensorFlow's tf.nn.moments +
tf.nn.batch_normalization (what Keras' BatchNormalization computes with training=True) for
several micro-batch splits and thread counts."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from cs_api import pb
from tests.wafer.test_wse_kernels_elementwise import close, program, randn
from wafer.kernels import KernelError, RunContext, build_kernel
from wafer.kernels.normalization import column_sum
from wafer.optimizers import make_optimizer
from wse_sim.pipeline import Pipeline
from wse_sim.program import check_program

BATCH, SHAPE, EPS, MOMENTUM = 8, (4, 4, 3), 1e-3, 0.99
RULES = {"affine": [np.float32(MOMENTUM), np.float32(1.0 - MOMENTUM)],
         "delta": [np.float32(1.0 - MOMENTUM)]}


def bn_program(micro: int, update: str) -> pb.Program:
    """features * w -> batch norm (gamma, beta, moving statistics) -> * labels -> sum."""
    attrs = {"epsilon": EPS, "scale": True, "center": True, "mean_rule": update,
             "variance_rule": update,
             "mean_update": [float(c) for c in RULES[update]],
             "variance_update": [float(c) for c in RULES[update]]}
    message = program([
        ("scaled", "binary", ["features"], {"op": "mul", "operands": "ip", "p1": list(SHAPE)}, SHAPE),
        ("bn", "batch_norm_training", ["scaled"], attrs, SHAPE),
        ("weighted", "binary", ["bn", "labels"], {"op": "mul", "operands": "ii"}, SHAPE),
        ("loss", "loss", ["weighted"], {"scale": 1.0}, ()),
    ], inputs=(("features", "float32", SHAPE), ("labels", "float32", SHAPE)))
    message.batch_size, message.micro_batch_size = BATCH, micro
    message.kernels[0].params.add(role="p1", variable="w", shape=list(SHAPE), dtype=pb.FLOAT32)
    for role, var in (("scale", "gamma"), ("offset", "beta"), ("moving_mean", "moving_mean"),
                      ("moving_variance", "moving_variance")):
        message.kernels[1].params.add(role=role, variable=var, shape=[3], dtype=pb.FLOAT32,
                                      frozen=role.startswith("moving"))
    message.loss_kernel = "loss"
    message.optimizer.CopyFrom(pb.Optimizer(type="sgd", learning_rate=1.0))
    return message


def tf_step(state, x, labels, update):
    """TF's loss, gradients and new moving statistics for one batch."""
    w, gamma, beta = (tf.Variable(state[k]) for k in ("w", "gamma", "beta"))
    with tf.GradientTape() as tape:
        h = w * x
        mean, variance = tf.nn.moments(h, axes=[0, 1, 2])
        y = tf.nn.batch_normalization(h, mean, variance, beta, gamma, EPS)
        loss = tf.reduce_sum(y * labels)
    grads = dict(zip(("w", "gamma", "beta"), tape.gradient(loss, [w, gamma, beta])))
    moving = {}
    for name, stat in (("moving_mean", mean), ("moving_variance", variance)):
        v = tf.constant(state[name])
        if update == "affine":
            moving[name] = (v * RULES[update][0] + stat * RULES[update][1]).numpy()
        else:
            moving[name] = (v - (v - stat) * RULES[update][0]).numpy()
    return float(loss), {k: g.numpy() for k, g in grads.items()}, moving


@pytest.mark.parametrize("micro, threads, update", [
    (8, 1, "affine"), (4, 1, "affine"), (2, 2, "delta"), (1, 2, "affine")])
def test_batch_norm_training_uses_the_whole_batchs_statistics_like_tensorflow(micro, threads,
                                                                              update):
    checked = check_program(bn_program(micro, update))
    state = {"w": randn(*SHAPE, low=0.5, high=2.0), "gamma": randn(3, low=0.5, high=1.5),
             "beta": randn(3), "moving_mean": randn(3), "moving_variance": randn(3, low=0.5, high=2.0)}
    pipeline = Pipeline(checked.kernels, checked.sources, checked.variables, state,
                        batch_size=BATCH, micro_batch_size=micro, loss_kernel="loss",
                        optimizer=make_optimizer(checked.optimizer), seed=0, threads=threads,
                        min_stage_flops=0, params=checked.params)
    try:
        for _ in range(2):  # the second batch starts from the first's weights and statistics
            before = {k: np.array(v) for k, v in pipeline.state().items()}
            x = randn(BATCH, *SHAPE) * 3 + 1
            labels = randn(BATCH, *SHAPE)
            step = pipeline.run({"features": x, "labels": labels}, training=True, outputs=["bn"])
            loss, grads, moving = tf_step(before, x, labels, update)
            after = pipeline.state()
            h = before["w"] * x
            mean, var = h.mean(axis=(0, 1, 2)), h.var(axis=(0, 1, 2))
            normalised = (h - mean) / np.sqrt(var + EPS) * before["gamma"] + before["beta"]
            close(step.outputs["bn"], normalised, rtol=2e-5)
            assert step.loss == pytest.approx(loss, rel=1e-4, abs=1e-3)
            for name, grad in grads.items():  # SGD with rate 1: the change is the gradient
                close(before[name] - after[name], grad, rtol=2e-4)
            for name, value in moving.items():
                close(after[name], value, rtol=1e-6)
    finally:
        pipeline.close()


def test_batch_norm_training_evaluates_with_batch_statistics_and_moves_nothing():
    checked = check_program(bn_program(2, "affine"))
    state = {"w": np.ones(SHAPE, np.float32), "gamma": np.ones(3, np.float32),
             "beta": np.zeros(3, np.float32), "moving_mean": randn(3),
             "moving_variance": randn(3, low=0.5, high=2.0)}
    pipeline = Pipeline(checked.kernels, checked.sources, checked.variables, state,
                        batch_size=BATCH, micro_batch_size=2, loss_kernel="loss",
                        optimizer=None, seed=0, params=checked.params)
    x = randn(BATCH, *SHAPE)
    out = pipeline.run({"features": x, "labels": x}, training=False, outputs=["bn"]).outputs["bn"]
    close(out, (x - x.mean(axis=(0, 1, 2))) / np.sqrt(x.var(axis=(0, 1, 2)) + EPS), rtol=2e-5)
    np.testing.assert_array_equal(pipeline.state()["moving_mean"], state["moving_mean"])


@pytest.mark.parametrize("attrs, message", [
    ({}, "a number attr epsilon"),
    ({"epsilon": 1e-3, "mean_rule": "ema"}, "mean_rule and variance_rule one of affine, delta"),
    ({"epsilon": 1e-3, "mean_update": [0.9]}, "mean_update and variance_update"),
])
def test_batch_norm_training_refuses_bad_attrs_naming_the_kernel(attrs, message):
    with pytest.raises(KernelError, match=rf"'bad_kernel' \(batch_norm_training\).*{message}"):
        build_kernel("batch_norm_training", "bad_kernel", attrs, [(3,)])


def test_fused_batch_norm_training_and_its_bessel_corrected_moving_variance_match_tensorflow():
    """FusedBatchNormV3 with is_training: (x - mean) * (rsqrt(var + eps) * gamma) + beta with
    the biased variance; its batch_variance output (what a moving average follows) is
    Bessel-corrected, n / (n - 1) with n = B H W; epsilon as given (no clamp)."""
    eps = 1e-5
    attrs = {"epsilon": eps, "fused": True, "mean_rule": "affine", "variance_rule": "affine",
             "mean_update": [0.0, 1.0], "variance_update": [0.0, 1.0]}  # moving = the batch's
    kernel = build_kernel("batch_norm_training", "bn", attrs, [SHAPE])
    params = {"scale": randn(3, low=0.5, high=1.5), "offset": randn(3),
              "moving_mean": np.zeros(3, np.float32), "moving_variance": np.zeros(3, np.float32)}
    x, dy = randn(BATCH, *SHAPE) * 3 + 1, randn(BATCH, *SHAPE)
    xt, gamma, beta = tf.constant(x), tf.Variable(params["scale"]), tf.Variable(params["offset"])
    with tf.GradientTape() as tape:
        tape.watch(xt)
        y, batch_mean, batch_variance = tf.compat.v1.nn.fused_batch_norm(
            xt, gamma, beta, epsilon=eps, is_training=True)[:3]
    gx, gg, gb = tape.gradient(y, [xt, gamma, beta], output_gradients=dy)
    # as the executor runs it: two micro-batches, each with the statistics of both
    micro = (slice(0, 4), slice(4, 8))
    ctx = RunContext(training=True, batch_size=BATCH)
    ctx.batch = (kernel.batch_statistics(params, [x], ctx),)
    out = np.concatenate([kernel.forward(params, [x[m]], ctx)[0] for m in micro])
    close(out, y.numpy(), rtol=2e-5)
    close(params["moving_mean"], batch_mean.numpy(), rtol=1e-6)
    close(params["moving_variance"], batch_variance.numpy(), rtol=1e-6)
    ctx.batch += (kernel.gradient_statistics(params, [x[m] for m in micro], [dy[m] for m in micro],
                                             ctx),)
    grads = {"scale": np.zeros(3, np.float32), "offset": np.zeros(3, np.float32)}
    dx = [kernel.backward(params, x[m], dy[m], ctx, grads)[0][0] for m in micro]
    close(np.concatenate(dx), gx.numpy(), rtol=2e-4)
    close(grads["scale"], gg.numpy(), rtol=2e-4)
    close(grads["offset"], gb.numpy(), rtol=2e-5)


@pytest.mark.parametrize("rows,channels", [(1024, 16), (1030, 20), (15, 16), (64, 9), (4096, 3)])
def test_column_sums_are_tensorflows_bit_for_bit(rows, channels):
    """column_sum adds as TF's CPU Sum and Mean over every axis but the last (Eigen: 4
    accumulators in 8-wide packets from 16 rows, the rest in turn): bit-equal, where numpy's
    order differs in most columns."""
    x = np.random.default_rng(rows).normal(2.0, 0.3, size=(rows, 2, 2, channels)).astype(np.float32)
    flat = x.reshape(-1, channels)
    assert np.array_equal(column_sum(flat), tf.reduce_sum(x, [0, 1, 2]).numpy())
    assert np.array_equal(column_sum(flat) / np.float32(len(flat)),
                          tf.reduce_mean(x, [0, 1, 2]).numpy())


def test_mixed_float16_batch_norm_rounds_as_tensorflows_graph():
    """Keras' BatchNormalization under mixed_float16 (float32 ops between a float16 input and
    output, TF's graph on one thread): the kernel's output rounded to float16 is TF's but
    where Eigen's approximate Rsqrt moves a value across a rounding boundary (one float16
    ULP); the input's gradient rounded to float16 and offset's gradient are TF's bit for
    bit (TF's gradient graph in its order), scale's within Rsqrt's ULPs."""
    rng = np.random.default_rng(0)
    shape = (16, 8, 8, 16)
    x = (rng.normal(size=shape) * 0.3 + rng.normal(size=16) * 2).astype(np.float16)
    g = (rng.normal(size=shape) * 0.01).astype(np.float16)
    graph = tf.Graph()
    with graph.as_default():
        xs, gs = tf.compat.v1.placeholder(tf.float16, shape), tf.compat.v1.placeholder(tf.float16, shape)
        tf.keras.mixed_precision.set_global_policy("mixed_float16")
        try:
            layer = tf.keras.layers.BatchNormalization(epsilon=EPS)
            y = layer(xs, training=True)
        finally:
            tf.keras.mixed_precision.set_global_policy("float32")
        grads = tf.gradients(y, [xs, layer.gamma.value, layer.beta.value], grad_ys=gs)
        config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1,
                                          inter_op_parallelism_threads=1)
        with tf.compat.v1.Session(config=config) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            want_y, want_dx, want_gamma, want_beta = session.run([y] + grads, {xs: x, gs: g})
    kernel = build_kernel("batch_norm_training", "bn", {"epsilon": EPS}, [shape[1:]])
    params = {"scale": np.ones(16, np.float32), "offset": np.zeros(16, np.float32)}
    ctx = RunContext(training=True, batch_size=16)
    x32, g32 = x.astype(np.float32), g.astype(np.float32)
    ctx.batch = (kernel.batch_statistics(params, [x32], ctx),)
    out, cache = kernel.forward(params, [x32], ctx)
    ctx.batch += (kernel.gradient_statistics(params, [cache], [g32], ctx),)
    weight_grads = {role: np.zeros(16, np.float32) for role in params}
    dx = kernel.backward(params, cache, g32, ctx, weight_grads)[0][0]
    out16 = out.astype(np.float16)
    ulp = np.spacing(np.abs(want_y))
    assert np.mean(out16 == want_y) > 0.999 and np.all(np.abs(out16 - want_y) <= ulp)
    assert np.array_equal(dx.astype(np.float16), want_dx)
    assert np.array_equal(weight_grads["offset"], want_beta)
    scale_ulps = np.abs(weight_grads["scale"] - want_gamma) / np.spacing(np.abs(want_gamma))
    assert scale_ulps.max() <= 2  # sum(x g) - sum(g) mean is TF's; times r (Rsqrt's ULP)
