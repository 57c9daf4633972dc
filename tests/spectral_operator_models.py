"""Models that slice, pad, reshape, concat and contract complex values, written the way users
write them: Fourier neural operators (FNO) in 1-D and 2-D (the spectrum's lowest modes einsum'd
with a complex weight from tf.complex, zeros concatenated or padded back, irfft), an S4D layer
with its Vandermonde kernel (exp(dt*A) powers in complex, einsum with C*B, FFT convolution), a
spectral pooling CNN (the spectrum's corners cropped and concatenated, ifft2d), a complex dense
layer (matmul by a complex weight, sqrt, log, angle, a Hermitian product of conj), complex
attention (|q k^H| by tf.linalg.adjoint); refused: a batch slice of a spectrum, tanh of one, an
einsum over the batch, a shared complex bin concatenated to per-sample spectra."""
import numpy as np
import tensorflow as tf
from complex_models import FEATURES, T, sequence_input_fn, spec

L, v1 = tf.keras.layers, tf.compat.v1
MODES, WIDTH, SIDE, CHANNELS = 3, 4, 8, 2
__all__ = ["sequence_input_fn", "image_input_fn"]  # (the sequence models' input_fn)


def image_input_fn(params):
    """SIDE x SIDE images of CHANNELS; the class is the sign pattern of two channel sums."""
    rng = np.random.default_rng(params.get("data_seed", 5))
    x = rng.normal(size=(64, SIDE, SIDE, CHANNELS)).astype(np.float32)
    total = x.sum((1, 2))
    y = ((total[:, 0] > 0).astype(np.int32) + (total[:, 1] > 0)).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(16, drop_remainder=True)


def _complex_weight(name, shape):
    scale = 1.0 / (WIDTH * WIDTH)
    init = v1.random_uniform_initializer(0.0, scale)
    return tf.complex(v1.get_variable(f"{name}_re", shape, initializer=init),
                      v1.get_variable(f"{name}_im", shape, initializer=init))


def _spectral_conv_1d(h, name):
    """FNO's SpectralConv1d on (B, WIDTH, T): the lowest MODES bins mixed across channels,
    the others zero."""
    x_ft = tf.signal.rfft(h)
    weights = _complex_weight(name, [WIDTH, WIDTH, MODES])
    out_ft = tf.einsum("bix,iox->box", x_ft[:, :, :MODES], weights)
    out_ft = tf.concat([out_ft, tf.zeros_like(x_ft[:, :, MODES:])], axis=-1)
    return tf.signal.irfft(out_ft, fft_length=[T])


def fno_1d(features, labels, mode, params):
    """A 1-D Fourier neural operator: lift, two Fourier layers (spectral conv + pointwise
    Dense, GELU), project."""
    h = L.Dense(WIDTH)(features)  # (B, T, WIDTH)
    for k in range(2):
        spectral = tf.transpose(_spectral_conv_1d(tf.transpose(h, [0, 2, 1]), f"spec{k}"),
                                [0, 2, 1])
        h = tf.nn.gelu(spectral + L.Dense(WIDTH)(h))
    return spec(mode, labels, L.Dense(2)(h))


def fno_2d(features, labels, mode, params):
    """A 2-D FNO layer: rfft2d, the modes of both corners (low positive and negative rows)
    mixed by their own complex weights, zero-padded back in place, irfft2d."""
    h = tf.transpose(L.Dense(WIDTH)(features), [0, 3, 1, 2])  # (B, WIDTH, H, W)
    x_ft = tf.signal.rfft2d(h)
    w1 = _complex_weight("w1", [WIDTH, WIDTH, MODES, MODES])
    w2 = _complex_weight("w2", [WIDTH, WIDTH, MODES, MODES])
    top = tf.einsum("bixy,ioxy->boxy", x_ft[:, :, :MODES, :MODES], w1)
    bottom = tf.einsum("bixy,ioxy->boxy", x_ft[:, :, -MODES:, :MODES], w2)
    cols = SIDE // 2 + 1 - MODES
    out_ft = tf.pad(top, [[0, 0], [0, 0], [0, SIDE - MODES], [0, cols]]) + \
        tf.pad(bottom, [[0, 0], [0, 0], [SIDE - MODES, 0], [0, cols]])
    spectral = tf.transpose(tf.signal.irfft2d(out_ft, fft_length=[SIDE, SIDE]), [0, 2, 3, 1])
    h = tf.nn.gelu(spectral + L.Dense(WIDTH)(tf.transpose(h, [0, 2, 3, 1])))
    return spec(mode, labels, L.Dense(1)(h))


def s4d(features, labels, mode, params):
    """An S4D layer (diagonal state space, ZOH): the convolution kernel
    K = 2 Re(einsum(C * B * (exp(dtA) - 1) / A, exp(dtA)^l)) from a Vandermonde matrix of
    complex powers, applied by FFT zero-padded to 2T, plus a skip D * u."""
    u = tf.transpose(L.Dense(FEATURES)(features), [0, 2, 1])  # (B, H, T)
    n = 2
    log_dt = v1.get_variable("log_dt", [FEATURES], initializer=v1.constant_initializer(-1.0))
    log_a_re = v1.get_variable("log_a_real", [FEATURES, n],
                               initializer=v1.constant_initializer(np.log(0.5)))
    a_im = v1.get_variable("a_imag", [FEATURES, n],
                           initializer=v1.constant_initializer(np.pi * np.arange(n)))
    c = tf.complex(v1.get_variable("c_re", [FEATURES, n]), v1.get_variable("c_im", [FEATURES, n]))
    d = v1.get_variable("d", [FEATURES, 1], initializer=v1.ones_initializer())
    a = tf.complex(-tf.exp(log_a_re), a_im)  # (H, N)
    dt_a = tf.complex(tf.exp(log_dt), 0.0)[:, None] * a
    vandermonde = tf.exp(dt_a[:, :, None] * tf.cast(tf.range(T), tf.complex64))  # (H, N, T)
    coefficients = c * (tf.exp(dt_a) - 1.0) / a
    kernel = 2.0 * tf.math.real(tf.einsum("hn,hnl->hl", coefficients, vandermonde))
    y = tf.signal.irfft(tf.signal.rfft(u, [2 * T]) * tf.signal.rfft(kernel, [2 * T]),
                        [2 * T])[..., :T]
    return spec(mode, labels, tf.nn.gelu(y + d * u))


def spectral_pooling(features, labels, mode, params):
    """Spectral pooling (Rippel et al.): a Conv2D, the 2-D spectrum's four low-frequency
    corners cropped and concatenated, ifft2d back at half the size, a Dense."""
    h = tf.transpose(L.Conv2D(WIDTH, 3, padding="same", activation="relu")(features),
                     [0, 3, 1, 2])
    f = tf.signal.fft2d(tf.cast(h, tf.complex64))
    k = SIDE // 4
    rows = tf.concat([f[:, :, :k], f[:, :, -k:]], axis=2)
    cropped = tf.concat([rows[..., :k], rows[..., -k:]], axis=3)
    pooled = tf.math.real(tf.signal.ifft2d(cropped)) / 4.0
    return spec(mode, labels, tf.transpose(pooled, [0, 2, 3, 1]))


def complex_dense(features, labels, mode, params):
    """A complex-valued layer: z = tf.complex of two Dense projections, times a complex weight
    by tf.matmul, sqrt; read by its magnitude, phase (tf.math.angle) and log, and a Hermitian
    product tf.matmul(tf.math.conj(z), z, transpose_a=True) of its features."""
    z = tf.complex(L.Dense(FEATURES)(features), L.Dense(FEATURES)(features))  # (B, T, F)
    w = _complex_weight("w", [FEATURES, FEATURES])
    h = tf.sqrt(tf.matmul(z, w) + tf.complex(1.0, 0.0))
    flat = tf.reshape(h, [-1, T * FEATURES])
    gram = tf.matmul(tf.math.conj(h), h, transpose_a=True) / T  # (B, F, F): Hermitian
    parts = [tf.abs(flat), tf.math.angle(flat), tf.math.real(tf.math.log(flat)),
             tf.reshape(tf.math.real(gram), [-1, FEATURES * FEATURES]),
             tf.reshape(tf.math.imag(gram), [-1, FEATURES * FEATURES])]
    return spec(mode, labels, tf.concat(parts, 1))


def batch_slice(features, labels, mode, params):
    """The spectra of the batch's first half subtracted from its second's: the slice mixes
    the samples (refused)."""
    f = tf.signal.rfft(tf.transpose(L.Dense(FEATURES)(features), [0, 2, 1]))
    half = f[8:] - f[:8]
    return spec(mode, labels[8:], tf.math.real(half))


def complex_tanh(features, labels, mode, params):
    """tanh of a complex spectrum: outside the CS's complex ops (refused)."""
    f = tf.signal.rfft(tf.transpose(L.Dense(FEATURES)(features), [0, 2, 1]))
    return spec(mode, labels, tf.math.real(tf.math.tanh(f)))


def batch_contraction(features, labels, mode, params):
    """A complex einsum summing over the batch axis (refused)."""
    f = tf.signal.rfft(tf.transpose(L.Dense(FEATURES)(features), [0, 2, 1]))
    mixed = tf.einsum("bfk,bgk->fg", f, tf.math.conj(f))
    return spec(mode, labels, features * tf.reduce_sum(tf.math.real(mixed)))


def complex_attention(features, labels, mode, params):
    """Complex-valued self-attention: complex queries and keys, the scores |q k^H| by
    tf.linalg.adjoint, a softmax over the steps, the real values attended."""
    z = tf.complex(L.Dense(FEATURES)(features), L.Dense(FEATURES)(features))  # (B, T, F)
    q = tf.matmul(z, _complex_weight("wq", [FEATURES, FEATURES]))
    scores = tf.abs(tf.matmul(q, tf.linalg.adjoint(z))) / np.sqrt(FEATURES)  # (B, T, T)
    return spec(mode, labels, tf.matmul(tf.nn.softmax(scores), L.Dense(FEATURES)(features)))


def shared_bin(features, labels, mode, params):
    """A learned complex bin tiled over the batch and concatenated to each sample's spectrum:
    a per-sample value placed with one shared by the samples (refused)."""
    f = tf.signal.rfft(tf.transpose(L.Dense(FEATURES)(features), [0, 2, 1]))  # (B, F, T/2+1)
    token = _complex_weight("token", [FEATURES, 1])
    joined = tf.concat([f, tf.tile(token[None], [tf.shape(f)[0], 1, 1])], axis=-1)
    return spec(mode, labels, tf.signal.irfft(joined))
