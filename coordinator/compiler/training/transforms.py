"""The ordered list of gradient transforms the CS applies (wafer.grad_transforms), emitted
from the recognised chains, the loss scale folded in."""
from __future__ import annotations

import numpy as np

from coordinator.compiler.training.gradients import Chain, Step
from coordinator.compiler.training.graph import fail
from wafer.grad_transforms import GradientTransform


def merge(chains: list[Chain]) -> list[GradientTransform]:
    """One ordered list: each variable's steps in its order, a global-norm group once,
    equal per-variable steps merged when no step on their variables lies between."""
    order = {op.name: i for i, op in enumerate(chains[0].update.op.graph.get_operations())}
    instances: list[tuple[Step, tuple[str, ...]]] = []
    for chain in chains:
        for step in chain.steps:
            if step.kind == "clip_by_global_norm":
                if all(s is not step for s, _ in instances):
                    instances.append((step, step.variables))
            else:
                instances.append((step, (chain.update.variable,)))
    instances.sort(key=lambda sv: order[sv[0].anchor.name])
    merged: list[tuple[tuple, list[str]]] = []
    programs = {id(step.program): step.program for step, _ in instances}
    for step, names in instances:
        key = (step.kind, step.value, step.low, step.high, id(step.program))
        target = None
        if step.kind not in ("clip_by_global_norm", "program"):
            for entry in reversed(merged):
                if set(entry[1]) & set(names):
                    break
                if entry[0] == key:
                    target = entry
                    break
        if target is None:
            merged.append((key, list(names)))
        else:
            target[1].extend(names)
    rank = {c.update.variable: i for i, c in enumerate(chains)}
    return [GradientTransform(k[0], value=k[1], low=k[2], high=k[3], variables=tuple(
        v if k[0] == "clip_by_global_norm" else sorted(v, key=rank.__getitem__)),
        program=programs[k[4]]) for k, v in merged]


def fold_loss_scale(chains: list[Chain], half: bool) -> tuple[list[GradientTransform], float]:
    """The steps as the CS applies them to d(loss)/d(var): the loss scale S first, folded
    into the scale steps that follow it (S * (1 / S) = 1 drops both); and the scale left in
    the backward's seed. A float16 program keeps S in its seed (float16 gradients of S x the
    loss are what TF rounds and what overflows), and its 1 / S steps in the transforms."""
    if half:
        scales = {chain.call.scale for chain in chains}
        if len(scales) > 1:
            raise fail(chains[0].update.op, f"gradients of the loss scaled by several factors "
                                            f"({', '.join(map(str, sorted(scales)))})")
        return merge(chains), scales.pop()
    for chain in chains:
        if chain.call.scale != 1.0:
            chain.steps.insert(0, Step("scale", chain.raw.op, value=chain.call.scale))
        while (len(chain.steps) >= 2 and chain.steps[0].kind == "scale"
               and chain.steps[1].kind == "scale"):
            first = chain.steps.pop(0)
            chain.steps[0] = Step("scale", chain.steps[0].anchor, value=float(
                np.float32(first.value) * np.float32(chain.steps[0].value)))
        if chain.steps and chain.steps[0].kind == "scale" and \
                abs(chain.steps[0].value - 1.0) < 1e-6:
            chain.steps.pop(0)
    return merge(chains), 1.0
