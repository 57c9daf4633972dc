"""The loss of a batch tail: a loss that is a non-linear function of values of the whole
batch (a Mixture-of-Experts balance loss's importance x load, VICReg's variance hinge and
covariance, Barlow Twins' cross-correlation, the entropy of the batch's mean prediction).

`batch_tail_loss` is a loss kernel and a batch barrier. Its inputs are per-sample values
(the frontier of the user's loss tail); attr `steps` is the tail itself, a program of
library kernels run on a batch of one whose one sample is the whole batch
(`wafer.weight_programs.WeightProgram`: input j is source `input{j}`, shape (B, *its
per-sample shape)), as JSON: [{name, type, inputs, attrs}], an attr holding an array given
as the kernel attr `<step index>/<attr name>` instead. The last step is the loss, shape ().
Forward, once the whole batch of every input is there (`batch_statistics`), the program
computes the loss in TF's op order, each kernel's float32 arithmetic; micro-batch 0's first
sample carries it (every other value is 0, so the batch's sum is the loss). Backward, its
gradient with respect to each input of the whole batch runs back through the same kernels
(their backward, TF's gradient functions), seeded with `loss_scale` (default 1); each
micro-batch takes its rows.
"""
from __future__ import annotations

import json
import math
from typing import Any, Mapping, Sequence

import numpy as np

from wafer.kernels.base import Kernel, KernelError, RunContext, build_kernel, max_cores_for, register
from wafer.weight_programs import WeightProgram, WeightStep


def steps_attrs(steps: Sequence[tuple[str, str, Sequence[str], Mapping[str, Any]]]) -> dict[str, Any]:
    """The kernel attrs holding a tail's steps (name, type, inputs, attrs) in program order:
    `steps` as JSON, each array attr as `<index>/<key>`."""
    described, arrays = [], {}
    for index, (name, kind, inputs, attrs) in enumerate(steps):
        plain = {}
        for key, value in attrs.items():
            if isinstance(value, (np.ndarray, np.generic)):
                arrays[f"{index}/{key}"] = np.asarray(value)
            else:
                plain[key] = value
        described.append({"name": name, "type": kind, "inputs": list(inputs), "attrs": plain})
    return {"steps": json.dumps(described), **arrays}


def source_name(j: int) -> str:
    """The name the tail's steps read input j by."""
    return f"input{j}"


@register
class BatchTailLoss(Kernel):
    """attrs steps (see the module), batch_size B, loss_scale; inputs the per-sample float32
    values the tail reads (and the integer labels a slice of the batch takes); output () per sample, the batch's loss on its first sample."""

    type_name = "batch_tail_loss"
    is_loss = True
    batch_barrier = True
    barrier_holds = "the whole batch's values of the loss"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]):
        super().__init__(name, attrs, input_shapes)
        batch = self.attrs.get("batch_size")
        scale = self.attrs.get("loss_scale", 1.0)
        if not isinstance(batch, int) or batch < 1 or not self.input_shapes or \
                isinstance(scale, bool) or not isinstance(scale, (int, float)) or \
                not math.isfinite(scale) or scale <= 0:
            raise KernelError(f"kernel {name!r} (batch_tail_loss): takes per-sample inputs, attr "
                              f"batch_size (>= 1) and a positive loss_scale, got "
                              f"{len(self.input_shapes)} inputs, batch_size {batch!r}, "
                              f"loss_scale {scale!r}")
        self.batch: int = batch
        self.seed = np.float32(scale)
        self.program = self._program(name)

    def _program(self, name: str) -> WeightProgram:
        try:
            described = json.loads(self.attrs.get("steps", ""))
        except (TypeError, ValueError) as error:
            raise KernelError(f"kernel {name!r} (batch_tail_loss): attr steps is not JSON "
                              f"({error})") from None
        sources = [source_name(j) for j in range(len(self.input_shapes))]
        shapes = {s: (self.batch, *shape) for s, shape in zip(sources, self.input_shapes)}
        steps = []
        for index, step in enumerate(described if isinstance(described, list) else [None]):
            if not isinstance(step, dict) or {"name", "type", "inputs", "attrs"} - set(step) or \
                    any(i not in shapes for i in step["inputs"]) or step["name"] in shapes:
                raise KernelError(f"kernel {name!r} (batch_tail_loss): step {index} is not "
                                  "{name, type, inputs, attrs} reading inputs or earlier steps")
            attrs = dict(step["attrs"])
            prefix = f"{index}/"
            attrs.update({k[len(prefix):]: v for k, v in self.attrs.items() if k.startswith(prefix)})
            kernel = build_kernel(step["type"], step["name"], attrs,
                                  [shapes[i] for i in step["inputs"]])
            shapes[kernel.name] = tuple(kernel.output_shape)
            steps.append(WeightStep(kernel, tuple(step["inputs"])))
        if not steps or shapes[steps[-1].kernel.name] != ():
            raise KernelError(f"kernel {name!r} (batch_tail_loss): its last step is the loss, "
                              "shape ()")
        return WeightProgram(sources, steps)

    @property
    def output_shape(self):
        return ()

    def output_dtype(self, input_dtypes):
        """float32, its inputs' dtypes checked along the program: float32 values, and the
        integers (labels) only kernels taking integers read (slices, one_hot, cast)."""
        dtypes = {source_name(j): np.dtype(d) for j, d in enumerate(input_dtypes)}
        for step in self.program.steps:
            dtypes[step.kernel.name] = step.kernel.output_dtype([dtypes[i] for i in step.inputs])
        if dtypes[self.program.steps[-1].kernel.name] != np.float32:
            raise KernelError(f"kernel {self.name!r} (batch_tail_loss): its loss is not float32")
        return np.dtype(np.float32)

    def _values(self) -> int:
        return sum(math.prod(s) for s in self.input_shapes)

    def flops_per_sample(self) -> float:
        return self.program.flops() / self.batch  # (the program's one sample: the batch)

    def max_cores(self) -> int:
        return max_cores_for(self.flops_per_sample())

    def activation_bytes_per_sample(self) -> int:
        return 4 * self._values()  # every value until the batch is whole

    def barrier_transfers(self) -> tuple[int, ...]:
        """The batch's values (forward) and their gradients (backward)."""
        return (self.batch * self._values(),)

    def set_loss_scale(self, loss_scale: np.float32) -> None:
        self.seed = np.float32(loss_scale)

    # ---- the batch barrier ----
    def batch_statistics(self, params, inputs: Sequence[np.ndarray], ctx: RunContext):
        values = self.program.forward({source_name(j): x for j, x in enumerate(inputs)})
        return np.float32(values[self.program.steps[-1].kernel.name])

    def gradient_statistics(self, params, caches: Sequence[Any], grads: Sequence[np.ndarray],
                            ctx: RunContext):
        found = self.program.backward({self.program.steps[-1].kernel.name: np.asarray(self.seed)})
        return [found.get(source_name(j), np.zeros((self.batch, *shape), np.float32))
                for j, shape in enumerate(self.input_shapes)]

    # ---- one micro-batch ----
    def forward(self, params, inputs, ctx: RunContext):
        out = np.zeros(len(inputs[0]), np.float32)
        if ctx.offset == 0 and len(out):
            out[0] = ctx.batch[0]
        return out, (ctx.offset, len(out))

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        offset, rows = cache
        return [np.ascontiguousarray(g[offset:offset + rows]) if ctx.wants_grad(j) else None
                for j, g in enumerate(ctx.batch[1])], {}
