"""A loss model_fn returns besides the one its optimizer minimizes (TF trains on the minimized
value and reports the returned one): the data loss returned while the loss plus weight decay,
or plus an auxiliary head's loss, is minimized. The CS trains on the minimized loss's kernel
and reports the returned loss's kernel, both from the same forward pass (the returned loss's
per-sample terms from the same micro-batches); a weight penalty of the minimized loss alone
adds its gradient and is left out of the reported loss."""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import tensorflow as tf

from coordinator.compiler import loss_tail
from coordinator.compiler.extract import ExtractedGraph, data_upstream, user_name, user_source
from coordinator.compiler.ir import KernelNode, ParamRef, UnsupportedOp
from coordinator.compiler.training import minimized_apart
from coordinator.compiler.training.writes import computed_after_write

Penalties = dict[str, list[tuple[str, float]]]


def minimized_view(extracted: ExtractedGraph) -> tuple[ExtractedGraph, tf.Tensor | None]:
    """The graph with the minimized loss as model_fn's (the training passes' view) and the
    loss model_fn returns, when the train_op minimizes another; else (extracted, None)."""
    spec = extracted.spec
    if spec.loss is None or spec.train_op is None:
        return extracted, None
    minimized = minimized_apart(extracted)
    if minimized is None:
        return extracted, None
    view = dataclasses.replace(extracted, spec=dataclasses.replace(spec, loss=minimized))
    return view, spec.loss


def lower_first(matcher: Any, minimized: tf.Tensor | None, returned: tf.Tensor | None
                ) -> tuple[str, Penalties]:
    """The returned loss's kernel and penalties when it reads the minimized loss (a sum of
    it and other terms), lowered before it: a loss lowered first is a kernel's output, no
    longer the scalar a later loss's tail reads; else ("", {}): lowered after it."""
    if returned is None or minimized is None or matcher.unsupported or \
            minimized.op not in set(data_upstream(returned.op)):
        return "", {}
    return loss_tail.lower_loss(matcher, returned, True)


def after_update(returned: tf.Tensor) -> list[UnsupportedOp]:
    """The returned loss computed (in part) after a variable's write (under
    tf.control_dependencies([the update])): not a value of the step's forward pass."""
    found = computed_after_write(returned)
    if found is None:
        return []
    op, write = found
    return [UnsupportedOp(op.type, user_name(op), user_source(op), (
        f"computes the loss model_fn returns after a write ({write.type} at "
        f"{user_source(write)}) while the optimizer minimizes another loss: the CS "
        "reports the returned loss from the step's forward pass; compute it outside "
        "the control dependencies"))]


def unreported(returned: tf.Tensor, minimized: Penalties, reported: Penalties
               ) -> tuple[frozenset[str], list[UnsupportedOp]]:
    """The variables whose weight penalties are the minimized loss's alone (their gradients
    added, their values left out of the reported loss); a returned loss's penalty other
    than the minimized one's, refused."""
    for variable, terms in reported.items():
        if sorted(terms) != sorted(minimized.get(variable, [])):
            return frozenset(), [UnsupportedOp(returned.op.type, user_name(returned.op),
                                               user_source(returned.op), (
                f"the loss model_fn returns holds a weight penalty on {variable} {terms} "
                f"other than the loss the optimizer minimizes "
                f"({minimized.get(variable, [])}): the CS reports penalties of the minimized "
                f"loss; add the penalty to the minimized loss too, or drop it"))]
    return frozenset(set(minimized) - set(reported)), []


def mark_unreported(kernels: Sequence[KernelNode], params: Sequence[ParamRef],
                    variables: frozenset[str]) -> tuple[list[KernelNode], list[ParamRef]]:
    """The kernels' and weight program's params with the penalties of `variables` marked
    as the minimized loss's alone."""
    def marked(p: ParamRef) -> ParamRef:
        return dataclasses.replace(p, penalty_reported=False) if p.variable in variables else p
    return ([dataclasses.replace(k, params=tuple(map(marked, k.params))) for k in kernels],
            [marked(p) for p in params])
