"""The layer-pipelined executor: every kernel of the program is resident on its region for
the whole job, owning its weights, gradient accumulator and optimizer slots.

A batch of B samples streams through as M = B / micro_batch_size micro-batches on a clock
of ticks. At tick t the region at topological position k runs the forward pass of
micro-batch t - k and the backward pass of micro-batch t - 2(K - 1) + k (K regions; the
loss region turns a micro-batch around in the tick it sees it), so region k works on
micro-batch i + 1 while region k + 1 works on micro-batch i, and gradients flow back the
same way. Each region adds its micro-batches' weight gradients into its accumulator and
updates its weights in place once its backward pass of the batch ends. The result is
ordinary mini-batch training; `wse_sim.timing` says how long the wafer would take.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from wse_sim.kernels import Kernel, RunContext
from wse_sim.optimizers import Optimizer


@dataclass
class Region:
    """One kernel on its rectangle of cores, with everything it keeps for the job."""

    kernel: Kernel
    position: int
    sources: tuple[str, ...]  # program inputs or earlier kernels
    variables: dict[str, str]  # role -> TF variable name
    params: dict[str, np.ndarray]  # role -> weights (updated in place)
    trains: bool = False  # upstream of the loss: runs a backward pass
    grads: dict[str, np.ndarray] = field(default_factory=dict)  # gradient accumulators
    slots: dict[str, list[np.ndarray]] = field(default_factory=dict)  # role -> optimizer slots
    scratch: dict[str, np.ndarray] = field(default_factory=dict)
    input_grads: tuple[bool, ...] = ()


@dataclass(frozen=True)
class StepOutput:
    loss: float
    outputs: dict[str, np.ndarray]  # requested kernel or input values, batch first


class Pipeline:
    """A program's kernels resident on their regions; runs batches in pipelined ticks."""

    def __init__(self, kernels: Sequence[Kernel], sources: Sequence[Sequence[str]],
                 variables: Sequence[Mapping[str, str]], state: Mapping[str, np.ndarray], *,
                 batch_size: int, micro_batch_size: int, loss_kernel: str,
                 optimizer: Optimizer | None, seed: int):
        self.batch_size = batch_size
        self.micro = micro_batch_size
        self.loss_kernel = loss_kernel
        self.optimizer = optimizer
        self.rng = np.random.Generator(np.random.PCG64(seed))
        self.regions: list[Region] = []
        for position, (kernel, srcs, names) in enumerate(zip(kernels, sources, variables)):
            params = {role: np.array(state[var], dtype=np.float32, order="C")
                      for role, var in names.items()}
            self.regions.append(Region(kernel, position, tuple(srcs), dict(names), params))
        self.by_name = {r.kernel.name: r for r in self.regions}
        self._mark_training()
        if optimizer is not None:
            for region in self.regions:
                for role, var in region.variables.items():
                    shape = region.params[role].shape
                    region.grads[role] = np.zeros(shape, np.float32)
                    region.scratch[role] = np.empty(shape, np.float32)
                    region.slots[role] = [
                        np.array(state.get(f"{var}/{suffix}", np.zeros(shape, np.float32)),
                                 dtype=np.float32, order="C")
                        for suffix in optimizer.slot_suffixes]
            for name in optimizer.scalar_names:
                if name in state:
                    optimizer.scalars[name] = np.asarray(state[name], np.float32)

    def _mark_training(self) -> None:
        """Regions upstream of the loss train; an input takes a gradient if it is such a region."""
        if not self.loss_kernel:
            return
        needed = {self.loss_kernel}
        for region in reversed(self.regions):
            if region.kernel.name in needed:
                region.trains = True
                needed.update(region.sources)
        for region in self.regions:
            region.input_grads = tuple(s in self.by_name and self.by_name[s].trains
                                       for s in region.sources)

    # ---- running batches ----
    def run(self, batch: Mapping[str, np.ndarray], *, training: bool,
            outputs: Sequence[str] = ()) -> StepOutput:
        """One batch: forward (and when training, backward and update) through the pipeline."""
        regions = self.regions
        k_count = len(regions)
        m_count = self.batch_size // self.micro
        values: dict[str, list] = {name: [array[i * self.micro:(i + 1) * self.micro]
                                          for i in range(m_count)]
                                   for name, array in batch.items()}
        for region in regions:
            values[region.kernel.name] = [None] * m_count
        caches: list[list] = [[None] * m_count for _ in regions]
        grads: dict[str, list] = {r.kernel.name: [None] * m_count for r in regions}
        backward = training and self.optimizer is not None and bool(self.loss_kernel)
        ctx = RunContext(training=training, batch_size=self.batch_size, rng=self.rng)
        last_tick = m_count - 1 + (2 * (k_count - 1) if backward else k_count - 1)
        for tick in range(last_tick + 1):
            for region in regions:
                k, name = region.position, region.kernel.name
                i = tick - k
                if 0 <= i < m_count:
                    out, cache = region.kernel.forward(
                        region.params, [values[s][i] for s in region.sources], ctx)
                    values[name][i] = out
                    caches[k][i] = cache
                if not (backward and region.trains):
                    continue
                i = tick - 2 * (k_count - 1) + k
                if 0 <= i < m_count:
                    self._backward(region, i, caches, grads, ctx)
        if backward:
            self._update()
        loss = 0.0
        if self.loss_kernel:
            loss = float(sum(np.sum(v, dtype=np.float32) for v in values[self.loss_kernel]))
        return StepOutput(loss, {name: np.concatenate(values[name]) for name in outputs})

    def _backward(self, region: Region, i: int, caches, grads, ctx: RunContext) -> None:
        name = region.kernel.name
        upstream = None if region.kernel.is_loss else grads[name][i]
        if upstream is None and not region.kernel.is_loss:
            return  # nothing downstream of this micro-batch's output reached the loss
        ctx.input_grads, ctx.accumulate = region.input_grads, i > 0
        input_grads, _ = region.kernel.backward(region.params, caches[region.position][i], upstream,
                                                ctx, region.grads or None)
        ctx.input_grads, ctx.accumulate = None, True
        caches[region.position][i] = None
        grads[name][i] = None
        for source, wanted, grad in zip(region.sources, region.input_grads, input_grads):
            if not wanted or grad is None:
                continue
            held = grads[source][i]
            if held is None:
                grads[source][i] = grad
            else:
                grads[source][i] = held + grad

    def _update(self) -> None:
        optimizer = self.optimizer
        for region in self.regions:
            if region.trains:
                for role, var in region.params.items():
                    optimizer.apply(var, region.grads[role], region.slots[role], region.scratch[role])
        optimizer.finish_step()

    # ---- state ----
    def state(self) -> dict[str, np.ndarray]:
        """Weights, optimizer slots and scalars by their TensorFlow names."""
        out: dict[str, np.ndarray] = {}
        suffixes = self.optimizer.slot_suffixes if self.optimizer is not None else ()
        for region in self.regions:
            for role, var in region.variables.items():
                out[var] = region.params[role]
                for suffix, slot in zip(suffixes, region.slots.get(role, ())):
                    out[f"{var}/{suffix}"] = slot
        if self.optimizer is not None:
            out.update(self.optimizer.scalars)
        return out
