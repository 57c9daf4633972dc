"""Complex values of a sample on the CS (tests/complex_models.py): FNet's Fourier mixing,
a global filter by a trainable complex filter, an S4D long convolution by FFT of a kernel
built in complex from weights, an auto-correlation: each a `complex_region` kernel, trained
in process against TensorFlow (4 steps, 1e-5), evaluated and predicted like the CPU path;
in micro-batches of 4, the kernel's steps (a Take, an Einsum of an adjoint, Log, Sqrt, Angle
too) against TF's ops and gradients one by one; an FFT along the batch axis and a predicted
complex value refused in one line (the slices, products and other ops:
test_spectral_operators.py)."""
from __future__ import annotations

import json

import complex_models as models
import cs_inprocess
import numpy as np
import pytest
import tensorflow as tf
import tf_reference

from wafer.kernels import RunContext, build_kernel

RTOL = 1e-5
TRAINED = ["fnet", "fnet_1d", "global_filter", "s4_convolution", "autocorrelation"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return cs_inprocess.cached_comparisons(
        {name: (getattr(models, name), models.sequence_input_fn, {}) for name in TRAINED},
        {}, tmp_path_factory)


@pytest.mark.parametrize("name", TRAINED)
def test_complex_values_train_like_tensorflow(trained, name):
    result = trained(name)
    cs_inprocess.assert_same_training(result, rtol=RTOL)
    assert "complex_region" in cs_inprocess.kernel_types(result.compiled.program)


@pytest.mark.parametrize("name", ["global_filter", "s4_convolution"])
def test_complex_weights_train_like_tensorflow_in_micro_batches(trained, name):
    """Micro-batches of 4: the weights' gradients (the filter's, the S4D kernel's through its
    complex exp) accumulated over the batch's 4 micro-batches."""
    result = trained(name)
    data = tf_reference.batches(models.sequence_input_fn, {}, 4)
    cs = cs_inprocess.run_on_cs(cs_inprocess.at_micro_batch(result.compiled.program, 4),
                                result.compiled.initial_weights, data)
    cs_inprocess.assert_same_training(
        cs_inprocess.Comparison(result.compiled, cs, result.reference), rtol=RTOL)


@pytest.mark.parametrize("name", ["s4_convolution", "autocorrelation"])
def test_complex_values_evaluate_and_predict_like_the_cpu_path(tmp_path, trained, name):
    model_fn = getattr(models, name)
    assert cs_inprocess.cpu_path_mismatches(model_fn, models.sequence_input_fn, {},
                                            str(tmp_path), trained(name)) == []


def test_an_fft_along_the_batch_axis_is_refused_in_one_line(tmp_path):
    text = cs_inprocess.refusal(models.batch_fft, models.sequence_input_fn, {}, str(tmp_path),
                                models.__file__)
    assert "FFT 'FFT' at complex_models.py:88 transforms or sums along the batch axis" in \
        text.replace("tests/", "")


def test_a_predicted_complex_value_is_refused_in_one_line(tmp_path):
    text = cs_inprocess.refusal(models.predicted_spectrum, models.sequence_input_fn, {},
                                str(tmp_path), models.__file__, mode="infer")
    assert "the host reads the complex value of RFFT 'rfft'" in text


def _tf_step(op: str, x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
    """TF's op of the program below, on (B, 4, 6) real x and y."""
    z = tf.complex(x, y)
    return {
        "IRFFT": lambda: tf.signal.irfft(tf.signal.rfft(x, [8]) / tf.complex(2.0, 0.5), [8]),
        "IFFT2D": lambda: tf.math.imag(tf.signal.ifft2d(z - tf.math.conj(z) * z)),
        "ComplexAbs": lambda: tf.abs(tf.signal.fft(tf.exp(z * 0.3)) + tf.reduce_sum(z, 1,
                                                                                  keepdims=True)),
        "Mean": lambda: tf.math.real(tf.reduce_mean(tf.signal.rfft2d(x), -1)),
        "Einsum": lambda: tf.math.real(tf.matmul(z, z * tf.complex(0.5, 2.0), adjoint_a=True)),
        "Take": lambda: tf.math.imag(tf.concat([tf.pad(z[:, 1:, ::2], [[0, 0], [1, 0], [0, 1]]),
                                                tf.transpose(z, [0, 2, 1])[:, :4]], 1)),
        "Angle": lambda: tf.math.angle(tf.math.log(z) + tf.sqrt(z) * tf.square(z)),
    }[op]()


def _take_map() -> dict:
    """The Take step of "Take"'s concat of a pad of a slice and a transpose: each output
    element's element of a sample's (4, 6) value, -1 for a pad's zero."""
    codes = tf.reshape(tf.range(1, 25), [4, 6])
    codes = tf.concat([tf.pad(codes[1:, ::2], [[1, 0], [0, 1]]), tf.transpose(codes)[:4]], 0)
    return {"index": (codes.numpy().ravel() - 1).tolist(), "shape": codes.shape.as_list(),
            "batched": True}


PROGRAMS = {  # operands x, y (inputs); the constants as c operands
    "IRFFT": ("ii" "cc", [{"op": "RFFT", "args": [0], "fft_length": [8]},
                          {"op": "Complex", "args": [2, 3]},
                          {"op": "RealDiv", "args": [4, 5]},
                          {"op": "IRFFT", "args": [6], "fft_length": [8]}]),
    "IFFT2D": ("ii", [{"op": "Complex", "args": [0, 1]}, {"op": "Conj", "args": [2]},
                      {"op": "Mul", "args": [3, 2]}, {"op": "Sub", "args": [2, 4]},
                      {"op": "IFFT2D", "args": [5]}, {"op": "Imag", "args": [6]}]),
    "ComplexAbs": ("iicc", [{"op": "Complex", "args": [0, 1]}, {"op": "Complex", "args": [2, 3]},
                            {"op": "Mul", "args": [4, 5]}, {"op": "Exp", "args": [6]},
                            {"op": "FFT", "args": [7]},
                            {"op": "Sum", "args": [4], "axes": [1], "keep": True},
                            {"op": "AddV2", "args": [8, 9]}, {"op": "ComplexAbs", "args": [10]}]),
    "Mean": ("ii", [{"op": "RFFT2D", "args": [0], "fft_length": [4, 6]},
                    {"op": "Mean", "args": [2], "axes": [2], "keep": False},
                    {"op": "Real", "args": [3]}]),
    "Einsum": ("iicc", [{"op": "Complex", "args": [0, 1]}, {"op": "Complex", "args": [2, 3]},
                        {"op": "Mul", "args": [4, 5]},
                        {"op": "Einsum", "args": [4, 6], "equation": "bmk,bmn->bkn",
                         "conj": [True, False]},
                        {"op": "Real", "args": [7]}]),
    "Take": ("ii", [{"op": "Complex", "args": [0, 1]}, {"op": "Take", "args": [2]},
                    {"op": "Imag", "args": [3]}]),
    "Angle": ("ii", [{"op": "Complex", "args": [0, 1]}, {"op": "Log", "args": [2]},
                     {"op": "Sqrt", "args": [2]}, {"op": "Square", "args": [2]},
                     {"op": "Mul", "args": [4, 5]}, {"op": "AddV2", "args": [3, 6]},
                     {"op": "Angle", "args": [7]}]),
}
CONSTANTS = {"IRFFT": (2.0, 0.5), "ComplexAbs": (0.3, 0.0), "Einsum": (0.5, 2.0)}


@pytest.mark.parametrize("op", sorted(PROGRAMS))
def test_complex_region_steps_compute_tensorflows_values_and_gradients(op):
    """Forward and the gradients of both inputs against TF's ops and gradient functions (an
    upstream gradient drawn at random): within 1e-5 of the largest."""
    letters, program = PROGRAMS[op]
    if op == "Take":  # (its index map, which the compiler measures from TF's ops)
        program = [program[0], {**program[1], **_take_map()}, program[2]]
    attrs = {"operands": letters, "program": json.dumps(program)}
    for k, value in enumerate(CONSTANTS.get(op, ())):
        attrs[f"c{k + 2}"] = np.array(value, np.float32)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(2, 3, 4, 6)).astype(np.float32)
    kernel = build_kernel("complex_region", op, attrs, [(4, 6), (4, 6)])
    out, cache = kernel.forward({}, [x, y], RunContext(training=True, batch_size=3))
    g = rng.normal(size=out.shape).astype(np.float32)
    (gx, gy), _ = kernel.backward({}, cache, g, RunContext(training=True, batch_size=3))
    tx, ty = tf.constant(x), tf.constant(y)
    with tf.GradientTape() as tape:
        tape.watch([tx, ty])
        want = _tf_step(op, tx, ty)
        loss = tf.reduce_sum(want * g)
    want_x, want_y = tape.gradient(loss, [tx, ty], unconnected_gradients="zero")
    assert out.shape == tuple(want.shape) == (3, *kernel.output_shape)
    for got, expected in ((out, want), (gx, want_x), (gy, want_y)):
        expected = expected.numpy()
        got = np.zeros_like(expected) if got is None else got  # (y: not read)
        np.testing.assert_allclose(got, expected, rtol=0, atol=RTOL * np.abs(expected).max())
