"""The batch_row kernel (wafer/kernels/in_batch.py) against TensorFlow: a per-sample value
viewed with a leading axis of 1 and broadcast against per-sample values (x[None, :] +
y): every sample reads the whole batch's values; sample j's gradient is the sum over every
sample i of g_i at j's place (TF's broadcast gradient), for any micro-batch size."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from wafer.kernels import KernelError, RunContext, build_kernel


def row_and_gradient(x: np.ndarray, shape: tuple[int, ...], g: np.ndarray, micro: int):
    kernel = build_kernel("batch_row", "r", {"shape": list(shape), "batch_size": len(x)},
                          [x.shape[1:]])
    ctx = RunContext(training=True, batch_size=len(x))
    ctx.batch = (kernel.batch_statistics({}, [x], ctx),)
    passes = []
    for i in range(0, len(x), micro):
        ctx.offset = i
        passes.append(kernel.forward({}, [x[i:i + micro]], ctx))
    grads = [g[i:i + micro] for i in range(0, len(x), micro)]
    caches = [cache for _, cache in passes]
    ctx.batch = (ctx.batch[0], kernel.gradient_statistics({}, caches, grads, ctx))
    dx = [kernel.backward({}, cache, grad, ctx)[0][0] for cache, grad in zip(caches, grads)]
    return np.concatenate([out for out, _ in passes]), np.concatenate(dx)


@pytest.mark.parametrize("view", ["x[None, :]", "tf.transpose(x)", "x[None]"])
@pytest.mark.parametrize("micro", [24, 8, 3, 1])
def test_a_row_of_the_batch_and_its_gradient_are_tensorflows(view, micro):
    """Per-sample shapes [] (sq[None, :]), [1] (tf.transpose of [batch, 1]) and [k]
    (e[None, :, :]), broadcast against a per-sample [batch, ...] value."""
    rng = np.random.default_rng(micro)
    batch = 24
    sample = {"x[None, :]": (), "tf.transpose(x)": (1,), "x[None]": (5,)}[view]
    x = rng.normal(size=(batch, *sample)).astype(np.float32)
    shape = (batch,) if view == "tf.transpose(x)" else (batch, *sample)
    y = rng.normal(size=(batch, *shape)).astype(np.float32)
    g = rng.normal(size=(batch, *shape)).astype(np.float32)
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        row = xt[None, :] if view == "x[None, :]" else tf.transpose(xt) if sample == (1,) \
            else xt[None]
        out = row + tf.constant(y)
    expected_dx = tape.gradient(out, xt, output_gradients=tf.constant(g)).numpy()
    got, dx = row_and_gradient(x, shape, g, micro)
    assert got.dtype == dx.dtype == np.float32
    np.testing.assert_array_equal(got + y, out.numpy())
    assert np.all(np.abs(dx - expected_dx) <= 1e-6 * np.abs(g).sum(0).reshape(dx.shape))


def test_a_row_of_integer_labels_is_every_samples_and_compares_as_tfs():
    labels = np.array([3, 1, 3, 0, 1, 3], np.int32)
    kernel = build_kernel("batch_row", "r", {"shape": [6], "batch_size": 6}, [()])
    assert kernel.output_dtype([np.dtype(np.int32)]) == np.int32
    ctx = RunContext(training=False, batch_size=6)
    ctx.batch = (kernel.batch_statistics({}, [labels], ctx),)
    ctx.offset = 2
    row, _ = kernel.forward({}, [labels[2:4]], ctx)
    same = tf.equal(labels[:, None], labels[None, :]).numpy()
    np.testing.assert_array_equal(labels[2:4, None] == row, same[2:4])


@pytest.mark.parametrize("attrs, shapes", [({"shape": [5], "batch_size": 4}, [()]),
                                           ({"batch_size": 4}, [()]),
                                           ({"shape": [4], "batch_size": 0}, [()])])
def test_batch_row_refuses_a_shape_not_holding_the_batchs_values(attrs, shapes):
    with pytest.raises(KernelError, match="batch_row"):
        build_kernel("batch_row", "r", attrs, shapes)
