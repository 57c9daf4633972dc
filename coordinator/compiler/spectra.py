"""Spectrograms: TF's real FFT (RFFT: tf.signal.stft, tf.signal.rfft) of a per-sample float32
value whose complex result is read only by ComplexAbs (tf.abs), Real or Imag (tf.math.real,
tf.math.imag) becomes one `spectrum` kernel per part read; the complex value never leaves
it. An RFFT whose value only goes through a slice of its last axis and a product with a complex
constant into Real or Imag (tf.signal.dct: real(rfft(x, [2n])[..., :n] * scale)) is one
`scaled_spectrum` kernel, a real linear map. Any other use of a complex value is
complex_values.py's (complex arithmetic, IRFFT, FFT, slices, products, tf.math.angle), or
refused there.

The kernel's spectrum is the exact transform rounded to float32, TF's is 1.2-1.8e-7 of a
frame's largest magnitude from it (docs/design.md): bins that are 0 but for that rounding
(noiseless tones on a bin's frequency) differ from TF's wholly, and a log amplifies them. In
training the compiler measures it (`rounding_noise`): on input_fn's first batch, the loss and
its gradients with the kernels' spectra fed in place of TF's (and the random ops the numbers
of TF's run: SpecAugment's masks drawn alike) must be TF's within NOISE_RTOL, or within
SPREAD_FACTOR x TF's own spread (TF's runs from its weights moved by 1 ULP: a spectral loss
on the model's own output is that sensitive in TF too), or the RFFT is refused; the same
measurement covers complex_values.py's kernels. A part the host reads (an eval metric on
tf.abs of the labels' STFT, a predicted magnitude) is the kernel's output, streamed."""
from __future__ import annotations

import json

import numpy as np
import tensorflow as tf

from coordinator.compiler.extract import ExtractedGraph, data_flow_ops
from coordinator.compiler.ir import KernelNode, UnsupportedOp
from coordinator.compiler.operands import static_shape, strided_index
from coordinator.compiler.random_numbers import is_random
from coordinator.compiler.rounding_spread import SPREAD_FACTOR, distances, spread
from coordinator.compiler.rules import Context, has_kernel
from tf_model.model_fn import user_source
from wafer.kernels import RunContext, build_kernel

PARTS = {"ComplexAbs": "magnitude", "Real": "real", "Imag": "imag"}
NOISE_RTOL = 1e-5  # (recurrences.UNROLL_RTOL's: float32 sums in another order)
# Beyond NOISE_RTOL the CS's spectra may move the loss and each gradient by SPREAD_FACTOR x
# TF's own spread (rounding_spread).

# The README's row: kernel -> the TF ops it starts from.
KERNEL_ROWS = {
    "spectrum": "RFFT (tf.signal.stft, tf.signal.rfft of a per-sample float32 value) read only "
                "by ComplexAbs, Real, Imag (tf.abs of the spectrum: a magnitude spectrogram; "
                "tf.math.real, tf.math.imag): the DFT as two products with cosine and sine "
                "tables, its gradient TF's (0 where a magnitude is 0); a mel filterbank "
                "tf.tensordot(power, tf.signal.linear_to_mel_weight_matrix(...), 1) after it is "
                "a folded batch's `matmul` of the constant table",
    "scaled_spectrum": "RFFT read only through a constant slice of its last axis, a product "
                       "with a complex constant and Real or Imag (tf.signal.dct type II, "
                       "tf.signal.mfccs_from_log_mel_spectrograms): one product with a real "
                       "table built in float64 from TF's float32 constants, its gradient the "
                       "transposed map (TF's)",
}


def lower(m: Context, op: tf.Operation) -> bool:
    """The RFFT `op` and the parts read of it as `spectrum` kernels, or False (refused by
    its complex dtype)."""
    x, length = op.inputs
    fft_length = m.operands.constant(length)
    readers = m.consumers(op.outputs[0])
    if not m.is_batched(x) or x.dtype != tf.float32 or fft_length is None or \
            np.size(fft_length) != 1 or op.outputs[0].name in m.protected or not readers:
        return False
    if any(r.type not in PARTS for r in readers):
        return _scaled(m, op, int(np.ravel(fft_length)[0]))
    if not has_kernel("spectrum"):
        return False
    _per_part(m, op, readers, "spectrum", {"fft_length": int(np.ravel(fft_length)[0])}, [op])
    return True


def _per_part(m: Context, op: tf.Operation, readers: list[tf.Operation], kernel_type: str,
              attrs: dict, covered: list[tf.Operation]) -> None:
    """One `kernel_type` kernel of the RFFT `op`'s input per part read (abs, real, imag); a
    repeated reader of a part aliases its kernel. The first kernel covers `covered` too."""
    kernels: dict[str, tf.Tensor] = {}
    for reader in readers:
        part = PARTS[reader.type]
        if part in kernels:
            m.alias(reader, kernels[part])
            continue
        m.add_kernel(reader.name, kernel_type, [op.inputs[0]], {**attrs, "part": part}, [],
                     [reader] if kernels else [*covered, reader], reader.outputs[0],
                     source_op=op)
        kernels[part] = reader.outputs[0]


def _scaled(m: Context, op: tf.Operation, fft_length: int) -> bool:
    """The RFFT `op` sliced along its last axis, times a complex constant, read by Real or
    Imag (tf.signal.dct) as one `scaled_spectrum` kernel per part, or False."""
    cut = m.sole_consumer(op.outputs[0])
    product = cut and cut.type == "StridedSlice" and m.sole_consumer(cut.outputs[0])
    if not has_kernel("scaled_spectrum") or not cut or not product or product.type != "Mul":
        return False
    begin, end, strides = (m.operands.constant(t) for t in cut.inputs[1:])
    sliced = cut.outputs[0].name
    scale = m.operands.constant(product.inputs[1 if product.inputs[0].name == sliced else 0])
    readers = m.consumers(product.outputs[0])
    if begin is None or end is None or strides is None or scale is None or not readers or any(
            r.type not in ("Real", "Imag") for r in readers):
        return False
    shape = static_shape(op.outputs[0])
    positions = np.arange(int(np.prod(shape))).reshape(shape)
    kept = positions[strided_index(cut, begin, end, strides)]
    if kept.shape[:-1] != shape[:-1] or kept.ndim != len(shape) or \
            (kept // shape[-1] != positions[..., :1] // shape[-1]).any():
        return False  # it slices more than the bins of each frame
    bins = kept.reshape(-1, kept.shape[-1])[0] % shape[-1]
    if scale.ndim and (scale.shape[-1] not in (1, len(bins)) or scale.size != scale.shape[-1]):
        return False  # a scale per frame
    scale = np.broadcast_to(np.ravel(scale), bins.shape).astype(np.complex64)
    _per_part(m, op, readers, "scaled_spectrum",
              {"fft_length": fft_length, "bins": [int(k) for k in bins],
               "scale_real": [float(v) for v in scale.real],
               "scale_imag": [float(v) for v in scale.imag]}, [op, cut, product])
    return True


def _rfft(read: tf.Tensor) -> tf.Operation:
    """The RFFT whose (sliced and scaled: `scaled_spectrum`) value `read` is."""
    if read.op.type == "Mul":
        read = next(t for t in read.op.inputs if t.op.type == "StridedSlice").op.inputs[0]
    return read.op


def _draws(graph: tf.Graph, outputs: list[tf.Tensor]) -> list[tf.Tensor]:
    """The values of the random ops (SpecAugment's masks, candidate samplers) that `outputs`
    are computed from."""
    sources = [op.outputs[0] for op in graph.get_operations() if is_random(op.type)]
    return [t for op in data_flow_ops(graph, sources, outputs) if is_random(op.type)
            for t in op.outputs]


def rounding_noise(kernels: list[KernelNode], extracted: ExtractedGraph) -> list[UnsupportedOp]:
    """Each RFFT whose spectrum (and scaled_spectrum) kernels, and each complex region
    (complex_values.py) whose kernel, fed in place of TF's values on input_fn's first batch,
    move the loss or a gradient beyond NOISE_RTOL and beyond SPREAD_FACTOR x TF's own spread
    (training only). The second run is fed the first run's random numbers too: it differs
    by the kernels' FFTs alone."""
    graph, spec, batch = extracted.graph, extracted.spec, extracted.first_batch
    spectra = [k for k in kernels if k.type in KERNEL_ROWS or k.type == "complex_region"]
    if not spectra or batch is None or spec.loss is None:
        return []
    feed = {graph.get_tensor_by_name(extracted.placeholders[name]): value
            for name, value in batch.items()}
    with graph.as_default():
        trainable = tf.compat.v1.trainable_variables()
        grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                 for g in tf.gradients(spec.loss, trainable)]
        outputs = {"the loss": spec.loss,
                   **{v.op.name: g for v, g in zip(trainable, grads) if g is not None}}
        sources = [_operands(graph, k) for k in spectra]
        draws = _draws(graph, list(outputs.values()))
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            want, operands, drawn = session.run((outputs, sources, draws), feed)
            feed.update(zip(draws, drawn))
            fed = dict(feed)
            for kernel, values in zip(spectra, operands):
                fed.update(_fed(graph, kernel, values))
            got = session.run(outputs, fed)
            # a gradient's elements within NOISE_RTOL of the model's largest (a bias summing
            # terms that nearly cancel moves by more than its own 1e-5 in TF from run to run)
            largest = max(float(np.abs(want[name]).max()) for name in want if name != "the loss")
            scale = {name: abs(float(want[name])) if name == "the loss" else largest
                     for name in want}
            differ = [name for name in want if not np.allclose(
                got[name], want[name], rtol=NOISE_RTOL, atol=NOISE_RTOL * scale[name])]
            if not differ:
                return []
            apart = distances(got, want, scale)
            tf_spread = spread(session, outputs, feed, [v for v in trainable
                                                        if v.op.name in outputs], want, scale)
    differ = [name for name in differ if apart[name] > SPREAD_FACTOR * tf_spread[name]]
    if not differ:
        return []
    worst = max(differ, key=lambda name: apart[name] / max(tf_spread[name], 1e-30))
    unit = "relative" if worst == "the loss" else "of the largest gradient"
    ffts = dict.fromkeys(_fft(graph, k) for k in spectra)
    return [UnsupportedOp(
        fft.type, fft.name, user_source(fft),
        f"on input_fn's first batch the CS's FFT moves {', '.join(differ[:3])} from TF's "
        f"({worst} by {apart[worst]:.1e} {unit}, TF's own by {tf_spread[worst]:.1e} when its "
        f"weights move by 1 ULP; rounding stays within {SPREAD_FACTOR:g}x that): bins that "
        "are 0 but for the FFT's rounding (~1e-7 of a frame's largest magnitude: noiseless "
        "signals), which no CS kernel rounds as TF's FFT does, amplified downstream (a log's "
        "small epsilon); add noise to the signal in input_fn, raise the epsilon, or compute "
        "the spectrogram in input_fn") for fft in ffts]


def _operands(graph: tf.Graph, kernel: KernelNode) -> list[tf.Tensor]:
    """The TF values `kernel` computes from: the frames of a spectrum, a complex region's
    real operands."""
    if kernel.type == "complex_region":
        return [graph.get_tensor_by_name(n) for n in json.loads(kernel.attrs["tf_operands"])]
    read = graph.get_tensor_by_name(kernel.tf_tensor).op.inputs[0]
    return [_rfft(read).inputs[0]]


def _fed(graph: tf.Graph, kernel: KernelNode, values: list[np.ndarray]) -> dict:
    """The TF tensors `kernel` computes, fed its values from TF's `values` of its operands."""
    built = build_kernel(kernel.type, kernel.name, kernel.attrs, kernel.input_shapes)
    if kernel.type == "complex_region":
        letters = kernel.attrs["operands"]
        params = {f"p{k}": v for k, (c, v) in enumerate(zip(letters, values)) if c == "p"}
        inputs = [v for c, v in zip(letters, values) if c == "i"]
        value, _ = built.forward(params, inputs,
                                 RunContext(training=True, batch_size=len(inputs[0])))
        return {graph.get_tensor_by_name(kernel.tf_tensor): value}
    read = graph.get_tensor_by_name(kernel.tf_tensor).op.inputs[0]
    value, _ = built.forward({}, values, RunContext(training=True, batch_size=len(values[0])))
    return {r.outputs[0]: value for r in read.consumers()
            if PARTS.get(r.type) == kernel.attrs["part"]}


def _fft(graph: tf.Graph, kernel: KernelNode) -> tf.Operation:
    """The op a refusal names: the RFFT of a spectrum, a complex region's first op."""
    if kernel.type == "complex_region":
        return graph.get_operation_by_name(kernel.ops[0])
    return _rfft(graph.get_tensor_by_name(kernel.tf_tensor).op.inputs[0])
