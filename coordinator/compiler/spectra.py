"""Spectrograms: TF's real FFT (RFFT: tf.signal.stft, tf.signal.rfft) of a per-sample float32
value whose complex result is read only by ComplexAbs (tf.abs), Real or Imag (tf.math.real,
tf.math.imag) becomes one `spectrum` kernel per part read; the complex value never leaves
it. Any other use of a complex value (complex arithmetic, IRFFT, FFT, tf.math.angle) keeps
the dtype refusal (precision.dtype_problem)."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from coordinator.compiler.rules import Context, has_kernel

PARTS = {"ComplexAbs": "magnitude", "Real": "real", "Imag": "imag"}

# The README's row: kernel -> the TF ops it starts from.
KERNEL_ROWS = {
    "spectrum": "RFFT (tf.signal.stft, tf.signal.rfft of a per-sample float32 value) read only "
                "by ComplexAbs, Real, Imag (tf.abs of the spectrum: a magnitude spectrogram; "
                "tf.math.real, tf.math.imag): the DFT as two products with cosine and sine "
                "tables, its gradient TF's (0 where a magnitude is 0); a mel filterbank "
                "tf.tensordot(power, tf.signal.linear_to_mel_weight_matrix(...), 1) after it is "
                "a `matmul` of the constant table",
}


def lower(m: Context, op: tf.Operation) -> bool:
    """The RFFT `op` and the parts read of it as `spectrum` kernels, or False (refused by
    its complex dtype)."""
    x, length = op.inputs
    fft_length = m.operands.constant(length)
    readers = m.consumers(op.outputs[0])
    if not has_kernel("spectrum") or not m.is_batched(x) or x.dtype != tf.float32 or \
            fft_length is None or np.size(fft_length) != 1 or op.outputs[0].name in m.protected \
            or not readers or any(r.type not in PARTS or r.outputs[0].name in m.protected
                                  for r in readers):
        return False
    kernels: dict[str, tf.Tensor] = {}
    for reader in readers:
        part = PARTS[reader.type]
        if part in kernels:
            m.alias(reader, kernels[part])
            continue
        m.add_kernel(reader.name, "spectrum", [x],
                     {"fft_length": int(np.ravel(fft_length)[0]), "part": part}, [],
                     [reader] if kernels else [op, reader], reader.outputs[0], source_op=op)
        kernels[part] = reader.outputs[0]
    return True
