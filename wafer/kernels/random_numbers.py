"""The `random` kernel: random numbers drawn on the CS, one set per sample (tf.random.normal,
truncated_normal, uniform and their stateless forms: a VAE's reparameterisation, Keras'
GaussianNoise and GaussianDropout), as the raw draws of TF's op (standard normal, normal
truncated to |z| < 2, uniform in [0, 1)); the graph's scale and shift are kernels after it.
Integers (tf.random.uniform of an int dtype: a DDPM's timestep per sample) are drawn as TF's
op returns them, uniform in [minval, maxval).
A `random` kernel with no input is the weight program's (wafer.weight_programs): one draw of
`shape` for a batch of one, once a step, that every micro-batch's kernels read through the
weights computed from it (Bayes by backprop's w = mu + softplus(rho) * eps).
The `categorical` kernel: tf.random.categorical's classes drawn from each sample's logits.

The CS draws its own numbers (TF's Philox stream is not the contract): the region's stream
of the step (`RunContext.rng`, made by the executor from the program's seed, the region's
position and the global step; in evaluation and prediction from the batch's index too).
Each value is drawn in sample order from that stream, so micro-batches of any size and
replicas draw what one whole batch draws.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from wafer.kernels.base import INTEGER_NAMES, KernelError, RunContext, check_dtypes, is_int, register
from wafer.kernels.draw_replay import replay_of
from wafer.kernels.structure import Elementwise

DISTRIBUTIONS = ("normal", "truncated_normal", "uniform", "uniform_int")
# TF's TruncatedNormal keeps the standard normal values with |z| below this, redrawing others.
TRUNCATE = 2.0


def integers(rng: np.random.Generator, low: int, high: int, shape: tuple[int, ...]) -> np.ndarray:
    """`shape` int64 values uniform in [low, high): one 64-bit number of `rng` each, reduced
    modulo high - low (as TF's CPU kernel reduces its random bits; the bias, (high - low) /
    2^64, is below any test's resolution)."""
    raw = rng.bit_generator.random_raw(math.prod(shape))
    offsets = np.asarray(raw % np.uint64(high - low)).astype(np.int64)  # (wraps beyond 2^63)
    return (np.int64(low) + offsets).reshape(shape)


def draw(rng: np.random.Generator, distribution: str, shape: tuple[int, ...]) -> np.ndarray:
    """`shape` float32 values of `distribution` (not uniform_int: `integers`), taken from
    `rng` value after value (the truncated normal redraws only what it rejected, so the
    stream is used as a draw of one value at a time would use it)."""
    if distribution == "uniform":
        return rng.random(shape, dtype=np.float32)
    values = rng.standard_normal(shape, dtype=np.float32)
    if distribution == "normal":
        return values
    flat = values.reshape(-1)
    kept = flat[np.abs(flat) < TRUNCATE]
    while kept.size < flat.size:
        more = rng.standard_normal(flat.size - kept.size, dtype=np.float32)
        kept = np.concatenate([kept, more[np.abs(more) < TRUNCATE]])
    return kept.reshape(shape)


@register
class RandomNumbers(Elementwise):
    """attrs distribution (DISTRIBUTIONS), shape (per sample); uniform_int also minval <
    maxval and output (int32 or int64, TF's dtype), its values in [minval, maxval). Its one
    input is any value of the micro-batch (it reads only its number of samples) and takes no
    gradient; with none it draws for a batch of one (the weight program's draw). Draws in
    training, evaluation and prediction alike, as TF's op does in every mode."""

    type_name = "random"
    draws_random = True
    draws_in_inference = True

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]):
        super().__init__(name, attrs, input_shapes)
        self.distribution = str(self.attrs.get("distribution", ""))
        self.shape = tuple(int(d) for d in self.attrs.get("shape", ()))
        if len(self.input_shapes) > 1 or self.distribution not in DISTRIBUTIONS or \
                any(d < 0 for d in self.shape):
            raise KernelError(f"kernel {name!r}: random takes 0 or 1 input, a distribution among "
                              f"{', '.join(DISTRIBUTIONS)} and a shape, got "
                              f"{len(self.input_shapes)} inputs, {self.distribution!r}, {self.shape}")
        self.bounds: tuple[int, int] | None = None
        self.output = "float32"
        if self.distribution == "uniform_int":
            low, high, output = (self.attrs.get(k) for k in ("minval", "maxval", "output"))
            if not is_int(low) or not is_int(high) or low >= high or output not in INTEGER_NAMES:
                raise KernelError(f"kernel {name!r}: random of uniform_int takes integers minval < "
                                  f"maxval and output {' or '.join(INTEGER_NAMES)}, got {low!r}, "
                                  f"{high!r}, {output!r}")
            info = np.iinfo(output)
            if low < info.min or high - 1 > info.max:
                raise KernelError(f"kernel {name!r}: minval {low} and maxval {high} exceed {output}")
            self.bounds, self.output = (low, high), output

    @property
    def output_shape(self):
        return self.shape

    def flops_per_sample(self) -> float:
        return float(max(math.prod(self.shape), 1))

    def output_dtype(self, input_dtypes):
        return np.dtype(self.output)  # whatever the input it reads the size of

    def input_differentiable(self, index: int) -> bool:
        return False

    def forward(self, params, inputs, ctx: RunContext):
        shape = (inputs[0].shape[0] if inputs else 1, *self.shape)
        replayed = replay_of(self.name, shape)
        if replayed is not None:
            return np.asarray(replayed).reshape(shape).astype(self.output), None
        assert ctx.rng is not None, "the pipeline gives a drawing region its random stream"
        if self.bounds is not None:
            return integers(ctx.rng, *self.bounds, shape).astype(self.output), None
        return draw(ctx.rng, self.distribution, shape), None

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        return [None] * len(self.input_shapes), {}


def categories(rng: np.random.Generator, logits: np.ndarray, count: int) -> np.ndarray:
    """`count` classes for each row of `logits` (samples, classes), as TF's CPU Multinomial
    kernel draws them: the unnormalised CDF of exp(logit - the row's largest finite logit)
    in float64, non-finite logits given probability 0, and for each draw the first class
    whose CDF exceeds u times the total, u uniform in [0, 1) (float64: one value of `rng` per
    draw, the rows' draws in sample order)."""
    wide = logits.astype(np.float64)
    finite = np.isfinite(wide)
    largest = np.where(finite, wide, -np.inf).max(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", over="ignore"):
        weights = np.where(finite, np.exp(wide - largest), 0.0)
    cdf = np.cumsum(weights, axis=1)
    wanted = rng.random((len(logits), count)) * cdf[:, -1:]
    return (cdf[:, None, :] <= wanted[:, :, None]).sum(axis=2)  # std::upper_bound


@register
class Categorical(Elementwise):
    """tf.random.categorical(logits, num_samples) (Multinomial) of per-sample logits
    (classes,), or (k, classes) for a sample's k folded rows (folded_batch.py: logits [B*k,
    classes]): attrs num_samples, output (int32 or int64, TF's output_dtype); output
    (num_samples,), or (k, num_samples), classes drawn from the region's stream
    (`categories`, the rows in sample order), in every mode as TF's op. The logits take no
    gradient (TF registers none)."""

    type_name = "categorical"
    draws_random = True
    draws_in_inference = True

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]):
        super().__init__(name, attrs, input_shapes)
        count, output = self.attrs.get("num_samples"), self.attrs.get("output", "int64")
        if len(self.input_shapes) != 1 or len(self.input_shapes[0]) not in (1, 2) or \
                not is_int(count) or count < 1 or output not in INTEGER_NAMES:
            raise KernelError(f"kernel {name!r}: categorical takes 1 input of logits (classes,) "
                              f"or (rows, classes), "
                              f"num_samples >= 1 and output {' or '.join(INTEGER_NAMES)}, got "
                              f"shapes {self.input_shapes}, {count!r}, {output!r}")
        self.count: int = count
        self.output: str = output

    @property
    def output_shape(self):
        return (*self.input_shapes[0][:-1], self.count)

    def flops_per_sample(self) -> float:
        return float(math.prod(self.input_shapes[0]) * (3 + self.count))

    def output_dtype(self, input_dtypes):
        check_dtypes(self, input_dtypes, [(np.float32,)])
        return np.dtype(self.output)

    def input_differentiable(self, index: int) -> bool:
        return False

    def forward(self, params, inputs, ctx: RunContext):
        shape = (inputs[0].shape[0], *self.output_shape)
        replayed = replay_of(self.name, shape)
        if replayed is not None:
            return np.asarray(replayed).reshape(shape).astype(self.output), None
        assert ctx.rng is not None, "the pipeline gives a drawing region its random stream"
        rows = inputs[0].reshape(-1, inputs[0].shape[-1])  # (each sample's rows in order)
        return categories(ctx.rng, rows, self.count).reshape(shape).astype(self.output), None

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        return [None], {}
