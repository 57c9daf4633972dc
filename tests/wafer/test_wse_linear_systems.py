"""The cholesky, solve and slogdet kernels on a micro-batch of each sample's own matrices
against TF's float32 ops and their gradients (tf.linalg.cholesky, solve, triangular_solve,
inv, det, slogdet), a constant or weight operand broadcast to every sample; operands that
would broadcast against the batch are refused; a singular matrix (TF's kernels stop with
an error) gives NaN, not a crash of the simulator."""
import numpy as np
import pytest
import tensorflow as tf

from wafer.kernels import KernelError, RunContext, build_kernel

B, N = 5, 3
RNG = np.random.default_rng(0)
A = (RNG.normal(size=(B, N, N)) + 3 * np.eye(N)).astype(np.float32)
SPD = (A @ np.swapaxes(A, 1, 2)).astype(np.float32)
RHS = RNG.normal(size=(B, N, 2)).astype(np.float32)
SHARED = RNG.normal(size=(N, 2)).astype(np.float32)  # a constant or weight's right-hand sides


def tf_values_and_gradients(function, *arrays):
    tensors = [tf.constant(a) for a in arrays]
    with tf.GradientTape() as tape:
        tape.watch(tensors)
        y = function(*tensors)
        seed = tf.constant(np.linspace(-1, 1, y.shape.num_elements(), dtype=np.float32).reshape(y.shape))
        weighted = tf.reduce_sum(y * seed)
    return y.numpy(), seed.numpy(), [g.numpy() for g in tape.gradient(weighted, tensors)]


@pytest.mark.parametrize("kind, attrs, arrays, function", [
    ("cholesky", {}, [SPD], tf.linalg.cholesky),
    ("solve", {"operands": "ii"}, [A, RHS], tf.linalg.solve),
    ("solve", {"operands": "ii", "adjoint": True}, [A, RHS],
     lambda a, b: tf.linalg.solve(a, b, adjoint=True)),
    ("solve", {"operands": "ii", "triangle": "lower"}, [A, RHS],
     lambda a, b: tf.linalg.triangular_solve(a, b, lower=True)),
    ("solve", {"operands": "ip", "triangle": "upper", "adjoint": True, "p1": [N, 2]}, [A, SHARED],
     lambda a, b: tf.linalg.triangular_solve(a, b, lower=False, adjoint=True)),
    ("solve", {"operands": "ic", "c1": np.eye(N, dtype=np.float32)}, [A], tf.linalg.inv),
    ("slogdet", {"output": "log_abs_det"}, [A], lambda a: tf.linalg.slogdet(a)[1]),
    ("slogdet", {"output": "determinant"}, [A], tf.linalg.det),
], ids=["cholesky", "solve", "solve_adjoint", "triangular_lower", "triangular_upper_adjoint_weight",
        "inverse", "slogdet", "det"])
def test_each_samples_system_matches_tensorflow(kind, attrs, arrays, function):
    expected, seed, tf_grads = tf_values_and_gradients(function, *arrays)
    weight = attrs.get("operands") == "ip"
    inputs = arrays if attrs.get("operands") == "ii" else arrays[:1]  # (batch first)
    kernel = build_kernel(kind, "k", attrs, [a.shape[1:] for a in inputs])
    params = {"p1": arrays[1]} if weight else {}
    context = RunContext(training=True, batch_size=B)
    y, cache = kernel.forward(params, inputs, context)
    assert kernel.output_shape == expected.shape[1:]
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)
    grads, param_grads = kernel.backward(params, cache, seed, context)
    got = [*grads, param_grads["p1"]] if weight else grads
    for ours, theirs in zip(got, tf_grads):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


def test_a_constant_stacked_like_the_batch_is_refused():
    with pytest.raises(KernelError, match="broadcast against the batch"):
        build_kernel("solve", "k", {"operands": "ic", "c1": np.zeros((B, 1, N, 2), np.float32)},
                     [(N, N)])


@pytest.mark.parametrize("kind, attrs, matrix", [
    ("cholesky", {}, -SPD),
    ("solve", {"operands": "ic", "c1": SHARED}, np.zeros((B, N, N), np.float32)),
    ("slogdet", {"output": "determinant"}, np.zeros((B, N, N), np.float32)),
], ids=["not_positive_definite", "singular_solve", "singular_det_gradient"])
def test_a_matrix_tensorflow_stops_on_gives_nan_not_a_crash(kind, attrs, matrix):
    kernel = build_kernel(kind, "k", attrs, [(N, N)])
    context = RunContext(training=True, batch_size=B)
    y, cache = kernel.forward({}, [matrix], context)
    grads, _ = kernel.backward({}, cache, np.ones_like(y), context)
    assert np.isnan(grads[0]).all() and (kind == "slogdet" or np.isnan(y).all())
