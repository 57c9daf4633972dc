"""Audio front-ends and cyclic shifts in the graph on the CS: tf.signal.frame (a gather of a
sample's values at constant indices along its own axis) and tf.roll along a sample's axes,
trained with TensorFlow's numbers; the take kernel's gradient of overlapping windows adds
in TF's order; gathers across samples and tf.image.crop_and_resize refused in one line
(spectrograms: test_spectrograms.py)."""
from __future__ import annotations

import cs_inprocess
import numpy as np
import pytest
import tensorflow as tf

from common.errors import CSRunError
from coordinator.compiler import compile_model
from launcher.estimator import CSEstimatorSpec
from wafer.kernels import RunContext, build_kernel

v1 = tf.compat.v1
SAMPLES, WORDS, BATCH = 128, 4, 8


def audio_input_fn(params):
    """Waveforms: a tone per keyword (its frequency) with noise; labels: the keyword."""
    rng = np.random.default_rng(5)
    count = 64
    labels = rng.integers(0, WORDS, count).astype(np.int32)
    t = np.arange(SAMPLES, dtype=np.float32)
    waves = np.sin(2 * np.pi * (labels[:, None] + 1) * t / 32) + \
        0.3 * rng.standard_normal((count, SAMPLES))
    return tf.data.Dataset.from_tensor_slices((waves.astype(np.float32), labels)).repeat().batch(
        params["batch_size"], drop_remainder=True)


def keyword_model(features, labels, mode, params):
    """Overlapping Hann-windowed frames (tf.signal.frame: windows of 32, hop 12, so most
    samples sit in two or three frames), a learned filterbank (Dense) and a log energy,
    Conv1D over the frames, pooled, Dense to the keywords; Adam."""
    frames = tf.signal.frame(features, frame_length=32, frame_step=12, pad_end=params["pad_end"])
    frames *= tf.signal.hann_window(32)
    bank = tf.keras.layers.Dense(12, use_bias=False)(frames)
    energy = tf.math.log(tf.square(bank) + 1e-6)
    x = tf.keras.layers.Conv1D(8, 3, activation="relu")(energy)
    x = tf.keras.layers.GlobalAveragePooling1D()(x)
    logits = tf.keras.layers.Dense(WORDS)(x)
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    train_op = v1.train.AdamOptimizer(0.01).minimize(
        loss, global_step=v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op)


def sequence_input_fn(params):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((64, 10, 6)).astype(np.float32)
    y = (x[:, :, 0].sum(axis=1) > 0).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(
        params["batch_size"], drop_remainder=True)


def shifted_model(features, labels, mode, params):
    """A cyclic shift of the hidden sequence concatenated to it (tf.roll by 3 along time, by
    -2 along time and 1 along the features in one call), then a Dense head; momentum SGD."""
    h = tf.keras.layers.Dense(8, activation="tanh")(features)
    ahead = tf.roll(h, shift=3, axis=1)
    around = tf.roll(h, shift=[-2, 1], axis=[1, 2])
    x = tf.concat([h, ahead, around], axis=-1)
    logits = tf.keras.layers.Dense(2)(tf.reshape(x, [params["batch_size"], -1]))
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    train_op = v1.train.MomentumOptimizer(0.05, 0.9).minimize(loss)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op)


def params(**extra):
    return {"batch_size": BATCH, "runconfig": {"tf_random_seed": 4}, **extra}


@pytest.mark.slow
@pytest.mark.parametrize("pad_end", [False, True])
def test_a_framed_audio_keyword_model_trains_like_tensorflow(tmp_path, pad_end):
    run = cs_inprocess.compare(keyword_model, audio_input_fn, params(pad_end=pad_end),
                               str(tmp_path), steps=4)
    assert "take" in [k.type for k in run.compiled.program.kernels]
    # the zero-padded last frames' near-zero energies: log(b^2 + 1e-6) amplifies the Dense's
    # summation order, and TF's own threaded matmul moves its Adam slots by 5e-5 from run to
    # run there (with relu for the log, the CS and TF agree to 1e-6)
    assert not cs_inprocess.mismatches(run, rtol=1e-4 if pad_end else 1e-5)


@pytest.mark.slow
def test_a_cyclic_shift_inside_the_graph_trains_like_tensorflow(tmp_path):
    run = cs_inprocess.compare(shifted_model, sequence_input_fn, params(), str(tmp_path), steps=4)
    assert [k.type for k in run.compiled.program.kernels].count("take") == 3
    assert not cs_inprocess.mismatches(run, rtol=1e-5)


@pytest.mark.parametrize("precision", ["float32", "float16"])
@pytest.mark.parametrize("axis, indices", [
    (1, [[0, 1, 2, 3], [2, 3, 4, 5], [4, 5, 6, 7], [4, 5, 6, 7]]),  # frames, one repeated
    (2, [3, 3, 0, 3, 1]), (1, 4), (1, [5] * 12)])
def test_take_at_constant_indices_matches_tensorflows_gather_and_gradient(axis, indices,
                                                                          precision):
    """tf.gather(x, indices, axis) bit for bit; the gradient of an index taken several times
    (up to more often than scatter_add's passes) adds its gradients in TF's order
    (_GatherV2Grad's UnsortedSegmentSum), in float16 each sum rounded."""
    rng = np.random.default_rng(1)
    dtype = tf.float16 if precision == "float16" else tf.float32
    x = rng.standard_normal((3, 8, 6)).astype(dtype.as_numpy_dtype).astype(np.float32)
    value = tf.constant(x, dtype)
    with tf.GradientTape() as tape:
        tape.watch(value)
        y = tf.gather(value, indices, axis=axis)
    dy = (rng.standard_normal(y.shape) * 10.0 ** rng.integers(-3, 4, y.shape)).astype(
        dtype.as_numpy_dtype).astype(np.float32)
    grad = tf.convert_to_tensor(tape.gradient(y, value, output_gradients=tf.constant(dy, dtype)))
    flat = np.asarray(indices).ravel().tolist()
    attrs = {"axis": axis - 1, "indices": flat, **({"precision": precision} if
                                                     precision == "float16" else {})}
    kernel = build_kernel("take", "model/frame", attrs, [(8, 6)])
    ctx = RunContext(training=True, batch_size=3)
    out, cache = kernel.forward({}, [x], ctx)
    (dx,), _ = kernel.backward({}, cache, dy.reshape(out.shape), ctx)
    np.testing.assert_array_equal(out.reshape(y.shape), y.numpy().astype(np.float32))
    np.testing.assert_array_equal(dx, grad.numpy().astype(np.float32))


def refused_model(features, labels, mode, params):
    waves = tf.reshape(features, [BATCH, SAMPLES])
    x = {
        "across samples": lambda: tf.gather(waves, [0, 0, 1, 2, 3, 4, 5, 6]),
        "outside": lambda: tf.gather(waves, [[0, 1], [SAMPLES - 1, SAMPLES]], axis=1),
        "roll the batch": lambda: tf.roll(waves, shift=1, axis=0),
        "crop and resize": lambda: tf.image.crop_and_resize(
            tf.reshape(waves, [BATCH, 16, 8, 1]), tf.abs(waves[:, :4]) / 4, tf.range(BATCH),
            [4, 4]),
    }[params["case"]]()
    logits = tf.keras.layers.Dense(WORDS)(tf.reshape(x, [BATCH, -1]))
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    return CSEstimatorSpec(mode=mode, loss=loss,
                           train_op=v1.train.GradientDescentOptimizer(0.1).minimize(loss))


@pytest.mark.parametrize("case, op, words", [
    ("across samples", "GatherV2", "along the batch axis"),
    ("outside", "GatherV2", "outside [0, 128)"), ("roll the batch", "Roll", "batch axis"),
    ("crop and resize", "CropAndResize", "crop in input_fn")])
def test_what_the_cs_cannot_compute_is_refused_in_one_line(tmp_path, case, op, words):
    with pytest.raises(CSRunError) as error:
        compile_model(refused_model, audio_input_fn, params(case=case), str(tmp_path),
                      validate_only=True)
    found = cs_inprocess.model_op_words(refused_model, audio_input_fn, params(case=case))
    assert cs_inprocess.refusal_problem(error.value, __file__, found) == ""
    assert str(error.value).startswith(f"validation failed: {op} ") and words in str(error.value)
