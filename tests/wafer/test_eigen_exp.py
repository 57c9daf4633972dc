"""exp, elu, selu, softmax and log_softmax against TensorFlow's float32 CPU kernels (Eigen's,
oneDNN off as the suite pins it): exp bit for bit on every regime of argument and every
length's scalar tail; log_softmax bit for bit, forward and gradient; softmax bit for bit
where TF's path is the same on every CPU (fewer than 8 rows), within 3 ulp where it is not
(Eigen's packet inverse is the CPU's rcpps and a Newton step)."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tests.wafer.test_eigen_logistic import arguments, assert_bits_equal
from wafer.eigen_exp import exp
from wafer.eigen_log import expm1, log, log1p
from wafer.kernels import RunContext, build_kernel
from wafer.kernels.activations import apply, gradient

RNG = np.random.default_rng(20261206)
EDGES = (88.723, 88.72283935546875, 87.0, -87.0, -88.3762626647950, -103.97, -104.0, 0.5, -0.5)


def exp_arguments() -> np.ndarray:
    near = [(np.float32(c).view(np.int32) + np.arange(-3000, 3000)).astype(np.int32).view(np.float32)
            for c in EDGES]
    return np.concatenate([arguments(), *near])


@pytest.mark.parametrize("function, op, numpys", [(exp, tf.exp, np.exp), (expm1, tf.math.expm1, np.expm1),
                                                 (log, tf.math.log, np.log), (log1p, tf.math.log1p, np.log1p)])
def test_exp_expm1_log_log1p_are_tensorflows_bit_for_bit(function, op, numpys):
    """exp: pexp_float; expm1: Kahan's generic_expm1 over Eigen's exp and log; log:
    plog_float; log1p: generic_log1p; libm's expf, expm1f, logf, log1pf on the scalar path
    (numpy's: 71 %, 82 %, 89 %, 83 %). Denormal arguments are zeros (DAZ)."""
    x = exp_arguments()
    if function in (log, log1p):  # positive arguments too, and some near -1
        x = np.concatenate([np.abs(x), x, np.float32(-1) + np.abs(x[:20_000]) * np.float32(1e-3)])
    assert_bits_equal(function(x), op(x).numpy())
    with np.errstate(all="ignore"):  # numpy's differs
        assert np.mean(numpys(x).view(np.int32) == op(x).numpy().view(np.int32)) < 0.9
    for n in range(1, 18):  # all on Eigen's scalar path up to 7, then its tail
        assert_bits_equal(function(x[:n]), op(x[:n]).numpy())


@pytest.mark.parametrize("function, op", [("exp", tf.exp), ("expm1", tf.math.expm1), ("elu", tf.nn.elu),
                                          ("selu", tf.nn.selu), ("softplus", tf.nn.softplus),
                                          ("log", tf.math.log), ("log1p", tf.math.log1p)])
def test_micro_batched_exp_elu_selu_softplus_are_tensorflows(function, op):
    """A batch of 6 samples of 5x7 in micro-batches of 4 and 2 (TF's scalar tail: the last 2).
    Softplus: x, exp(x) or Eigen's log1p(exp(x)) by TF's thresholds +-(log(eps) + 2)."""
    x = RNG.uniform(-20, 16, (6, 5, 7)).astype(np.float32)
    if function.startswith("log"):
        x = np.abs(x)
    kernel = build_kernel("activation", "k", {"function": function}, [x.shape[1:]])
    outs = [kernel.forward({}, [x[a:b]], RunContext(training=True, batch_size=6, offset=a))[0]
            for a, b in ((0, 4), (4, 6))]
    assert_bits_equal(np.concatenate(outs), op(x).numpy())
    assert_bits_equal(apply(function, x), op(x).numpy())


def ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.abs(a.view(np.int32).astype(np.int64) - b.view(np.int32).astype(np.int64))


def run_softmax(x: np.ndarray, log: bool, micro: int) -> tuple[np.ndarray, np.ndarray]:
    """The softmax kernel's output and input gradient (of sum(y * w)) in micro-batches."""
    kernel = build_kernel("softmax", "s", {"axis": -1, "log": log}, [x.shape[1:]])
    w = RNG.normal(size=x.shape).astype(np.float32)
    ys, dxs = [], []
    for a in range(0, len(x), micro):
        ctx = RunContext(training=True, batch_size=len(x), offset=a)
        y, cache = kernel.forward({}, [x[a:a + micro]], ctx)
        ys.append(y)
        dxs.append(kernel.backward({}, cache, w[a:a + micro], ctx)[0][0])
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        yt = (tf.nn.log_softmax if log else tf.nn.softmax)(xt)
        loss = tf.reduce_sum(yt * w)
    dxt = tape.gradient(loss, xt)
    return np.concatenate(ys), yt.numpy(), np.concatenate(dxs), dxt.numpy()


@pytest.mark.parametrize("n", [2, 3, 10, 37, 100, 1000])
@pytest.mark.parametrize("rows, micro", [(7, 4), (13, 4), (64, 16)])
def test_log_softmax_is_tensorflows_bit_for_bit(n, rows, micro):
    """Eigen's exp row by row, its row sums, the log of the sums on Eigen's packet path
    (plog_float) and, for the batch's last rows mod 8, libm's logf: forward and gradient
    bit-equal for any batch and micro-batch size."""
    x = RNG.normal(0, 4, (rows, n)).astype(np.float32)
    y, yt, dx, dxt = run_softmax(x, True, micro)
    assert_bits_equal(y, yt)
    assert_bits_equal(dx, dxt)


@pytest.mark.parametrize("n", [2, 3, 10, 37, 100, 1000])
def test_softmax_of_a_small_batch_is_tensorflows_bit_for_bit(n):
    """Fewer than 8 rows: TF inverts every row's sum on Eigen's scalar path, the same on
    every CPU: forward and gradient bit-equal."""
    x = RNG.normal(0, 4, (7, n)).astype(np.float32)
    y, yt, dx, dxt = run_softmax(x, False, micro=4)
    assert_bits_equal(y, yt)
    assert_bits_equal(dx, dxt)


@pytest.mark.parametrize("n", [2, 3, 10, 37, 1000])
def test_softmax_of_a_large_batch_is_within_a_few_ulp(n):
    """8 rows and more: TF inverts the sums of whole packets of rows with the CPU's rcpps and
    a Newton step (Intel's and AMD's rcpps differ), the CS exactly: within 3 ulp of TF's
    forward (measured on an AMD EPYC: at most 3), the gradient within float32 rounding of
    its largest term."""
    x = RNG.normal(0, 4, (64, n)).astype(np.float32)
    y, yt, dx, dxt = run_softmax(x, False, micro=16)
    assert ulps(y, yt).max() <= 3
    np.testing.assert_allclose(dx, dxt, rtol=0, atol=4e-6 * np.abs(dxt).max())


@pytest.mark.parametrize("sparse", [True, False])
@pytest.mark.parametrize("n", [2, 10, 37, 1000])
@pytest.mark.parametrize("rows, micro", [(7, 4), (13, 4), (64, 16)])
def test_softmax_cross_entropy_is_tensorflows_bit_for_bit(sparse, n, rows, micro):
    """(Sparse)SoftmaxCrossEntropyWithLogits' loss and gradients (to the logits: g times the
    kernel's backprop, exp / sum - labels; dense, to the labels: -g log_softmax) bit-equal
    for any batch: the kernel divides by the sums (no rcpps)."""
    logits = RNG.normal(0, 4, (rows, n)).astype(np.float32)
    if sparse:
        labels = RNG.integers(0, n, rows).astype(np.int32)
    else:
        labels = RNG.dirichlet(np.ones(n), rows).astype(np.float32)
    g = RNG.normal(size=rows).astype(np.float32)
    kernel = build_kernel("softmax_cross_entropy_with_logits", "x", {"sparse": sparse},
                          [logits.shape[1:], labels.shape[1:]])
    losses, d_logits, d_labels = [], [], []
    for a in range(0, rows, micro):
        ctx = RunContext(training=True, batch_size=rows, offset=a)
        loss, cache = kernel.forward({}, [logits[a:a + micro], labels[a:a + micro]], ctx)
        grads = kernel.backward({}, cache, g[a:a + micro], ctx)[0]
        losses.append(loss)
        d_logits.append(grads[0])
        d_labels.append(grads[1])
    lt, yt = tf.constant(logits), tf.constant(labels)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([lt, yt])
        if sparse:
            loss_t = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=yt, logits=lt)
        else:
            loss_t = tf.nn.softmax_cross_entropy_with_logits(labels=yt, logits=lt)
        total = tf.reduce_sum(loss_t * g)
    assert_bits_equal(np.concatenate(losses), loss_t.numpy())
    assert_bits_equal(np.concatenate(d_logits), tape.gradient(total, lt).numpy())
    if not sparse:
        assert_bits_equal(np.concatenate(d_labels), tape.gradient(total, yt).numpy())


@pytest.mark.parametrize("function, op", [("erf", tf.math.erf), ("erfc", tf.math.erfc),
                                          ("softplus", tf.nn.softplus)])
def test_erf_erfc_softplus_gradients_are_tensorflows_bit_for_bit(function, op):
    """_ErfGrad and _ErfcGrad: (dy * ±2/sqrt(pi)) * tf.exp(-x^2), Eigen's exp (whole packets);
    _SoftplusGrad: dy * tf.sigmoid(x)."""
    x = RNG.uniform(-5, 5, 64_000).astype(np.float32)
    dy = RNG.normal(size=x.size).astype(np.float32)
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        y = op(xt)
    expected = tape.gradient(y, xt, output_gradients=tf.constant(dy)).numpy()
    assert_bits_equal(gradient(function, x, op(x).numpy(), dy), expected)
