"""The `sampled_logits` kernel: tf.nn.sampled_softmax_loss's and tf.nn.nce_loss's logits
(TF's _compute_sampled_logits). Once a step (in evaluation and prediction once a batch) it
draws num_sampled class ids for the whole batch as TF's candidate sampler does (log-uniform
or uniform over range_max classes; unique: rejection until num_sampled distinct ids), and
gives each sample its true classes' logits x . w[label] + b[label] and the sampled classes'
x . w[id] + b[id], less the log of TF's expected counts, a sampled class equal to one of the
sample's labels (an accidental hit) given -FLT_MAX added. The table's and biases' gradients
are TF's IndexedSlices: the rows of the sample's labels, then those of the sampled ids.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from wafer.kernels import draw_replay, random_numbers
from wafer.kernels.base import (
    INTEGER,
    Kernel,
    KernelError,
    RunContext,
    Shape,
    check_dtypes,
    is_int,
    max_cores_for,
    register,
)
from wafer.kernels.embedding import check_indices, scatter_add

SAMPLERS = ("log_uniform", "uniform", "fixed_unigram")
HIT = np.float32(-np.finfo(np.float32).max)  # what TF adds to an accidental hit's logit


@dataclass(frozen=True)
class Classes:
    """A candidate sampler's distribution over [0, range_max), as TF's RangeSampler:
    log-uniform, uniform, or fixed unigram (`weights`: each class's float32 weight, TF's
    powf(unigram, distortion) after num_reserved_ids zeros)."""

    sampler: str
    range_max: int
    weights: np.ndarray | None = field(default=None, compare=False)
    total: np.float32 = np.float32(0)  # the weights' float32 sum, added in order (TF's)

    @staticmethod
    def of(attrs: Mapping[str, Any]) -> Classes:
        """The distribution a kernel's attrs name (fixed_unigram: unigrams, distortion and
        num_reserved_ids too)."""
        sampler, range_max = str(attrs.get("sampler")), int(attrs.get("range_max", 0))
        if sampler != "fixed_unigram":
            return Classes(sampler, range_max)
        unigrams = np.asarray(attrs.get("unigrams", ()), np.float32)
        distorted = np.power(unigrams, np.float32(attrs.get("distortion", 1.0)))
        reserved = np.zeros(int(attrs.get("num_reserved_ids", 0)), np.float32)
        weights = np.concatenate([reserved, distorted])
        total = np.add.accumulate(weights)[-1] if len(weights) else np.float32(0)
        return Classes(sampler, range_max, weights, np.float32(total))

    def probability(self, classes: np.ndarray) -> np.ndarray:
        """TF's Probability of each class, float32 as TF returns it (log-uniform: log((k + 2) /
        (k + 1)) / log(range_max + 1) in float64; fixed unigram: weight / the weights' float32
        sum, added in order)."""
        if self.sampler == "uniform":
            return np.full(np.shape(classes), np.float32(1) / np.float32(self.range_max),
                           np.float32)
        if self.weights is not None:
            return self.weights[np.asarray(classes)] / self.total
        k = np.asarray(classes, np.float64)
        return (np.log((k + 2.0) / (k + 1.0)) / np.log1p(float(self.range_max))).astype(np.float32)

    def candidates(self, rng: np.random.Generator, count: int) -> np.ndarray:
        """`count` classes as TF's samplers draw each: log-uniform int64(exp(u * log(range_max
        + 1))) - 1 modulo range_max, u a float64 uniform in [0, 1); uniform an integer in [0,
        range_max); fixed unigram a class of probability weight / total."""
        if self.sampler == "uniform":
            return random_numbers.integers(rng, 0, self.range_max, (count,))
        if self.weights is not None:  # (the inverse of the float64 CDF)
            cdf = np.cumsum(self.weights, dtype=np.float64)
            return np.searchsorted(cdf, rng.random(count) * cdf[-1], side="right").astype(np.int64)
        values = np.exp(rng.random(count) * np.log1p(float(self.range_max))).astype(np.int64) - 1
        return values % self.range_max

    def sample(self, rng: np.random.Generator, num_sampled: int,
               unique: bool) -> tuple[np.ndarray, int]:
        """(the sampled ids, the tries drawn): with `unique` draws are taken in order, a
        class already drawn rejected, until num_sampled distinct (TF's rejection)."""
        if not unique:
            return self.candidates(rng, num_sampled), num_sampled
        kept: list[int] = []
        seen: set[int] = set()
        tries = 0
        while len(kept) < num_sampled:
            for value in self.candidates(rng, 2 * num_sampled).tolist():
                tries += 1
                if value not in seen:
                    seen.add(value)
                    kept.append(value)
                    if len(kept) == num_sampled:
                        break
        return np.asarray(kept, np.int64), tries


def expected_count(p: np.ndarray, num_sampled: int, tries: int) -> np.ndarray:
    """TF's ExpectedCountHelper in float32: p * num_sampled when every try was kept (always
    without unique), else 1 - (1 - p)^tries as -expm1(tries * log1p(-p))."""
    p = np.asarray(p, np.float32)
    if tries == num_sampled:
        return p * np.float32(num_sampled)
    return -np.expm1(np.float32(tries) * np.log1p(-p))


@register
class SampledLogits(Kernel):
    """Inputs x (D,) float32 and the sample's labels (num_true,) int32/int64; params
    `weights` (range_max, D) and `biases` (range_max,); attrs sampler (SAMPLERS), num_sampled,
    num_true, range_max, unique, remove_accidental_hits (fixed_unigram: unigrams, distortion,
    num_reserved_ids, `Classes`). Output (num_true + num_sampled,): the true logits, then the
    sampled ones, each less log(expected count); an accidental hit adds HIT at the sampled
    id's last position (TF's ComputeAccidentalHits maps a repeated id to its last). The draw is the
    micro-batch at offset 0's (every micro-batch of the step reads it); the test seam
    (draw_replay.replayed_draws) hands it (num_sampled + 1,) int64: TF's ids and tries."""

    type_name = "sampled_logits"
    draws_random = True
    draws_in_inference = True

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]):
        super().__init__(name, attrs, input_shapes)
        sampler = attrs.get("sampler")
        sizes = tuple(attrs.get(k, 0) for k in ("num_sampled", "num_true", "range_max"))
        self.unique = bool(attrs.get("unique", True))
        self.remove_hits = bool(attrs.get("remove_accidental_hits", False))
        if sampler not in SAMPLERS or not all(is_int(n) and n > 0 for n in sizes) or \
                len(self.input_shapes) != 2 or len(self.input_shapes[0]) != 1 or \
                self.input_shapes[1] != (sizes[1],) or self.unique and int(sizes[0]) > int(sizes[2]):
            raise KernelError(f"kernel {name!r} (sampled_logits): takes x (D,), labels "
                              f"(num_true,), a sampler of {SAMPLERS} and num_sampled, num_true, "
                              f"range_max > 0 (num_sampled <= range_max if unique), got "
                              f"{self.input_shapes}, {sampler!r}, {sizes}")
        self.num_sampled, self.num_true, self.range_max = (int(n) for n in sizes)
        self.classes = Classes.of(attrs)
        weights = self.classes.weights
        if weights is not None and (len(weights) != self.range_max or not self.classes.total > 0
                                    or (weights < 0).any()):
            raise KernelError(f"kernel {name!r} (sampled_logits): fixed_unigram takes "
                              f"num_reserved_ids + len(unigrams) = range_max {self.range_max} "
                              f"non-negative weights of a positive sum, got {len(weights)}")
        self.dim = self.input_shapes[0][0]
        self.draw: tuple[np.ndarray, int] | None = None  # (ids, tries) of the step

    @property
    def output_shape(self):
        return (self.num_true + self.num_sampled,)

    def param_shapes(self):
        return {"weights": (self.range_max, self.dim), "biases": (self.range_max,)}

    def flops_per_sample(self) -> float:
        return float(2 * self.dim * (self.num_true + self.num_sampled))

    def max_cores(self) -> int:
        return max_cores_for(self.flops_per_sample())

    def activation_bytes_per_sample(self) -> int:
        return 4 * self.dim + 8 * self.num_true

    def output_dtype(self, input_dtypes):
        check_dtypes(self, input_dtypes, [(np.float32,), INTEGER])
        return np.dtype(np.float32)

    def input_differentiable(self, index: int) -> bool:
        return index == 0

    def _draw(self, ctx: RunContext) -> tuple[np.ndarray, int]:
        """The step's ids and tries: drawn by the first micro-batch, read by the others."""
        if ctx.offset == 0 and not ctx.replay or self.draw is None:
            shape = (self.num_sampled + 1,)
            replayed = draw_replay.replay_of(self.name, shape)
            if replayed is not None:
                values = np.asarray(replayed, np.int64).reshape(shape)
                self.draw = values[:-1], int(values[-1])
            else:
                assert ctx.rng is not None, "the pipeline gives a drawing region its random stream"
                self.draw = self.classes.sample(ctx.rng, self.num_sampled, self.unique)
        return self.draw

    def forward(self, params, inputs, ctx: RunContext):
        x, labels = inputs[0], np.asarray(inputs[1], np.int64)
        weights, biases = params["weights"], params["biases"]
        ids, tries = self._draw(ctx)
        check_indices(self, labels, self.range_max, "the table")
        true_w, sampled_w = weights[labels], weights[ids]
        true = (x[:, None, :] * true_w).sum(-1, dtype=np.float32) + biases[labels]
        sampled = x @ sampled_w.T + biases[ids]
        if self.remove_hits:  # (a repeated id's last position only: TF's id -> position map)
            last = np.zeros(len(ids), bool)
            last[len(ids) - 1 - np.unique(ids[::-1], return_index=True)[1]] = True
            hits = (labels[:, :, None] == ids[None, None, :]).any(1) & last
            sampled = np.where(hits, sampled + HIT, sampled)
        true = true - np.log(self.expected(labels, tries))
        sampled = sampled - np.log(self.expected(ids, tries))
        return np.concatenate([true, sampled], 1).astype(np.float32), (x, labels, ids)

    def expected(self, classes: np.ndarray, tries: int) -> np.ndarray:
        """TF's expected counts of `classes` in a draw of `tries` tries."""
        return expected_count(self.classes.probability(classes), self.num_sampled, tries)

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        x, labels, ids = cache
        weights = params["weights"]
        g_true, g_sampled = grad_output[:, :self.num_true], grad_output[:, self.num_true:]
        dx = None
        if ctx.wants_grad(0):
            dx = (g_true[:, :, None] * weights[labels]).sum(1, dtype=np.float32) + \
                g_sampled @ weights[ids]
        grads: dict[str, np.ndarray] = {}
        for role, (rows, values) in self._slices(x, labels, ids, grad_output).items():
            if param_grads is None:
                table = np.zeros(self.param_shapes()[role], np.float32)
            else:  # (the rows added into the accumulator; the batch's first overwrites)
                table = param_grads[role]
                if not ctx.accumulate:
                    table.fill(0)
            scatter_add(table, rows, values)
            grads[role] = table
        return [dx, None], grads

    def _slices(self, x, labels, ids, grad_output) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Each table's IndexedSlices for the micro-batch: the labels' rows in sample order,
        then the sampled ids' (summed over the micro-batch), as TF's gather gradients."""
        g_true, g_sampled = grad_output[:, :self.num_true], grad_output[:, self.num_true:]
        rows = np.concatenate([labels.reshape(-1), ids])
        true_w = (g_true[:, :, None] * x[:, None, :]).reshape(-1, self.dim)
        return {"weights": (rows, np.concatenate([true_w, g_sampled.T @ x]).astype(np.float32)),
                "biases": (rows, np.concatenate([g_true.reshape(-1), g_sampled.sum(0)]))}

    def table_slices(self, cache, grad_output: np.ndarray,
                     role: str = "weights") -> tuple[np.ndarray, np.ndarray]:
        x, labels, ids = cache
        return self._slices(x, labels, ids, grad_output)[role]

