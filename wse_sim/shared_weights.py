"""Weights read by several kernels (tied embeddings, a layer called twice), or through a
static view (a slice or constant gather of a position table): each lives once, in the region
of its first use, with its one gradient and optimizer slots; every use reads it (over the
fabric, `wafer.timing`), keeps its own gradient accumulator, and at the end of a batch the
uses' gradients are scattered back into the variable's shape and summed in program order
(TF sums the gradients of a variable's reads with AddN: the same terms, maybe another order)
before the one update. A view is refreshed from the variable after each update; a reshape
is a numpy view of the variable's memory and needs none.

The weight program's sources (wafer.weight_programs) live here too, with or without a use
of their own. Its values, the derived weights, are computed at Load and after each update
into the params of the kernels reading them; after the batch's backward pass their readers'
gradients (summed in program order) flow back through it and are added to its sources'.
A program that draws random numbers computes its values before every batch instead
(`redraw`), from the batch's stream.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

import numpy as np

from wafer.optimizers import Optimizer, slot_name
from wafer.weight_programs import WeightProgram
from wse_sim.program import SPARSE_GRADIENT_KERNELS, ParamSpec, SharedWeight, WeightUse
from wse_sim.view_slices import view_slices

# a batch's gradient kept aside: dense, or an IndexedSlices' (indices, values)
HeldGradient = np.ndarray | tuple[np.ndarray, np.ndarray]


class UseRegion(Protocol):
    """What a use needs of its region (wse_sim.pipeline.Region)."""

    kernel: Any
    variables: dict[str, str]
    params: dict[str, np.ndarray]
    grads: dict[str, np.ndarray]
    pieces: dict[str, list[tuple[np.ndarray, np.ndarray]]]
    backward: bool  # on the backward pass: some gradient reaches it


@dataclass
class Variable:
    """One shared or viewed variable on the CS, with what its updates keep."""

    weight: SharedWeight
    spec: ParamSpec
    value: np.ndarray  # TF's shape, updated in place
    regions: list[UseRegion] = field(default_factory=list)  # of each use, in order
    grad: np.ndarray | None = None
    slots: list[np.ndarray] = field(default_factory=list)
    scratch: list[np.ndarray] = field(default_factory=list)
    slices: tuple[np.ndarray, np.ndarray] | None = None  # a sparse update's IndexedSlices

    def param(self, use: WeightUse) -> np.ndarray:
        """The array a use's kernel reads: the variable's memory, or a copy of its view."""
        if use.view is None:
            return self.value.reshape(use.shape)
        return np.asarray(np.take(self.value.reshape(-1), use.view))  # (a scalar's: 0-d, writable)

    def refresh(self) -> None:
        """After an update: every viewed use reads the new values."""
        flat = self.value.reshape(-1)
        for use, region in zip(self.weight.uses, self.regions):
            if use.view is not None:
                np.take(flat, use.view, out=region.params[use.role])


class SharedWeights:
    """A program's shared and viewed variables (CheckedProgram.shared) on the pipeline."""

    def __init__(self, shared: Mapping[str, SharedWeight], specs: Mapping[str, ParamSpec],
                 state: Mapping[str, np.ndarray], program: WeightProgram | None = None):
        self.variables = {var: Variable(w, specs.get(var, ParamSpec()),
                                        np.array(state[var], np.float32, order="C"))
                          for var, w in shared.items()}
        self.program = program
        self.derived: dict[str, np.ndarray] = self._derive()
        self.reads: dict[str, list[tuple[UseRegion, str]]] = {}  # derived -> (region, role)

    def __contains__(self, variable: str) -> bool:
        return variable in self.variables or variable in self.derived

    def _derive(self, rng: np.random.Generator | None = None) -> dict[str, np.ndarray]:
        """The weight program's values from its sources' current values (a drawing
        program's: zeros until the first batch's `redraw`)."""
        if self.program is None:
            return {}
        if self.program.draws and rng is None:
            return {name: np.zeros(shape, np.float32)
                    for name, shape in self.program.shapes().items()}
        return self.program.forward({var: self.variables[var].value
                                     for var in self.program.sources}, rng)

    def redraw(self, rng: np.random.Generator) -> None:
        """A drawing weight program's values for the next batch, drawn from `rng`, into
        their readers' params."""
        self.derived = self._derive(rng)
        self._copy_derived()

    def __bool__(self) -> bool:
        return bool(self.variables)

    def param(self, variable: str, kernel: int, role: str) -> np.ndarray:
        if variable in self.derived:  # the reading region's own copy
            return np.array(self.derived[variable], np.float32, order="C")
        v = self.variables[variable]
        return v.param(next(u for u in v.weight.uses if u.kernel == kernel and u.role == role))

    def bind(self, regions: Sequence[UseRegion], optimizer: Optimizer | None,
             state: Mapping[str, np.ndarray], trained: set[str]) -> None:
        """Know each use's region; give the `trained` variables a gradient and slots (the
        weight program's unfrozen sources when a trained kernel reads a derived weight)."""
        for region in regions:
            for role, var in region.variables.items():
                if var in self.derived:
                    self.reads.setdefault(var, []).append((region, role))
        if self.program is not None and any(var in trained for var in self.derived):
            trained = trained | {var for var in self.program.sources
                                 if not self.variables[var].spec.frozen}
        for var, v in self.variables.items():
            v.regions = [regions[use.kernel] for use in v.weight.uses]
            if optimizer is None or var not in trained:
                continue
            shape = v.value.shape
            v.grad = np.zeros(shape, np.float32)
            v.scratch = [np.empty(shape, np.float32) for _ in range(2)]
            rule = optimizer.for_variable(var)
            v.slots = [np.array(state.get(slot_name(var, suffix), np.full(shape, initial, np.float32)),
                                dtype=np.float32, order="C")
                       for suffix, initial in zip(rule.slot_suffixes, rule.slot_initial_values)]

    def trained(self) -> list[Variable]:
        return [v for v in self.variables.values() if v.grad is not None]

    def gather_gradients(self) -> None:
        """Every trained variable's batch gradient: its uses' gradients (a use no gradient
        reaches adds none) scattered into its shape and summed in program order, plus its regularizers' (once); a sparse one as
        the IndexedSlices of its lookups, in program order."""
        for v in self.trained():
            assert v.grad is not None
            if v.spec.update == "sparse":
                v.slices = _slices(v)
                continue
            v.grad.fill(0)
            flat = v.grad.reshape(-1)
            for use, region in zip(v.weight.uses, v.regions):
                if not region.backward:
                    continue  # no gradient reaches this use (an argmin's input): TF's None
                g = region.grads[use.role]
                if use.view is None:
                    flat += g.reshape(-1)
                else:
                    np.add.at(flat, use.view.reshape(-1), g.reshape(-1))
            for reg in v.spec.regularizers:
                reg.add_gradient(v.value, v.grad)
        if self.program is not None:
            self._weight_program_gradients()

    def _weight_program_gradients(self) -> None:
        """The derived weights' gradients (their readers', summed in program order) back
        through the weight program, added to its trained sources' gradients."""
        assert self.program is not None
        grads: dict[str, np.ndarray] = {}
        for var, reads in self.reads.items():
            for region, role in reads:
                if role in region.grads:
                    g = region.grads[role]
                    grads[var] = g.copy() if var not in grads else grads[var] + g
        for var, grad in self.program.backward(grads).items():
            v = self.variables[var]
            if v.grad is not None:
                v.grad += grad.reshape(v.grad.shape)

    def gradients(self) -> dict[str, np.ndarray]:
        """The batch's gradients by TF name (sparse: their IndexedSlices' values)."""
        return {v.weight.variable: v.slices[1] if v.slices is not None else v.grad
                for v in self.trained() if v.grad is not None}

    def held(self, variables: frozenset[str]) -> dict[str, HeldGradient]:
        """Copies of the batch's gradients of `variables` (sparse: their IndexedSlices)."""
        return {v.weight.variable: (v.slices[0].copy(), v.slices[1].copy())
                if v.slices is not None else v.grad.copy()
                for v in self.trained() if v.weight.variable in variables and v.grad is not None}

    def restore(self, held: Mapping[str, HeldGradient]) -> None:
        """The gradients `held` gave, back as the batch's (for the update)."""
        for v in self.trained():
            gradient = held.get(v.weight.variable)
            if isinstance(gradient, tuple):
                v.slices = gradient
            elif gradient is not None and v.grad is not None:
                np.copyto(v.grad, gradient)

    def regularization(self) -> float:
        return float(sum((reg.loss(v.value) for v in self.variables.values()
                          for reg in v.spec.regularizers if reg.reported), np.float32(0)))

    def update(self, optimizer: Optimizer,
               write_before: Callable[[str, np.ndarray], object] | None = None,
               skipped: frozenset[str] = frozenset()) -> None:
        """Apply the batch's gradients (`write_before` writing each weight first: a weight
        write before its update; not to the `skipped` variables), then refresh the views
        and the derived weights."""
        for v in self.trained():
            if v.weight.variable in skipped:
                continue
            if write_before is not None:
                write_before(v.weight.variable, v.value)
            rule = optimizer.for_variable(v.weight.variable)
            if v.slices is not None:
                rule.apply_sparse(v.value, *v.slices, v.slots)
                v.slices = None
            else:
                assert v.grad is not None
                rule.apply(v.value, v.grad, v.slots, v.scratch)
            v.refresh()
        self._refresh_derived()

    def reupdate(self, variable: str, rule: Optimizer, gradient: HeldGradient | None,
                 slots: list[np.ndarray], scratch: list[np.ndarray]) -> None:
        """A further optimizer's update of `variable` after its first (`rule`, its own
        `slots`, the `gradient` its objective's pass kept), then its views and the derived
        weights refreshed."""
        v = self.variables[variable]
        if isinstance(gradient, tuple):
            rule.apply_sparse(v.value, *gradient, slots)
        else:
            assert gradient is not None
            rule.apply(v.value, gradient, slots, scratch)
        v.refresh()
        self._refresh_derived()

    def rewritten(self, variables: set[str]) -> None:
        """After `variables`' values were written in place: their views and the derived
        weights read the new values."""
        for var in variables:
            self.variables[var].refresh()
        self._refresh_derived()

    def _refresh_derived(self) -> None:
        """The derived weights from the updated sources (a drawing program's: at the next
        batch's `redraw`)."""
        if self.program is not None and not self.program.draws:
            self.derived = self._derive()
            self._copy_derived()

    def _copy_derived(self) -> None:
        for var, reads in self.reads.items():
            for region, role in reads:
                np.copyto(region.params[role], self.derived[var])

    def state(self, optimizer: Optimizer | None) -> dict[str, np.ndarray]:
        """The variables and, under their TF names, the slots of the trained ones."""
        out: dict[str, np.ndarray] = {}
        for var, v in self.variables.items():
            out[var] = v.value
            suffixes = optimizer.for_variable(var).slot_suffixes if v.slots and optimizer else ()
            for suffix, slot in zip(suffixes, v.slots):
                out[slot_name(var, suffix)] = slot
        return out


def _slices(v: Variable) -> tuple[np.ndarray, np.ndarray]:
    """The IndexedSlices of a table every use looks up (a gather's pieces) or reads whole, or
    that every use reads through the one view of a gather at constant indices (their
    gradients summed: view_slices)."""
    if v.weight.uses[0].view is not None:
        view = v.weight.uses[0].view
        summed = np.zeros(view.shape, np.float32)
        for use, region in zip(v.weight.uses, v.regions):
            if region.backward:
                summed += region.grads[use.role]
        return view_slices(view, summed, v.value.shape[1:])
    ids, values = [], []
    for use, region in zip(v.weight.uses, v.regions):
        pieces = region.pieces.pop(use.role, [])
        if not region.backward:
            continue  # no gradient reaches this use: TF's None
        if region.kernel.type_name not in SPARSE_GRADIENT_KERNELS:
            # read whole (position embeddings, [None] of them too): every row once, in order
            grad = region.grads[use.role].reshape(v.value.shape)
            ids.append(np.arange(len(v.value)))
            values.append(grad)
            continue
        ids += [i for i, _ in pieces]
        values += [x for _, x in pieces]
    if not ids:
        return np.zeros(0, np.int64), np.zeros((0,) + v.value.shape[1:], np.float32)
    return np.concatenate(ids), np.concatenate(values)
