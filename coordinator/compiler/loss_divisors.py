"""The loss's divisors: scalar programs of the batch's sums, lowered from the graph and proven.

A loss divided by a value of the batch (loss_tail.py) divides by d = f(S_1..S_n): S_k the
batch sum of a per-sample tensor U_k computed from the inputs and labels alone
(tf.reduce_sum or tf.reduce_mean over all its axes: a count of tokens, the sum of a mask,
tf.math.count_nonzero), f a scalar program of element-wise ops on them and constants
(wafer.schedules' ops: tf.maximum(count, 1), count + 1e-8, tf.clip_by_value as TF's minimum
then maximum, casts, tf.sqrt, tf.where of a comparison), lowered op by op from the graph as
TF executes it (a division by a constant as the multiplication by its float32 reciprocal
that Grappler makes of it).
The proof: the U_k are fed whole-number values (all zero, all one, random counts and
quarters), and the program must give TF's float32 divisor bit for bit every time.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from coordinator.compiler.extract import user_source
from coordinator.compiler.operands import static_shape
from coordinator.compiler.rules import TailContext
from coordinator.compiler.scalar_ops import BINARY, BOOL_RESULTS, DTYPES, UNARY
from wafer.kernels.losses import DIVISOR, sum_name
from wafer.schedules import ARITY, ScalarOp, Schedule, evaluate

# Ops that pass their one data input on (Reshape's second input is a shape).
_PASS = {"Identity", "Snapshot", "Reshape", "Squeeze", "ExpandDims"}
# Ops the loss tail allows only on a divisor's side (not linear): see loss_tail.py.
DIVISOR_OPS = {*UNARY, *BINARY, "ClipByValue", "Select", "SelectV2", "Cast", "AddN", *_PASS,
               "Sum", "Mean"}
SUPPORTED_DIVISORS = ("sums or means of the batch's inputs and labels (tf.reduce_sum, tf.reduce_mean, "
             "tf.math.count_nonzero), constants, and element-wise ops on them (tf.maximum, "
             "tf.minimum, tf.clip_by_value, +, -, *, /, tf.sqrt, tf.cast, tf.where)")


class DivisorRefused(Exception):
    """The op that cannot be lowered, and why (loss_tail.py reports it)."""

    def __init__(self, op: tf.Operation, reason: str):
        super().__init__(reason)
        self.op, self.reason = op, reason


class _Lowering:
    """One divisor's scalar ops; `summed` collects the per-sample tensors its sums read
    (shared by the loss's divisors: the loss kernel's denominator inputs, in order)."""

    def __init__(self, m: TailContext, summed: list[tf.Tensor]):
        self.m, self.summed = m, summed
        self.ops: list[ScalarOp] = []
        self.index: dict[str, int] = {}

    def add(self, op: str, dtype: str, inputs: tuple[int, ...] = (), value: float = 0.0,
            name: str = "") -> int:
        self.ops.append(ScalarOp(op, dtype, inputs, (), value, name))
        return len(self.ops) - 1

    def lower(self, t: tf.Tensor) -> int:
        if t.name not in self.index:
            self.index[t.name] = self._tensor(t)
        return self.index[t.name]

    def _tensor(self, t: tf.Tensor) -> int:
        op = t.op
        if t.dtype.base_dtype not in DTYPES:
            raise DivisorRefused(op, f"the loss's divisor is computed in {t.dtype.name}: the CS "
                                     "computes divisors in float32, int64, int32 and bool")
        dtype = DTYPES[t.dtype.base_dtype]
        if self.m.is_batched(t) or t.shape.num_elements() != 1:
            raise DivisorRefused(op, f"the loss is divided by a tensor of shape {t.shape}: "
                                     f"the CS divides by one value of the batch, from {SUPPORTED_DIVISORS}")
        value = self.m.operands.constant(t)
        if value is not None:
            return self.add("const", dtype, value=float(np.asarray(value).reshape(())))
        inputs = list(op.inputs)
        if op.type in ("Sum", "Mean") and self.m.is_batched(inputs[0]):
            if inputs[0] not in self.summed:
                self.summed.append(inputs[0])
            total = self.add("input", dtype, name=sum_name(self.summed.index(inputs[0])))
            if op.type == "Sum":
                return total
            if dtype != "float32":
                raise DivisorRefused(op, "the loss is divided by an integer mean of the batch: "
                                         "cast to float32 before tf.reduce_mean")
            count = self.add("const", dtype, value=float(np.prod(static_shape(inputs[0]))))
            return self.add("div", dtype, (total, count))  # TF's mean: the sum / the count
        if op.type in _PASS:
            return self.lower(inputs[0])
        if op.type == "Cast":
            return self.add("cast", dtype, (self.lower(inputs[0]),))
        if op.type in ("Select", "SelectV2"):
            return self.add("select", dtype, tuple(self.lower(i) for i in inputs))
        if op.type == "ClipByValue":  # TF's kernel: min(x, high), then max(., low)
            low, high = self.lower(inputs[1]), self.lower(inputs[2])
            return self.add("maximum", dtype, (self.add("minimum", dtype, (
                self.lower(inputs[0]), high)), low))
        if op.type == "AddN":
            total = self.lower(inputs[0])
            for i in inputs[1:]:
                total = self.add("add", dtype, (total, self.lower(i)))
            return total
        if op.type in ("Sum", "Mean"):
            raise DivisorRefused(op, f"the loss is divided by a {op.type} of a reduction over "
                                     "the batch axis: reduce the batch's values over all their "
                                     "axes at once (tf.reduce_sum(mask))")
        kind = UNARY.get(op.type) or BINARY.get(op.type)
        if kind == "div" and dtype == "float32" and self.m.operands.constant(inputs[1]) is not None:
            # Grappler's constant folding: x / c runs as x * (1 / c), 1 / c rounded to float32
            c = np.float32(np.asarray(self.m.operands.constant(inputs[1])).reshape(()))
            with np.errstate(divide="ignore"):
                reciprocal = self.add("const", dtype, value=float(np.float32(1) / c))
            return self.add("mul", dtype, (self.lower(inputs[0]), reciprocal))
        if kind is None or len(inputs) != ARITY[kind]:
            raise DivisorRefused(op, f"the loss is divided by a value computed by {op.type}: the "
                                     f"CS evaluates a divisor from {SUPPORTED_DIVISORS}")
        return self.add(kind, "bool" if kind in BOOL_RESULTS else dtype,
                        tuple(self.lower(i) for i in inputs))


def lower_divisor(m: TailContext, division: tf.Operation, summed: list[tf.Tensor]) -> Schedule:
    """The scalar program of `division`'s divisor (its sums' tensors added to `summed`), or
    DivisorRefused."""
    lowering = _Lowering(m, summed)
    lowering.lower(division.inputs[1])
    if lowering.ops[-1].dtype != "float32":
        raise DivisorRefused(division, "the loss is divided by a value that is not float32")
    return Schedule(DIVISOR, tuple(lowering.ops), division.inputs[1].name, user_source(division))


def batch_sums(values: dict[tf.Tensor, np.ndarray], summed: list[tf.Tensor]) -> dict[str, np.ndarray]:
    """The sums a divisor program reads, as the loss kernel computes them (its set_batch)."""
    return {sum_name(k): np.asarray(np.sum(values[u], dtype=np.int64 if u.dtype.is_integer else np.float64))
            for k, u in enumerate(summed) if u in values}


def prove_divisor(session: tf.compat.v1.Session, division: tf.Operation, program: Schedule,
                  summed: list[tf.Tensor]) -> str:
    """'' if `program` gives TF's divisor bit for bit from fed whole-number per-sample
    values (all 0, all 1, random 0/1, counts to 3, quarters in [-2, 2]); else what differs."""
    rng = np.random.default_rng(2)
    names = {o.name for o in program.ops if o.op == "input"}
    used = [u for k, u in enumerate(summed) if sum_name(k) in names]
    draws = [lambda s: np.zeros(s), lambda s: np.ones(s), lambda s: rng.integers(0, 2, s),
             lambda s: rng.integers(0, 4, s), lambda s: rng.integers(-8, 9, s) / 4]
    for draw in draws:
        values = {u: np.asarray(draw(static_shape(u))).astype(u.dtype.as_numpy_dtype) for u in used}
        got = np.float32(session.run(division.inputs[1], values))
        with np.errstate(all="ignore"):
            want = evaluate(program, 0, batch_sums(values, summed))
        if got.tobytes() != want.tobytes() and not (np.isnan(got) and np.isnan(want)):
            return (f"the CS's divisor ({want!r}) differs from TensorFlow's ({got!r}) for sums "
                    f"{batch_sums(values, summed)}")
    return ""
