"""The activation_grad kernel against TensorFlow's gradient ops, float32: its forward is the
op's value (TanhGrad, SigmoidGrad, ReluGrad, LeakyReluGrad, EluGrad, Relu6Grad, SeluGrad, SqrtGrad)
and its backward TF's registered gradient of that op (the second order a loss holding a gradient trains with),
bit for bit on 4096 values of each input (zeros and ties included)."""
import numpy as np
import pytest
import tensorflow as tf

from wafer.kernels import RunContext, build_kernel
from wafer.kernels.activation_grads import OPS

RAW = {"TanhGrad": lambda a, b: tf.raw_ops.TanhGrad(y=a, dy=b),
       "SigmoidGrad": lambda a, b: tf.raw_ops.SigmoidGrad(y=a, dy=b),
       "ReluGrad": lambda a, b: tf.raw_ops.ReluGrad(gradients=a, features=b),
       "LeakyReluGrad": lambda a, b: tf.raw_ops.LeakyReluGrad(gradients=a, features=b, alpha=0.3),
       "EluGrad": lambda a, b: tf.raw_ops.EluGrad(gradients=a, outputs=b),
       "Relu6Grad": lambda a, b: tf.raw_ops.Relu6Grad(gradients=a, features=b),
       "SeluGrad": lambda a, b: tf.raw_ops.SeluGrad(gradients=a, outputs=b),
       "SqrtGrad": lambda a, b: tf.raw_ops.SqrtGrad(y=a, dy=b)}


def _inputs(op_type: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    a, b, g = (rng.normal(size=(64, 64)).astype(np.float32) for _ in range(3))
    if op_type in ("TanhGrad", "SigmoidGrad"):  # a is the activation's output y
        a = (np.tanh(a) if op_type == "TanhGrad" else 1 / (1 + np.exp(-a))).astype(np.float32)
    if op_type in ("EluGrad", "SeluGrad"):  # b is the activation's output
        b = tf.nn.elu(b).numpy() if op_type == "EluGrad" else tf.nn.selu(b).numpy()
    if op_type == "SqrtGrad":  # a is the square root y (0 too: where dy is 0, so is TF's value)
        a = np.sqrt(np.abs(a) * (rng.uniform(size=a.shape) > 0.02)).astype(np.float32)
    if op_type == "Relu6Grad":
        b = 4 * b
        b[1, :8] = 6.0
    b[0, :8] = 0.0  # the ties of the comparisons
    return a, b, g


@pytest.mark.parametrize("op_type", sorted(OPS))
def test_activation_grad_is_tensorflows_op_and_its_gradient_bit_for_bit(op_type):
    a, b, g = _inputs(op_type, np.random.default_rng(len(op_type)))
    ta, tb = tf.constant(a), tf.constant(b)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([ta, tb])
        out = RAW[op_type](ta, tb)
    expected = out.numpy()
    grads = tape.gradient(out, [ta, tb], output_gradients=tf.constant(g))
    attrs = {"function": OPS[op_type], **({"alpha": 0.3} if op_type == "LeakyReluGrad" else {})}
    kernel = build_kernel("activation_grad", "k", attrs, [(64,), (64,)])
    value, cache = kernel.forward({}, [a, b], RunContext(training=True, batch_size=64))
    np.testing.assert_array_equal(value, expected)
    assert value.dtype == np.float32
    computed, _ = kernel.backward({}, cache, g, RunContext(training=True, batch_size=64))
    for mine, theirs in zip(computed, grads):
        np.testing.assert_array_equal(mine, np.zeros_like(a) if theirs is None else theirs.numpy())
