"""Spectrograms on the CS: TF's real FFT read only through its magnitude (tf.abs of
tf.signal.stft or tf.signal.rfft), real or imaginary part is a `spectrum` kernel. Proven
here: the kernel against TF's forward and gradient (frame lengths 64..512, zero-padded to
fft_length, odd lengths, silent frames whose magnitude is 0); a keyword-spotting model as
users write it (a Hann-windowed STFT, power, log-mel, Conv2D) trains 4 steps like TF,
evaluates and predicts like the CPU path, one with SpecAugment's masks drawn per sample
trains so (TF's draws replayed) and evaluates; a metric on the labels' spectrum (a spectral-mask denoiser)
evaluates like the CPU path; a learned front-end before the STFT takes the spectrum's
gradient; under mixed_float16 the spectrum stays float32 as TF's; a spectral loss on a
learned synthesizer's audio, as sensitive to rounding in TF as on the CS, validates and trains
no farther from float64 TF than TF float32; a log of bins at TF's FFT rounding level
(noiseless on-bin tones) is refused in one line; the spectrum's phase (tf.math.angle) trains
like TF."""
from __future__ import annotations

import cs_inprocess
import numpy as np
import pytest
import tensorflow as tf
import tf_reference
from keyword_spotters import WORDS, keyword_head

from common.errors import CSRunError
from coordinator.compiler import compile_model
from cs_api.attrs import from_attr
from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys
from wafer.kernels import RunContext, build_kernel

v1 = tf.compat.v1
L = tf.keras.layers
SAMPLES, BATCH, RATE = 1024, 8, 8000


def keywords(count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(waveforms, their 0.2 noise, keywords) of `count` keywords, 1024 samples at 8 kHz: a
    keyword is a tone (its pitch) with a falling second tone."""
    rng = np.random.default_rng(11)
    labels = rng.integers(0, WORDS, count).astype(np.int32)
    t = np.arange(SAMPLES) / RATE
    pitch = 300.0 * (labels[:, None] + 1) + rng.uniform(-20, 20, (count, 1))
    waves = np.sin(2 * np.pi * pitch * t) + 0.5 * np.sin(2 * np.pi * pitch * 1.5 * t * (1 - t))
    return waves, 0.2 * rng.standard_normal((count, SAMPLES)), labels


def tones_input_fn(params):
    """The keywords in noise; labels: the keyword."""
    waves, noise, labels = keywords(64)
    return tf.data.Dataset.from_tensor_slices(((waves + noise).astype(np.float32), labels)) \
        .repeat().batch(params["batch_size"], drop_remainder=True)


def log_mel(features: tf.Tensor, frame: int) -> tf.Tensor:
    """A log-mel spectrogram: Hann-windowed STFT, |.|², 16 mel bands, log(+1e-6)."""
    magnitude = tf.abs(tf.signal.stft(features, frame_length=frame, frame_step=frame // 2,
                                      window_fn=tf.signal.hann_window))
    power = tf.square(magnitude)
    mel = tf.signal.linear_to_mel_weight_matrix(16, magnitude.shape[-1], RATE, 80.0, 3800.0)
    return tf.math.log(tf.tensordot(power, mel, 1) + 1e-6)


def keyword_spotter(features, labels, mode, params):
    """The log-mel spectrogram, two Conv2D, pooled, Dense to the keywords; Adam; accuracy
    evaluated, classes predicted."""
    return keyword_head(log_mel(features, params["frame_length"]), labels, mode, 0.01)


def specaugment_spotter(features, labels, mode, params):
    """The keyword spotter with SpecAugment in training: each sample's log-mel loses a band of
    4 frames and one of 3 mel bands at places drawn by tf.random.uniform."""
    image = log_mel(features, params["frame_length"])
    if mode == ModeKeys.TRAIN:
        frames, bands = image.shape[1], image.shape[2]
        t0 = tf.random.uniform([tf.shape(image)[0], 1, 1]) * (frames - 4)
        f0 = tf.random.uniform([tf.shape(image)[0], 1, 1]) * (bands - 3)
        t = tf.range(frames, dtype=tf.float32)[None, :, None]
        f = tf.range(bands, dtype=tf.float32)[None, None, :]
        time_mask = tf.cast((t >= t0) & (t < t0 + 4.0), tf.float32)
        band_mask = tf.cast((f >= f0) & (f < f0 + 3.0), tf.float32)
        image = image * (1.0 - time_mask) * (1.0 - band_mask)
    return keyword_head(image, labels, mode, 0.01)


def noisy_keywords_input_fn(params):
    """The keywords in noise; labels: the clean waveforms."""
    waves, noise, _ = keywords(64)
    return tf.data.Dataset.from_tensor_slices(((waves + noise).astype(np.float32),
                                               waves.astype(np.float32))).repeat().batch(
        params["batch_size"], drop_remainder=True)


def spectral_mask_denoiser(features, labels, mode, params):
    """Speech enhancement: a mask in [0, 1] from the noisy STFT's log magnitude (Conv1D over
    the frames) times that magnitude, against the clean waveform's (the labels') STFT
    magnitude; Adam; the enhanced magnitude's SNR evaluated (a metric on the label
    spectrum); the mask and the noisy magnitude predicted."""
    noisy = tf.abs(tf.signal.stft(features, frame_length=64, frame_step=32))
    h = L.Conv1D(16, 3, padding="same", activation="relu")(tf.math.log1p(noisy))
    mask = L.Conv1D(noisy.shape[-1], 1, activation="sigmoid")(h)
    enhanced = mask * noisy
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode=mode, predictions={"mask": mask, "magnitude": noisy})
    clean = tf.abs(tf.signal.stft(labels, frame_length=64, frame_step=32))
    loss = v1.losses.mean_squared_error(clean, enhanced)
    if mode == ModeKeys.EVAL:
        snr = 10.0 * tf.math.log(tf.reduce_sum(tf.square(clean), [1, 2]) / tf.reduce_sum(
            tf.square(clean - enhanced), [1, 2])) / tf.math.log(10.0)
        return CSEstimatorSpec(mode=mode, loss=loss, eval_metric_ops={"snr_db": v1.metrics.mean(snr)})
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=v1.train.AdamOptimizer(3e-3).minimize(
        loss, global_step=v1.train.get_or_create_global_step()))


def mixed_spotter(features, labels, mode, params):
    """The keyword spotter under Keras' mixed_float16 policy (its layers in float16; TF's
    RFFT takes float32 only, so the spectrum stays float32)."""
    tf.keras.mixed_precision.set_global_policy(params.get("policy", "mixed_float16"))
    try:
        return keyword_spotter(features, labels, mode, params)
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")


def learned_front_end(features, labels, mode, params):
    """A learned pre-emphasis (a Conv1D over the waveform) before tf.signal.frame and
    tf.abs(tf.signal.rfft(frames)) of zero-padded frames (fft_length 128 > 100), log1p; the
    real part of the spectrum read too; momentum SGD."""
    wave = tf.squeeze(L.Conv1D(1, 5, padding="same")(features[..., tf.newaxis]), -1)
    frames = tf.signal.frame(wave, 100, 50)
    spectrum = tf.signal.rfft(frames, fft_length=[128])
    x = tf.concat([tf.math.log1p(tf.abs(spectrum)), 0.01 * tf.math.real(spectrum)], -1)
    logits = L.Dense(WORDS)(L.Flatten()(L.Dense(8, activation="tanh")(x)))
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    train_op = v1.train.MomentumOptimizer(0.01, 0.9).minimize(loss)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op)


def params(**extra):
    return {"batch_size": BATCH, "runconfig": {"tf_random_seed": 3}, "frame_length": 256, **extra}


@pytest.mark.parametrize("n, fft_length, part", [
    (64, 64, "magnitude"), (100, 128, "magnitude"), (256, 256, "magnitude"), (400, 512, "magnitude"),
    (512, 512, "magnitude"), (33, 33, "magnitude"), (96, 128, "real"), (96, 128, "imag")])
def test_the_spectrum_kernel_matches_tensorflows_rfft_and_gradient(n, fft_length, part):
    """Of frames (a silent one: its magnitude 0 and TF's gradient there 0), the magnitude
    within 2e-7 of the frame's largest (TF's own rounding: 1.2-1.8e-7 from the exact
    transform), the gradient within 5e-7 of the largest."""
    rng = np.random.default_rng(n)
    x = rng.standard_normal((3, 5, n)).astype(np.float32)
    x[0, 0] = 0.0
    value = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(value)
        spectrum = tf.signal.rfft(value, fft_length=[fft_length])
        y = {"magnitude": tf.abs, "real": tf.math.real, "imag": tf.math.imag}[part](spectrum)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    grad = tape.gradient(y, value, output_gradients=tf.constant(dy)).numpy()
    kernel = build_kernel("spectrum", "stft/rfft", {"fft_length": fft_length, "part": part},
                          [(5, n)])
    ctx = RunContext(training=True, batch_size=3)
    out, cache = kernel.forward({}, [x], ctx)
    (dx,), _ = kernel.backward({}, cache, dy, ctx)
    assert out.dtype == np.float32 and out.shape == y.shape
    np.testing.assert_allclose(out, y.numpy(), rtol=0, atol=2e-7 * np.abs(y.numpy()).max())
    np.testing.assert_allclose(dx, grad, rtol=0, atol=5e-7 * np.abs(grad).max())
    if part == "magnitude":
        assert not out[0, 0].any() and not dx[0, 0].any()


@pytest.fixture(scope="module")
def spotter(tmp_path_factory):
    return cs_inprocess.compare(keyword_spotter, tones_input_fn, params(),
                                str(tmp_path_factory.mktemp("spotter")), steps=4)


def test_a_log_mel_keyword_spotter_trains_like_tensorflow(spotter):
    kernels = [(k.type, k.attrs) for k in spotter.compiled.program.kernels]
    assert [t for t, _ in kernels].count("spectrum") == 1
    cs_inprocess.assert_same_training(spotter, rtol=1e-5)


def test_the_keyword_spotter_evaluates_and_predicts_like_the_cpu(spotter, tmp_path):
    assert cs_inprocess.evaluation_mismatch(keyword_spotter, tones_input_fn, params(),
                                            str(tmp_path), spotter, steps=2) == ""
    assert cs_inprocess.prediction_mismatch(keyword_spotter, tones_input_fn, params(),
                                            str(tmp_path), spotter) == ""


def test_a_specaugment_spotter_trains_like_tensorflow_with_its_draws_and_evaluates(tmp_path):
    """Masks drawn per sample after the spectrogram: the rounding measurement feeds the first
    run's draws to the second (redrawn, they moved the loss and it was refused as noiseless
    signals); with TF's draws replayed the CS trains like TF."""
    run = cs_inprocess.compare_drawn(specaugment_spotter, tones_input_fn, params(),
                                     str(tmp_path), steps=4)
    assert [k.type for k in run.compiled.program.kernels].count("random") == 2
    cs_inprocess.assert_same_training(run, rtol=1e-5)
    assert cs_inprocess.evaluation_mismatch(specaugment_spotter, tones_input_fn, params(),
                                            str(tmp_path), run, steps=2) == ""


def test_a_metric_on_the_label_spectrum_evaluates_like_the_cpu(tmp_path):
    """The clean spectrum tf.abs(tf.signal.stft(labels)), read by the loss and by an eval
    metric, is the spectrum kernel's output streamed to the host (it was refused as a
    complex value the host reads); predicting the noisy magnitude streams it too."""
    run = cs_inprocess.compare(spectral_mask_denoiser, noisy_keywords_input_fn, params(),
                               str(tmp_path), steps=4)
    cs_inprocess.assert_same_training(run, rtol=1e-5)
    assert cs_inprocess.evaluation_mismatch(spectral_mask_denoiser, noisy_keywords_input_fn,
                                            params(), str(tmp_path), run, steps=2) == ""
    assert cs_inprocess.prediction_mismatch(spectral_mask_denoiser, noisy_keywords_input_fn,
                                            params(), str(tmp_path), run) == ""


@pytest.mark.slow
@pytest.mark.parametrize("frame_length", [64, 128, 512])
def test_keyword_spotters_of_other_frame_lengths_train_like_tensorflow(tmp_path, frame_length):
    run = cs_inprocess.compare(keyword_spotter, tones_input_fn, params(frame_length=frame_length),
                               str(tmp_path), steps=4)
    cs_inprocess.assert_same_training(run, rtol=1e-5)


@pytest.mark.slow
def test_under_mixed_float16_the_spectrum_stays_float32_as_in_tensorflow(tmp_path):
    run = cs_inprocess.compare(mixed_spotter, tones_input_fn, params(), str(tmp_path), steps=4)
    precisions = {k.type: from_attr(k.attrs["precision"]) if "precision" in k.attrs else "float32"
                  for k in run.compiled.program.kernels}
    assert precisions["spectrum"] == "float32" and precisions["conv2d"] == "float16"
    twin = cs_inprocess.float32_twin(mixed_spotter, tones_input_fn, params(), run, steps=4)
    assert not cs_inprocess.mixed_precision_mismatches(run, twin)


def test_a_learned_front_end_takes_the_spectrums_gradient_like_tensorflow(tmp_path):
    run = cs_inprocess.compare(learned_front_end, tones_input_fn, params(), str(tmp_path), steps=4)
    parts = sorted(from_attr(k.attrs["part"]) for k in run.compiled.program.kernels
                   if k.type == "spectrum")
    assert parts == ["magnitude", "real"]
    cs_inprocess.assert_same_training(run, rtol=1e-5)


def on_bin_tones_input_fn(params):
    """Noiseless tones exactly on the frequency of a 64-sample frame's bin (8 kHz / 64 = 125 Hz
    apart): the other bins of the Hann-windowed frames are 0 but for the FFT's rounding."""
    rng = np.random.default_rng(4)
    labels = rng.integers(0, WORDS, 64).astype(np.int32)
    t = np.arange(SAMPLES) / RATE
    waves = np.sin(2 * np.pi * 500.0 * (labels[:, None] + 1) * t)
    return tf.data.Dataset.from_tensor_slices((waves.astype(np.float32), labels)).repeat().batch(
        params["batch_size"], drop_remainder=True)


def log_spectrogram(features, labels, mode, params):
    """log(|stft| + epsilon (1e-6)) of frames of 64, a Conv2D, pooled, Dense; RMSProp."""
    spectrum = tf.signal.stft(features, frame_length=64, frame_step=32, fft_length=64)
    if params.get("complex"):  # the same magnitudes through complex values: complex_region
        frames = tf.signal.frame(features, 64, 32) * tf.signal.hann_window(64)
        spectrum = tf.signal.fft(tf.cast(frames, tf.complex64))
    log = tf.math.log(tf.abs(spectrum)[..., :33] + params.get("epsilon", 1e-6))
    x = L.Conv2D(8, 3, activation="relu")(log[..., None])
    logits = L.Dense(WORDS)(L.GlobalAveragePooling2D()(x))
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=v1.train.RMSPropOptimizer(1e-3).minimize(
        loss, global_step=v1.train.get_or_create_global_step()))


def test_a_log_of_bins_at_the_ffts_rounding_level_is_refused_in_one_line(tmp_path):
    """Noiseless on-bin tones: TF's bins off the tone are its FFT's rounding noise (~1e-6
    here), which the log's 1e-6 amplifies; measured on input_fn's first batch and refused
    (the loss 9.4e-4 apart, TF from 1-ULP-moved weights 3.2e-7). As the line advises, with
    an epsilon of 1e-3 the model validates, and with noise in the signal it trains like TF."""
    with pytest.raises(CSRunError) as error:
        compile_model(log_spectrogram, on_bin_tones_input_fn, params(), str(tmp_path),
                      validate_only=True)
    found = cs_inprocess.model_op_words(log_spectrogram, on_bin_tones_input_fn, params())
    assert cs_inprocess.refusal_problem(error.value, __file__, found) == ""
    assert str(error.value).startswith("validation failed: RFFT ") and \
        "the FFT's rounding" in str(error.value)
    compile_model(log_spectrogram, on_bin_tones_input_fn, params(epsilon=1e-3), str(tmp_path),
                  validate_only=True)
    run = cs_inprocess.compare(log_spectrogram, tones_input_fn, params(), str(tmp_path), steps=4)
    cs_inprocess.assert_same_training(run, rtol=1e-5)


def test_a_log_of_a_complex_fft_at_its_rounding_level_is_refused_in_one_line(tmp_path):
    """The same measurement covers a complex_region's FFT (tf.signal.fft of complex frames):
    refused naming its first op; with an epsilon of 1e-3 it validates."""
    with pytest.raises(CSRunError) as error:
        compile_model(log_spectrogram, on_bin_tones_input_fn, params(complex=True),
                      str(tmp_path), validate_only=True)
    assert str(error.value).startswith("validation failed: Cast ") and \
        "the FFT's rounding" in str(error.value)
    compile_model(log_spectrogram, on_bin_tones_input_fn, params(complex=True, epsilon=1e-3),
                  str(tmp_path), validate_only=True)


SYNTH_SAMPLES, PARTIALS = 512, 6


def partials(pitch: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """sin(2 pi k f t) of the partials k = 1..PARTIALS of `pitch` [B, 1] in Hz: [B, samples, k]."""
    t = tf.constant(np.arange(SYNTH_SAMPLES) / RATE, dtype)[None, :, None]
    k = tf.constant(np.arange(1, PARTIALS + 1), dtype)
    return tf.sin(2 * np.pi * tf.cast(pitch, dtype)[:, :, None] * k * t)


def notes_input_fn(params):
    """Features: a note's (pitch - 300) / 100 and its first partial's amplitude; labels: the
    note, its partials decaying (an additive synthesizer's target audio, noiseless)."""
    rng = np.random.default_rng(7)
    pitch = rng.uniform(150, 500, (64, 1))
    amplitudes = np.exp(-np.arange(1, PARTIALS + 1) * rng.uniform(0.3, 1.0, (64, 1)))
    with tf.Graph().as_default(), v1.Session() as session:
        audio = session.run(tf.reduce_sum(partials(pitch, tf.float32) * amplitudes[:, None, :]
                                          .astype(np.float32), -1))
    features = np.concatenate([(pitch - 300) / 100, amplitudes[:, :1]], 1).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((features, audio)).repeat().batch(
        params["batch_size"], drop_remainder=True)


def learned_synthesizer(features, labels, mode, params):
    """An MLP's partial amplitudes, summed sinusoids, a multi-scale spectral loss (L1 of the
    magnitudes and of their logs, epsilon 1e-5: DDSP's) against the target's; Adam."""
    amplitudes = L.Dense(PARTIALS, activation="softplus")(L.Dense(16, activation="tanh")(features))
    pitch = features[:, :1] * 100 + 300
    audio = tf.reduce_sum(partials(pitch, amplitudes.dtype) * amplitudes[:, None, :], -1)
    loss = 0.0
    for frame in (64, 128):
        pred = tf.abs(tf.signal.stft(audio, frame, frame // 4, frame))
        target = tf.abs(tf.signal.stft(tf.cast(labels, audio.dtype), frame, frame // 4, frame))
        loss += tf.reduce_mean(tf.abs(pred - target)) + tf.reduce_mean(
            tf.abs(tf.math.log(pred + 1e-5) - tf.math.log(target + 1e-5)))
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=v1.train.AdamOptimizer(3e-3).minimize(
        loss, global_step=v1.train.get_or_create_global_step()))


def test_a_spectral_loss_as_sensitive_to_rounding_as_tensorflow_trains_within_its_spread(tmp_path):
    """The synthesized audio's off-partial bins are rounding noise under a log's 1e-5: the CS's
    spectra move the first batch's gradients by 3.4e-4 of the largest, beyond 1e-5, but TF's
    own move as far from weights moved by 1 ULP, so the model validates. Neither run is the
    other's to 1e-4 (TF's own 1-ULP runs are not either); against float64 TF the CS's weights
    are no farther than 2x TF float32's. TF's FFT rounds otherwise on other CPUs (on an AMD
    EPYC its own 1-ULP spread is 3.8e-4 and the CS's 1.2e-3): there the check refuses the
    model, naming the FFT, rather than letting it train beyond TF's spread."""
    try:
        run = cs_inprocess.compare(learned_synthesizer, notes_input_fn, params(), str(tmp_path),
                                   steps=4)
    except CSRunError as refusal:
        assert "RFFT 'stft/rfft'" in str(refusal) and "no CS kernel rounds as TF's FFT does" in str(refusal)
        return
    data = tf_reference.batches(notes_input_fn, params(), 4)
    exact = tf_reference.run(learned_synthesizer, notes_input_fn, params(),
                             run.compiled.initial_weights, data, floatx="float64")
    assert cs_inprocess.farther_than_tensorflow(run, exact.state, 2.0, floor=1e-5) == []
    assert np.allclose(run.cs.losses, exact.losses, rtol=2 * np.abs(
        np.subtract(run.reference.losses, exact.losses) / exact.losses).max())


def spectrum_model(features, labels, mode, params):
    spectrum = tf.signal.rfft(tf.signal.frame(features, 64, 32))
    x = {
        "phase": lambda: tf.math.angle(spectrum),
        "complex arithmetic": lambda: tf.abs(spectrum * tf.complex(0.5, 0.5)),
        "inverse": lambda: tf.signal.irfft(spectrum),
        "complex fft": lambda: tf.abs(tf.signal.fft(tf.cast(tf.signal.frame(features, 64, 32),
                                                            tf.complex64))),
    }[params["case"]]()
    logits = L.Dense(WORDS)(tf.reshape(x, [BATCH, -1]))
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    return CSEstimatorSpec(mode=mode, loss=loss,
                           train_op=v1.train.GradientDescentOptimizer(0.1).minimize(loss))


def test_the_phase_of_a_spectrum_trains_like_tensorflow(tmp_path):
    """tf.math.angle of the spectrum: a `complex_region` (complex_values.py), its gradient
    TF's -complex(g, 0) / complex(Im z, Re z)."""
    run = cs_inprocess.compare(spectrum_model, tones_input_fn, params(case="phase"),
                               str(tmp_path), steps=4)
    assert "complex_region" in cs_inprocess.kernel_types(run.compiled.program)
    cs_inprocess.assert_same_training(run, rtol=1e-5)


@pytest.mark.parametrize("case", ["complex arithmetic", "inverse", "complex fft"])
def test_complex_arithmetic_of_a_spectrum_validates(tmp_path, case):
    """Once refused by their dtype: complex_region kernels now (tests/coordinator/
    test_complex_values.py trains them)."""
    compile_model(spectrum_model, tones_input_fn, params(case=case), str(tmp_path),
                  validate_only=True)
