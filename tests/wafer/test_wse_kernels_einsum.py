"""The einsum kernel (Keras MultiHeadAttention's products) against tf.einsum and its gradients."""
import numpy as np
import pytest
import tensorflow as tf

from wafer.kernels import KernelError, RunContext, build_kernel


def tf_einsum(equation, a, b):
    a, b = tf.constant(a), tf.constant(b)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([a, b])
        y = tf.einsum(equation, a, b)
        weighted = tf.reduce_sum(y * tf.constant(np.linspace(-1, 1, y.shape.num_elements(),
                                                             dtype=np.float32).reshape(y.shape)))
    return y.numpy(), [g.numpy() for g in tape.gradient(weighted, [a, b])]


@pytest.mark.parametrize("equation, a_shape, b_shape, operands", [
    ("aecd,abcd->acbe", (4, 6, 2, 8), (4, 5, 2, 8), "ii"),   # query . key
    ("acbe,aecd->abcd", (4, 2, 5, 6), (4, 6, 2, 8), "ii"),   # attention . value
    ("abc,cde->abde", (4, 5, 6), (6, 2, 3), "ip"),           # EinsumDense with a weight
])
def test_einsum_forward_and_gradients_match_tensorflow(equation, a_shape, b_shape, operands):
    rng = np.random.default_rng(0)
    a = rng.normal(size=a_shape).astype(np.float32)
    b = rng.normal(size=b_shape).astype(np.float32)
    attrs = {"equation": equation, "operands": operands}
    inputs = [a_shape[1:]] + ([b_shape[1:]] if operands == "ii" else [])
    if operands == "ip":
        attrs["p1"] = list(b_shape)
    kernel = build_kernel("einsum", "e", attrs, inputs)
    params = {"p1": b} if operands == "ip" else {}
    arrays = [a, b] if operands == "ii" else [a]
    y, cache = kernel.forward(params, arrays, RunContext(training=True, batch_size=4))
    expected, (ga, gb) = tf_einsum(equation, a, b)
    assert kernel.output_shape == expected.shape[1:]
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)
    weights = np.linspace(-1, 1, expected.size, dtype=np.float32).reshape(expected.shape)
    grads, param_grads = kernel.backward(params, cache, weights, RunContext(training=True, batch_size=4))
    np.testing.assert_allclose(grads[0], ga, rtol=1e-5, atol=1e-5)
    got_b = grads[1] if operands == "ii" else param_grads["p1"]
    np.testing.assert_allclose(got_b, gb, rtol=1e-5, atol=1e-5)


def test_einsum_that_mixes_the_batch_letter_is_refused():
    with pytest.raises(KernelError, match="batch letter"):
        build_kernel("einsum", "e", {"equation": "ab,cb->ac", "operands": "ii"}, [(3,), (3,)])
