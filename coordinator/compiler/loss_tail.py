"""The loss tail: what the user's graph does after the per-sample values, proven linear.

The CS sums per-sample values over the batch; so the loss must be
    loss = sum_j c_j * sum(T_j) + sum_k d_k * R_k(w)
where T_j are per-sample tensors that the graph reduces over the batch (a mean, a sum,
weights and `num_present` of tf.compat.v1.losses folded into c_j) and R_k are terms of one
weight alone (tf.nn.l2_loss, Keras L2/L1 regularizers, sum(square(w)), sum(abs(w))), which
the CS computes on the weight's own region. The structure is checked op by op, then the
coefficients are measured by feeding values into the graph and the linearity is verified
with fresh values. Anything else is refused naming the op.

A term may be divided by a value of the batch (tf.compat.v1.losses' default reduction with
per-sample weights, SUM_BY_NONZERO_WEIGHTS: DivNoNan by the count of nonzero weights; MEAN:
by their sum; a hand-written sum(l * mask) / tf.maximum(sum(mask), 1)): d = f(sum(U_1), ..),
the U_k per-sample tensors computed from the program's inputs alone (never from the model's
outputs or weights), f a scalar program (loss_divisors.py), so the CS knows d before the
batch's backward pass (wafer.kernels.losses.BatchLoss). Feeding the divisors proves which
terms each divides and measures the rest as above; the ops computing a divisor from the
batch's sums need not be linear.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np
import tensorflow as tf

from coordinator.compiler import batch_tail
from coordinator.compiler.extract import SHAPE_OPS, data_upstream, user_name, user_source
from coordinator.compiler.ir import KernelNode, ParamRef, UnsupportedOp
from coordinator.compiler.loss_divisors import (
    DIVISOR_OPS,
    SUPPORTED_DIVISORS,
    DivisorRefused,
    batch_sums,
    lower_divisor,
    prove_divisor,
)
from coordinator.compiler.operands import static_shape
from coordinator.compiler.random_numbers import is_draw
from coordinator.compiler.rules import TailContext
from coordinator.compiler.step_values import ON_WEIGHTS
from wafer.kernels.losses import divisors_attr
from wafer.schedules import evaluate

# Ops allowed between the batch reductions (and weight terms) and the loss: linear ones.
TAIL_OPS = {"Sum", "Mean", "Mul", "RealDiv", "Div", "DivNoNan", "AddV2", "Add", "AddN", "Sub",
            "Neg", "Cast", "Identity", "Reshape", "Squeeze", "ExpandDims", "L2Loss"}
# Weight terms: op type of the base -> (regularizer kind, factor), see _weight_base.
WEIGHT_TERM_OPS = {"Mul", "RealDiv", "AddV2", "Add", "AddN", "Neg", "Identity", "Cast"}
RTOL = 1e-4
# A measured factor this far below the largest is float32 rounding of the loss, not a term:
# 0 (mean(recon) + beta * mean(kl) measures recon's factor of beta at 1.6e-8 of kl's).
NOISE = 1e-6
# Divisions of the loss by a value of the batch (a count or sum of per-sample weights).
DIVISIONS = {"DivNoNan": True, "RealDiv": False, "Div": False}  # -> 0 where the divisor is 0
# Ops of a denominator's upstream that make it the model's, not the inputs' (see _model_op).
VARIABLE_OPS = {"VarHandleOp", "VariableV2", "Variable"}
UNEVALUATED = "the loss could not be evaluated from its per-sample values"
# Why a loss over a stack in front of the batch (leading_stack.py) that is no sum of its
# values times constants is refused (a sum is the same in either layout).
LEADING_TAIL = ("a loss of tf.stack(values, axis=0) that is not a sum or mean of its values "
                "times constants: reduce over the stack axis 0 first (tf.reduce_mean(stacked, 0))")
# Why weight scalars are refused where the CS cannot carry them (see _lower_loss).
WEIGHTED_IN_FLOAT32 = ("a loss weighted by weights (learned task weights) or by a value of the "
                       "global step is carried out in float32 over a mean or sum of the batch: "
                       "divide by the batch size, not by a count of its values, and compute "
                       "the loss in float32")
# A tail computing in float16 (a mixed_float16 loss) is measured to float16's precision:
# a few units in its last place (2 ** -11).
HALF_RTOL = 4e-3


def _reject(m: TailContext, op: tf.Operation, reason: str) -> tuple[str, dict]:
    m.unsupported.append(UnsupportedOp(op.type, user_name(op), user_source(op), reason))
    return "", {}


def _tail_ops(m: TailContext, loss: tf.Tensor) -> list[tf.Operation]:
    """Ops between the batch reductions and the loss (graph order)."""
    found, stack = set(), [loss.op]
    while stack:
        op = stack.pop()
        if op in found or not any(out.name in m.tail for out in op.outputs):
            continue
        found.add(op)
        stack.extend(t.op for t in op.inputs)
    return [op for op in m.ops if op in found]


def _divisions(m: TailContext, loss: tf.Tensor) -> tuple[list[tf.Operation], set[tf.Operation]]:
    """The divisions of the loss by a value of the batch, and the tail ops that compute
    the loss other than through a divisor (those must be linear)."""
    divisions, found, stack = [], set(), [loss.op]
    while stack:
        op = stack.pop()
        if op in found or not any(out.name in m.tail for out in op.outputs):
            continue
        found.add(op)
        inputs = list(op.inputs)
        if op.type in DIVISIONS and inputs[1].name in m.tail:
            divisions.append(op)
            inputs = inputs[:1]
        stack.extend(t.op for t in inputs)
    return [op for op in m.ops if op in divisions], found


def _weight_base(m: TailContext, tensor: tf.Tensor):
    """(kind, factor, variable) if `tensor` is l2_loss(w), sum(square(w)) or sum(abs(w))."""
    op = tensor.op
    if op.type == "L2Loss":
        w = m.operands.weight(op.inputs[0])
        return ("l2", 0.5, w) if w is not None else None
    if op.type == "Sum":
        inner = op.inputs[0].op
        axes = m.operands.constant(op.inputs[1])
        if inner.type in ("Square", "Abs") and axes is not None:
            w = m.operands.weight(inner.inputs[0])
            if w is not None and len({int(a) % max(len(w.shape), 1) for a in np.atleast_1d(axes)}) \
                    == len(w.shape):
                return ("l2" if inner.type == "Square" else "l1", 1.0, w)
    return None


def _weight_terms(m: TailContext, tensor: tf.Tensor, bases: list, reasons: list) -> None:
    """Collect the regularizer bases under a weight-only value (through linear ops)."""
    base = _weight_base(m, tensor)
    if base is not None:
        bases.append((tensor, *base))
        return
    op = tensor.op
    if op.type not in WEIGHT_TERM_OPS:
        reasons.append((op, "a term of the loss computed from weights that is not an L2 or L1 "
                            "penalty (tf.nn.l2_loss, sum(square(w)), sum(abs(w)), Keras L1/L2)"))
        return
    for t in op.inputs:
        if m.operands.constant(t) is None:
            _weight_terms(m, t, bases, reasons)


def lower_loss(m: TailContext, loss: tf.Tensor, own_frontier: bool = False,
               ) -> tuple[str, dict[str, list[tuple[str, float]]]]:
    """Add the `loss` kernel for the batch reduction; return its name and the regularizers
    by variable (kind, scale). Problems are added to m.unsupported. `own_frontier`: of the
    batch reductions, those the loss is computed from only (one of several losses)."""
    with tf.compat.v1.Session(graph=m.graph) as session:  # (one for every measurement)
        return _lower_loss(m, loss, session, own_frontier)


def _lower_loss(m: TailContext, loss: tf.Tensor, session: tf.compat.v1.Session,
                own_frontier: bool = False) -> tuple[str, dict[str, list[tuple[str, float]]]]:
    if loss.name not in m.tail:
        return _reject(m, loss.op, "the loss is not reduced over the batch from per-sample "
                                   "values (e.g. tf.reduce_mean of per-sample losses)")
    ops = _tail_ops(m, loss)
    frontier_names = {t.name for t in m.frontier}
    if any(m.is_batched(t) and t.name not in frontier_names for op in ops for t in op.inputs):
        return _batch_tail(m, loss, session)  # (per-sample values met after a batch reduction)
    divisions, linear = _divisions(m, loss)
    bases: list = []
    scalars: list[tf.Tensor] = []  # weight-only scalars: task weights, their additive terms
    for op in ops:
        if op not in linear and op.type not in DIVISOR_OPS and _model_op(op.outputs[0]) is None:
            return _reject(m, op, f"the loss is divided by a value computed by {op.type}: the "
                                  f"CS evaluates a divisor from {SUPPORTED_DIVISORS}")
        if op in linear and op.type not in TAIL_OPS or \
                op not in linear and op.type not in DIVISOR_OPS:
            return _batch_tail(m, loss, session)  # (a non-linear function of batch reductions)
        if op.type == "Cast" and op in linear and op.outputs[0].dtype not in (tf.float32, tf.float16):
            return _reject(m, op, "the loss is cast to a type other than float32 or float16")
        for t in op.inputs:
            if t.name in m.tail or m.is_batched(t) or m.operands.constant(t) is not None:
                continue
            if m.step_values.reads_step(t):  # a term's weight on a schedule (KL annealing)
                if m.step_values.reads_weights(t):
                    product = _annealed(m, t)
                    if product is None:
                        return _reject(m, op, f"adds weights or a weight penalty times a value "
                                              f"of the global step ({t.op.type} '{t.op.name}' "
                                              f"at {user_source(t.op)}): {ON_WEIGHTS}")
                    t = product
                kernel = m.step_values.kernel(m, _annealed_parts(m, t)[0], op)
                if isinstance(kernel, tuple):
                    return _reject(m, op, kernel[0])
                scalars += [t] if t not in scalars else []
                continue
            reasons: list = []
            found: list = []
            _weight_terms(m, t, found, reasons)
            if reasons and _weight_scalar(m, t):
                written = m.step_values.written_refusal(_scalar_variable(m, t))
                if written:
                    return _reject(m, op, f"a term of the loss is {written}")
                if op.type in DIVISIONS and t is op.inputs[1]:
                    return _reject(m, op, "divides a term of the loss by a scalar of weights: "
                                          "the CS multiplies a term by one (a task's learned "
                                          "weight): write it as a factor, L * tf.math."
                                          "reciprocal(2 * sigma ** 2) or L * tf.exp(-s)")
                scalars += [t] if t not in scalars else []
                continue
            if reasons:
                problem = m.weight_problem(t) if static_shape(t) == () else ""
                return _reject(m, t.op, f"a term of the loss {problem}") if problem else \
                    _reject(m, *reasons[0])
            bases += found
    frontier = list(dict.fromkeys(m.frontier))
    if own_frontier:
        upstream = set(data_upstream(loss.op))
        frontier = [t for t in frontier if t.op in upstream]
    half = any(t.dtype == tf.float16 for t in frontier) or \
        any(t.dtype == tf.float16 for op in ops for t in op.outputs)
    rtol = HALF_RTOL if half else RTOL
    divisions = list({op.inputs[1].name: op for op in divisions}.values())
    for op in divisions:
        for t in _summed(m, op.inputs[1]):
            if _model_op(t) is not None:  # (a ratio of the model's batch sums)
                return _batch_tail(m, loss, session)
    if scalars and half:
        return _reject(m, scalars[0].op, WEIGHTED_IN_FLOAT32)
    fixed = {op.inputs[1]: np.float32(1.0) for op in divisions}
    fixed.update({t: np.float32(0.0) for t in scalars})
    coefficients = _measure(session, loss, frontier, [b[0] for b in bases], rtol, fixed)
    if isinstance(coefficients, str):
        return _reject(m, loss.op, coefficients) if coefficients.startswith(UNEVALUATED) \
            else _batch_tail(m, loss, session)
    weighting = _measure_weighting(session, loss, frontier, bases, scalars, coefficients,
                                   fixed) if scalars else None
    if isinstance(weighting, str):
        return _reject(m, loss.op, weighting)
    if weighting is not None and divisions:  # (terms of weights added to a divided loss)
        divided = _added_apart(session, loss, scalars, weighting, divisions,
                               {**{t: np.zeros(static_shape(t), np.float32)
                                   for t in frontier + [b[0] for b in bases]}, **fixed})
        if divided:
            return _reject(m, *divided)
    divided_by = [-1] * len(coefficients)
    for r, op in enumerate(divisions):  # which terms each divides: halved with it doubled
        doubled = _measure(session, loss, frontier, [b[0] for b in bases], rtol,
                           {**fixed, op.inputs[1]: np.float32(2.0)})
        for j, c2 in enumerate(doubled if not isinstance(doubled, str) else [None]):
            c = coefficients[j]
            if c2 is None or not (np.isclose(c2, c, rtol=rtol) or (
                    divided_by[j] < 0 and np.isclose(c2, c / 2, rtol=rtol))):
                return _batch_tail(m, loss, session)  # (not linear in the per-sample values)
            if c and not np.isclose(c2, c, rtol=rtol):
                divided_by[j] = r
    if any(r >= 0 for r in divided_by[len(frontier):]):
        return _reject(m, divisions[0], "a weight penalty is divided by a count or sum of the "
                                        "batch: add penalties to the loss after the division")
    denominators: list = []
    summed: list[tf.Tensor] = []
    for op in divisions:
        try:
            program = lower_divisor(m, op, summed)
        except DivisorRefused as refused:
            return _reject(m, refused.op, refused.reason)
        problem = prove_divisor(session, op, program, summed)
        if problem:
            return _reject(m, op, problem)
        denominators.append((op, program))
    if divisions:
        terms = dict(zip(scalars, weighting[1])) if weighting is not None else {}
        problem = _check_ratio(session, loss, frontier, [b[0] for b in bases],
                               coefficients[:len(frontier)], divided_by, denominators, summed,
                               rtol, terms)
        if problem:
            return _batch_tail(m, loss, session)
    data_c, weight_c = coefficients[:len(frontier)], coefficients[len(frontier):]
    regularizers = _penalties(m, bases, weight_c)
    if isinstance(regularizers, tuple):
        return _reject(m, *regularizers)
    if weighting is not None and not divisions:
        return _weighted_loss_kernel(m, loss, frontier, data_c, scalars, *weighting), regularizers
    added = _weight_terms_per_sample(m, loss, scalars, weighting[1]) \
        if weighting is not None else None
    return _loss_kernel(m, loss, frontier, data_c, divided_by[:len(frontier)],
                        denominators, summed, added), regularizers


def _added_apart(session: tf.compat.v1.Session, loss: tf.Tensor, scalars: list[tf.Tensor],
                 weighting: tuple[list[list[float]], list[float]], divisions: list[tf.Operation],
                 zeros: dict) -> tuple[tf.Operation, str] | None:
    """None if the weight scalars are only added to a loss divided by values of the batch
    (no a_jk of _measure_weighting's form) and no division divides them (each divisor fed
    2, their terms unchanged, every other value fed as in `zeros`); else (op, why not)."""
    factors, terms = weighting
    if any(a for row in factors for a in row):
        return scalars[0].op, WEIGHTED_IN_FLOAT32
    for op in divisions:
        for w, d in zip(scalars, terms):
            got = float(session.run(loss, {**zeros, op.inputs[1]: np.float32(2.0),
                                           w: np.float32(1.5)}))
            if not np.isclose(got, 1.5 * d, rtol=RTOL, atol=1e-6):
                return op, ("divides a term of the loss computed from weights by a count or "
                            "sum of the batch: add terms of weights to the loss after the "
                            "division")
    return None


def _penalties(m: TailContext, bases: list, coefficients: Sequence[float],
               ) -> dict[str, list[tuple[str, float]]] | tuple[tf.Operation, str]:
    """The regularizers by variable (kind, scale) of the weight penalties `bases` added to
    the loss with `coefficients`, or (op, why not)."""
    params = {p.variable for k in m.kernels for p in k.params} | m.weight_program_sources()
    regularizers: dict[str, list[tuple[str, float]]] = {}
    for (tensor, kind, factor, weight), c in zip(bases, coefficients):
        if weight.variable not in params:
            return tensor.op, f"penalises {weight.variable}, which no layer on the CS uses"
        regularizers.setdefault(weight.variable, []).append((kind, float(c * factor)))
    return regularizers


def _batch_tail(m: TailContext, loss: tf.Tensor, session: tf.compat.v1.Session,
                ) -> tuple[str, dict]:
    """A loss that is no sum of per-sample values: evaluated once per batch (batch_tail.py),
    the weight penalties added to it (tf.nn.l2_loss, Keras regularizers) measured apart."""
    stacked = next((t for t in m.frontier if t.name in m.leading), None)
    if stacked is not None:  # (the whole batch in TF's layout: not the one the CS holds)
        return _reject(m, loss.op, f"{LEADING_TAIL} ({stacked.op.type} '{stacked.op.name}' at "
                                   f"{user_source(stacked.op)})")
    bases: list = []
    terms: list[tf.Tensor] = []  # the values of weights alone the tail adds: sums of penalties
    for op in _tail_ops(m, loss):
        for t in op.inputs:
            if t.name in m.tail or m.is_batched(t) or m.operands.constant(t) is not None:
                continue
            found: list = []
            reasons: list = []
            _weight_terms(m, t, found, reasons)
            if found and not reasons:  # (else the tail's lowering refuses t)
                bases += found
                terms.append(t)
    name, samples = batch_tail.lower(m, loss, terms, lambda t: _shared_weight(m, loss, t))
    if not name or not bases:
        return name, {}
    coefficients = _penalty_factors(session, loss, samples, [b[0] for b in bases])
    if isinstance(coefficients, str):
        return _reject(m, loss.op, coefficients)
    regularizers = _penalties(m, bases, coefficients)
    return (name, regularizers) if isinstance(regularizers, dict) else _reject(m, *regularizers)


def _shared_weight(m: TailContext, loss: tf.Tensor, tensor: tf.Tensor) -> str | None:
    """The kernel giving every sample the scalar `tensor` a loss of the whole batch reads: a
    value of the global step (a capacity schedule's C: its `schedule` kernel) or of weights
    (a learned temperature, a term of weights alone); None if it is none such."""
    if m.step_values.reads_step(tensor) and not m.step_values.reads_weights(tensor):
        kernel = m.step_values.kernel(m, tensor, loss.op)
        return kernel if isinstance(kernel, str) else None
    if not _weight_scalar(m, tensor) or _scalar_variable_written(m, tensor):
        return None
    return _per_sample(m, loss, tensor)


def _penalty_factors(session: tf.compat.v1.Session, loss: tf.Tensor, samples: list[tf.Tensor],
                     bases: list[tf.Tensor]) -> list[float] | str:
    """The factors c_k of loss = f(the batch's values) + sum_k c_k R_k, the weight penalties
    R_k fed (each so large that c_k R_k outweighs f's rounding by 1e4: a float32 difference
    of the loss measures c_k to its precision), then verified with fresh values of
    everything at once."""
    rng = np.random.default_rng(3)
    zeros = {b: np.zeros(static_shape(b), np.float32) for b in bases}

    def evaluate(values: dict) -> float:
        return float(session.run(loss, {**zeros, **values}))

    try:
        values = {t: _sample_values(rng, t) for t in samples}
        alone = evaluate(values)
        picks, factors = [], []
        for b in bases:
            ones = np.ones(static_shape(b), np.float32)
            rough = abs(evaluate({**values, b: ones}) - alone) / ones.size
            pick = ones * np.float32(1e4 * max(1.0, abs(alone)) / rough if rough else 1.0)
            factors.append(exact((evaluate({**values, b: pick}) - alone) / float(pick.sum())))
            picks.append(pick * np.float32(rng.uniform(0.5, 2.0)))
        fresh = {t: _sample_values(rng, t) for t in samples}
        want = evaluate(fresh) + sum(c * float(r.sum()) for c, r in zip(factors, picks))
        if not np.isclose(evaluate({**fresh, **dict(zip(bases, picks))}), want, rtol=RTOL,
                          atol=1e-6):
            return ("the loss of the whole batch is not its batch terms plus weight penalties "
                    "(a penalty multiplies or is multiplied): add penalties to the loss")
    except tf.errors.OpError as error:
        return f"{UNEVALUATED} ({error.message})"
    return factors


def _sample_values(rng: np.random.Generator, t: tf.Tensor) -> np.ndarray:
    """Values of a per-sample value a batch tail reads: in [0.5, 2], its integers 0 (a
    class, a segment, an index of any batch's labels)."""
    if t.dtype.is_integer:
        return np.zeros(static_shape(t), t.dtype.as_numpy_dtype)
    return _draw(rng, t, static_shape(t), 0.5, 2.0)


def _annealed(m: TailContext, tensor: tf.Tensor) -> tf.Tensor | None:
    """The product beta * W that `tensor` (a tail input reading the global step and weights)
    is computed from alone (through constant factors and divisors, negations): beta a
    scalar of the global step and constants, W a weight scalar (an annealed KL of the
    weights, beta * tf.nn.l2_loss(w)); None if it is none such."""
    while True:
        op = tensor.op
        if op.type == "Mul":
            a, b = op.inputs
            step = [t for t in (a, b) if not m.step_values.reads_weights(t)]
            weights = [t for t in (a, b) if not m.step_values.reads_step(t)]
            if len(step) == 1 and len(weights) == 1 and step[0] is not weights[0] and \
                    static_shape(step[0]) == () and _weight_scalar(m, weights[0]) and \
                    not _scalar_variable_written(m, weights[0]):
                return tensor
        variable = [t for t in op.inputs if m.operands.constant(t) is None]
        if op.type not in ("Mul", "RealDiv", "Neg", "Identity") or len(variable) != 1 or \
                op.type == "RealDiv" and variable[0] is not op.inputs[0]:
            return None
        tensor = variable[0]


def _annealed_parts(m: TailContext, tensor: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor | None]:
    """(beta, W) of an annealed product (_annealed), or (tensor, None) for a value of the
    global step alone."""
    if m.step_values.reads_weights(tensor):
        a, b = tensor.op.inputs
        return (a, b) if not m.step_values.reads_weights(a) else (b, a)
    return tensor, None


def _scalar_variable_written(m: TailContext, tensor: tf.Tensor) -> bool:
    return bool(m.step_values.written_refusal(_scalar_variable(m, tensor)))


def _weight_scalar(m: TailContext, tensor: tf.Tensor) -> bool:
    """Whether `tensor` is a float32 scalar of weights alone (a variable, a view of one or
    the weight program's value: a task's tf.exp(-s), its s)."""
    return static_shape(tensor) == () and tensor.dtype == tf.float32 and (
        m.operands.weight(tensor) or m.operands.view(tensor) or m.derived_weight(tensor)) \
        is not None


def _measure_weighting(session: tf.compat.v1.Session, loss: tf.Tensor, frontier: list[tf.Tensor],
                       bases: list, scalars: list[tf.Tensor], coefficients: Sequence[float],
                       fixed: dict) -> tuple[list[list[float]], list[float]] | str:
    """(a, d) of loss = sum_j sum(T_j) * (c_j + sum_k a_jk W_k) + sum_k d_k W_k + the
    penalties (c: `coefficients`, measured with every W_k 0), the W_k the weight scalars fed
    as values: measured term by term, then verified with fresh values of everything at once
    (a product of two scalars, of a scalar and a penalty, a nonlinear term: refused), the
    `fixed` tensors (the divisors: 1) fed their values."""
    rng = np.random.default_rng(2)
    bases_t = [b[0] for b in bases]
    feeds = frontier + bases_t + scalars
    zeros = {**{t: np.zeros(static_shape(t), np.float32) for t in feeds}, **fixed}

    def evaluate(values: dict) -> float:
        return float(session.run(loss, {**zeros, **values}))

    try:
        picks = [np.float32(rng.uniform(0.5, 2.0)) for _ in scalars]
        terms = [exact(evaluate({w: v}) / float(v)) for w, v in zip(scalars, picks)]
        factors = []
        for t, c in zip(frontier, coefficients):
            value = _draw(rng, t, static_shape(t), 0.5, 2.0)
            total = float(value.sum(dtype=np.float64))
            factors.append([exact((evaluate({t: value, w: v}) - c * total - d * float(v))
                                  / (total * float(v))) for w, v, d in zip(scalars, picks, terms)])
        scale = max([abs(c) for c in coefficients] + [abs(a) for row in factors for a in row])
        factors = [[a if abs(a) > NOISE * scale else 0.0 for a in row] for row in factors]
        values = {t: _draw(rng, t, static_shape(t), -2.0, 2.0) for t in frontier + bases_t}
        values.update({w: np.float32(rng.uniform(-2.0, 2.0)) for w in scalars})
        sums = {t: float(v.sum(dtype=np.float64)) for t, v in values.items()}
        want = sum(sums[t] * (c + sum(a * sums[w] for a, w in zip(row, scalars)))
                   for t, c, row in zip(frontier, coefficients, factors))
        want += sum(d * sums[w] for d, w in zip(terms, scalars))
        want += sum(c * sums[t] for t, c in zip(bases_t, coefficients[len(frontier):]))
        if not np.isclose(evaluate(values), want, rtol=RTOL, atol=1e-6):
            return ("the loss is not a sum of batch means (or sums) each times a scalar of "
                    "weights (exp(-s) * mean(l)), plus scalars of weights (+ s): a product of "
                    "weights with each other or a nonlinear term")
    except tf.errors.OpError as error:
        return f"the loss could not be evaluated from its per-sample values ({error.message})"
    return factors, terms


def _weighted_loss_kernel(m: TailContext, loss: tf.Tensor, frontier: list[tf.Tensor],
                          coefficients: Sequence[float], scalars: list[tf.Tensor],
                          factors: list[list[float]], terms: list[float]) -> str:
    """The `loss` kernel of a loss weighted by weight scalars (_measure_weighting's form):
    each sample's value sum_j s_j * (c_j + sum_k a_jk W_k) + sum_k d_k W_k / batch, s_j its
    sum of T_j, the W_k the kernels' weights (binary mul, broadcast: their gradients the
    batch's sums, through the weight program to the variables)."""
    total: str | tf.Tensor | None = None
    for t, c, row in zip(frontier, coefficients, factors):
        value = _sample_sum(m, loss, t)
        pieces = [(value, c)] if c else []
        for w, a in zip(scalars, row):
            if a:
                pieces.append((_weighted(m, loss, value, w), a))
        for name, factor in pieces:
            total = _added(m, loss, total, _scaled(m, loss, name, factor))
    added = _weight_terms_per_sample(m, loss, scalars, terms)
    total = _added(m, loss, total, added) if added is not None else total
    assert total is not None
    return m.add_kernel("loss", "loss", [total], {"scale": 1.0}, [], [], loss, output_shape=(),
                        source_op=loss.op).name


def _weight_terms_per_sample(m: TailContext, loss: tf.Tensor, scalars: list[tf.Tensor],
                             terms: Sequence[float]) -> str | tf.Tensor | None:
    """Each sample's share of sum_k d_k W_k (the weight scalars `scalars` added with the
    factors `terms`): d_k W_k / batch, whose batch sum is the terms; None if every d_k is 0."""
    total: str | tf.Tensor | None = None
    for w, d in zip(scalars, terms):
        if d:
            value = _per_sample(m, loss, w)
            total = _added(m, loss, total, _scaled(m, loss, value, d / m.batch_size))
    return total


def _weighted(m: TailContext, loss: tf.Tensor, value: str | tf.Tensor, w: tf.Tensor) -> str:
    """The kernel of each sample's `value` times the scalar `w`: a weight (the param of a
    binary mul) or a value of the global step (its `schedule` kernel's, step_values.py)."""
    if m.step_values.reads_step(w):
        return m.add_kernel("loss/weighted", "binary", [value, _per_sample(m, loss, w)],
                            {"op": "mul", "operands": "ii"}, [], [], None, output_shape=(),
                            source_op=loss.op).name
    param = _scalar_param(m, loss, w, "p1")
    return m.add_kernel("loss/weighted", "binary", [value], {
        "op": "mul", "operands": "ip", "p1": list(param.shape)}, [param], [], None,
        output_shape=(), source_op=loss.op).name


def _per_sample(m: TailContext, loss: tf.Tensor, w: tf.Tensor) -> str:
    """The kernel giving every sample the scalar `w` (a weight: `broadcast`; a value of the
    global step: `schedule`, made by _lower_loss)."""
    if m.step_values.reads_step(w):
        step, weights = _annealed_parts(m, w)
        kernel = m.step_values.kernel(m, step, loss.op)
        assert isinstance(kernel, str), kernel
        return kernel if weights is None else _weighted(m, loss, kernel, weights)
    param = _scalar_param(m, loss, w, "value")
    return m.add_kernel("loss/weight_term", "broadcast", [m.sample_input()],
                        {"shape": [], "value": list(param.shape)}, [param], [], None,
                        output_shape=(), source_op=loss.op).name


def _scalar_variable(m: TailContext, tensor: tf.Tensor) -> str:
    """The variable a weight scalar reads (a variable or a view of one), or ""."""
    weight = m.operands.weight(tensor) or m.operands.view(tensor)
    return weight.variable if weight is not None else ""


def _scalar_param(m: TailContext, loss: tf.Tensor, tensor: tf.Tensor, role: str) -> ParamRef:
    """The kernel param reading the weight scalar `tensor` (a variable, its view or the
    weight program's value: _weight_scalar said it is one)."""
    found = m.operand_list(loss.op, [tensor])
    assert not isinstance(found, str) and found[0] == "p", found
    param = found[3][0]
    if param.view is not None:  # one element of a variable (log_vars[0]): read as (1,)
        return replace(param, role=role, shape=(1,), view=np.array(param.view).reshape(1))
    return replace(param, role=role)


def _sample_sum(m: TailContext, loss: tf.Tensor, t: tf.Tensor) -> str | tf.Tensor:
    """Each sample's sum of T (T itself if it is a scalar per sample)."""
    shape = m.shape(t)
    if not shape:
        return t
    return m.add_kernel("loss/sum", "reduce", [t], {"op": "sum", "axes": list(range(len(shape))),
                                                   "keepdims": False},
                        [], [], None, output_shape=(), source_op=loss.op).name


def _scaled(m: TailContext, loss: tf.Tensor, name: str | tf.Tensor, c: float) -> str | tf.Tensor:
    if c == 1.0:
        return name
    return m.add_kernel("loss/scale", "binary", [name], {"op": "mul", "operands": "ic",
                                                         "c1": np.asarray(c, np.float32)},
                        [], [], None, output_shape=(), source_op=loss.op).name


def _added(m: TailContext, loss: tf.Tensor, total: str | tf.Tensor | None,
           name: str | tf.Tensor) -> str | tf.Tensor:
    if total is None:
        return name
    return m.add_kernel("loss/add", "binary", [total, name], {"op": "add", "operands": "ii"},
                        [], [], None, output_shape=(), source_op=loss.op).name


def _summed(m: TailContext, tensor: tf.Tensor) -> list[tf.Tensor]:
    """The per-sample tensors whose batch sums `tensor` (of the tail) is computed from."""
    return list(dict.fromkeys(t for op in _tail_ops(m, tensor) for t in op.inputs
                              if m.is_batched(t)))


def _model_op(tensor: tf.Tensor) -> tf.Operation | None:
    """A variable or random draw `tensor`'s value is computed from (through data, not
    shapes: tf.ones_like(losses) reads a shape), or None: from the inputs alone."""
    seen, stack = set(), [tensor.op]
    while stack:
        op = stack.pop()
        if op in seen or op.type in SHAPE_OPS:
            continue
        seen.add(op)
        if op.type in VARIABLE_OPS or is_draw(op):
            return op
        stack.extend(t.op for t in op.inputs)
    return None


def _check_ratio(session: tf.compat.v1.Session, loss: tf.Tensor, frontier: list[tf.Tensor],
                 bases: list[tf.Tensor], coefficients: Sequence[float], divided_by: Sequence[int],
                 denominators: list, summed: list[tf.Tensor], rtol: float,
                 terms: dict[tf.Tensor, float]) -> str:
    """'' if the loss is sum_j c_j sum(T_j) / d_r(j) + sum_k d_k W_k with fresh values of
    every per-sample tensor (the denominators computed by the graph from theirs) and of the
    weight scalars W_k (`terms`: their d_k); else what is not."""
    rng = np.random.default_rng(1)
    values = {t: _draw(rng, t, static_shape(t), 0.5, 2.0) for t in frontier}
    values.update({t: np.zeros(static_shape(t), np.float32) for t in bases})
    added = {w: np.float32(rng.uniform(-2.0, 2.0)) for w in terms}
    sums = {t.name: float(v.sum(dtype=np.float64)) for t, v in values.items()}
    with np.errstate(all="ignore"):
        d = [float(evaluate(program, 0, batch_sums(values, summed)))
             for _, program in denominators]
    want = sum(c * sums[t.name] / (d[r] if r >= 0 else 1.0)
               for t, c, r in zip(frontier, coefficients, divided_by))
    want += sum(d_k * float(added[w]) for w, d_k in terms.items())
    got = float(session.run(loss, {**values, **added}))
    if not np.isclose(got, want, rtol=rtol, atol=1e-6 if rtol == RTOL else rtol):
        return "the loss is not a sum of per-sample values divided by a count or sum of the batch"
    return ""


def _measure(session: tf.compat.v1.Session, loss: tf.Tensor, frontier: list[tf.Tensor],
             bases: list[tf.Tensor], rtol: float = RTOL, fixed: dict | None = None,
             ) -> list[float] | str:
    """The coefficients c of loss = sum_i c_i * sum(x_i), measured and verified by feeding
    (with the `fixed` tensors fed their values)."""
    rng = np.random.default_rng(0)
    feeds = frontier + bases
    shapes = [static_shape(t) for t in feeds]
    zeros = {**{t: np.zeros(s, np.float32) for t, s in zip(feeds, shapes)}, **(fixed or {})}

    def evaluate(values: dict) -> float:
        return float(session.run(loss, {**zeros, **values}))

    try:
        offset = evaluate({})
        if abs(offset) > 1e-6:
            return f"the loss adds a constant ({offset:g}) to the sum of per-sample values"
        coefficients, draws = [], []
        for t, s in zip(feeds, shapes):
            value = _draw(rng, t, s, 0.5, 2.0)
            coefficients.append(exact(evaluate({t: value}) / float(value.sum(dtype=np.float64)),
                                      rtol / 2 if rtol > RTOL else 1e-5))
            draws.append(value)
        for t, s, c in zip(feeds, shapes, coefficients):  # linear in each, with fresh values
            value = _draw(rng, t, s, -2.0, 2.0)
            if not np.isclose(evaluate({t: value}), c * float(value.sum(dtype=np.float64)),
                              rtol=rtol, atol=1e-6 if rtol == RTOL else rtol):
                return f"the loss is not a sum or mean of the values of {t.name} (not linear)"
        together = sum(c * float(v.sum(dtype=np.float64)) for c, v in zip(coefficients, draws))
        if not np.isclose(evaluate(dict(zip(feeds, draws))), together, rtol=rtol,
                          atol=1e-6 if rtol == RTOL else rtol):
            return "the loss's terms are not added (the loss is not linear in them)"
    except tf.errors.OpError as error:
        return f"{UNEVALUATED} ({error.message})"
    return coefficients


def _draw(rng: np.random.Generator, t: tf.Tensor, shape: tuple[int, ...], low: float,
          high: float) -> np.ndarray:
    """Values in [low, high] for `t`: float32, or whole numbers for an integer tensor (a
    count: tf.math.count_nonzero)."""
    if t.dtype.is_integer:
        return rng.integers(int(np.ceil(low)), int(high) + 1, shape).astype(t.dtype.as_numpy_dtype)
    return rng.uniform(low, high, shape).astype(np.float32)


def exact(c: float, rtol: float = 1e-5) -> float:
    """A measured coefficient snapped to the n or 1/n it stands for (a mean over n values,
    a weight), so that measurement noise does not enter the CS's arithmetic."""
    for candidate in (c, 1.0 / c if c else 0.0):
        n = round(candidate)
        if n and abs(candidate - n) <= rtol * abs(candidate):
            return float(n) if candidate is c else 1.0 / n
    return c


def _loss_kernel(m: TailContext, loss: tf.Tensor, frontier: list[tf.Tensor],
                 coefficients: Sequence[float], divided_by: Sequence[int] = (),
                 denominators: Sequence = (), summed: Sequence[tf.Tensor] = (),
                 added: str | tf.Tensor | None = None) -> str:
    """One `loss` kernel summing scale * per-sample values (several terms combined first),
    each group of terms divided by its denominator (wafer.kernels.losses.BatchLoss), and
    the per-sample value `added` (terms of weights: _weight_terms_per_sample) undivided."""
    if not denominators:
        if len(frontier) == 1:
            return m.add_kernel("loss", "loss", [frontier[0]], {"scale": float(coefficients[0])},
                                [], [], loss, output_shape=(), source_op=loss.op).name
        return m.add_kernel("loss", "loss", [_combined(m, loss, frontier, coefficients)],
                            {"scale": 1.0}, [], [], loss, output_shape=(), source_op=loss.op).name
    divided_by = list(divided_by)
    groups = sorted({r for r, c in zip(divided_by, coefficients) if c})
    inputs: list = []
    if added is not None and -1 not in groups:
        groups.insert(0, -1)
    for r in groups:
        terms = [(t, c) for t, c, g in zip(frontier, coefficients, divided_by) if g == r and c]
        value = _combined(m, loss, [t for t, _ in terms], [c for _, c in terms]) if terms else None
        if r == -1 and added is not None:  # (each sample's sum of T, then its share)
            summed_t = _sample_sum(m, loss, value) if isinstance(value, tf.Tensor) else value
            value = _added(m, loss, summed_t, added)
        assert value is not None
        inputs.append(value)
    attrs = {"scale": 1.0, "divided_by": groups,
             "divisors": divisors_attr([program for _, program in denominators]),
             "div_no_nan": [int(DIVISIONS[op.type]) for op, _ in denominators]}
    return m.add_kernel("loss", "loss", inputs + list(summed), attrs, [], [], loss, output_shape=(),
                        source_op=loss.op).name


def _combined(m: TailContext, loss: tf.Tensor, frontier: list[tf.Tensor],
              coefficients: Sequence[float]) -> str | tf.Tensor:
    """A per-sample value whose batch sum is sum_j c_j * sum(T_j): T itself with c 1, else
    kernels summing each T_j over its sample, scaling and adding them."""
    if len(frontier) == 1 and coefficients[0] == 1.0:
        return frontier[0]
    total = None
    for t, c in zip(frontier, coefficients):
        total = _added(m, loss, total, _scaled(m, loss, _sample_sum(m, loss, t), c))
    assert total is not None
    return total


def attach_regularizers(kernels: Sequence[KernelNode],
                        regularizers: dict[str, list[tuple[str, float]]]) -> list[KernelNode]:
    out = []
    for k in kernels:
        params = tuple(replace(p, regularizers=tuple(regularizers[p.variable]))
                       if p.variable in regularizers else p for p in k.params)
        out.append(replace(k, params=params))
    return out
