"""MFCCs on the CS: tf.signal.dct (type II, also through
tf.signal.mfccs_from_log_mel_spectrograms) is TF's real(rfft(x, [2n])[..., :n] * scale), a real
linear map the `scaled_spectrum` kernel computes as one product with a float64 table. Proven
here: the kernel against TF's tf.signal.dct forward and gradient (n = 13, 40, 64); an MFCC
keyword spotter as users write it (|stft|², mel matrix, log, MFCCs, Conv2D, Adam) trains 4
steps like TF, evaluates and predicts like the CPU path, and so do orthonormal, type IV and
zero-padded DCTs, and the type III DCT (an IRFFT: a `complex_region`); so do other complex uses
of a sliced spectrum (a per-sample complex factor, its phase: a `complex_region`'s slice)."""
from __future__ import annotations

import cs_inprocess
import numpy as np
import pytest
import tensorflow as tf
from keyword_spotters import WORDS, keyword_head

from tf_model.estimator_spec import CSEstimatorSpec
from wafer.kernels import RunContext, build_kernel

v1 = tf.compat.v1
L = tf.keras.layers
SAMPLES, BATCH, RATE = 1024, 8, 8000


def keyword_input_fn(params):
    """Waveforms of 1024 samples at 8 kHz: a keyword is a tone (its pitch; the last one
    sweeps) under a Gaussian envelope, in noise; labels: the keyword."""
    rng = np.random.default_rng(15)
    count = 64
    labels = rng.integers(0, WORDS, count).astype(np.int32)
    t = np.arange(SAMPLES) / RATE
    pitch = np.array([300.0, 600.0, 900.0, 300.0])[labels][:, None]
    sweep = np.array([0.0, 0.0, 0.0, 800.0])[labels][:, None]
    envelope = np.exp(-((t - rng.uniform(0.03, 0.1, (count, 1))) ** 2) / 0.002)
    waves = envelope * np.sin(2 * np.pi * (pitch * t + 0.5 * sweep * t ** 2 / t[-1])) \
        + 0.1 * rng.standard_normal((count, SAMPLES))
    return tf.data.Dataset.from_tensor_slices((waves.astype(np.float32), labels)).repeat().batch(
        params["batch_size"], drop_remainder=True)


def mfcc_spotter(features, labels, mode, params):
    """|stft|², a 20-band mel matrix, log(+1e-6), the first 13 MFCCs (or of tf.signal.dct with
    params["dct"]), two Conv2D, pooled, Dense to the keywords; Adam; accuracy evaluated, classes and MFCCs predicted."""
    stft = tf.signal.stft(features, frame_length=128, frame_step=64, fft_length=128)
    power = tf.square(tf.abs(stft))
    mel = tf.signal.linear_to_mel_weight_matrix(20, 65, RATE, 50.0, 1800.0)
    log_mel = tf.math.log(tf.tensordot(power, mel, 1) + 1e-6)
    if "dct" in params:  # the cepstrum by tf.signal.dct itself
        mfcc = tf.signal.dct(log_mel, **params["dct"])[..., :13]
    else:
        mfcc = tf.signal.mfccs_from_log_mel_spectrograms(log_mel)[..., :13]
    return keyword_head(mfcc, labels, mode, 3e-3)


def params(**extra):
    return {"batch_size": BATCH, "runconfig": {"tf_random_seed": 3}, **extra}


def dct_kernel(n: int) -> object:
    """The kernel the compiler builds for tf.signal.dct of n values: TF's own scale
    2·exp(−iπk/2n) (complex64, as dct_ops computes it) on the first n bins of the RFFT of 2n."""
    k = tf.range(float(n))
    scale = (2.0 * tf.exp(tf.complex(0.0, -k * np.pi * 0.5 / float(n)))).numpy()
    return build_kernel("scaled_spectrum", "dct/Real", {
        "fft_length": 2 * n, "bins": list(range(n)), "part": "real",
        "scale_real": [float(v) for v in scale.real],
        "scale_imag": [float(v) for v in scale.imag]}, [(5, 2 * n)])


@pytest.mark.parametrize("n", [13, 40, 64])
def test_the_dct_kernel_matches_tensorflows_dct_and_gradient(n):
    """TF's dct pads to 2n before its RFFT (a `pad` kernel on the CS): the kernel on the
    padded values is within 1.5e-7 of TF's largest coefficient (TF's complex64 FFT's own
    rounding), its gradient (the transposed map) within 3e-7 of TF's largest."""
    rng = np.random.default_rng(n)
    x = (3 * rng.standard_normal((3, 5, n)) + 2).astype(np.float32)
    value = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(value)
        y = tf.signal.dct(value, type=2)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    grad = tape.gradient(y, value, output_gradients=tf.constant(dy)).numpy()
    kernel, ctx = dct_kernel(n), RunContext(training=True, batch_size=3)
    out, cache = kernel.forward({}, [np.concatenate([x, np.zeros_like(x)], -1)], ctx)
    (dx,), _ = kernel.backward({}, cache, dy, ctx)
    assert out.dtype == np.float32 and out.shape == y.shape
    np.testing.assert_allclose(out, y.numpy(), rtol=0, atol=1.5e-7 * np.abs(y.numpy()).max())
    np.testing.assert_allclose(dx[..., :n], grad, rtol=0, atol=3e-7 * np.abs(grad).max())


@pytest.fixture(scope="module")
def spotter(tmp_path_factory):
    return cs_inprocess.compare(mfcc_spotter, keyword_input_fn, params(),
                                str(tmp_path_factory.mktemp("mfcc")), steps=4)


def test_an_mfcc_keyword_spotter_trains_like_tensorflow(spotter):
    types = [k.type for k in spotter.compiled.program.kernels]
    assert types.count("scaled_spectrum") == 1 and types.count("spectrum") == 1
    cs_inprocess.assert_same_training(spotter, rtol=1e-5)


def test_the_mfcc_spotter_evaluates_and_predicts_like_the_cpu(spotter, tmp_path):
    assert cs_inprocess.evaluation_mismatch(mfcc_spotter, keyword_input_fn, params(),
                                            str(tmp_path), spotter, steps=2) == ""
    assert cs_inprocess.prediction_mismatch(mfcc_spotter, keyword_input_fn, params(),
                                            str(tmp_path), spotter) == ""


@pytest.mark.slow
@pytest.mark.parametrize("dct", [{"norm": "ortho"}, {"type": 4}, {"n": 16}])
def test_orthonormal_type_iv_and_padded_dcts_train_like_tensorflow(tmp_path, dct):
    """norm="ortho" (a constant weight per coefficient after the kernel), type IV (the type II
    of 2n values, every other coefficient) and n > the input's length (zero-padded)."""
    run = cs_inprocess.compare(mfcc_spotter, keyword_input_fn, params(dct=dct), str(tmp_path),
                               steps=4)
    assert [k.type for k in run.compiled.program.kernels].count("scaled_spectrum") == 1
    cs_inprocess.assert_same_training(run, rtol=1e-5)


@pytest.mark.slow
def test_a_type_iii_dct_trains_like_tensorflow(tmp_path):
    """The type III DCT (dct_ops: an IRFFT of the input times complex constants) is a
    `complex_region` kernel (tests/coordinator/test_complex_values.py)."""
    run = cs_inprocess.compare(mfcc_spotter, keyword_input_fn, params(dct={"type": 3}),
                               str(tmp_path), steps=4)
    assert "complex_region" in cs_inprocess.kernel_types(run.compiled.program)
    cs_inprocess.assert_same_training(run, rtol=1e-5)


def sliced_spectrum_model(features, labels, mode, params):
    frames = tf.signal.frame(features, 64, 32)
    bins = tf.signal.rfft(frames, fft_length=[128])[..., :64]
    x = {
        "per-sample factor": lambda: tf.math.real(bins * tf.complex(frames, 0.0)),
        "phase": lambda: tf.math.angle(bins * tf.complex(0.5, 0.5)),
    }[params["case"]]()
    logits = L.Dense(WORDS)(tf.reshape(x, [BATCH, -1]))
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    return CSEstimatorSpec(mode=mode, loss=loss,
                           train_op=v1.train.GradientDescentOptimizer(0.1).minimize(loss))


@pytest.mark.parametrize("case", ["per-sample factor", "phase"])
def test_other_complex_uses_of_a_sliced_spectrum_train_like_tensorflow(tmp_path, case):
    """Refused until complex regions sliced their values: the slice is a `complex_region`'s
    Take step (tests/coordinator/test_spectral_operators.py)."""
    run = cs_inprocess.compare(sliced_spectrum_model, keyword_input_fn, params(case=case),
                               str(tmp_path), steps=4)
    assert "complex_region" in cs_inprocess.kernel_types(run.compiled.program)
    cs_inprocess.assert_same_training(run, rtol=1e-5)
