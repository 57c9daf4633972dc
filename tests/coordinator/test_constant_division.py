"""Division by a constant as TF's Session computes it: Grappler's constant folding
(ReduceDivToReciprocalMul) runs x / c as x * (1 / c), the reciprocal rounded to float32,
in the forward pass and in _RealDivGrad's g / c; exact division is 1 ULP off at times."""
import breadth_models as bm
import cs_inprocess
import numpy as np
import tensorflow as tf
from tensorflow.keras import layers as L

from cs_api.attrs import from_attr
from wafer.kernels import RunContext, build_kernel

PARAMS = {"runconfig": {"tf_random_seed": 1}}
SAMPLE_RATE = 8000.0


def phase_synth(features, labels, mode, params):
    """A frame Dense as instantaneous frequencies, phase by the cumulative sum of f / rate (an
    additive synthesizer's oscillator), its sine pooled over time."""
    f0 = L.Dense(4, name="f0")(features) * 440.0
    phase = tf.cumsum(f0 / SAMPLE_RATE, axis=1)
    return bm._spec(mode, L.Dense(3)(tf.reduce_mean(tf.sin(2.0 * np.pi * phase), axis=1)), labels)


def _session_division(x, g):
    """TF's Session (Grappler on, as the CPU path runs) x / rate and its gradient at g."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        xt = tf.compat.v1.placeholder(tf.float32, x.shape)
        gt = tf.compat.v1.placeholder(tf.float32, x.shape)
        y = xt / SAMPLE_RATE
        return session.run([y, tf.gradients(y, xt, grad_ys=gt)[0]], {xt: x, gt: g})


def test_division_by_a_constant_is_tensorflows_bit_for_bit(tmp_path):
    compiled = cs_inprocess.compile_checked(phase_synth, bm.sequence_input_fn, PARAMS, str(tmp_path))
    (message,) = [k for k in compiled.program.kernels if k.name.endswith("truediv")]
    attrs = {key: from_attr(value) for key, value in message.attrs.items()}
    kernel = build_kernel(message.type, message.name, attrs, [(12, 4)])
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(8, 12, 4)) * 440).astype(np.float32)
    g = rng.normal(size=x.shape).astype(np.float32)
    expected, expected_grad = _session_division(x, g)
    assert np.mean(expected != x / np.float32(SAMPLE_RATE)) > 0.3  # exact division differs
    context = RunContext(True, 8)
    out, cache = kernel.forward({}, [x], context)
    (grad,), _ = kernel.backward({}, cache, g, context)
    assert np.array_equal(out, expected) and np.array_equal(grad, expected_grad)


def test_a_phase_accumulated_from_a_divided_frequency_trains_like_tensorflow(tmp_path):
    result = cs_inprocess.compare(phase_synth, bm.sequence_input_fn, PARAMS, str(tmp_path), steps=4)
    cs_inprocess.assert_same_training(result)
    for check in (cs_inprocess.evaluation_mismatch, cs_inprocess.prediction_mismatch):
        problem = check(phase_synth, bm.sequence_input_fn, PARAMS, str(tmp_path), result)
        assert not problem, problem
