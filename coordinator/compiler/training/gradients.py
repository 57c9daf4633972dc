"""Gradients: each applied gradient peeled back through recognised transforms (scale,
clip_by_value, clip_by_norm, clip_by_global_norm; any other transform of one gradient: a
program, gradient_program.py) to the output of tf.gradients, whose seed
must sit on model_fn's loss (or on S * loss: loss scaling, a scale S), or on one of several
losses the calls minimize (objectives: a GAN's discriminator and generator losses)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from operator import attrgetter

import tensorflow as tf

from coordinator.compiler.extract import (
    ExtractedGraph,
    data_downstream,
    data_upstream,
    each_once,
    op_closure,
    user_name,
    user_source,
)
from coordinator.compiler.training.conditional import gradient_branches
from coordinator.compiler.training.gradient_program import GradientPrograms
from coordinator.compiler.training.graph import Refused, const, fail, scalar, skip_identity
from coordinator.compiler.training.updates import Update
from cs_api import cs_api_pb2 as pb

TRANSFORMS = ("scaling, tf.clip_by_value, tf.clip_by_norm, tf.clip_by_global_norm, and "
              "element-wise ops, reductions and tf.where of one gradient, weights and constants")

DENSIFY = ("transform an embedding table's IndexedSlices gradient by scaling and tf.clip_by_* "
           "only, or make it dense first with tf.convert_to_tensor(g)")

# Ops allowed inside a clipping factor's computation (norms of gradients).
_NORM_OPS = {"Mul", "Sum", "Greater", "Fill", "Select", "SelectV2", "Sqrt", "Maximum",
             "Minimum", "RealDiv", "AddV2", "Add", "Sub", "Pack", "L2Loss", "Const",
             "Identity", "OnesLike", "ZerosLike", "Cast", "Range"}


@dataclass(frozen=True)
class _GradientCall:
    """One tf.gradients call: its name scope, the loss scale S of y = S * loss, and the
    loss it differentiates when not model_fn's (one of several objectives: a GAN's)."""

    scope: str
    scale: float
    objective: tf.Tensor | None = None


@dataclass(eq=False)
class Step:
    """A recognised transform (one instance shared by a clip_by_global_norm group)."""

    kind: str
    anchor: tf.Operation
    value: float = 0.0
    low: float = 0.0
    high: float = 0.0
    group: tuple[tf.Tensor, ...] = ()  # clip_by_global_norm: the gradients, in TF's order
    variables: tuple[str, ...] = ()  # clip_by_global_norm: the group's variables
    program: pb.WeightProgram | None = None  # a program: its kernels (gradient_program.py)


class _Unrecognised(Refused):
    """An op on a gradient none of the recognised transforms' (then lowered as a program)."""


@dataclass(eq=False)
class Chain:
    """One update's gradient: raw (tf.gradients' output) -> steps -> applied."""

    update: Update
    raw: tf.Tensor
    raw_indices: tf.Tensor | None
    call: _GradientCall
    steps: list[Step]
    inputs: list[tf.Tensor]  # the tensor each step reads


def gradient_calls(extracted: ExtractedGraph,
                   updates: list[Update]) -> dict[str, _GradientCall | Refused]:
    """tf.gradients calls by name scope (their seeds `<scope>/grad_ys_<i>`) and what they
    differentiate: the loss, S * loss, one of several losses (objectives), or something
    else (refused)."""
    graph, loss = extracted.graph, extracted.spec.loss
    seeds = _seeds(graph)
    core = skip_identity(loss).op
    varying = data_downstream([graph.get_operation_by_name(u.variable) for u in updates])
    calls: dict[str, _GradientCall | Refused] = {}
    others: dict[str, tf.Tensor] = {}  # the calls of another tensor than the loss
    minimized = _minimized_by(graph, _applied(extracted), loss)
    for scope, fills in seeds.items():
        if len(fills) != 1:
            calls[scope] = fail(fills[0], "gradients of several tensors at once")
            continue
        fill = fills[0]
        seed_value = scalar(fill.inputs[1])
        starts = {op for c in fill.outputs[0].consumers()
                  if (op := _forward_op(graph, scope, c)) is not None}
        if not starts or seed_value is None:
            calls[scope] = fail(fill, "a gradient computation the compiler cannot follow")
            continue
        scale = 1.0 if _is_loss(starts, core, varying) else (
            _loss_scale(next(iter(starts)), core) if len(starts) == 1 else None)
        if scale is None:
            if scope in minimized:
                others[scope] = minimized[scope]
            upstream = set(data_upstream(core))
            y = min((op for op in starts if op not in upstream), default=None,
                    key=attrgetter("name"))
            calls[scope] = Refused(
                f"the train_op minimizes {y.outputs[0].name} computed at {user_source(y)}, not "
                f"the loss model_fn returns ({loss.name} at {user_source(loss.op)})"
                if y is not None else
                f"the train_op minimizes part of the loss model_fn returns ("
                f"{', '.join(sorted(op.name for op in starts))} at "
                f"{user_source(min(starts, key=lambda op: op.name))}), not all of it")
            continue
        calls[scope] = _GradientCall(scope, scale * seed_value)
    return {**calls, **_objectives(calls, others, seeds)}


def _seeds(graph: tf.Graph) -> dict[str, list[tf.Operation]]:
    """The seeds of the graph's tf.gradients calls by name scope."""
    seeds: dict[str, list[tf.Operation]] = {}
    for op in graph.get_operations():
        m = re.match(r"^(.*)/grad_ys_\d+$", op.name)
        if m and op.type == "Fill":
            seeds.setdefault(m.group(1), []).append(op)
    return seeds


def _applied(extracted: ExtractedGraph) -> dict[str, list[tf.Operation]]:
    """The seeds of the calls the train_op runs (not a summary's or a metric's; in an update
    cond's branch: conditional.gradient_branches, imported first)."""
    train = extracted.spec.train_op
    closure = {op for start in [train, *gradient_branches(train)] for op in op_closure(start)}
    return {scope: fills for scope, fills in _seeds(extracted.graph).items()
            if fills[0] in closure}


def _minimized_by(graph: tf.Graph, seeds: dict[str, list[tf.Operation]],
                  loss: tf.Tensor) -> dict[str, tf.Tensor]:
    """The tensor y each tf.gradients call differentiates, by scope: the op whose gradient
    function reads the seed, or the sum (Identity, AddN, Add) that passed it on to them.
    A call inside the forward pass (a gradient penalty's: the loss or another y is computed
    from its seed) minimizes nothing and is left out."""
    varying = data_downstream([op for op in graph.get_operations() if op.type in _VARIABLE_OPS])
    found = {}
    for scope, fills in seeds.items():
        starts = {op for c in fills[0].outputs[0].consumers()
                  if (op := _forward_op(graph, scope, c)) is not None}
        front = set(starts)
        while len(starts) > 1 and front:
            front = {c for op in front for out in op.outputs for c in out.consumers()
                     if c.type in _PASS_THROUGH}
            y = min((op for op in front if _is_loss(starts, op, varying)), default=None,
                    key=attrgetter("name"))
            if y is not None:
                starts = {y}
        if len(starts) == 1:
            found[scope] = next(iter(starts)).outputs[0]
    forward = {op for y in [loss, *found.values()] for op in data_upstream(y.op)}
    return {scope: y for scope, y in found.items() if seeds[scope][0] not in forward}


def _objectives(calls: dict[str, _GradientCall | Refused], others: dict[str, tf.Tensor],
                seeds: dict[str, list[tf.Operation]]) -> dict[str, _GradientCall]:
    """The calls of several losses minimized in one step (a GAN's discriminator and
    generator losses: two tensors at least, model_fn's loss counting as one when a call
    minimizes it), each a call of its objective with seed 1; {} when not so."""
    losses = {skip_identity(t).name for t in others.values()}
    if len(losses) + any(isinstance(c, _GradientCall) for c in calls.values()) < 2:
        return {}
    return {scope: _GradientCall(scope, 1.0, y) for scope, y in others.items()
            if scalar(seeds[scope][0].inputs[1]) == 1.0}


def objective_losses(extracted: ExtractedGraph) -> list[tf.Tensor]:
    """The losses besides model_fn's that the train_op's tf.gradients calls minimize when
    it minimizes several (a GAN's), in the order of their calls; [] when one."""
    loss = skip_identity(extracted.spec.loss)
    found: dict[str, tf.Tensor] = {}
    minimizes_loss = False
    seeds = _applied(extracted)
    for y in _minimized_by(extracted.graph, seeds, loss).values():
        if skip_identity(y).name == loss.name or _loss_scale(y.op, loss.op) is not None:
            minimizes_loss = True
        else:
            found.setdefault(skip_identity(y).name, y)
    return list(found.values()) if len(found) + minimizes_loss >= 2 else []


def minimized_apart(extracted: ExtractedGraph) -> tf.Tensor | None:
    """The one loss the train_op minimizes when it is not the loss model_fn returns (nor S
    times it): model_fn reports a part of what it trains, e.g. the data loss of a loss
    plus weight decay; None when not so."""
    loss = skip_identity(extracted.spec.loss)
    found = {skip_identity(y).name: y for y in
             _minimized_by(extracted.graph, _applied(extracted), loss).values()}
    if len(found) != 1:
        return None
    y = next(iter(found.values()))
    if skip_identity(y).name == loss.name or _scales(y.op, loss):
        return None
    return y


def _scales(y: tf.Operation, loss: tf.Tensor) -> bool:
    """Whether y is the loss times a factor: a constant S, or a loss scale optimizer's dynamic
    scale (loss * tf.cast(scale_variable)): the loss scaling analysis's, not another loss."""
    return y.type == "Mul" and loss.name in {skip_identity(t).name for t in y.inputs}


# Ops whose gradient functions may pass the seed on without creating an op.
_PASS_THROUGH = {"Identity", "AddN", "Add", "AddV2"}
_VARIABLE_OPS = {"VarHandleOp", "VariableV2", "Variable"}


def _is_loss(starts: set[tf.Operation], core: tf.Operation, varying: set) -> bool:
    """The ops whose gradient functions read the seed are those of d(loss): the loss's op,
    or the terms it passes the seed to (a sum's terms that depend on trained variables)."""
    front = {core}
    while True:
        front = {op for op in front if op in varying}
        if front == starts:
            return True
        expand = {op for op in front if op not in starts and op.type in _PASS_THROUGH}
        if not expand:
            return False
        front = (front - expand) | {t.op for op in expand for t in op.inputs}


def _forward_op(graph: tf.Graph, scope: str, grad_op: tf.Operation) -> tf.Operation | None:
    rest = grad_op.name[len(scope) + 1:]
    if "_grad/" not in rest:
        return None
    try:
        return graph.get_operation_by_name(rest[:rest.index("_grad/")])
    except KeyError:
        return None


def _loss_scale(y: tf.Operation, core: tf.Operation) -> float | None:
    """S if y is S * loss (constant S), else None."""
    if y.type == "Mul":
        a, b = y.inputs
        for x, s in ((a, b), (b, a)):
            if skip_identity(x).op is core and scalar(s) is not None:
                return scalar(s)
    return None


def in_scope(op: tf.Operation, calls: dict) -> str | None:
    for scope in calls:
        if op.name.startswith(scope + "/"):
            return scope
    return None


def gradient_chain(update: Update, calls: dict, norms: dict, programs: GradientPrograms) -> Chain:
    """Peel update.grad back to the tf.gradients output it is computed from (an op no
    recognised transform computes: the rest down to it is one program)."""
    steps: list[Step] = []
    inputs: list[tf.Tensor] = []
    t = update.grad
    sparse = update.indices is not None
    dense: tf.Tensor | None = None  # a densified sparse gradient: the summed table gradient
    while (scope := in_scope(t.op, calls)) is None:
        op = t.op
        if op.type in ("Identity", "Snapshot") or (op.type == "Cast" and
                                                    op.inputs[0].dtype == t.dtype):
            t = op.inputs[0]
            continue
        values = densified(op, calls)
        if values is not None:
            dense, t = t, values
            continue
        try:
            step, t = _recognise(op, update.variable, calls, norms)
        except _Unrecognised as refusal:
            if sparse:
                raise fail(op, f"the sparse (IndexedSlices) gradient of {update.variable} is "
                               "changed by an op the CS carries out on dense gradients only: "
                               "make it dense first (tf.convert_to_tensor(g); TF then applies "
                               "the optimizer's dense rule to the whole table)",
                           DENSIFY) from None
            if t.dtype.base_dtype != tf.float32:
                raise Refused(str(refusal)) from None
            program, t = programs.lower(t, update.variable)
            step = Step("program", op, program=program)
        steps.append(step)
        inputs.append(t)
    call = calls[scope]
    if isinstance(call, Refused):
        raise call
    raw_indices = None
    if sparse:
        raw_indices = skip_identity(update.indices)
        if in_scope(raw_indices.op, calls) != scope:
            raise fail(update.op, f"the sparse gradient of {update.variable} has indices "
                                  "not computed by tf.gradients")
    _check_source(update, t, scope)
    steps.reverse()
    inputs.reverse()
    return Chain(update, t if dense is None else dense, raw_indices, call, steps, inputs)


def densified(op: tf.Operation, calls: dict) -> tf.Tensor | None:
    """The IndexedSlices' values `op` sums at their indices into a dense gradient
    (tf.convert_to_tensor of a sparse gradient, tf.math.unsorted_segment_sum or
    tf.scatter_nd of its values), or None. The sum is the table's gradient the CS computes
    for a dense update; the numeric check proves it the loss's, of the variable's shape."""
    if op.type == "UnsortedSegmentSum":
        values, ids = op.inputs[0], op.inputs[1]
    elif op.type == "ScatterNd" and op.inputs[0].op.type in ("ExpandDims", "Reshape") and \
            op.inputs[0].shape.rank == 2 and op.inputs[0].shape[1] == 1:
        values, ids = op.inputs[1], op.inputs[0].op.inputs[0]
    else:
        return None
    values, ids = skip_identity(values), skip_identity(ids)
    scope = in_scope(values.op, calls)
    if scope is None or in_scope(ids.op, calls) != scope or ids.shape.rank != 1 or \
            not op.outputs[0].shape.is_fully_defined():
        return None
    return values


def _depends_on(op: tf.Operation, variable: tf.Operation) -> bool:
    """Whether the forward op's value depends on the variable (TF's gradient functions pass
    a gradient through unchanged, e.g. Sub's when shapes agree, so the op whose `_grad` scope
    made the tensor may read the variable only through another op)."""
    seen, stack = set(), [op]
    while stack:
        current = stack.pop()
        if current is variable:
            return True
        if current in seen:
            continue
        seen.add(current)
        stack.extend(t.op for t in current.inputs)
    return False


def _check_source(update: Update, raw: tf.Tensor, scope: str) -> None:
    """The raw gradient is computed by the gradient functions of ops whose value depends
    on the variable (`<scope>/<op>_grad/...`, summed by AddN), not by another part of the
    graph; the numeric check then proves it is that variable's gradient."""
    target = update.op.graph.get_operation_by_name(update.variable)
    forward, stack = [], [skip_identity(raw).op]
    while stack:
        op = stack.pop()
        rest = op.name[len(scope) + 1:]
        if op.type == "AddN" and "_grad/" not in rest:
            stack.extend(skip_identity(t).op for t in op.inputs)
        elif "_grad/" in rest:
            forward.append(rest[:rest.index("_grad/")])
    readers = []
    for name in forward:
        try:
            readers.append(target.graph.get_operation_by_name(name))
        except KeyError:
            pass
    if readers and not any(_depends_on(r, target) for r in readers):
        raise fail(update.op, f"the gradient applied to {update.variable} is the gradient of "
                              f"another tensor ({readers[0].name}'s input at "
                              f"{user_source(readers[0])}), not of {update.variable}")


def _recognise(op: tf.Operation, variable: str, calls: dict,
               norms: dict) -> tuple[Step, tf.Tensor]:
    """The transform `op` computes from one gradient tensor, and that tensor."""

    def why() -> Refused:
        if not any(in_scope(o, calls) for o in data_upstream(op)):
            return fail(op, f"the gradient applied to {variable} is not computed from the "
                            "loss's gradient (tf.gradients / compute_gradients)")
        return _Unrecognised(
            f"the gradient of {variable} is changed by an op the CS cannot carry out (it "
            f"carries out {TRANSFORMS}) ({op.type} '{user_name(op)}' at {user_source(op)})")

    if op.type == "Mul":
        a, b = op.inputs
        for x, s in ((a, b), (b, a)):
            c = scalar(s)
            if c is not None:
                return Step("scale", op, value=c), x
        for x, s in ((a, b), (b, a)):
            step = _global_norm(s, norms)
            if step is not None and any(skip_identity(g).name == skip_identity(x).name
                                        for g in step.group):
                # a sparse gradient: TF's norm and product are over its IndexedSlices'
                # values (one row per lookup, duplicates included), as the CS holds them
                return step, x
        raise why()
    if op.type == "RealDiv":
        c = scalar(op.inputs[1])
        if c is not None and c != 0:
            return Step("scale", op, value=1.0 / c), op.inputs[0]
        return _clip_by_norm(op, why)
    if op.type == "Maximum":
        low = scalar(op.inputs[1])
        inner = op.inputs[0].op
        high = scalar(inner.inputs[1]) if inner.type == "Minimum" else None
        if low is None or high is None:
            raise why()
        # a sparse gradient: TF clips its IndexedSlices' values, one row per lookup before
        # duplicates are summed, as the CS holds them (element-wise: the same numbers)
        return Step("clip_by_value", op, low=low, high=high), inner.inputs[0]
    raise why()


def _norm_graph(tensor: tf.Tensor) -> tuple[list[tf.Operation], list[tf.Tensor]] | None:
    """The ops of a norm computation and the gradients whose squares it sums (None: it
    reads something else or uses an op outside _NORM_OPS)."""
    ops, leaves, stack = [], [], [tensor]
    for t in each_once(stack):
        op = t.op
        if op.type == "Const":
            continue
        if op.type == "L2Loss" or (op.type == "Mul" and op.inputs[0].name == op.inputs[1].name):
            ops.append(op)
            leaves.append(op.inputs[0])
            continue
        if op.type not in _NORM_OPS:
            return None
        ops.append(op)
        if op.type not in ("OnesLike", "ZerosLike"):
            stack.extend(op.inputs)
    return ops, leaves


def _clip_by_norm(op: tf.Operation, why) -> tuple[Step, tf.Tensor]:
    """t * c / maximum(l2norm(t), c) (tf.clip_by_norm over all axes)."""
    mul, maximum = op.inputs[0].op, op.inputs[1].op
    if mul.type != "Mul" or maximum.type != "Maximum":
        raise why()
    x, c = mul.inputs[0], scalar(mul.inputs[1])
    found = _norm_graph(maximum.inputs[0])
    if c is None or scalar(maximum.inputs[1]) != c or found is None or \
            {t.name for t in found[1]} != {x.name}:
        raise why()
    rank = x.shape.rank
    for s in (o for o in found[0] if o.type == "Sum"):
        axes = const(s.inputs[1])
        if axes is None or rank is None or sorted({int(a) % rank for a in axes.flat}) != \
                list(range(rank)):
            raise fail(op, "clip_by_norm over some axes only; the CS clips by the norm of "
                           "the whole gradient")
    # a sparse gradient: TF's norm is over its IndexedSlices' values (one row per lookup,
    # duplicates included), as the CS holds them
    return Step("clip_by_norm", op, value=c), x


def _global_norm(scale: tf.Tensor, norms: dict) -> Step | None:
    """clip_norm * minimum(1 / gn, 1 / clip_norm) + (gn - gn), gn the group's global norm."""
    add = skip_identity(scale).op
    if add in norms:
        return norms[add]
    if add.type not in ("AddV2", "Add"):
        return None
    mul = next((t.op for t in add.inputs if t.op.type == "Mul"), None)
    clip = None if mul is None else next(
        (scalar(t) for t in mul.inputs if scalar(t) is not None), None)
    found = _norm_graph(add.outputs[0])
    if clip is None or found is None or not found[1]:
        return None
    packs = [o for o in found[0] if o.type == "Pack"]
    l2 = {o.outputs[0].name: o.inputs[0] for o in found[0] if o.type == "L2Loss"}
    if len(packs) == 1 and len(l2) == len(found[1]):
        group = tuple(l2[t.name] for t in packs[0].inputs if t.name in l2)
    else:
        group = tuple(found[1])
    step = Step("clip_by_global_norm", add, value=clip, group=group)
    norms[add] = step
    return step


def group_order(chains: list[Chain]) -> None:
    """A clip_by_global_norm group's variables in TF's order (the norm sums in it)."""
    for chain in chains:
        for step in chain.steps:
            if step.kind != "clip_by_global_norm" or step.variables:
                continue
            members = {skip_identity(c.inputs[c.steps.index(step)]).name: c.update.variable
                       for c in chains if step in c.steps}
            names = []
            for g in step.group:
                if skip_identity(g).name not in members:
                    raise fail(step.anchor, "clip_by_global_norm over gradients the train_op "
                                            "does not apply; the CS computes the norm of the "
                                            "applied gradients only")
                names.append(members[skip_identity(g).name])
            step.variables = tuple(names)
