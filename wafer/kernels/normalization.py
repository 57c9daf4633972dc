"""Batch normalisation: with moving statistics (inference), a per-channel affine map of the
last axis, so each sample is computed on its own; with the statistics of the whole batch
(training), a batch barrier."""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from wafer.kernels.base import Kernel, KernelError, RunContext, Shape, accumulate, max_cores_for, register

_ONE = np.float32(1)


class _BatchNorm(Kernel):
    """What both batch normalisations take: 1 input with channels last, a number attr
    epsilon >= 0 and bool attrs scale, center (the optional weights) and fused
    (FusedBatchNormV3's order)."""

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]):
        super().__init__(name, attrs, input_shapes)
        flags = {k: self.attrs.get(k, default) for k, default in
                 (("scale", True), ("center", True), ("fused", False))}
        eps = self.attrs.get("epsilon")
        if len(self.input_shapes) != 1 or not self.input_shapes[0] or \
                any(not isinstance(f, bool) for f in flags.values()) or \
                isinstance(eps, bool) or not isinstance(eps, (int, float)) or \
                not (math.isfinite(eps) and eps >= 0):
            raise KernelError(f"kernel {name!r} ({self.type_name}): takes 1 input with "
                              f"channels last, a number attr epsilon >= 0 and bool attrs scale, "
                              f"center, fused, got inputs {self.input_shapes}, epsilon {eps!r}, "
                              f"{flags}")
        self.scale, self.center, self.fused = flags["scale"], flags["center"], flags["fused"]
        self.eps = np.float32(eps)
        self.channels = self.input_shapes[0][-1]

    @property
    def output_shape(self):
        return self.input_shapes[0]

    def max_cores(self) -> int:
        return max_cores_for(self.flops_per_sample())


@register
class BatchNormInference(_BatchNorm):
    """x (..., C) with the frozen weights mean and variance (C,), optional scale (attr
    scale) and offset (attr center), attr epsilon, in TF's order:
      tf.nn.batch_normalization (Keras' BatchNormalization):
        inv = rsqrt(variance + epsilon) [* scale];  y = x * inv + (offset - mean * inv)
      FusedBatchNormV3 with is_training false (attr fused):
        y = (x - mean) * (rsqrt(variance + epsilon) [* scale]) + offset
    Gradients (TF's, of the ops above): x gets g * inv; scale
    (sum(g x) - sum(g) mean) rsqrt(...) or, fused, sum(g (x - mean)) rsqrt(...); offset
    sum(g). mean and variance are moving statistics: they take no gradient."""

    type_name = "batch_norm_inference"

    def param_shapes(self):
        roles = ["mean", "variance"] + ["scale"] * self.scale + ["offset"] * self.center
        return {role: (self.channels,) for role in roles}

    def flops_per_sample(self) -> float:
        return 2.0 * math.prod(self.input_shapes[0])  # a multiply-add per value

    def activation_bytes_per_sample(self) -> int:
        return 4 * math.prod(self.input_shapes[0]) if self.scale else 0  # x, for scale's gradient

    def _factors(self, params) -> tuple[np.ndarray, np.ndarray]:
        """(rsqrt(variance + epsilon), inv = that [* scale])."""
        r = _ONE / np.sqrt(params["variance"] + self.eps)
        return r, (r * params["scale"] if self.scale else r)

    def forward(self, params, inputs, ctx: RunContext):
        x = inputs[0]
        r, inv = self._factors(params)
        if self.fused:
            y = (x - params["mean"]) * inv
            if self.center:
                y += params["offset"]
        else:
            shift = -(params["mean"] * inv)
            if self.center:
                shift = params["offset"] - params["mean"] * inv
            y = x * inv + shift
        return y, x if self.scale else None

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        g = grad_output
        r, inv = self._factors(params)
        rows = tuple(range(g.ndim - 1))
        grads: dict[str, np.ndarray] = {}
        g_sum = g.sum(axis=rows, dtype=np.float32)
        if self.scale:
            x = cache
            if self.fused:
                d_inv = (g * (x - params["mean"])).sum(axis=rows, dtype=np.float32)
            else:
                d_inv = (g * x).sum(axis=rows, dtype=np.float32) - g_sum * params["mean"]
            accumulate(param_grads, "scale", d_inv * r, grads, ctx)
        if self.center:
            accumulate(param_grads, "offset", g_sum, grads, ctx)
        dx = g * inv if ctx.wants_grad(0) else None
        return [dx], grads


def column_sum(x: np.ndarray) -> np.ndarray:
    """The float32 sums of x's columns (R, C) in TF's CPU order (Eigen's reduction of the first
    axis: TF's Sum and Mean over every axis but the last; bit-equal, tests/wafer): the columns
    of whole 8-wide packets, from 16 rows on, into 4 accumulators taking rows j, j + 1, j + 2,
    j + 3 in turn, combined ((a0 + a1) + a2) + a3, then the rows left over; the other columns
    one row after another."""
    rows, cols = x.shape
    packed = cols // 8 * 8 if rows >= 16 else 0
    unrolled = rows // 4 * 4 if packed else 0
    total = np.empty(cols, np.float32)
    if packed:
        lanes = [_in_turn(x[a:unrolled:4, :packed]) for a in range(4)]
        total[:packed] = ((lanes[0] + lanes[1]) + lanes[2]) + lanes[3]
        total[:packed] = _in_turn(np.concatenate([total[None, :packed], x[unrolled:, :packed]]))
    total[packed:] = _in_turn(x[:, packed:])
    return total


def _in_turn(x: np.ndarray) -> np.ndarray:
    """x's rows added one after another (a cumulative sum: never numpy's pairwise order)."""
    if not x.shape[0]:
        return np.zeros(x.shape[1], np.float32)
    return np.cumsum(x, axis=0, dtype=np.float32)[-1]


# How a moving statistic follows the batch's (attrs mean_rule, variance_rule): Keras' and the usual
# hand-written `v.assign(v * a + s * b)`, or tf.compat.v1's assign_moving_average,
# `v.assign_sub((v - s) * d)`.
MOVING_UPDATES = ("affine", "delta")


@register
class BatchNormTraining(_BatchNorm):
    """Batch normalisation with the statistics of the whole batch (training), as
    tf.nn.moments + tf.nn.batch_normalization compute it (Keras 3's BatchNormalization with
    training=True): over every axis but the last,
        mean = mean(x);  variance = mean((x - mean)^2)   (the biased estimator)
        inv = rsqrt(variance + epsilon) [* scale];  y = x * inv + (offset - mean * inv)
    or, attr fused, as FusedBatchNormV3 with is_training: y = (x - mean) * inv + offset,
    and the variance its moving statistic follows is its batch_variance output, Bessel's
    correction of the biased one: variance * (n / (n - 1)), n the batch's values per
    channel (the normalisation itself uses the biased variance).
    Keras' ops are computed as TF's CPU kernels compute them (bit-equal but for Rsqrt, which
    Eigen computes with the CPU's approximate rsqrt and a Newton step: 1/sqrt here), their
    gradients in the order of TF's gradient graph: its sums over the batch `column_sum`s,
        d_inv = sum(x g) + (-sum(g)) mean;  d_variance = -0.5 r^2 (r (d_inv [* scale]))
        dx = (g inv + 2 (d_variance / N) (x - mean)) + (-sum(g)) inv / N
        scale d_inv r; offset sum(g)   (N the batch's values per channel, r = rsqrt(..))
    which a float16 model (mixed_float16: float32 between a float16 input and output, TF's
    graph too) needs: its gradients amplify float32 ULPs into float16 roundings. Fused, the
    gradients are the closed form, xhat = (x - mean) r:
        dx = inv (g - sum(g) / N - xhat sum(g xhat) / N); scale sum(g (x - mean)) r.
    A batch barrier (`batch_barrier`): the executor hands it the whole batch's input before
    any micro-batch's forward (`batch_statistics`) and every micro-batch's output gradient
    before any backward (`gradient_statistics`); each micro-batch then reads them from
    ctx.batch. With attrs mean_update / variance_update (the constants of mean_rule /
    variance_rule, empty: none) the training batch also moves the frozen weights moving_mean / moving_variance,
    as the train_op's assign ops do."""

    type_name = "batch_norm_training"
    batch_barrier = True

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]):
        super().__init__(name, attrs, input_shapes)
        self.kinds = {stat: self.attrs.get(f"{stat}_rule", "affine") for stat in ("mean", "variance")}
        self.rules = {stat: [float(c) for c in self.attrs.get(f"{stat}_update", [])]
                      for stat in ("mean", "variance")}
        sizes = {"affine": 2, "delta": 1}
        if any(kind not in sizes for kind in self.kinds.values()) or \
                any(len(r) not in (0, sizes[self.kinds[s]]) or not all(map(math.isfinite, r))
                    for s, r in self.rules.items()):
            raise KernelError(f"kernel {name!r} (batch_norm_training): takes mean_rule and "
                              f"variance_rule one of {', '.join(MOVING_UPDATES)} with mean_update "
                              f"and variance_update their constants (or none), got rules "
                              f"{self.kinds} {self.rules}")

    def param_shapes(self):
        roles = ["scale"] * self.scale + ["offset"] * self.center + \
            [f"moving_{stat}" for stat, rule in self.rules.items() if rule]
        return {role: (self.channels,) for role in roles}

    def flops_per_sample(self) -> float:
        return 6.0 * math.prod(self.input_shapes[0])  # moments (3), normalise (2), ~1 more

    def activation_bytes_per_sample(self) -> int:
        return 4 * math.prod(self.input_shapes[0])  # x, until the statistics are known

    # ---- the batch barrier ----
    def batch_statistics(self, params, inputs: Sequence[np.ndarray], ctx: RunContext):
        """(mean, variance, r = rsqrt(variance + eps), inv = r [* scale]) of the whole
        batch of x; a training batch moves the moving statistics (once: not in a replay)."""
        x = inputs[0]
        count = np.float32(x.size // self.channels)
        mean = column_sum(x.reshape(-1, self.channels)) / count
        variance = column_sum(np.square(x - mean).reshape(-1, self.channels)) / count
        r = _ONE / np.sqrt(variance + self.eps)
        inv = r * params["scale"] if self.scale else r
        if ctx.training and not ctx.replay:
            batch_variance = variance
            if self.fused:  # FusedBatchNormV3's batch_variance output: Bessel's correction
                with np.errstate(divide="ignore"):
                    batch_variance = variance * (count / (count - _ONE))
            for stat, value in (("mean", mean), ("variance", batch_variance)):
                rule = [np.float32(c) for c in self.rules[stat]]
                if not rule:
                    continue
                moving = params[f"moving_{stat}"]
                if self.kinds[stat] == "affine":
                    moving[...] = moving * rule[0] + value * rule[1]
                else:
                    moving -= (moving - value) * rule[0]
        return mean, variance, r, inv

    def gradient_statistics(self, params, caches: Sequence[Any], grads: Sequence[np.ndarray],
                            ctx: RunContext):
        """From the whole batch (every micro-batch's output gradient `grads` with its forward
        cache): (a, b), dx = (g inv + a (x - mean)) + b, and the gradients of scale and
        offset by role (taken by the first micro-batch's backward). RsqrtGrad's d_variance
        is 0 where its d_r is (TF's mul_no_nan)."""
        mean, _, r, inv = ctx.batch[0]
        x = np.concatenate(caches).reshape(-1, self.channels)
        g = np.concatenate(grads).reshape(-1, self.channels)
        count = np.float32(x.shape[0])
        g_sum = column_sum(g)
        if self.fused:
            gx_mean = column_sum(g * ((x - mean) * r)) / count
            return (-(inv * r * gx_mean), -(inv * (g_sum / count)),
                    self._weight_grads(column_sum(g * (x - mean)) * r, g_sum))
        d_inv = column_sum(x * g) + (-g_sum) * mean
        d_r = d_inv * params["scale"] if self.scale else d_inv
        d_variance = np.where(d_r == 0, np.float32(0), (np.float32(-0.5) * (r * r)) * (r * d_r))
        return (np.float32(2) * (d_variance / count), ((-g_sum) * inv) / count,
                self._weight_grads(d_inv * r, g_sum))

    def _weight_grads(self, scale: np.ndarray, offset: np.ndarray) -> dict[str, np.ndarray]:
        return {role: value for role, value in (("scale", scale), ("offset", offset))
                if role in self.param_shapes()}

    # ---- one micro-batch ----
    def forward(self, params, inputs, ctx: RunContext):
        x = inputs[0]
        mean, _, _, inv = ctx.batch[0]
        if self.fused:
            y = (x - mean) * inv
            return (y + params["offset"] if self.center else y), x
        shift = params["offset"] - mean * inv if self.center else -(mean * inv)
        return x * inv + shift, x

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        """dx = (g inv + a (x - mean)) + b (`gradient_statistics`); scale's and offset's
        gradients are the whole batch's, handed over by the first micro-batch's call."""
        x, g = cache, grad_output
        mean, _, _, inv = ctx.batch[0]
        a, b, pending = ctx.batch[1]
        grads: dict[str, np.ndarray] = {}
        for role in self._weight_grads(inv, inv):
            accumulate(param_grads, role, pending.pop(role, np.zeros(self.channels, np.float32)),
                       grads, ctx)
        dx = None
        if ctx.wants_grad(0):
            dx = (g * inv + a * (x - mean)) + b
        return [dx], grads
