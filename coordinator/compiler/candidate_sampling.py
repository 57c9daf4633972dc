"""tf.nn.sampled_softmax_loss and tf.nn.nce_loss: TF's _compute_sampled_logits (a candidate
sampler drawing num_sampled classes for the whole batch, the output weights and biases
gathered at the labels and the sampled ids, every sample's logits against them, accidental
hits removed, the log expected counts subtracted) is one `sampled_logits` kernel
(wafer.kernels.candidate_sampling), from the sampler to the logits' concat. The labels' side
of the loss (ones / num_true, zeros) is constants (sampled softmax's cross entropy reads
them as a sample_constant row); the loss after it is the ordinary kernels'.

Proven before it is taken: the ops between are exactly those of _compute_sampled_logits
(`LOGITS_OPS`), and on a probe (random inputs, weights and draws fed to TF's ops) TF's
logits are the kernel's (`PROBE_RTOL`). Refused in one line naming the sampler: samplers
other than log-uniform, uniform and fixed unigram of in-memory unigrams (learned unigram,
all classes, a vocab_file), sharded weights, and the sampler's outputs read by anything
but those ops.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from coordinator.compiler.extract import is_gradient
from coordinator.compiler.ir import ParamRef
from coordinator.compiler.operands import Weight, static_shape
from coordinator.compiler.random_numbers import CANDIDATE_SAMPLERS
from coordinator.compiler.rules import Context, fast_path
from wafer.kernels.base import KernelError, RunContext
from wafer.kernels.candidate_sampling import SampledLogits

# TF op -> the kernel's sampler
SAMPLERS = {"LogUniformCandidateSampler": "log_uniform", "UniformCandidateSampler": "uniform",
            "FixedUnigramCandidateSampler": "fixed_unigram"}
# The op types of _compute_sampled_logits between the sampler and its logits' concat.
LOGITS_OPS = {"Reshape", "ConcatV2", "StopGradient", "ResourceGather", "GatherV2", "Identity",
              "Slice", "MatMul", "Mul", "ExpandDims", "AddV2", "Add", "Sub", "Log",
              "ComputeAccidentalHits", "Cast", "SparseToDense", "Shape", "StridedSlice", "Pack",
              "Fill", "Const", *SAMPLERS}
PROBE_RTOL = 1e-5
# The README's "Supported operations" row.
KERNEL_ROWS = {"sampled_logits": (
    "tf.nn.sampled_softmax_loss and tf.nn.nce_loss of one weight table and its biases: "
    "LogUniformCandidateSampler (their default), UniformCandidateSampler or "
    "FixedUnigramCandidateSampler of in-memory unigrams (any distortion and reserved ids; "
    "tf.random.*_candidate_sampler as sampled_values), unique or not, the gathers, "
    "logits, accidental hits (ComputeAccidentalHits, SparseToDense) and log expected counts "
    "of _compute_sampled_logits: the classes drawn on the CS once a step for the whole batch "
    "(in evaluation and prediction once a batch) with TF's distribution and expected counts; "
    "the table's and biases' gradients TF's IndexedSlices (sparse updates)")}
UNSUPPORTED = ("the CS draws the classes of tf.nn.sampled_softmax_loss and tf.nn.nce_loss "
               "with their default log-uniform sampler, tf.random.uniform_candidate_sampler or "
               "fixed_unigram_candidate_sampler of in-memory unigrams (one unsharded table)")


def _sampler(m: Context, op: tf.Operation) -> tf.Operation | None:
    """The candidate sampler whose logits start at `op`: the sampler, or the labels' Reshape
    concatenated with its sampled ids (built before it)."""
    if op.type in CANDIDATE_SAMPLERS and op.type != "ComputeAccidentalHits":
        return op
    if op.type != "Reshape":
        return None
    for concat in m.consumers(op.outputs[0]):
        for t in concat.inputs if concat.type == "ConcatV2" else ():
            if t.op.type == "StopGradient" and t.op.inputs[0].op.type in SAMPLERS:
                return t.op.inputs[0].op
    return None


def _consumer(tensor: tf.Tensor, op_type: str) -> tf.Operation | None:
    found = [c for c in tensor.consumers() if c.type == op_type]
    return found[0] if len(found) == 1 else None


def _logits(m: Context, sampler: tf.Operation) -> tf.Tensor | None:
    """The concat of the true and sampled logits, each less its log expected count."""
    subs = []
    for index in (1, 2):
        stop = _consumer(sampler.outputs[index], "StopGradient")
        log = _consumer(stop.outputs[0], "Log") if stop is not None else None
        sub = _consumer(log.outputs[0], "Sub") if log is not None else None
        if sub is None:
            return None
        subs.append(sub.outputs[0])
    concat = m.sole_consumer(subs[0])
    if concat is None or concat.type != "ConcatV2" or list(concat.inputs[:2]) != subs:
        return None
    return concat.outputs[0]


def _region(sampler: tf.Operation, out: tf.Tensor) -> set[tf.Operation]:
    """The ops from the sampler (and the labels' reshape) to `out`, and the per-sample ops
    only they read (the inputs' ExpandDims)."""
    upstream, stack = set(), [out.op]
    while stack:
        op = stack.pop()
        if op not in upstream:
            upstream.add(op)
            stack.extend(t.op for t in op.inputs)
    labels = sampler.inputs[0]
    region, stack = set(), [sampler, *[c for c in labels.consumers() if c in upstream]]
    while stack:
        op = stack.pop()
        if op in upstream and op not in region:
            region.add(op)
            stack.extend(c for t in op.outputs for c in t.consumers())
    region.update(op for op in upstream - region if op.type == "ExpandDims" and all(
        c in region or is_gradient(c) for c in op.outputs[0].consumers()))
    return region


@dataclass(frozen=True)
class SampledLoss:
    """A sampler's logits as the kernel computes them: its attrs, inputs, tables, the ops."""

    attrs: dict[str, Any]
    x: tf.Tensor
    labels: tf.Tensor
    weights: Weight
    biases: Weight
    ops: frozenset[tf.Operation]
    logits: tf.Tensor


def sampled_loss(m: Context, sampler: tf.Operation) -> SampledLoss | str:
    """The sampler's logits, or why the CS does not compute them."""
    if sampler.type not in SAMPLERS:
        return f"draws classes by {sampler.type}: {UNSUPPORTED}"
    out = _logits(m, sampler)
    if out is None:
        return (f"its draws are read other than by tf.nn.sampled_softmax_loss or "
                f"tf.nn.nce_loss: {UNSUPPORTED}")
    region = _region(sampler, out)
    odd = sorted({op.type for op in region} - LOGITS_OPS)
    labels = sampler.inputs[0]
    rows = static_shape(labels)[0] * sampler.get_attr("num_true") + sampler.get_attr("num_sampled")
    gathers = [op for op in region if op.type in ("ResourceGather", "GatherV2")]
    matmuls = [op for op in region if op.type == "MatMul" and op.get_attr("transpose_b")]
    # (no gradient stopped but the draws': TF's gradients are the kernel's)
    stops = [op for op in region if op.type == "StopGradient" and op.inputs[0].op is not sampler]
    if odd or stops or len(matmuls) != 1 or len(gathers) != 2 or any(
            static_shape(g.outputs[0])[:1] != (rows,) for g in gathers):
        return (f"its logits are computed by other ops ({', '.join(odd) or 'gathers, stops'}): "
                f"{UNSUPPORTED}")
    x = matmuls[0].inputs[0]
    tables = {len(static_shape(g.outputs[0])): m.operands.weight(g.inputs[0]) for g in gathers}
    weights, biases = tables.get(2), tables.get(1)
    if not m.is_batched(x) or not m.is_batched(labels) or x.dtype != tf.float32 or \
            len(static_shape(x)) != 2 or m.shape(x) != static_shape(x)[1:] or \
            m.shape(labels) != static_shape(labels)[1:] or weights is None or biases is None \
            or weights.dtype != "float32" or biases.dtype != "float32":
        return (f"its inputs are not float32 per-sample vectors, or its weights and biases not "
                f"float32 variables: {UNSUPPORTED}")
    for op in region:
        outside = [t for t in op.inputs if t.op not in region and t.dtype != tf.resource
                   and t not in (x, labels) and m.operands.constant(t) is None]
        leaks = [c.name for t in op.outputs if t is not out for c in t.consumers()
                 if c not in region and not is_gradient(c)]
        leaks += [t.name for t in op.outputs if t is not out and t.name in m.protected]
        if outside or leaks:
            what = f"read {outside[0].name}" if outside else f"feed {leaks[0]}"
            return (f"its draws and the logits computed from them {what}, which TF's sampled "
                    f"losses do not: {UNSUPPORTED}")
    attrs = {"sampler": SAMPLERS[sampler.type], "num_sampled": sampler.get_attr("num_sampled"),
             "num_true": sampler.get_attr("num_true"), "range_max": sampler.get_attr("range_max"),
             "unique": sampler.get_attr("unique"),
             "remove_accidental_hits": any(op.type == "ComputeAccidentalHits" for op in region)}
    if sampler.type == "FixedUnigramCandidateSampler":
        if sampler.get_attr("vocab_file") or sampler.get_attr("num_shards") != 1:
            return (f"draws classes of a unigram vocab_file or of a shard of the classes: "
                    f"{UNSUPPORTED}; give tf.random.fixed_unigram_candidate_sampler the counts "
                    f"as unigrams")
        attrs.update(unigrams=[float(u) for u in sampler.get_attr("unigrams")],
                     distortion=sampler.get_attr("distortion"),
                     num_reserved_ids=sampler.get_attr("num_reserved_ids"))
    if attrs["range_max"] != weights.shape[0]:
        return (f"draws classes in [0, {attrs['range_max']}) of a table of {weights.shape[0]} "
                f"rows: give num_classes the table's rows")
    found = SampledLoss(attrs, x, labels, weights, biases, frozenset(region), out)
    return _probe(found, sampler, gathers)


def _probe(found: SampledLoss, sampler: tf.Operation,
           gathers: list[tf.Operation]) -> SampledLoss | str:
    """`found` if TF's ops between, fed random inputs, table rows (the gathers' outputs) and
    the kernel's draw (with an accidental hit, of an id drawn twice when draws repeat), give
    the kernel's logits within PROBE_RTOL."""
    rng = np.random.default_rng(0)
    attrs, (batch, dim) = found.attrs, static_shape(found.x)
    try:
        kernel = SampledLogits("probe", attrs, [(dim,), (attrs["num_true"],)])
    except KernelError as problem:
        return f"{problem}: {UNSUPPORTED}"
    params = {"weights": rng.standard_normal((attrs["range_max"], dim)).astype(np.float32),
              "biases": rng.standard_normal(attrs["range_max"]).astype(np.float32)}
    xs = rng.standard_normal((batch, dim)).astype(np.float32)
    ys = rng.integers(0, attrs["range_max"], (batch, attrs["num_true"]))
    ids, tries = kernel.classes.sample(rng, attrs["num_sampled"], attrs["unique"])
    if not attrs["unique"] and len(ids) > 1:
        ids[-1] = ids[0]  # (a repeated id)
    ys[0, 0] = ids[0]
    kernel.draw = ids, tries
    expected, _ = kernel.forward(params, [xs, ys], RunContext(True, batch, offset=1))
    feed = {found.x: xs, found.labels: ys.astype(found.labels.dtype.as_numpy_dtype),
            sampler.outputs[0]: ids, sampler.outputs[1]: kernel.expected(ys, tries),
            sampler.outputs[2]: kernel.expected(ids, tries)}
    every = np.concatenate([ys.reshape(-1), ids])
    for gather in gathers:
        table = params["weights" if len(static_shape(gather.outputs[0])) == 2 else "biases"]
        feed[gather.outputs[0]] = table[every]
    try:
        with tf.compat.v1.Session(graph=found.logits.graph) as session:
            logits = session.run(found.logits, feed)
    except (ValueError, tf.errors.OpError):  # (shapes other than TF's function's)
        logits = None
    if logits is None or not np.allclose(logits, expected, rtol=PROBE_RTOL, atol=PROBE_RTOL):
        return f"its logits are not those of TF's _compute_sampled_logits on a probe: {UNSUPPORTED}"
    return found


@fast_path
def match_sampled_logits(m: Context, op: tf.Operation) -> bool:
    sampler = _sampler(m, op)
    if sampler is None:
        return False
    found = sampled_loss(m, sampler)
    if isinstance(found, str):
        if op is sampler:
            m.reject(sampler, found)
        return op is sampler
    params = [ParamRef(role, w.variable, w.shape, variable_shape=w.variable_shape)
              for role, w in (("weights", found.weights), ("biases", found.biases))]
    ops = sorted((o for o in found.ops if o in m.flow), key=lambda o: o.name)
    m.add_kernel(sampler.name, "sampled_logits", [found.x, found.labels], found.attrs, params,
                 ops, found.logits, source_op=sampler)
    _label_rows(m, sampler, found.logits)
    return True


def _label_rows(m: Context, sampler: tf.Operation, out: tf.Tensor) -> None:
    """sampled_softmax_loss's labels (1 / num_true for the true classes, 0 for the sampled,
    a constant of the batch's shape, every row the same) for its cross entropy: each
    sample's row, a sample_constant kernel."""
    readers = out.consumers() + [c for r in out.consumers() if r.type == "Reshape"
                                 for c in r.outputs[0].consumers()]
    for xent in readers:
        if xent.type != "SoftmaxCrossEntropyWithLogits" or m.is_batched(xent.inputs[1]):
            continue
        value = m.operands.constant(xent.inputs[1])
        if value is not None and value.shape == (m.batch_size, *static_shape(out)[1:]) and \
                (value == value[:1]).all():
            m.add_kernel(f"{sampler.name}/labels", "sample_constant", [m.sample_input()],
                         {"value": np.asarray(value, np.float32)}, [], [], xent.inputs[1],
                         output_shape=value.shape[1:], source_op=sampler)
