"""Random numbers on the samples' side: TF's ops drawing floats of a per-sample shape
(tf.random.normal, truncated_normal, uniform, their tf.compat.v1 and Keras forms, the
stateless ops of Keras' GaussianNoise and GaussianDropout) become `random` kernels
(wafer.kernels.random_numbers) drawing the op's raw values; the graph's scale and shift
(stddev, mean, maxval - minval, minval) are ordinary kernels after them. Integers of a
per-sample shape (tf.random.uniform of an int dtype, RandomUniformInt, and its stateless
forms) are `random` kernels drawing the op's values, uniform in its constant [minval, maxval). Multinomial
(tf.random.categorical) of per-sample logits (or a sample's k rows folded into the batch:
folded_batch.py), or of constant logits whose rows are all equal (each sample given the
row), becomes a `categorical` kernel drawing each sample's classes (each of its rows').

The matcher treats these ops as sources of per-sample values, like the program's inputs
(`DRAWS`). A draw of a constant shape that meets the samples only through values computed
from weights too (Bayes by backprop's w = mu + softplus(rho) * eps: `weight_draws`), or
read only as a weight is read (`_read_as_weight`: a product's shared operand, a Performer's
or random Fourier features' projection x @ tf.random.normal([d, m]); or an operand broadcast
over the batch, the features' random phase cos(x @ w + b), noise added to activations, a
dropout mask of noise_shape [1, d], a drawn scale or temperature), is no source: the weight
program draws it (weight_program.py), once a step, for every micro-batch of the step. What
stays refused, in one line naming the op: numbers shared by the batch that meet values of
the whole batch (its loss, a batch statistic) or that a per-sample op reads other than as a
weight, a shape
computed from values, a stateless op with a constant seed (TF repeats its numbers every
step), integers over a dtype's full range (tf.random.stateless_uniform without bounds),
shuffles, and candidate samplers other than tf.nn.nce_loss's and sampled_softmax_loss's
(candidate_sampling.py). Noise on the labels (targets
plus noise, classes drawn from a smoothed one-hot, a conditional generator's noise joined
with one_hot(labels)) is the model's computation like any other.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from coordinator.compiler.extract import SHAPE_OPS, data_flow_ops
from coordinator.compiler.operands import RANDOM_OPS, VARIABLE_OPS, Operands, depends_on
from coordinator.compiler.rules import Context, generic

# TF op -> the `random` kernel's distribution (the op's raw draws).
DRAWS = {"RandomStandardNormal": "normal", "StatelessRandomNormal": "normal",
         "StatelessRandomNormalV2": "normal", "TruncatedNormal": "truncated_normal",
         "StatelessTruncatedNormal": "truncated_normal",
         "StatelessTruncatedNormalV2": "truncated_normal", "RandomUniform": "uniform",
         "StatelessRandomUniform": "uniform", "StatelessRandomUniformV2": "uniform",
         "RandomUniformInt": "uniform_int", "StatelessRandomUniformInt": "uniform_int",
         "StatelessRandomUniformIntV2": "uniform_int"}
# An integer draw's minval and maxval: its inputs' positions, by op type.
INTEGER_BOUNDS = {"RandomUniformInt": (1, 2), "StatelessRandomUniformInt": (2, 3),
                  "StatelessRandomUniformIntV2": (4, 5)}
# The random ops the CS draws (DRAWS and tf.random.categorical's Multinomial).
DRAWN_OPS = {*DRAWS, "Multinomial"}
# Draws of classes for the batch (tf.nn.nce_loss, tf.nn.sampled_softmax_loss).
CANDIDATE_SAMPLERS = ("LogUniformCandidateSampler", "UniformCandidateSampler",
                      "LearnedUnigramCandidateSampler", "FixedUnigramCandidateSampler",
                      "ThreadUnsafeUnigramCandidateSampler", "AllCandidateSampler",
                      "ComputeAccidentalHits")
# Gamma draws (tf.random.gamma): the CS has no gamma sampler.
GAMMA_OPS = {"RandomGamma"}
USE_INSTEAD = ("draw per sample: tf.random.normal, truncated_normal or uniform (floats, or "
               "integers in [minval, maxval)) of tf.shape(x) or [tf.shape(x)[0]], x a "
               "per-sample value")
# The README's "Supported operations" row and refusal.
KERNEL_ROWS = {"random": (
    "RandomStandardNormal, TruncatedNormal, RandomUniform and their stateless forms of a "
    "per-sample shape (the batch axis first: tf.random.normal(tf.shape(x)), "
    "tf.random.normal([batch, k]), tf.keras.backend.random_normal, truncated_normal, uniform; "
    "a VAE's mean + tf.exp(0.5 * log_var) * eps, Keras GaussianNoise and GaussianDropout in "
    "training, Gumbel noise): drawn on the CS, fresh every step and in evaluation and "
    "prediction too, as TF's ops; of a shape without the batch axis (or a first axis of 1), "
    "combined with weights before it meets the samples (Bayes by backprop's w = mu + "
    "softplus(rho) * eps, its bias's too; NoisyNet's factorised noise), read as a product's "
    "shared operand (a random projection x @ tf.random.normal([d, m]), "
    "tf.einsum('bhnd,dm->bhnm', q, w) of a Performer's FAVOR+ features, random Fourier "
    "features) or broadcast over the batch (their phase cos(x @ w + b), b = "
    "tf.random.uniform([D], 0, 2 pi); noise added to activations; a dropout mask of "
    "noise_shape [1, d]; Gaussian dropout's h * tf.random.normal([1, d], 1, s); a drawn "
    "temperature logits / tf.random.uniform([])): drawn once a step in the weight program, "
    "every sample of the step reading the same numbers, the gradient taken back through "
    "them to mu and rho; in evaluation and prediction once a batch. RandomUniformInt and its stateless forms of a per-sample shape "
    "(tf.random.uniform([batch], 0, T, dtype=tf.int32): a DDPM's timestep per sample), "
    "constant minval < maxval, int32 or int64: each sample's integers drawn on the CS uniform "
    "in [minval, maxval), in every mode; no gradient"),
    "categorical": (
    "Multinomial (tf.random.categorical, tf.compat.v1.multinomial) of per-sample logits "
    "[batch, classes] (or constant ones whose rows are all equal: tf.zeros([batch, classes]), "
    "tf.zeros_like(x), a [classes] prior broadcast), or of a sample's k folded rows [batch * k, "
    "classes] (tf.reshape(logits, [-1, classes]) of [batch, k, classes]: ELECTRA's replacement "
    "tokens, each row drawn from its own logits), any num_samples, int64 or int32: each sample's classes drawn on the CS by "
    "TF's CPU rule (the inverse of the float64 CDF of exp(logits - max), non-finite logits "
    "never drawn) at its own uniform numbers, fresh every step and in every mode; no "
    "gradient (a REINFORCE policy's action)")}
REFUSED = {"random numbers": (
    "other than dropout masks and the draws above: numbers shared by the batch that meet "
    "values of the whole batch (a draw scaling the batch's loss) or that a per-sample op "
    "reads other than as a weight (a product's shared operand, an operand broadcast over the "
    "batch), shapes "
    "computed from values, stateless ops with a constant seed "
    "(tf.random.stateless_categorical too), integer draws of computed bounds or over the "
    "dtype's full range, shuffles, candidate samplers but the log-uniform, uniform and fixed "
    "unigram ones of tf.nn.nce_loss and sampled_softmax_loss (learned unigram and all-class "
    "samplers, a unigram vocab_file, a sharded table, a sampler's draws read by other ops)")}


def is_random(op_type: str) -> bool:
    return op_type in RANDOM_OPS or op_type in CANDIDATE_SAMPLERS


def is_draw(op: tf.Operation) -> bool:
    """An op whose values the matcher starts from, as from an input: random numbers (the
    CS's draws, or a refusal naming the op), not Keras' seed arithmetic."""
    return op.type in RANDOM_OPS and op.type != "StatelessRandomGetKeyCounter"


def refusal(op_type: str) -> str:
    """Why the CS does not draw what an op of `op_type` (a random op not in DRAWS) draws."""
    if op_type in CANDIDATE_SAMPLERS:
        return ("a candidate sampler's classes, drawn for the whole batch, are read other than "
                "by tf.nn.sampled_softmax_loss or tf.nn.nce_loss: the CS draws them only "
                "there; use those losses or the full softmax "
                "(tf.nn.sparse_softmax_cross_entropy_with_logits)")
    if op_type == "StatelessMultinomial":
        return ("tf.random.stateless_categorical draws the same classes for the same seed at "
                "every step; the CS draws fresh ones each step: use tf.random.categorical")
    if op_type in GAMMA_OPS:
        return ("draws from a gamma distribution (tf.random.gamma; a Beta as the ratio of two "
                "gammas, mixup's lambda): the CS has no gamma sampler; draw it in input_fn "
                "(np.random.gamma, or mixup's lambda as np.random.beta(alpha, alpha)) and "
                "yield it with the batch")
    return (f"draws a shuffle or integers over their dtype's full range: the CS draws floats, "
            f"integers in [minval, maxval) and each sample's classes (tf.random.categorical); "
            f"{USE_INSTEAD}")


# Products reading a weight (a kernel, a filter) after the samples' operand.
WEIGHT_OPERAND_OPS = {"MatMul", "BatchMatMulV2", "BatchMatMulV3", "Conv2D", "Conv3D",
                      "DepthwiseConv2dNative"}
BATCHED_PRODUCTS = {"BatchMatMulV2", "BatchMatMulV3"}


def noise_on_weights(graph: tf.Graph, sources: list[tf.Tensor], targets: list[tf.Tensor],
                     batch_size: int) -> set[tf.Operation]:
    """The draws the weight program draws (`weight_draws`), the data flow from `sources`
    and the draws of shapes computed at run time to `targets` telling where the samples
    are."""
    draws = [op for op in graph.get_operations() if is_draw(op)]
    static = [op for op in draws if op.type in DRAWS and op.type not in INTEGER_BOUNDS
              and op.outputs[0].shape.is_fully_defined()]  # (the weight program's are floats)
    if not static:
        return set()
    flow = data_flow_ops(graph, sources + [op.outputs[0] for op in draws if op not in static],
                         targets)
    return weight_draws(static, set(flow), batch_size)


def weight_draws(draws: list[tf.Operation], flow: set[tf.Operation],
                 batch_size: int) -> set[tf.Operation]:
    """Numbers shared by the batch, which the weight program draws once a step: the draws
    whose every value the samples' ops (`flow`, found without them) read is computed from a
    variable too (noise on weights), or is read as a weight is (`_read_as_weight`: a
    product's shared operand, or broadcast over the batch: a drawn phase or bias added to
    every sample, a mask of noise_shape [1, d], a drawn scale or temperature). One whose
    first axis is a multiple of the batch (per-sample numbers, or folded rows of them,
    unless proven otherwise) must meet the samples, each time read as a weight: a [16, 4]
    kernel's eps at a batch of 8, a bias's of as many units as the batch."""
    found = set()
    for draw in draws:
        shape = draw.outputs[0].shape
        per_sample = shape.rank > 0 and shape[0] % batch_size == 0
        stack, seen, weighted, met = [draw.outputs[0]], set(), True, False
        while stack and weighted:
            tensor = stack.pop()
            for reader in tensor.consumers():
                if reader in flow:
                    met = True
                    as_weight = _read_as_weight(tensor, reader, batch_size)
                    weighted = as_weight or not per_sample and depends_on(
                        tensor, VARIABLE_OPS, SHAPE_OPS | set(DRAWS)) is not None
                    # (a seed generator's state is no weight)
                elif reader not in seen and reader.type not in SHAPE_OPS:
                    seen.add(reader)
                    stack.extend(reader.outputs)
                if not weighted:
                    break
        if weighted and (met or not per_sample):
            found.add(draw)
    return found


def _read_as_weight(tensor: tf.Tensor, reader: tf.Operation, batch_size: int) -> bool:
    """Whether a per-sample op reads `tensor` as a weight: a product's shared operand
    (`_product_weight`), or an operand broadcast over the batch: TF aligns its last axes
    with the output's, and it has none, or 1, where the output has its first axis of a
    multiple of the batch's size (the batch, folded rows of it; a stack's [K, B, ...] the
    second)."""
    if reader.type in WEIGHT_OPERAND_OPS or reader.type == "Einsum":
        return _product_weight(tensor, reader)
    if reader.type in ("GatherV2", "GatherNd") and reader.get_attr("batch_dims") > 0:
        return False  # each sample's own indices (an MAE's argsort of its noise), no broadcast
    out = reader.outputs[0].shape if reader.outputs else tf.TensorShape(None)
    if out.rank is None or tensor.shape.rank is None or tensor.shape.rank > out.rank or \
            not out.is_fully_defined() or not tensor.shape.is_fully_defined():
        return False
    batch = next((axis for axis, d in enumerate(out) if d % batch_size == 0), None)
    lead = out.rank - tensor.shape.rank  # (the output's axes `tensor` lacks)
    return batch is not None and all(d == 1 for d in tensor.shape[:max(batch + 1 - lead, 0)])


def _product_weight(tensor: tf.Tensor, reader: tf.Operation) -> bool:
    """Whether a product reads `tensor` as its weight, shared by the batch: a kernel or
    filter (not the product's first operand), or an einsum operand whose term lacks the
    output's first letter (the batch: x @ tf.random.normal([d, m]) as
    tf.einsum('bnd,dm->bnm', x, w), whatever d equals). A batched matmul's second operand
    of its output's rank pairs its first axis with the batch's: no weight."""
    if reader.type in WEIGHT_OPERAND_OPS:
        return reader.inputs[0].name != tensor.name and (
            reader.type not in BATCHED_PRODUCTS or tensor.shape.rank is not None and
            tensor.shape.rank < reader.outputs[0].shape.rank)
    if reader.type != "Einsum":
        return False
    lhs, _, out = reader.get_attr("equation").decode().replace(" ", "").partition("->")
    terms = lhs.split(",")
    return bool(out) and len(terms) == len(reader.inputs) and all(
        out[0] not in term for term, t in zip(terms, reader.inputs) if t.name == tensor.name)


HOST_READS_NOISE = ("a value the host computes (a prediction or metric) reads the weights drawn "
                    "from it: the CS draws them once a batch and the host would draw its own; "
                    "output values of the samples computed from the drawn weights (x @ w) or "
                    "the weights' mean and scale")


def drawn(operands: Operands, op: tf.Operation) -> tuple[str, tuple[int, ...]] | str:
    """(distribution, shape) of the raw numbers a draw of DRAWS takes, or why the CS does
    not draw them."""
    value = operands.constant(op.inputs[0])
    if value is None:
        return f"the shape of its random numbers is computed from values: {USE_INSTEAD}"
    if op.type.startswith("Stateless"):
        seed = op.inputs[1]
        if seed.op.type == "StatelessRandomGetKeyCounter":
            seed = seed.op.inputs[0]
        if operands.constant(seed) is not None:
            return ("a stateless random op with a constant seed draws the same numbers at every "
                    "step; the CS draws fresh ones each step: use tf.random.normal, "
                    "truncated_normal or uniform (or Keras' GaussianNoise)")
    return DRAWS[op.type], tuple(int(d) for d in np.atleast_1d(value)) if np.ndim(value) else ()


@generic(*DRAWS)
def _draw(m: Context, op: tf.Operation) -> str:
    found = drawn(m.operands, op)
    if isinstance(found, str):
        return found
    distribution, shape = found
    rows = shape[0] // m.batch_size if shape and shape[0] % m.batch_size == 0 else 0
    # (rank 3 and more: a [K, B] draw's second axis is too often a sample's width equal to
    # the batch by chance, as a Dense(8)'s at batch 8)
    stacked = rows != 1 and rows not in m.fold_factors and len(shape) >= 3 and \
        shape[1] == m.batch_size
    if not shape or (rows != 1 and rows not in m.fold_factors and not stacked):
        return (f"draws random numbers of shape {shape}, not one set per sample, that meet "
                f"values other than as a weight (shared by the batch of {m.batch_size}): the "
                f"CS draws numbers without the batch axis only where the samples read them "
                f"as weights (noise on weights w = mu + sigma * eps, a projection x @ "
                f"tf.random.normal([d, m]) read by a matmul, einsum or conv, a bias, mask or "
                f"scale broadcast over the batch: x + b, x * eps); {USE_INSTEAD}")
    # [B*k, ...] where values are folded k rows a sample (folded_batch.py): each sample's k
    # rows of numbers its own (k, ...), one number an element as TF's
    # [K, B, ...]: K sets a sample stacked in front of the batch (a VIB's or IWAE's K Monte
    # Carlo samples): each sample's own (K, ...), held stack-first (leading_stack.py)
    per_sample = shape[1:] if rows == 1 else (shape[0], *shape[2:]) if stacked else \
        (rows, *shape[1:])
    if stacked:
        m.leading.add(op.outputs[0].name)
    attrs: dict[str, object] = {"distribution": distribution, "shape": list(per_sample)}
    if stacked:
        attrs["batch_axis"] = 1  # (TF's [K, B, ...]: read by tests replaying TF's draws)
    if op.type in INTEGER_BOUNDS:
        bounds = integer_bounds(m.operands, op)
        if isinstance(bounds, str):
            return bounds
        attrs.update(minval=bounds[0], maxval=bounds[1], output=op.outputs[0].dtype.name)
    m.add_kernel(op.name, "random", [m.sample_input()], attrs, [], [op], op.outputs[0],
                 output_shape=per_sample)
    return ""


def integer_bounds(operands: Operands, op: tf.Operation) -> tuple[int, int] | str:
    """An integer draw's constant (minval, maxval), or why the CS does not draw it."""
    low, high = (operands.constant(op.inputs[i]) for i in INTEGER_BOUNDS[op.type])
    if low is None or high is None or np.ndim(low) or np.ndim(high):
        return ("draws integers between bounds computed at run time (or not scalars): the CS "
                "draws integers in constant bounds; give tf.random.uniform a constant minval "
                "and maxval")
    if int(low) >= int(high):
        return (f"draws integers in [{int(low)}, {int(high)}), an empty range (TF fails at run "
                f"time): give tf.random.uniform minval < maxval")
    return int(low), int(high)


@generic("Multinomial")
def _categorical(m: Context, op: tf.Operation) -> str:
    """tf.random.categorical of per-sample logits [batch, classes] (or [batch * k, classes],
    a sample's k folded rows: the kernel draws for each), or of a constant [batch, classes]
    whose rows are all equal (`equal_rows`)."""
    count = m.operands.constant(op.inputs[1])
    logits: tf.Tensor | str = op.inputs[0]
    if not m.is_batched(op.inputs[0]):
        row = equal_rows(m, op.inputs[0])
        if row is None:
            return ("draws classes from logits that are not one row per sample (shared by the "
                    "batch, a weight's, or a constant whose rows differ): the CS draws each "
                    "sample's classes from its own logits; give tf.random.categorical logits "
                    "of shape [batch, classes] computed from the samples, or every row the "
                    "same (tf.zeros([batch, classes]))")
        logits = m.add_kernel(f"{op.name}/logits", "sample_constant", [m.sample_input()],
                              {"value": np.repeat(row[None], m.batch_size, 0)}, [], [op], None,
                              output_shape=row.shape).name
    if count is None:
        return "tf.random.categorical with num_samples computed at run time: the CS needs a constant"
    m.add_kernel(op.name, "categorical", [logits],
                 {"num_samples": int(count), "output": op.get_attr("output_dtype").name}, [],
                 [op], op.outputs[0])
    return ""


def equal_rows(m: Context, logits: tf.Tensor) -> np.ndarray | None:
    """The one row (classes,) of constant float32 logits [batch, classes] whose rows are all
    equal (tf.zeros([batch, C]), tf.fill, a [C] constant broadcast, tf.zeros_like of a
    per-sample value), else None. Each sample's draw from it has the distribution TF's has,
    whatever the rows mean; a constant whose rows differ is no sample's own row."""
    value = m.operands.shaped_constant(logits)
    if value is None or logits.dtype != tf.float32 or value.ndim != 2 or \
            value.shape[0] != m.batch_size or not (value == value[:1]).all():
        return None
    return np.asarray(value[0], np.float32)
