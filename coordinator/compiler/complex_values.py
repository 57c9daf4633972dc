"""Complex values computed per sample: a closed region of TF's complex64 ops (the transforms
RFFT, IRFFT, FFT, IFFT and their 2-D forms along a sample's own axes; Mul, Add, Sub, Div,
Neg, Conj, Exp, Log, Sqrt, Square, Complex, Cast between float32 and complex64, Sum and Mean
over a sample's axes; slices, reshapes, transposes, concats, pads and the other ops that
place elements, MatMul/BatchMatMul/Einsum: complex_layout.py; rfft's zero Pad of a
weight-derived value) between real operands (per-sample values, weights, constants) and real
results (IRFFT, Real, Imag, ComplexAbs, Angle, Cast to float32) becomes one `complex_region`
kernel per real result read; the complex values never leave it. A real value one complex
value gives another (rfft(2 * real(...))) joins the region. Any other op on a complex value,
a complex value the host reads, a transform, sum, slice or product along the batch axis, an
operand of rows folded into it is refused in one line naming the op."""
from __future__ import annotations

import json

import numpy as np
import tensorflow as tf

from coordinator.compiler import complex_layout, precision
from coordinator.compiler.operands import static_shape
from coordinator.compiler.rules import Context, has_kernel
from tf_model.model_fn import user_name, user_source
from wafer.kernels.complex_values import OPS

TRANSFORM_AXES = {"RFFT": 1, "IRFFT": 1, "FFT": 1, "IFFT": 1, "RFFT2D": 2, "IRFFT2D": 2,
                  "FFT2D": 2, "IFFT2D": 2}
SUPPORTED = ("the CS computes complex values per sample only through tf.signal's rfft, irfft, "
             "fft, ifft and their 2-D forms, *, +, -, /, tf.math.conj, tf.exp, log, sqrt, "
             "square, tf.complex, tf.cast, tf.reduce_sum/mean, slices, reshapes, "
             "transposes, concats, pads, tf.matmul, tf.einsum and tf.math.real, imag, abs, "
             "angle; compute the rest from those parts, or in input_fn")
REAL_ARITHMETIC = ("Mul", "AddV2", "Add", "Sub", "RealDiv", "Div", "Neg", "Identity")
KERNEL_ROWS = {
    "complex_region": "complex64 values of a sample: tf.signal.rfft, irfft, fft, ifft, fft2d, "
                      "ifft2d, rfft2d, irfft2d along its own axes, *, +, -, /, tf.math.conj, "
                      "tf.exp, tf.math.log, tf.sqrt, tf.square, tf.complex, tf.cast between "
                      "float32 and complex64, tf.reduce_sum and reduce_mean over its own axes, "
                      "slices, reshapes, transposes, concats, pads, tiles, gathers and the "
                      "other ops placing its elements (an index map measured by TF's op), "
                      "tf.linalg.adjoint, tf.matmul (adjoints too) and tf.einsum of two "
                      "complex values keeping the batch axis first, read through "
                      "tf.math.real, imag, tf.abs, tf.math.angle or irfft (an FFT "
                      "convolution, an auto-correlation, FNet's mixing, a Fourier neural "
                      "operator's lowest modes times a complex weight, S4D's Vandermonde "
                      "kernel, spectral pooling, complex-valued layers, a Hermitian product, "
                      "complex attention; trainable complex filters of weights): float32 "
                      "pairs, each transform exact rounded to complex64, TF's gradients",
}


def _complex(t: tf.Tensor) -> bool:
    return t.dtype.base_dtype in (tf.complex64, tf.complex128)


def _step(op: tf.Operation) -> str:
    """The kernel's step for `op` ("" if none)."""
    if op.type == "Cast":
        source, target = op.inputs[0].dtype.base_dtype, op.outputs[0].dtype.base_dtype
        if source == tf.float32 and target == tf.complex64:
            return "ToComplex"
        return "ToReal" if source == tf.complex64 and target == tf.float32 else ""
    if op.type in ("Identity", "Sum", "Mean") and _complex(op.outputs[0]):
        return op.type
    if op.type in complex_layout.PLACING and (_complex(op.outputs[0]) or op.type == "Pad"):
        return "Take"  # (a real Pad: tf.signal.rfft's zero padding to fft_length)
    if op.type in complex_layout.PRODUCTS and _complex(op.outputs[0]):
        return "Einsum"
    return op.type if op.type in OPS and all(
        t.dtype.base_dtype in (tf.float32, tf.complex64, tf.int32) for t in op.outputs) else ""


def _args(m: Context, op: tf.Operation) -> list[tf.Tensor]:
    """The values `op`'s step reads."""
    step = _step(op)
    return complex_layout.placed_inputs(m, op) if step == "Take" else \
        list(op.inputs[:OPS[step]])


def _region(m: Context, start: tf.Operation) -> list[tf.Operation] | str:
    """The ops computing or reading the complex values connected to `start`'s (through real
    values too: rfft(real(...)) of a kernel built in complex from weights), in graph order,
    or why not (an op outside the closed set, a complex value the host reads)."""
    seen: set[tf.Operation] = set()
    todo = [start]
    while todo:
        op = todo.pop()
        if op in seen:
            continue
        seen.add(op)
        if not _step(op):
            return (f"{op.type} '{user_name(op)}' at {user_source(op)} computes with its "
                    f"complex value: {SUPPORTED}")
        for t in _args(m, op):
            if _complex(t) and m.operands.constant(t) is None or _from_complex(m, t) or \
                    t.op.type == "Pad" and op.type in TRANSFORM_AXES and not m.is_batched(t):
                todo.append(t.op)
        for t in op.outputs:
            if _complex(t) and t.name in m.protected:
                return (f"the host reads the complex value of {op.type} '{user_name(op)}' "
                        f"(a prediction, metric or summary): return its real and imaginary "
                        "parts (tf.math.real, tf.math.imag) instead")
            todo.extend(c for c in m.consumers(t) if _complex(t) or _into_complex(c))
    return sorted(seen, key=lambda op: op._id)  # graph order


def _later(m: Context, start: tf.Operation, ops: list[tf.Operation]) -> bool:
    """Whether an op of the region computing a complex value comes after every per-sample
    operand the region reads that is still to be computed (a transpose of the keys after the
    queries' rfft) and after `start`: the matcher reaches it later."""
    pending = [t.op._id for op in ops for t in _args(m, op)
               if t.op not in ops and t.op in m.flow and not m.is_batched(t)
               and t.op not in m.consumed]
    if not pending:
        return False
    ready = max(pending)
    return any(op._id > ready and op._id > start._id and any(_complex(t) for t in op.outputs)
               for op in ops)


def _from_complex(m: Context, t: tf.Tensor) -> bool:
    """Whether `t` is a real value a complex one gives (IRFFT, Real, ...), or one the same
    for every sample computed from such values by arithmetic (an S4D kernel
    2 * real(einsum(...)) of weights): the region computes it."""
    if _out_of_complex(t.op):
        return True
    return t.op.type in REAL_ARITHMETIC and bool(_step(t.op)) and not m.is_batched(t) and \
        any(_from_complex(m, u) for u in _args(m, t.op))


def _into_complex(op: tf.Operation) -> bool:
    """Whether `op` takes a real value into the complex ones (RFFT, tf.complex, Cast)."""
    return bool(_step(op)) and any(_complex(t) for t in op.outputs)


def _out_of_complex(op: tf.Operation) -> bool:
    """Whether `op` takes a complex value out to a real one (IRFFT, Real, tf.abs, Cast)."""
    return bool(_step(op)) and any(_complex(t) for t in op.inputs) and \
        not any(_complex(t) for t in op.outputs)


def lower(m: Context, start: tf.Operation) -> str:
    """The complex region of `start` as complex_region kernels, one per real result read
    (""), or why the CS refuses it."""
    if not has_kernel("complex_region"):
        return precision.dtype_problem(start.outputs[0].dtype.name)
    ops = _region(m, start)
    if isinstance(ops, str):
        return f"computes in complex64, and {ops}"
    if _later(m, start, ops):
        return ""  # a later op of the region lowers it, once its operands are computed
    results = [op for op in ops if not any(_complex(t) for t in op.outputs) and (
        op.outputs[0].name in m.protected or any(c not in ops for c in m.consumers(op.outputs[0])))]
    if not results or any(op in m.consumed for op in ops):
        return precision.dtype_problem(start.outputs[0].dtype.name)
    kernels = []
    for result in results:
        kernel = _program(m, ops, result)
        if isinstance(kernel, str):
            return f"computes in complex64, and {kernel}"
        kernels.append((result, kernel))
    for k, (result, (inputs, attrs, params)) in enumerate(kernels):
        covered = [op for op in ops if op not in results] + [result] if k == 0 else [result]
        m.add_kernel(result.name, "complex_region", inputs, attrs, params, covered,
                     result.outputs[0], source_op=start)
    return ""


def _axes(m: Context, op: tf.Operation) -> tuple[int, ...] | None:
    """The axes a Sum or Mean reduces (non-negative; () for other ops), None if not constant."""
    if op.type not in ("Sum", "Mean"):
        return ()
    axes, rank = m.operands.constant(op.inputs[1]), len(static_shape(op.inputs[0]))
    return None if axes is None else tuple(sorted({int(a) % rank for a in np.ravel(axes)}))


def _program(m: Context, ops: list[tf.Operation], result: tf.Operation):
    """(inputs, attrs, params) of the complex_region kernel computing `result`, or why not."""
    needed: set[tf.Operation] = set()
    todo = [result]
    while todo:
        op = todo.pop()
        if op in needed or op not in ops:
            continue
        needed.add(op)
        todo.extend(t.op for t in op.inputs)
    steps = [op for op in ops if op in needed]
    leaves: list[tf.Tensor] = []
    constants: dict[str, np.ndarray] = {}
    batched: set[str] = set()
    for op in steps:
        args = _args(m, op)
        for t in args:
            if t.op in needed:
                continue
            if _complex(t):
                value = m.operands.constant(t)
                if value is None:
                    return (f"the complex value {t.op.type} '{user_name(t.op)}' at "
                            f"{user_source(t.op)} is neither computed per sample nor a "
                            f"constant: {SUPPORTED}")
                constants.setdefault(t.name, np.asarray(value))
            elif t not in leaves:
                leaves.append(t)
        axes = _axes(m, op)
        where = f"{op.type} '{user_name(op)}' at {user_source(op)}"
        if axes is None:
            return f"{where} sums over axes not known when the graph is built"
        if any(t.name in batched or m.is_batched(t) for t in args):
            batched.add(op.outputs[0].name)
            if len(static_shape(op.inputs[0])) <= TRANSFORM_AXES.get(op.type, 0) or 0 in axes:
                return (f"{where} transforms or sums along the batch axis (it mixes the "
                        "samples): the CS computes each sample on its own; transform a "
                        "sample's own axes")
    odd = next((t for t in leaves if m.folds(t) > 1 or t.name in m.leading), None)
    if odd is not None:  # (its TF axes are not the kernel's: a sum's axes would differ)
        return (f"{odd.op.type} '{user_name(odd.op)}' at {user_source(odd.op)} holds several "
                "rows of a sample along the batch axis: apply the complex ops to a "
                "[batch, ...] value")
    found = m.operand_list(result, leaves)
    if isinstance(found, str):
        return found
    if "i" not in found[0]:
        return f"{result.type} '{user_name(result)}' does not compute per sample"
    letters, inputs, attrs, params = found
    index = {t.name: k for k, t in enumerate(leaves)}
    program = []
    for value in constants.values():  # complex constants: Complex(c_re, c_im)
        k = len(letters)
        letters += "cc"
        attrs[f"c{k}"] = np.real(value).astype(np.float32)
        attrs[f"c{k + 1}"] = np.imag(value).astype(np.float32)
    # values: the operands, then the constants' Complex steps, then the region's steps
    base = len(letters)
    for j, name in enumerate(constants):
        first = len(leaves) + 2 * j
        program.append({"op": "Complex", "args": [first, first + 1]})
        index[name] = base + j
    for op in steps:
        step = _step(op)
        args = _args(m, op)
        spec: dict = {"op": step, "args": [index[t.name] for t in args]}
        where = f"{op.type} '{user_name(op)}' at {user_source(op)}"
        per_sample = [t.name in batched or m.is_batched(t) for t in args]
        if step in ("Take", "Einsum"):
            found = complex_layout.index_map(m, op, per_sample) if step == "Take" else \
                complex_layout.product(m, op, per_sample)
            if isinstance(found, str):
                return found
            spec.update(found)
        if op.type in ("RFFT", "IRFFT", "RFFT2D", "IRFFT2D"):
            length = m.operands.constant(op.inputs[1])
            if length is None:
                return f"{where} has an fft_length not known when the graph is built"
            spec["fft_length"] = [int(v) for v in np.ravel(length)]
        if op.type in ("Sum", "Mean"):
            spec.update(axes=list(_axes(m, op) or ()), keep=op.get_attr("keep_dims"))
        program.append(spec)
        index[op.outputs[0].name] = base + len(program) - 1
    # (the real operands' TF names: spectra.rounding_noise feeds TF's values to the kernel)
    return inputs, {"operands": letters, **attrs, "program": json.dumps(program),
                    "tf_operands": json.dumps([t.name for t in leaves])}, params
