"""The loss and cross entropy. The `loss` kernel is the batch reduction of any per-sample
tensor (the compiler proves the user's loss is such a sum); `softmax_cross_entropy_with_logits`
is TF's per-row op, one of the values feeding it."""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from wafer.kernels.base import INTEGER, Kernel, KernelError, RunContext, check_dtypes, max_cores_for, register
from wafer.schedules import Schedule, attr_programs, evaluate, programs_attr, schedule_problem

DIVISOR = "loss divisor"  # the hyper_parameter of a divisor's Schedule (what errors name)


def divisors_attr(programs: Sequence[Schedule]) -> str:
    """The `divisors` attr of a loss kernel (wafer.schedules.programs_attr)."""
    return programs_attr(programs)


def divisor_programs(text: str) -> list[Schedule]:
    """The divisors of a `divisors` attr (ValueError, TypeError: not one)."""
    return attr_programs(text, DIVISOR)


def sum_name(k: int) -> str:
    """The name of a divisor's `input` op reading the batch sum of denominator input k."""
    return f"S{k}"


@register
class SoftmaxCrossEntropyWithLogits(Kernel):
    """tf.nn.(sparse_)softmax_cross_entropy_with_logits, one value per row (not a loss):
    logits (..., k) with labels (..., k) float32, or with `sparse` integer labels (...);
    output (...). Arithmetic in the order of TF's CPU kernels (xent_op, sparse_xent_op):
    loss = sum(labels * (log(sum(exp(s))) - s)), s = logits - max; the gradient to the
    logits is g * (softmax - labels) and, dense, to the labels g * -log_softmax(logits)."""

    type_name = "softmax_cross_entropy_with_logits"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]):
        super().__init__(name, attrs, input_shapes)
        self.sparse = self.attrs.get("sparse", False)
        if not isinstance(self.sparse, bool) or len(self.input_shapes) != 2:
            raise KernelError(f"kernel {name!r} ({self.type_name}): takes (logits, labels) and "
                              f"a bool attr sparse, got {len(self.input_shapes)} inputs and "
                              f"sparse {self.sparse!r}")
        logits, labels = self.input_shapes
        expected = logits[:-1] if self.sparse else logits
        if not logits or labels != expected:
            raise KernelError(f"kernel {name!r} ({self.type_name}): logits {logits} need "
                              f"{'sparse ' if self.sparse else ''}labels {expected} "
                              f"(logits with a class axis), got {labels}")
        self.k = logits[-1]

    @property
    def output_shape(self):
        return self.input_shapes[0][:-1]

    def output_dtype(self, input_dtypes):
        check_dtypes(self, input_dtypes, [(np.float32,), INTEGER if self.sparse else (np.float32,)])
        return np.dtype(np.float32)

    def input_differentiable(self, index: int) -> bool:
        return index == 0 or not self.sparse

    def flops_per_sample(self) -> float:
        return float(6 * math.prod(self.input_shapes[0]))

    def max_cores(self) -> int:
        return max_cores_for(self.flops_per_sample())

    def activation_bytes_per_sample(self) -> int:
        return 4 * math.prod(self.input_shapes[0])  # the softmax gradient

    def rows(self, logits: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, ...]:
        """(loss, backprop = softmax - labels, shifted = logits - max, exp(shifted), its
        sum), in the order of TF's CPU kernel."""
        shifted = logits - logits.max(axis=-1, keepdims=True)
        exp = np.exp(shifted)
        sum_exp = exp.sum(axis=-1, keepdims=True)
        log_sum = np.log(sum_exp)
        if self.sparse:
            if labels.size and (labels.min() < 0 or labels.max() >= self.k):
                bad = labels[(labels < 0) | (labels >= self.k)].flat[0]
                raise ValueError(f"{self.name}: label {bad} is outside the {self.k} classes "
                                 f"[0, {self.k})")
            # the label's entries by index (numpy's float32 minus a one-hot bool array is a
            # slow mixed-type loop); the others' x - 0 was x
            rows = np.indices(labels.shape, sparse=True)
            at = (*rows, labels)
            loss = log_sum[..., 0] - shifted[at]
            backprop = exp / sum_exp
            backprop[at] -= np.float32(1)
        else:
            loss = (labels * (log_sum - shifted)).sum(axis=-1)
            backprop = exp / sum_exp - labels
        return loss, backprop, shifted - log_sum, exp, sum_exp

    def forward(self, params, inputs, ctx: RunContext):
        loss, backprop, log_softmax, _, _ = self.rows(*inputs)
        return loss, (backprop, None if self.sparse else log_softmax)

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        backprop, log_softmax = cache
        g = grad_output[..., None]
        d_labels = None
        if not self.sparse and ctx.wants_grad(1):
            d_labels = g * -log_softmax
        return [g * backprop if ctx.wants_grad(0) else None, d_labels], {}


@register
class BatchLoss(Kernel):
    """The loss: scale * the sum of its input over a sample, one value per sample, so the
    batch's values add up to scale * sum(T) (scale 1 / elements of the batch for a mean).
    Its backward takes no upstream gradient: scale, shaped like T.

    Divided by a value of the batch (tf.compat.v1.losses' default reduction with per-sample
    weights: sum(w * l) / count_nonzero(w), DivNoNan; MEAN's sum(w); a masked mean
    sum(l * mask) / tf.maximum(sum(mask), 1)): the inputs are T_1..T_n, then U_1..U_k;
    `divided_by[j]` names the divisor of T_j (-1: none), and divisor r is the scalar program
    `divisors[r]` (wafer.schedules' ops, as JSON: divisors_attr) of the batch sums
    S_k = sum(U_k) over the whole batch (its `input` ops named sum_name(k)), evaluated in
    float32 op by op as TF does; `div_no_nan[r]`: 0 where d_r is 0, else TF's x / 0. The U
    inputs depend on the program's inputs alone (the executor computes them ahead of the
    batch): `set_batch` takes them before the batch's first micro-batch, so each sample's
    value is scale * sum(T_j) / d_r and its seed scale / d_r, as TF's DivNoNan and its
    gradient.
    """

    type_name = "loss"
    is_loss = True

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]):
        super().__init__(name, attrs, input_shapes)
        scale = self.attrs.get("scale")
        divided_by = self.attrs.get("divided_by", [-1])
        no_nan = self.attrs.get("div_no_nan", [])
        n = len(divided_by) if isinstance(divided_by, list) else 0
        try:
            programs = divisor_programs(self.attrs.get("divisors", "[]"))
        except (ValueError, TypeError) as error:
            raise KernelError(f"kernel {name!r} (loss): divisors is not a list of scalar "
                              f"programs ({error})") from None
        sums = {sum_name(k) for k in range(len(self.input_shapes) - n)}
        problems = [f"divisor {r}: {schedule_problem(p) or 'reads an unknown sum'}"
                    for r, p in enumerate(programs) if schedule_problem(p) or
                    any(o.op in ("step", "variable") or (o.op == "input" and o.name not in sums)
                        for o in p.ops)]
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or \
                not math.isfinite(scale) or n < 1 or problems or \
                len(self.input_shapes) != n + len(sums) or (sums and not programs) or \
                any(not -1 <= r < len(programs) for r in divided_by) or \
                not isinstance(no_nan, list) or len(no_nan) != len(programs):
            raise KernelError(f"kernel {name!r} (loss): takes its per-sample values (one input, "
                              f"or one per entry of divided_by), then the inputs its divisors "
                              f"sum over the batch (divisors: scalar programs of their sums, "
                              f"div_no_nan a flag each) and a finite number attr scale, got "
                              f"{len(self.input_shapes)} inputs, scale {scale!r}, divided_by "
                              f"{divided_by!r}, {len(programs)} divisors"
                              + (f" ({problems[0]})" if problems else ""))
        self.scale = np.float32(scale)
        self.divided_by, self.programs = list(divided_by), programs
        self.no_nan = [bool(f) for f in no_nan]
        self.terms = n
        # loss scaling into a float16 backward: the gradient seeded with loss_scale x the
        # loss's (the optimizer divides it out); 1 for float32 programs (folded away)
        loss_scale = self.attrs.get("loss_scale", 1.0)
        if isinstance(loss_scale, bool) or not isinstance(loss_scale, (int, float)) or \
                not math.isfinite(loss_scale) or loss_scale <= 0:
            raise KernelError(f"kernel {name!r} (loss): loss_scale must be a positive finite "
                              f"number, got {loss_scale!r}")
        self.seed = np.float32(self.scale * np.float32(loss_scale))
        self.denominators = np.ones(len(programs), np.float32)  # this batch's (set_batch)

    @property
    def denominator_inputs(self) -> range:
        """The inputs the denominators sum over the batch (after the per-sample values)."""
        return range(self.terms, len(self.input_shapes))

    def set_loss_scale(self, loss_scale: np.float32) -> None:
        """Seed the next backward with this loss scale (dynamic loss scaling: per step)."""
        self.seed = np.float32(self.scale * np.float32(loss_scale))

    def set_batch(self, inputs: Sequence[np.ndarray]) -> None:
        """The batch's divisors from the whole batch's denominator inputs (in order): each
        summed exactly (float64, then rounded once to its dtype: TF's float32 sum of counts
        is exact below 2^24; integers exactly), then each divisor's program in float32."""
        sums = {sum_name(k): np.asarray(np.sum(u, dtype=np.int64 if u.dtype.kind in "iub" else np.float64))
                for k, u in enumerate(inputs)}
        self.denominators = np.array([evaluate(p, 0, sums) for p in self.programs], np.float32)

    def _divide(self, x: np.ndarray, r: int) -> np.ndarray:
        if r < 0:
            return x
        d = self.denominators[r]
        if d == 0 and self.no_nan[r]:
            return np.zeros_like(x)
        with np.errstate(divide="ignore", invalid="ignore"):
            return x / d

    @property
    def output_shape(self):
        return ()

    def output_dtype(self, input_dtypes):
        check_dtypes(self, input_dtypes, [(np.float32,)] * self.terms +
                     [(np.float32,) + INTEGER + (np.bool_,)] * len(self.denominator_inputs))
        return np.dtype(np.float32)

    def input_differentiable(self, index: int) -> bool:
        return index < self.terms

    def flops_per_sample(self) -> float:
        return float(sum(math.prod(s) for s in self.input_shapes))

    def max_cores(self) -> int:
        return max_cores_for(self.flops_per_sample())

    def activation_bytes_per_sample(self) -> int:
        return 0

    def forward(self, params, inputs, ctx: RunContext):
        values = None
        for j, t in enumerate(inputs[:self.terms]):
            value = self._divide(self.scale * t.reshape(len(t), -1).sum(axis=1),
                                 self.divided_by[j])
            values = value if values is None else values + value
        return values, [t.shape for t in inputs[:self.terms]]

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        grads: list[np.ndarray | None] = [
            np.full(shape, self._divide(np.asarray(self.seed), r), np.float32)
            for shape, r in zip(cache, self.divided_by)]
        return grads + [None] * len(self.denominator_inputs), {}


@register
class SoftmaxCrossEntropyBackprop(SoftmaxCrossEntropyWithLogits):
    """The second output of (Sparse)SoftmaxCrossEntropyWithLogits, backprop = softmax -
    labels (the loss's gradient that tf.gradients of the loss in model_fn multiplies by its
    upstream gradient), in the arithmetic of TF's CPU kernel; output (..., k). Backward is
    TF's registered gradient (nn_grad._SoftmaxCrossEntropyWithLogitsGrad's grad_grad term):
    (g - sum(g * softmax)) * softmax to the logits, softmax as TF's Softmax op computes it,
    and nothing to the labels (TF's gradient ignores the backprop's dependence on them)."""

    type_name = "softmax_cross_entropy_backprop"

    @property
    def output_shape(self):
        return self.input_shapes[0]

    def input_differentiable(self, index: int) -> bool:
        return index == 0

    def forward(self, params, inputs, ctx: RunContext):
        _, backprop, _, exp, sum_exp = self.rows(*inputs)
        return backprop, exp * (np.float32(1) / sum_exp)  # (tf.nn.softmax's order)

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        softmax, g = cache, grad_output
        d_logits = g - (g * softmax).sum(axis=-1, keepdims=True, dtype=np.float32)
        return [np.multiply(d_logits, softmax, out=d_logits), None], {}
