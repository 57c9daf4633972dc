"""reduce, softmax, matmul, transpose, slice, pad, gather and batch norm (inference)
against TensorFlow: forward values and the gradients of a weighted sum of the output."""
import numpy as np
import pytest
import tensorflow as tf

from wse_sim.kernels import KernelError, RunContext, build_kernel

RNG = np.random.default_rng(0)


def normal(*shape):
    return RNG.normal(size=shape).astype(np.float32)


def weights_like(y):
    return np.linspace(-1, 1, y.size, dtype=np.float32).reshape(y.shape)


def check(kernel_type, attrs, inputs, tf_fn, params=None, input_shapes=None, grads_of=None):
    """Forward and backward of the kernel equal TF's on (inputs, params)."""
    params = params or {}
    shapes = input_shapes or [x.shape[1:] for x in inputs]
    kernel = build_kernel(kernel_type, "k", attrs, shapes)
    ctx = RunContext(training=True, batch_size=inputs[0].shape[0])
    y, cache = kernel.forward(params, inputs, ctx)
    sources = [tf.constant(v) for v in (*inputs, *params.values())]
    with tf.GradientTape() as tape:
        tape.watch(sources)
        expected = tf_fn(*sources)
        weighted = tf.reduce_sum(expected * weights_like(expected.numpy()))
    tf_grads = tape.gradient(weighted, sources)
    assert kernel.output_shape == tuple(expected.shape[1:])
    np.testing.assert_allclose(y, expected.numpy(), rtol=1e-5, atol=1e-6)
    grads, param_grads = kernel.backward(params, cache, weights_like(y), ctx)
    for got, want in zip([*grads, *(param_grads[r] for r in params)], tf_grads):
        if got is None or want is None:
            continue
        want = tf.convert_to_tensor(want).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    return kernel


@pytest.mark.parametrize("op, axes, keepdims", [
    ("sum", [1], False), ("mean", [0, 2], True), ("max", [2], False), ("min", [0], True)])
def test_reduce(op, axes, keepdims):
    x = normal(4, 3, 5, 2)
    x[:, :, 1] = x[:, :, 0]  # ties for max/min
    fn = {"sum": tf.reduce_sum, "mean": tf.reduce_mean, "max": tf.reduce_max, "min": tf.reduce_min}[op]
    check("reduce", {"op": op, "axes": axes, "keepdims": keepdims}, [x],
          lambda t: fn(t, axis=[a + 1 for a in axes], keepdims=keepdims))


@pytest.mark.parametrize("log", [False, True])
def test_softmax(log):
    check("softmax", {"axis": -1, "log": log}, [normal(4, 3, 6)],
          tf.nn.log_softmax if log else tf.nn.softmax)


@pytest.mark.parametrize("ta, tb", [(False, False), (True, False), (False, True), (True, True)])
def test_matmul_of_two_activations(ta, tb):
    a = normal(4, 2, 5, 3) if ta else normal(4, 2, 3, 5)
    b = normal(4, 2, 6, 5) if tb else normal(4, 2, 5, 6)
    check("matmul", {"operands": "ii", "transpose_a": ta, "transpose_b": tb}, [a, b],
          lambda x, y: tf.matmul(x, y, transpose_a=ta, transpose_b=tb))


def test_matmul_with_a_weight_broadcasts_it_and_sums_its_gradient():
    x, w = normal(4, 7, 5), normal(5, 3)
    check("matmul", {"operands": "ip", "p1": [5, 3]}, [x], lambda t, v: tf.matmul(t, v),
          params={"p1": w})


def test_matmul_across_samples_is_refused():
    with pytest.raises(KernelError, match="across samples"):
        build_kernel("matmul", "k", {"operands": "ii"}, [(5,), (5,)])


def test_transpose_slice_pad():
    x = normal(4, 3, 5, 2)
    check("transpose", {"perm": [2, 0, 1]}, [x], lambda t: tf.transpose(t, [0, 3, 1, 2]))
    check("slice", {"begin": [0, 1, 0], "end": [1, 5, 2], "strides": [1, 2, 1], "shrink": [0]},
          [x], lambda t: t[:, 0, 1::2, :])
    check("pad", {"paddings": [1, 0, 0, 2, 0, 0], "value": 0.0}, [x],
          lambda t: tf.pad(t, [[0, 0], [1, 0], [0, 2], [0, 0]]))


def test_gather_sums_repeated_rows_into_the_table_gradient():
    table = normal(10, 4)
    ids = np.array([[1, 3, 1], [9, 0, 1]], np.int32)
    kernel = build_kernel("gather", "emb", {"operands": "pi", "p0": [10, 4]}, [(3,)])
    ctx = RunContext(training=True, batch_size=2)
    y, cache = kernel.forward({"p0": table}, [ids], ctx)
    np.testing.assert_array_equal(y, table[ids])
    g = weights_like(y)
    _, grads = kernel.backward({"p0": table}, cache, g, ctx)
    expected = np.zeros_like(table)
    np.add.at(expected, ids.ravel(), g.reshape(-1, 4))
    np.testing.assert_allclose(grads["p0"], expected, rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="emb: index 10 is outside the table's 10 rows"):
        kernel.forward({"p0": table}, [np.array([[10, 0, 0]], np.int32)], ctx)


def test_batch_norm_inference_matches_keras():
    layer = tf.keras.layers.BatchNormalization(epsilon=1e-3)
    x = normal(4, 3, 6)
    layer.build((None, 3, 6))
    mean, var = normal(6), np.abs(normal(6)) + 0.5
    gamma, beta = normal(6), normal(6)
    layer.set_weights([gamma, beta, mean, var])
    params = {"scale": gamma, "offset": beta, "mean": mean, "variance": var}
    kernel = build_kernel("batch_norm_inference", "bn", {"epsilon": 1e-3}, [(3, 6)])
    y, cache = kernel.forward(params, [x], RunContext(training=True, batch_size=4))
    np.testing.assert_allclose(y, layer(x, training=False).numpy(), rtol=1e-5, atol=1e-6)
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        out = layer(xt, training=False)
        loss = tf.reduce_sum(out * weights_like(y))
    gx, gg, gb = tape.gradient(loss, [xt, layer.gamma, layer.beta])
    grads, pgrads = kernel.backward(params, cache, weights_like(y), RunContext(training=True, batch_size=4))
    np.testing.assert_allclose(grads[0], gx.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(pgrads["scale"], gg.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(pgrads["offset"], gb.numpy(), rtol=1e-5, atol=1e-6)
