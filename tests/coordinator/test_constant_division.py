"""Float ops with constants as TF's Session computes them: Grappler's constant folding runs
x / c as x * (1 / c) (ReduceDivToReciprocalMul) and (x * y) * c, y constant, as x * (c * y)
(ConstantPushDown), each 1 ULP from the graph's op in many values (docs/design.md,
"Grappler's rewrites")."""
import breadth_models as bm
import cs_inprocess
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.keras import layers as L

from common.run_settings import RunSettings
from cs_api.attrs import from_attr
from tf_model import cpu_session
from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys
from wafer.kernels import RunContext, build_kernel

PARAMS = {"runconfig": {"tf_random_seed": 1}}
SAMPLE_RATE = 8000.0
HARMONICS = np.arange(1, 9, dtype=np.float32)


def phase_synth(features, labels, mode, params):
    """A frame Dense as instantaneous frequencies, phase by the cumulative sum of f / rate (an
    additive synthesizer's oscillator), its sine pooled over time."""
    f0 = L.Dense(4, name="f0")(features) * 440.0
    phase = tf.cumsum(f0 / SAMPLE_RATE, axis=1)
    return bm.spec(mode, L.Dense(3)(tf.reduce_mean(tf.sin(2.0 * np.pi * phase), axis=1)), labels)


def pitch_input_fn(params):
    rng = np.random.default_rng(3)
    f0 = rng.uniform(100, 500, size=(32, 64, 1)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices(
        (f0, rng.normal(size=(32, 64)).astype(np.float32) * 0.3)).batch(8, drop_remainder=True)


def harmonic_oscillator(features, labels, mode, params):
    """DDSP's harmonic oscillator: the phase of each harmonic k, 2π · cumsum(f0 / rate) · k,
    its sines weighted by a learned amplitude of the pitch."""
    partials = 2 * np.pi * tf.cumsum(features / SAMPLE_RATE, axis=1) * HARMONICS
    amplitude = L.Dense(1, activation="softplus", name="amplitude")(features / 500.0)
    audio = tf.reduce_sum(amplitude * tf.sin(partials), -1)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"partials": partials, "audio": audio})
    loss = tf.compat.v1.losses.mean_squared_error(labels, audio)
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss)
    train_op = tf.compat.v1.train.AdamOptimizer(1e-2).minimize(
        loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode, loss=loss, train_op=train_op)


def _session_division(x, g):
    """TF's Session (Grappler on, as the CPU path runs) x / rate and its gradient at g."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        xt = tf.compat.v1.placeholder(tf.float32, x.shape)
        gt = tf.compat.v1.placeholder(tf.float32, x.shape)
        y = xt / SAMPLE_RATE
        return session.run([y, tf.gradients(y, xt, grad_ys=gt)[0]], {xt: x, gt: g})


@pytest.fixture(scope="module")
def phase_run(tmp_path_factory):
    """phase_synth compiled and trained 4 steps on the CS and on TF, once for the module."""
    return cs_inprocess.compare(phase_synth, bm.sequence_input_fn, PARAMS,
                                str(tmp_path_factory.mktemp("phase_synth")), steps=4)


def test_division_by_a_constant_is_tensorflows_bit_for_bit(phase_run):
    (message,) = [k for k in phase_run.compiled.program.kernels if k.name.endswith("truediv")]
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


def test_a_phase_accumulated_from_a_divided_frequency_trains_like_tensorflow(phase_run, tmp_path):
    cs_inprocess.assert_same_training(phase_run)
    for check in (cs_inprocess.evaluation_mismatch, cs_inprocess.prediction_mismatch):
        problem = check(phase_synth, bm.sequence_input_fn, PARAMS, str(tmp_path), phase_run)
        assert not problem, problem


def test_harmonic_phases_are_tensorflows_bit_for_bit(tmp_path):
    """ddsp_harmonic's first loss was 1.1e-4 from TF's (its 1-ULP runs: 1e-6) and its first
    gradients 7 %: TF's Session computes the phases as cumsum(f0 · (1 / rate)) · (2π · k)."""
    result = cs_inprocess.compare(harmonic_oscillator, pitch_input_fn, PARAMS, str(tmp_path), steps=4)
    cs_inprocess.assert_same_training(result)
    path = cs_inprocess.trained_checkpoint(str(tmp_path), result)
    cs = cs_inprocess.predict_like_the_chief(harmonic_oscillator, pitch_input_fn, PARAMS,
                                             str(tmp_path), path, steps=1)
    cpu = cpu_session.predict(harmonic_oscillator, pitch_input_fn,
                              RunSettings(str(tmp_path), PARAMS, None, None, None, None),
                              checkpoint_path=path, num_samples=8).arrays
    f0 = np.concatenate([x for x, _ in cs_inprocess.first_batches(pitch_input_fn, PARAMS, 1)])
    cumsum = np.cumsum(f0 * np.float32(1 / SAMPLE_RATE), axis=1, dtype=np.float32)
    as_written = np.float32(2 * np.pi) * cumsum * HARMONICS
    assert np.mean(as_written != cpu["partials"]) > 0.1  # the graph's own order differs
    assert np.array_equal(cs["partials"], cpu["partials"])
    np.testing.assert_allclose(cs["audio"], cpu["audio"], rtol=1e-5, atol=1e-6)
