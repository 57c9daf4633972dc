"""The kernel interface: one class per library kernel holds its forward, its backward, its
FLOPs per sample and its memory, so the compiler's cost model and the simulator's
arithmetic read the same definition.

Shapes given to and returned by a kernel's *shape* methods are per sample (no batch
dimension). Arrays given to forward/backward carry a leading micro-batch dimension.
All arithmetic is float32 numpy; a kernel's output may also be int32, int64 or bool
(comparisons, casts), as its `output_dtype` says.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping, Sequence, TypeGuard

import numpy as np

Shape = tuple[int, ...]
INTEGER = (np.int32, np.int64)  # the integer dtypes kernels take (indices, labels)
INTEGER_NAMES = tuple(np.dtype(t).name for t in INTEGER)  # (attrs naming an output dtype)


# A core needs at least this many forward FLOPs of a kernel's work per sample to be useful:
# the cost model's bound on a kernel's parallelism (max_cores ~ flops_per_sample / this).
# 1152 FLOPs = 576 multiply-adds, a 24 x 24 weight tile per core per sample. Calibrated with
# Fabric.efficiency = 0.5 so that FC-MNIST (784-500-300-10), whose kernels all sit at their
# parallelism limit, estimates r f eta / (3 x 1152) = 8 x 1.1e9 x 0.5 / 3456 = 1.27 M
# samples/s on a CS-2, the original's published compile estimate.
MIN_FLOPS_PER_CORE = 1152


def max_cores_for(flops_per_sample: float) -> int:
    """A kernel's useful parallelism: one core per MIN_FLOPS_PER_CORE of forward work."""
    return max(1, math.ceil(flops_per_sample / MIN_FLOPS_PER_CORE))


Tile = Callable[[], None]  # a piece of a kernel's work writing its own part of the output


def run_in_order(tiles: Sequence[Tile], later: Sequence[Tile] = ()) -> None:
    for tile in (*tiles, *later):
        tile()


class KernelError(ValueError):
    """A kernel built with attributes or input shapes it cannot accept."""


@dataclass
class RunContext:
    """What a kernel may need besides its inputs while running one micro-batch."""

    training: bool
    batch_size: int  # the full batch (losses reduced with "mean" divide by it)
    rng: np.random.Generator | None = None  # the region's own seeded stream (dropout, random)
    input_grads: Sequence[bool] | None = None  # which inputs need a gradient (None: all)
    accumulate: bool = True  # add into backward's param_grads (False: the batch's first, overwrite)
    # runs the tiles of a kernel's large GEMMs (`tiles`), maybe several at once on the
    # executor's threads; returns once all are done, except those passed as `later`
    # (weight gradients: the executor waits for them before it reads the accumulators)
    run_tiles: Callable[..., object] = run_in_order
    extra: dict[str, Any] = field(default_factory=dict)
    # a batch barrier's statistics of the whole batch: (batch_statistics,) in forward,
    # (batch_statistics, gradient_statistics) in backward
    batch: tuple[Any, ...] = ()
    offset: int = 0  # the batch's index of the micro-batch's first sample (forward)
    step: int = 0  # the global step the batch trains from (evaluation: the checkpoint's)
    # the step's forward pass run again (a further loss's backward pass: wse_sim.pipeline):
    # what a training forward moves (moving statistics) moved in the first
    replay: bool = False

    def wants_grad(self, index: int) -> bool:
        return self.input_grads is None or bool(self.input_grads[index])


class Kernel:
    """Base class of library kernels.

    Subclasses set `type_name` and implement the methods below. A kernel is built from
    its name, its attributes (plain Python values, as decoded from the program's
    AttrValue map) and the per-sample shapes of its inputs, and must raise KernelError
    with a precise message when they do not fit.
    """

    type_name: ClassVar[str]
    is_loss: ClassVar[bool] = False
    # A batch barrier computes with values of the whole batch (BatchNormalization in
    # training, in-batch products): the kernels whose samples meet. The executor gives it
    # the whole batch of its inputs (`batch_statistics`) before any micro-batch's forward,
    # and every micro-batch's output gradient (`gradient_statistics`) before any backward.
    batch_barrier: ClassVar[bool] = False
    barrier_holds: ClassVar[str] = "the whole batch's statistics"  # (the compile report's words)
    # a float16 kernel (attr precision) whose forward rounds its own output (the fused
    # affine kernels round each TF op's result inside); others are rounded by the executor
    rounds_own_output: ClassVar[bool] = False
    # its forward draws from the step's random stream (`RunContext.rng`: dropout); the
    # executor makes a stream only for such kernels (a generator costs ~25 us a step)
    draws_random: ClassVar[bool] = False
    # it draws in evaluation and prediction too (as TF's ops do in every mode)
    draws_in_inference: ClassVar[bool] = False

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]):
        self.name = name
        self.attrs = dict(attrs)
        self.input_shapes = [tuple(int(d) for d in s) for s in input_shapes]
        # backward passes of a training step through it: one per loss whose backward pass
        # reaches it when a step minimizes several (a GAN's; wafer.timing.count_backward_passes)
        self.backward_passes = 1

    # ---- shapes and cost model (compiler and timing model) ----
    @property
    def output_shape(self) -> Shape:
        """Per-sample output shape (a loss kernel returns ())."""
        raise NotImplementedError

    def param_shapes(self) -> dict[str, Shape]:
        """Weights by role, e.g. {"kernel": (784, 500), "bias": (500,)}; {} if none."""
        return {}

    def flops_per_sample(self) -> float:
        """Forward FLOPs for one sample (a multiply-add counts 2)."""
        raise NotImplementedError

    def max_cores(self) -> int:
        """Useful parallelism: more cores than this do not make the kernel faster."""
        raise NotImplementedError

    def activation_bytes_per_sample(self) -> int:
        """Bytes this kernel keeps per sample in flight for its backward pass."""
        raise NotImplementedError

    # ---- dtypes and gradient flow (program checks and the executor) ----
    def output_dtype(self, input_dtypes: Sequence[np.dtype]) -> np.dtype:
        """The output's dtype given the inputs' (KernelError for a dtype the kernel cannot
        take), checked along the program at Load. By default every input is float32 and so
        is the output: a kernel taking integer or bool inputs (indices, labels) or giving a
        non-float32 output overrides it."""
        check_dtypes(self, input_dtypes, [(np.float32,)] * len(input_dtypes))
        return np.dtype(np.float32)

    def input_differentiable(self, index: int) -> bool:
        """Whether a gradient flows back through input `index` (False: stop_gradient,
        integer or bool inputs, comparisons, labels): backward returns None for it."""
        return True

    # ---- arithmetic (simulator) ----
    def forward(self, params: Mapping[str, np.ndarray], inputs: Sequence[np.ndarray],
                ctx: RunContext) -> tuple[np.ndarray, Any]:
        """Return (output, cache); the cache is handed back to backward."""
        raise NotImplementedError

    def batch_statistics(self, params: Mapping[str, np.ndarray], inputs: Sequence[np.ndarray],
                         ctx: RunContext) -> Any:
        """A batch barrier: the statistics of the whole batch of each input (every
        micro-batch of it, in order), which forward reads as ctx.batch[0]."""
        raise NotImplementedError

    def barrier_transfers(self) -> tuple[int, ...] | None:
        """A batch barrier: the values each of its transfers across its region carries in a
        pass (None: BatchNormalization's, the channels' sums: wafer.timing.barrier)."""
        return None

    def gradient_statistics(self, params: Mapping[str, np.ndarray], caches: Sequence[Any],
                            grads: Sequence[np.ndarray], ctx: RunContext) -> Any:
        """A batch barrier: the statistics of the whole batch's output gradient (every
        micro-batch's, with its forward cache), which backward reads as ctx.batch[1]."""
        raise NotImplementedError

    def backward(self, params: Mapping[str, np.ndarray], cache: Any, grad_output: np.ndarray | None,
                 ctx: RunContext, param_grads: Mapping[str, np.ndarray] | None = None,
                 ) -> tuple[list[np.ndarray | None], dict[str, np.ndarray]]:
        """Return (gradients w.r.t. inputs, gradients w.r.t. params by role).

        An input that takes no gradient (labels, integer inputs) gets None.
        A loss kernel receives grad_output=None and applies its own reduction scale.
        With `param_grads` (accumulators by role, shaped like the params), the micro-batch's
        parameter gradients are added into them in place (overwrite them when
        `ctx.accumulate` is False: the batch's first micro-batch) and they are returned: a
        region accumulates its weight gradient over the batch without allocating.
        """
        raise NotImplementedError


    def table_slices(self, cache: Any, grad_output: np.ndarray,
                     role: str = "p0") -> tuple[np.ndarray, np.ndarray]:
        """A lookup kernel's (wse_sim.program.SPARSE_GRADIENT_KERNELS) gradient of its table
        `role` for the micro-batch, as TF's IndexedSlices: (ids, one row of values per id)."""
        raise NotImplementedError

def is_int(value: Any) -> TypeGuard[int]:
    """An int attr (not a bool, which Python counts as one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_dtypes(kernel: Kernel, input_dtypes: Sequence[np.dtype],
                 allowed: Sequence[Sequence[type]]) -> None:
    """Refuse an input whose dtype is not among those allowed for its position."""
    for index, (dtype, accepted) in enumerate(zip(input_dtypes, allowed)):
        if np.dtype(dtype) not in [np.dtype(a) for a in accepted]:
            names = " or ".join(np.dtype(a).name for a in accepted)
            raise KernelError(f"kernel {kernel.name!r} ({kernel.type_name}): input {index} is "
                              f"{np.dtype(dtype).name}, it takes {names}")


def accumulate(acc: Mapping[str, np.ndarray] | None, role: str, value: np.ndarray,
               grads: dict[str, np.ndarray], ctx: RunContext) -> None:
    """Add a parameter gradient into its accumulator (or hand it back when there is none)."""
    if acc is None:
        grads[role] = value
        return
    if ctx.accumulate:
        np.add(acc[role], value, out=acc[role])
    else:
        np.copyto(acc[role], value)
    grads[role] = acc[role]


KERNELS: dict[str, type[Kernel]] = {}


def register(cls: type[Kernel]) -> type[Kernel]:
    """Class decorator adding a kernel to the library under its `type_name`."""
    KERNELS[cls.type_name] = cls
    return cls


def build_kernel(kernel_type: str, name: str, attrs: Mapping[str, Any],
                 input_shapes: Sequence[Shape]) -> Kernel:
    try:
        cls = KERNELS[kernel_type]
    except KeyError:
        raise KernelError(f"kernel {name!r}: unknown kernel type {kernel_type!r}; "
                          f"the library has {', '.join(sorted(KERNELS))}") from None
    return cls(name, attrs, input_shapes)
