"""Models computing complex values per sample, written the way users write them: FNet's
token mixing (real(fft2d(cast(x))) and the 1-D form), a global filter (rfft, a product with
a trainable complex filter built by tf.complex, irfft), an S4-style long convolution by FFT
(rfft of x and of a kernel from complex-parameterised weights, zero-padded to 2L), an
auto-correlation (rfft of queries and keys, q * conj(k), irfft) feeding a Dense, and an FFT
along the batch axis and a predicted complex spectrum (refused)."""
import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

L, v1 = tf.keras.layers, tf.compat.v1
T, FEATURES, CLASSES = 8, 4, 3


def sequence_input_fn(params):
    """Sequences of T steps of FEATURES values; the class is the sign pattern of their sum."""
    rng = np.random.default_rng(params.get("data_seed", 3))
    x = rng.normal(size=(64, T, FEATURES)).astype(np.float32)
    total = x.sum(1)
    y = ((total[:, 0] > 0).astype(np.int32) + (total[:, 1] > 0)).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(16, drop_remainder=True)


def spec(mode, labels, mixed):
    logits = L.Dense(CLASSES)(L.Flatten()(mixed))
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode=mode, predictions={"logits": logits})
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode=mode, loss=loss, eval_metric_ops={
            "accuracy": v1.metrics.accuracy(labels, tf.argmax(logits, 1))})
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=v1.train.AdamOptimizer(1e-2).minimize(
        loss, global_step=v1.train.get_or_create_global_step()))


def fnet(features, labels, mode, params):
    """An FNet block: Dense, Fourier mixing over time and features, a residual LayerNorm."""
    h = L.Dense(FEATURES)(features)
    mixed = tf.math.real(tf.signal.fft2d(tf.cast(h, tf.complex64)))
    return spec(mode, labels, L.LayerNormalization()(h + mixed))


def fnet_1d(features, labels, mode, params):
    """FNet's 1-D form: the FFT over the features' axis of each step."""
    h = L.Dense(FEATURES)(features)
    return spec(mode, labels, h + tf.math.real(tf.signal.fft(tf.cast(h, tf.complex64))))


def global_filter(features, labels, mode, params):
    """A global filter layer: rfft over time, times a trainable complex filter per bin and
    feature, irfft back."""
    h = tf.transpose(L.Dense(FEATURES)(features), [0, 2, 1])  # (B, F, T)
    w_re = v1.get_variable("filter_re", [FEATURES, T // 2 + 1])
    w_im = v1.get_variable("filter_im", [FEATURES, T // 2 + 1])
    filtered = tf.signal.irfft(tf.signal.rfft(h) * tf.complex(w_re, w_im), fft_length=[T])
    return spec(mode, labels, tf.nn.gelu(filtered))


def s4_convolution(features, labels, mode, params):
    """An S4D-style long convolution: a kernel from complex-parameterised weights (a diagonal
    state matrix, exp of complex), convolved with the sequence by FFT zero-padded to 2T."""
    h = tf.transpose(L.Dense(FEATURES)(features), [0, 2, 1])  # (B, F, T)
    log_a = v1.get_variable("log_a_re", [FEATURES, 2], initializer=v1.constant_initializer(-0.5))
    a_im = v1.get_variable("a_im", [FEATURES, 2])
    c = v1.get_variable("c", [FEATURES, 2])
    steps = tf.range(T, dtype=tf.float32)
    powers = tf.exp(tf.complex(-tf.exp(log_a)[..., None] * steps,
                               a_im[..., None] * steps))  # (F, 2, T): exp(A l)
    kernel = tf.math.real(tf.reduce_sum(tf.cast(c[..., None], tf.complex64) * powers, 1))
    y = tf.signal.irfft(tf.signal.rfft(h, [2 * T]) * tf.signal.rfft(kernel, [2 * T]), [2 * T])
    return spec(mode, labels, y[..., :T])


def autocorrelation(features, labels, mode, params):
    """Autoformer's auto-correlation: queries' and keys' spectra over time, q * conj(k),
    irfft back; the correlation feeds a Dense."""
    q, k = L.Dense(FEATURES)(features), L.Dense(FEATURES)(features)
    q_f = tf.signal.rfft(tf.transpose(q, [0, 2, 1]))  # (the keys' transpose comes after it)
    k_f = tf.signal.rfft(tf.transpose(k, [0, 2, 1]))
    corr = tf.signal.irfft(q_f * tf.math.conj(k_f), fft_length=[T])
    return spec(mode, labels, corr)


def batch_fft(features, labels, mode, params):
    """An FFT along the batch axis: it mixes the samples (refused)."""
    h = L.Dense(1)(features)[:, 0, 0]
    mixed = tf.math.real(tf.signal.fft(tf.cast(h, tf.complex64)))
    return spec(mode, labels, features * mixed[:, None, None])


def predicted_spectrum(features, labels, mode, params):
    """A prediction of the complex spectrum itself: the host reads complex values (refused)."""
    spectrum = tf.signal.rfft(tf.transpose(L.Dense(FEATURES)(features), [0, 2, 1]))
    if mode == ModeKeys.PREDICT:
        logits = L.Dense(CLASSES)(L.Flatten()(tf.math.real(spectrum)))
        return CSEstimatorSpec(mode=mode, predictions={"spectrum": spectrum, "logits": logits})
    return spec(mode, labels, tf.math.real(spectrum))
