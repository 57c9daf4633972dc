"""Kernels that move or combine values: dropout, reshape, add, concat (without weights), and
broadcast (a weight given to every sample)."""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from wafer.kernels.base import Kernel, KernelError, RunContext, accumulate, max_cores_for, register
from wafer.kernels.draw_replay import replay_of
from wafer.kernels.operands import reduce_to


class Elementwise(Kernel):
    """A weightless kernel whose cost is one operation per output element."""

    def _elements(self) -> int:
        return math.prod(self.output_shape)

    def flops_per_sample(self) -> float:
        return float(self._elements())

    def max_cores(self) -> int:
        return max_cores_for(self.flops_per_sample())

    def activation_bytes_per_sample(self) -> int:
        return 0


@register
class Dropout(Elementwise):
    """Keep each value with probability 1 - rate, scaled by 1 / (1 - rate), with the
    program's own seeded generator, in every mode: an evaluation or prediction graph holds
    dropout only where the model asks for it (Keras' Dropout(training=True), tf.nn.dropout).
    attr noise_shape (per sample, 1 where the mask is shared, e.g. SpatialDropout's
    (1, 1, C)): one keep decision broadcast over those axes, as tf.nn.dropout's noise_shape."""

    type_name = "dropout"
    draws_random = True
    draws_in_inference = True

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]):
        super().__init__(name, attrs, input_shapes)
        self.rate = float(self.attrs.get("rate", -1))
        if len(self.input_shapes) != 1 or not 0 <= self.rate < 1:
            raise KernelError(f"kernel {name!r}: dropout takes 1 input and a rate in [0, 1), "
                              f"got {len(self.input_shapes)} inputs and rate {self.rate}")
        self.scale = np.float32(1.0 / (1.0 - self.rate))
        shape = self.input_shapes[0]
        self.noise_shape = tuple(int(d) for d in self.attrs.get("noise_shape", shape))
        if len(self.noise_shape) != len(shape) or any(
                n not in (1, d) for n, d in zip(self.noise_shape, shape)):
            raise KernelError(f"kernel {name!r}: dropout noise_shape {self.noise_shape} does not "
                              f"broadcast to the samples {shape}")

    @property
    def output_shape(self):
        return self.input_shapes[0]

    def activation_bytes_per_sample(self) -> int:
        return self._elements()  # the keep mask, a byte per value

    def forward(self, params, inputs, ctx: RunContext):
        x = inputs[0]
        if self.rate == 0:
            return x, None
        shape = (x.shape[0], *self.noise_shape)
        uniform = replay_of(self.name, shape)
        if uniform is None:
            assert ctx.rng is not None, "the pipeline gives a dropout region its random stream"
            uniform = ctx.rng.random(shape, dtype=np.float32)
        keep = np.asarray(uniform, np.float32).reshape(shape) >= np.float32(self.rate)
        return x * self.scale * keep, keep

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        if cache is None:
            return [grad_output], {}
        return [grad_output * self.scale * cache], {}


@register
class Reshape(Elementwise):
    type_name = "reshape"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]):
        super().__init__(name, attrs, input_shapes)
        shape = tuple(int(d) for d in self.attrs.get("shape", ()))
        if len(self.input_shapes) != 1:
            raise KernelError(f"kernel {name!r}: reshape takes 1 input, got {len(self.input_shapes)}")
        if math.prod(shape) != math.prod(self.input_shapes[0]) or any(d < 0 for d in shape):
            raise KernelError(f"kernel {name!r}: cannot reshape {self.input_shapes[0]} to {shape}")
        self.shape = shape

    @property
    def output_shape(self):
        return self.shape

    def flops_per_sample(self) -> float:
        return 0.0

    def output_dtype(self, input_dtypes):
        return np.dtype(input_dtypes[0])  # any dtype (labels are reshaped too)

    def forward(self, params, inputs, ctx: RunContext):
        x = inputs[0]
        return x.reshape(x.shape[0], *self.shape), x.shape

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        return [grad_output.reshape(cache)], {}


@register
class Add(Elementwise):
    type_name = "add"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]):
        super().__init__(name, attrs, input_shapes)
        if len(self.input_shapes) < 2 or len(set(self.input_shapes)) != 1:
            raise KernelError(f"kernel {name!r}: add takes 2 or more inputs of one shape, "
                              f"got {self.input_shapes}")

    @property
    def output_shape(self):
        return self.input_shapes[0]

    def forward(self, params, inputs, ctx: RunContext):
        total = inputs[0] + inputs[1]
        for x in inputs[2:]:
            np.add(total, x, out=total)
        return total, None

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        return [grad_output] * len(self.input_shapes), {}


@register
class Concat(Elementwise):
    type_name = "concat"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]):
        super().__init__(name, attrs, input_shapes)
        self.axis = int(self.attrs.get("axis", -1))
        shapes = self.input_shapes
        rank = len(shapes[0]) if shapes else 0
        if len(shapes) < 2 or not 0 <= self.axis < rank or any(
                len(s) != rank or s[:self.axis] + s[self.axis + 1:] !=
                shapes[0][:self.axis] + shapes[0][self.axis + 1:] for s in shapes):
            raise KernelError(f"kernel {name!r}: cannot concatenate {shapes} along per-sample "
                              f"axis {self.axis}")
        self.splits = np.cumsum([s[self.axis] for s in shapes])[:-1]

    @property
    def output_shape(self):
        s = list(self.input_shapes[0])
        s[self.axis] = sum(shape[self.axis] for shape in self.input_shapes)
        return tuple(s)

    def output_dtype(self, input_dtypes):
        if len({np.dtype(d) for d in input_dtypes}) != 1:
            raise KernelError(f"kernel {self.name!r} (concat): inputs of different dtypes "
                              f"{[np.dtype(d).name for d in input_dtypes]}")
        return np.dtype(input_dtypes[0])

    def forward(self, params, inputs, ctx: RunContext):
        return np.concatenate(inputs, axis=self.axis + 1), None

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        return list(np.split(grad_output, self.splits, axis=self.axis + 1)), {}


@register
class Broadcast(Elementwise):
    """A weight given to every sample: ViT's class token tf.tile'd over the batch, learned
    queries by tf.broadcast_to or tf.repeat, tf.ones_like(x[:, :1]) * w. Its one input is any
    value of the micro-batch (its size only; no gradient); param `value` (attr value: its TF
    shape, with a leading 1 for the batch or fewer axes) is broadcast to attr shape (per
    sample). Its gradient is the sum of the micro-batch's gradients over the batch and the
    broadcast axes (TF's TileGrad and BroadcastTo's: a sum over the tiled axes), accumulated
    over the batch as any weight's."""

    type_name = "broadcast"

    def __init__(self, name: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]):
        super().__init__(name, attrs, input_shapes)
        self.shape = tuple(int(d) for d in self.attrs.get("shape", ()))
        self.value = tuple(int(d) for d in self.attrs.get("value", ()))
        full = (1, *self.shape)
        aligned = (1,) * (len(full) - len(self.value)) + self.value
        if len(self.input_shapes) != 1 or len(self.value) > len(full) or aligned[0] != 1 or \
                any(v not in (1, d) for v, d in zip(aligned, full)):
            raise KernelError(f"kernel {name!r} (broadcast): takes 1 input and a weight of shape "
                              f"{self.value} that broadcasts to every sample's {self.shape} "
                              f"(a leading 1 for the batch, or fewer axes), got "
                              f"{len(self.input_shapes)} inputs")

    @property
    def output_shape(self):
        return self.shape

    def param_shapes(self):
        return {"value": self.value}

    def output_dtype(self, input_dtypes):
        return np.dtype(np.float32)  # whatever the input it reads the size of

    def input_differentiable(self, index: int) -> bool:
        return False

    def forward(self, params, inputs, ctx: RunContext):
        return np.broadcast_to(params["value"], (inputs[0].shape[0], *self.shape)).copy(), None

    def backward(self, params, cache, grad_output, ctx: RunContext, param_grads=None):
        grads: dict[str, np.ndarray] = {}
        accumulate(param_grads, "value", reduce_to(grad_output, self.value), grads, ctx)
        return [None], grads
