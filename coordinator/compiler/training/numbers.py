"""Numbers: one Session.run on input_fn's first batch compares the raw gradients with
tf.gradients(loss) (same run, same dropout masks); random gradients fed into TF's transform
subgraph are compared with wafer.grad_transforms.apply_transforms."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from coordinator.compiler.extract import ExtractedGraph, op_closure, user_name, user_source
from coordinator.compiler.ir import StatisticAverage
from coordinator.compiler.operands import VARIABLE_OPS
from coordinator.compiler.refusals import keras_layer
from coordinator.compiler.training.gradients import TRANSFORMS, Chain
from coordinator.compiler.training.graph import fail, variables_under
from coordinator.compiler.training.loss_scaling import PROOF_SCALE
from coordinator.compiler.training.noise import check_noise
from coordinator.compiler.training.transforms import merge
from wafer.grad_transforms import apply_transforms

# The numeric checks initialise every variable on the host: above this many values (1 GiB of
# float32) they are skipped and the structural proof stands alone.
NUMERIC_CHECK_VALUES = 2 ** 28
# A float16 backward's raw gradients against S x tf.gradients(loss): rounded apart by
# float16 (2 ** -11 per op), to this fraction of the largest.
HALF_GRADIENT_RTOL = 1e-2
# A gradient zero in exact arithmetic (an attention key's bias) is rounding noise, judged
# at this fraction of the model's largest gradient: about 8 ULPs in float32, one float16
# rounding (2 ** -11) in a float16 backward.
GRADIENT_NOISE = 1e-6
HALF_GRADIENT_NOISE = 2.0 ** -11
ZEROED_NOISE = 100.0  # a proven-0 gradient's noise may be this many times the noise bound
# A gradient program's clipping thresholds are values it computes (AGC's c * ||w||): its
# check feeds gradients of these scales too, below and above any threshold of ordinary size.
PROGRAM_SCALES = [1e-4, 1e4]
# Dynamic loss scaling's check halves the proof scale P while the float16 backward overflows
# on the first batch (as TF halves S), down to this (TF's DynamicLossScale floors S at 1).
SMALLEST_PROOF_SCALE = 1.0


def check_numbers(extracted: ExtractedGraph, chains: list[Chain],
                  averages: list[StatisticAverage], rtol: float = 1e-4,
                  noise: float = GRADIENT_NOISE, zeroed: tuple[str, ...] = (),
                  proof_scale: tf.Tensor | None = None) -> float | None:
    """One run on input_fn's first batch: raw gradients == S * d(loss)/d(var), TF's
    backward of the loss seeded with S (to `rtol`: oneDNN's and Eigen's kernels may round
    apart; _seeded_gradients), and no rounding noise among them
    that the optimizer would amplify (noise.py; `zeroed`, the variables the CS gives the
    exact 0 (shift.py), excepted); then TF's transforms == apply_transforms on random
    gradients. `proof_scale`: dynamic loss scaling's pinned S (loss_scaling.inline), halved
    while the raw gradients are not finite (_finite_scale). A static scale S that overflows
    is refused as such. Returns the model's largest raw gradient (over S), None when the check is
    skipped (the weights too large). (Moving averages and what else the gradients' control
    dependencies read are initialised too: gradients computed under
    tf.control_dependencies(update_ops) or a weight decay run them.)"""
    graph = extracted.graph
    losses = [c.call.objective if c.call.objective is not None else extracted.spec.loss
              for c in chains]  # (a GAN's: each update's own)
    handles = {op.name for loss in {t.name: t for t in losses}.values()
               for op in variables_under(loss)} | {c.update.variable for c in chains} \
        | {a.variable for a in averages} | {  # (what gradients under control dependencies run)
            op.name for c in chains for op in op_closure(c.raw) if op.type in VARIABLE_OPS} \
        | {op.name for c in chains for op in op_closure(c.update.grad)  # (a program reads)
           if op.type in VARIABLE_OPS}
    with graph.as_default():
        variables = [v for v in tf.compat.v1.global_variables() if v.op.name in handles]
    if sum(v.shape.num_elements() or 0 for v in variables) > NUMERIC_CHECK_VALUES:
        return None  # the weights alone exceed the check's memory: the structure is proven
    with graph.as_default(), tf.name_scope("csrun_training_check"):
        tensors = [graph.get_operation_by_name(c.update.variable).outputs[0] for c in chains]
        by_loss: dict[str, list[int]] = {}
        for k, loss in enumerate(losses):
            by_loss.setdefault(loss.name, []).append(k)
        expected: list = [None] * len(chains)
        for ks in by_loss.values():
            grads = tf.gradients(losses[ks[0]], [tensors[k] for k in ks])
            for k, grad in zip(ks, grads):
                expected[k] = grad
        raw, ours = [], []
        for chain, grad, handle in zip(chains, expected, tensors):
            if grad is None:
                raise fail(chain.update.op, f"the loss does not depend on {chain.update.variable}",
                           f"leave {chain.update.variable} out of the optimizer's var_list")
            if chain.raw_indices is not None:
                rows = handle.op.get_attr("shape").dim[0].size
                raw.append(tf.math.unsorted_segment_sum(chain.raw, chain.raw_indices, rows))
            else:
                raw.append(chain.raw)
            ours.append(tf.convert_to_tensor(grad))
        seeded = _seeded_gradients(chains, losses, tensors, ours, proof_scale)
        init = tf.compat.v1.variables_initializer(variables)
        read = {w: _read(graph, w) for t in merge(chains) for w in t.weights}
    batch = extracted.first_batch or {}
    feed = {graph.get_tensor_by_name(extracted.placeholders[s.name]): batch[s.name] for s in extracted.inputs}
    with tf.compat.v1.Session(graph=graph) as session:
        session.run(init)
        raw_values, loss_grads, seeded_values = session.run([raw, ours, seeded], feed)
        factor = 1.0
        if proof_scale is not None:
            raw_values, seeded_values, factor = _finite_scale(session, raw, seeded, raw_values,
                                                              seeded_values, feed, proof_scale)
            _never_finite(session, chains, raw_values, feed, proof_scale)
        else:
            _static_overflow(chains, raw_values, loss_grads)
        # A gradient that is zero in exact arithmetic (an attention key's bias) is rounding
        # noise on both sides: judged at the scale of the model's gradients, not its own.
        overall = max((float(np.max(np.abs(w), initial=0.0)) for w in seeded_values), default=0.0)
        for chain, got, want, unscaled in zip(chains, raw_values, seeded_values, loss_grads):
            if chain.update.variable in zeroed and \
                    float(np.max(np.abs(got), initial=0.0)) <= ZEROED_NOISE * noise * overall:
                continue  # both rounding noise (oneDNN's differs), which the CS makes the exact 0
            if not np.isfinite(unscaled).all():
                raise fail(chain.update.op, f"the gradient of the loss for {chain.update.variable} "
                                            "is not finite on input_fn's first batch (NaN or "
                                            "infinity): the training cannot be checked",
                           "make the loss finite on that batch (a log or division of 0, a "
                           "sqrt's gradient at 0: add a small epsilon)")
            bound = rtol * float(np.max(np.abs(want), initial=0.0)) + noise * overall + 1e-30
            # (written so that a NaN gradient, which compares false with anything, fails)
            if got.shape != want.shape or not float(np.max(np.abs(got - want), initial=0.0)) <= bound:
                raise fail(chain.update.op, f"the gradient applied to {chain.update.variable} "
                                            "is not the gradient of the loss " + (
                                                "it minimizes" if chain.call.objective is not None
                                                else "model_fn returns"),
                           "apply the loss's own gradients (minimize(loss), or "
                           "compute_gradients(loss) and apply_gradients), changed only by "
                           f"{TRANSFORMS}")
        largest = {c.update.variable: (c.update.optimizer, float(np.max(
            np.abs(got), initial=0.0)) / abs(c.call.scale * factor)) for c, got in zip(chains, raw_values)}
        check_noise(graph, {v: x for v, x in largest.items() if v not in zeroed}, noise)
        _check_transforms(session, chains, session.run(read))
    return max((g for _, g in largest.values()), default=0.0)


def _finite_scale(session, raw: list, seeded: list, values: list, seeded_values: list,
                  feed: dict, proof_scale: tf.Tensor) -> tuple[list, list, float]:
    """The raw gradients at the largest scale P / 2 ** k (k >= 0, down to
    SMALLEST_PROOF_SCALE) where all are finite, the loss's gradients seeded with that scale
    (_seeded_gradients), and P / 2 ** k / P. S enters the backward only as the seed
    S x loss and the unscaling 1 / S (loss_scaling._pin_reads), so its gradient is the same
    at every S up to float16 rounding and overflow; TF's skipped steps are the ones whose
    float16 backward overflows, which the CS's float16 kernels compute as TF's (an overflow
    is infinity in both)."""
    pinned = float(session.run(proof_scale))
    proof_scale.graph._unfeedable_tensors.discard(proof_scale)  # (tf.get_static_value marks it)
    scale = pinned
    while not all(np.isfinite(v).all() for v in values) and scale / 2 >= SMALLEST_PROOF_SCALE:
        scale /= 2
        values, seeded_values = session.run([raw, seeded], {**feed, proof_scale: np.float32(scale)})
    return values, seeded_values, scale / pinned


def _seeded_gradients(chains: list[Chain], losses: list[tf.Tensor], tensors: list[tf.Tensor],
                      ours: list[tf.Tensor], proof_scale: tf.Tensor | None) -> list[tf.Tensor]:
    """S x d(loss)/d(var) as TF's backward of the loss seeded with S (grad_ys; dynamic loss
    scaling's: the pinned `proof_scale`, fed as it is halved): a float16 backward at seed 1
    underflows float16 where the raw gradients' at S does not (an SE gate's gradient through
    its global average pool, 1 / (H x W) of a sum), so S x (the gradient at seed 1) is not
    the raw gradient's to float16 rounding. A chain of scale 1: its `ours`."""
    by_call: dict[tuple[str, float], list[int]] = {}
    for k, (chain, loss) in enumerate(zip(chains, losses)):
        by_call.setdefault((loss.name, chain.call.scale), []).append(k)
    seeded = list(ours)
    for (_, scale), ks in by_call.items():
        if scale == 1.0 and proof_scale is None:
            continue
        loss = losses[ks[0]]
        seed = tf.cast(proof_scale * np.float32(scale / PROOF_SCALE) if proof_scale is not None
                       else tf.constant(np.float32(scale)), loss.dtype)
        grads = tf.gradients(loss, [tensors[k] for k in ks], grad_ys=tf.fill(tf.shape(loss), seed))
        for k, grad in zip(ks, grads):
            seeded[k] = tf.convert_to_tensor(grad)
    return seeded


def _never_finite(session, chains: list[Chain], values: list, feed: dict,
                  proof_scale: tf.Tensor) -> None:
    """Refuse a float16 backward whose raw gradient is not finite on input_fn's first batch
    even at the smallest scale dynamic loss scaling reaches: TF would skip every step. The
    line names the first float16 op (in graph order) whose value overflows."""
    for chain, got in zip(chains, values):
        if np.isfinite(got).all():
            continue
        feed = {**feed, proof_scale: np.float32(SMALLEST_PROOF_SCALE)}
        halves = [op for op in op_closure(chain.raw)
                  if op.outputs and op.outputs[0].dtype == tf.float16]
        halves.sort(key=lambda op: op._id)  # (graph order: a value's inputs before it)
        found = session.run([op.outputs[0] for op in halves], feed)
        first = next((op for op, v in zip(halves, found) if not np.isfinite(v).all()), None)
        where = ""
        if first is not None:
            forward = _forward(first)
            layer, _ = keras_layer(forward)
            what = f"{layer} ({forward.type} '{user_name(forward)}')" if layer else \
                f"{forward.type} '{user_name(forward)}'"
            where = f"; float16 first overflows in {'the gradient of ' * (forward is not first)}" \
                    f"{what} at {user_source(forward)}"
        raise fail(chain.update.op, f"the gradient of the loss for {chain.update.variable} is "
                                    "not finite on input_fn's first batch at every loss scale "
                                    f"the dynamic scale reaches (down to "
                                    f"{SMALLEST_PROOF_SCALE:g}): TensorFlow would skip every "
                                    f"step and never train{where}",
                   "keep that layer's float16 values finite: a larger epsilon (Keras' "
                   "LayerNormalization default 1e-3), or the layer in float32 "
                   "(dtype=\"float32\")")


def _forward(op: tf.Operation) -> tf.Operation:
    """The forward op whose gradient `op` computes (`gradients/<op>_grad/...`), else `op`."""
    parts = op.name.split("/")
    scope = next((k for k, part in enumerate(parts) if part.startswith("gradients")), None)
    rest = "/".join(parts[scope + 1:]) if scope is not None else ""
    if "_grad/" not in rest:
        return op
    try:
        return op.graph.get_operation_by_name(rest[:rest.index("_grad/")])
    except KeyError:
        return op


def _static_overflow(chains: list[Chain], raw: list, loss_grads: list) -> None:
    """Refuse a static loss scale S under which a float16 backward's raw gradient is not
    finite on input_fn's first batch while the loss's gradient is (TF would apply the
    infinity and train NaN from its second step)."""
    for chain, got, want in zip(chains, raw, loss_grads):
        if chain.call.scale != 1.0 and not np.isfinite(got).all() and np.isfinite(want).all():
            raise fail(chain.update.op, f"the loss scale {chain.call.scale:g} overflows float16 "
                                        f"in the gradient of {chain.update.variable} on "
                                        "input_fn's first batch (TensorFlow trains NaN from "
                                        "its second step)",
                       'lower the loss scale or use "dynamic" (MixedPrecisionLossScaleOptimizer'
                       '(optimizer, "dynamic") skips the steps that overflow)')


def _read(graph: tf.Graph, variable: str) -> tf.Tensor:
    """A read of the variable's value (a resource's or a ref's)."""
    handle = graph.get_operation_by_name(variable).outputs[0]
    if handle.dtype != tf.resource:
        return tf.identity(handle)
    return tf.raw_ops.ReadVariableOp(
        resource=handle, dtype=graph.get_operation_by_name(variable).get_attr("dtype"))


def _check_transforms(session, chains: list[Chain], weights: dict[str, np.ndarray]) -> None:
    """TF's transform subgraph and apply_transforms agree on random gradients, with every
    clipping both inactive (tiny gradients) and active (large ones), and mixed (a program
    reads `weights`, the variables' values in `session`, and sees PROGRAM_SCALES too)."""
    transforms = merge(chains)
    if not transforms:
        return
    limits = [abs(v) for t in transforms if t.kind != "scale" for v in (t.value, t.low, t.high)
              if v]
    shapes = {c.update.variable: c.raw.shape for c in chains}
    if not all(s.is_fully_defined() for s in shapes.values()):
        raise fail(chains[0].update.op, "a gradient of unknown shape")
    size = max(s.num_elements() for s in shapes.values())
    scales = [10.0 * max(limits), min(limits) / (10.0 * np.sqrt(size))] if limits else [1.0]
    if any(t.kind == "program" for t in transforms):  # (its thresholds unknown: both sides)
        scales += PROGRAM_SCALES
    rng = np.random.default_rng(0)
    for trial in range(len(scales) + 1):
        feed, grads = {}, {}
        for c in chains:
            factor = scales[trial] if trial < len(scales) else float(
                np.exp(rng.uniform(np.log(min(scales)), np.log(max(scales)))))
            values = (rng.normal(size=shapes[c.update.variable].as_list()) * factor)
            feed[c.raw] = np.asarray(values, np.float32)  # (a scalar weight's: 0-d array)
            grads[c.update.variable] = feed[c.raw].copy()
        applied = session.run([c.update.grad for c in chains], feed)
        apply_transforms(transforms, grads, weights)
        for c, want in zip(chains, applied):
            bound = 1e-5 * float(np.max(np.abs(want), initial=0.0)) + 1e-30
            if not float(np.max(np.abs(grads[c.update.variable] - want), initial=0.0)) <= bound:
                anchor = c.steps[-1].anchor if c.steps else c.update.op
                raise fail(anchor, f"the gradient transforms of {c.update.variable} do not "
                                   f"compute what the CS computes ({TRANSFORMS})")
