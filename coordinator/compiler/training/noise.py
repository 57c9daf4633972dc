"""Noise: a trained variable whose gradient is rounding noise (zero in exact arithmetic) under
an optimizer that divides the gradient by its own size.

The training check (numbers.py) cannot tell such a gradient from 0, and the CS's rounding is
not TensorFlow's (nor is TF's the same on another CPU). A step is step(g) = g / d(g) times
factors every variable shares (the learning rate, 1 / (1 - momentum)), with d what the
optimizer divides by once its slot has taken g * g in (Adam's v and RMSProp's mean square
at g * g; Adagrad's accumulator its initial value plus g * g):

    sgd, momentum  d = 1                          adagrad  d = sqrt(initial_accumulator + g * g)
    adam           d = g + epsilon                rmsprop  d = sqrt(g * g + epsilon)
    adadelta       d = sqrt(g * g + epsilon)      ftrl, proximal_adagrad: as adagrad

Refused: a variable whose largest gradient g on input_fn's first batch is at most `noise`
of the model's largest G (and not 0), whose step relative to the largest gradient's,
step(g) / step(G), exceeds VISIBLE_AMPLIFICATION x `noise`, and which reaches a batch
normalization in training (a tensor centred by its mean over the batch: tf.nn.moments,
x - reduce_mean(x, 0), FusedBatchNorm): the batch's mean takes it out again in training,
so its gradient is 0, but evaluation subtracts the moving mean instead and reads it (a bias
before a batch normalization). Under SGD and momentum the ratio is g / G itself (at most
`noise`): never refused. Noise that reaches no batch normalization is zero for each sample
on its own (an attention key's bias: softmax ignores a shift shared by all keys): nothing the
model computes in any mode reads its value, which is accepted though not TF's.
Elements of a bias at the noise level that float32 may not determine (N-BEATS' sMAPE
below 0, Swin's fused qkv bias) are not refused: every test of them tried (size, another
order of the batch, weights moved by 1 ULP) also refused models that train like TF
(docs/design.md, "Noise elements").
Followed (`check_moving_shift`): a variable shift.py proves 0 through a batch normalization
whose batch mean a moving statistic follows is refused under an amplifying optimizer: TF's
noise steps move it and the moving mean with it, the CS's exact 0 does not.

Floored (`floored`): where only some elements of a gradient cancel (a ReLU unit active for
every sample of the batch before the normalization: its bias element sums the
normalization's backward output, 0 over the batch), the variables that reach a batch
normalization in training and are added across the batch (biases, offsets: each gradient
element a plain sum over the batch; kernels' elements sum products with the samples and
fall below the floor by chance while real), under an optimizer whose step for a gradient of `noise` x G
exceeds VISIBLE_AMPLIFICATION x `noise` of G's, get wafer.grad_transforms' `noise_floor`:
the CS sets each element at most `noise` x the step's largest gradient to 0 exactly, what
exact arithmetic gives for a cancelled sum. A float32 sum of n terms is only determined to
about n x 2 ** -24 of its terms' sizes (1e-6 for 16 terms): below that, at the scale of the
model's gradients, TF's own value is noise too (docs/design.md, *Amplified noise*).
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
import tensorflow as tf

from coordinator.compiler.extract import data_upstream
from coordinator.compiler.ir import StatisticAverage
from coordinator.compiler.training.graph import fail, skip_identity, variables_under
from wafer.optimizers import OptimizerConfig

# A noise gradient's step, relative to the step of the model's largest gradient, is visible
# above this multiple of the noise level: 1e-4 in float32, the differential tests' rtol.
VISIBLE_AMPLIFICATION = 100

_NAMES = {"adam": "Adam", "adamw": "AdamW", "rmsprop": "RMSProp", "adagrad": "Adagrad",
          "adadelta": "Adadelta", "ftrl": "FTRL", "proximal_adagrad": "ProximalAdagrad"}
_VIEWS = ("StopGradient", "Squeeze", "Reshape", "ExpandDims")
_ADDS = ("Add", "AddV2", "Sub")


def _divisor(config: OptimizerConfig, g: float) -> float:
    if config.type in ("adam", "adamw"):
        return g + config.epsilon
    if config.type in ("rmsprop", "adadelta"):  # (Adadelta: its accumulator of g², as RMSProp's)
        return math.sqrt(g * g + config.epsilon)
    if config.type in ("adagrad", "proximal_adagrad", "ftrl"):
        return math.sqrt(config.initial_accumulator_value + g * g)
    return 1.0


def relative_step(config: OptimizerConfig, g: float, largest: float) -> float:
    """The optimizer's step for a gradient of size g, as a fraction of its step for one of
    size `largest` (> 0)."""
    return (g / _divisor(config, g)) / (largest / _divisor(config, largest))


def amplifies(config: OptimizerConfig, largest: float | None, noise: float) -> bool:
    """Whether the optimizer turns a gradient of `noise` x `largest` (the model's largest
    gradient on input_fn's first batch; None: not measured, taken as 1) into a step more
    than VISIBLE_AMPLIFICATION x `noise` of the largest's (Adam, RMSProp, Adadelta; not SGD,
    momentum, nor Adagrad with TF's initial accumulator)."""
    scale = largest if largest is not None and 0 < largest < math.inf else 1.0
    return relative_step(config, noise * scale, scale) > VISIBLE_AMPLIFICATION * noise


def batch_centred(graph: tf.Graph) -> dict[str, tf.Operation]:
    """The variables under each tensor a batch normalization in training centres by its
    batch mean, each with that normalization's first op."""
    found: dict[str, tf.Operation] = {}
    for op in graph.get_operations():
        if op.type.startswith("FusedBatchNorm") and "is_training" in op.node_def.attr \
                and op.get_attr("is_training"):
            x = op.inputs[0]
        elif op.type == "Mean" and _over_batch(op):
            x = skip_identity(op.inputs[0])
            means, readers = [op.outputs[0]], set()
            while means:
                for reader in means.pop().consumers():
                    if reader.type in _VIEWS:
                        means.extend(reader.outputs)
                    else:
                        readers.add(reader)
            if not any(skip_identity(t) is x for reader in readers for t in reader.inputs):
                continue
        else:
            continue
        for variable in variables_under(x):
            found.setdefault(variable.name, op)
    return found


def _over_batch(mean: tf.Operation) -> bool:
    axes, rank = tf.get_static_value(mean.inputs[1]), mean.inputs[0].shape.rank
    return axes is not None and bool(rank) and any(int(a) % rank == 0 for a in np.ravel(axes))


def floored(loss: tf.Tensor, optimizers: dict[str, OptimizerConfig], largest: float | None,
            noise: float) -> tuple[str, ...]:
    """Those of `optimizers` (variable: its optimizer) that reach a batch normalization in
    training, are added across the batch on their way to `loss`, and whose optimizer turns a gradient element of `noise` x `largest` (the
    model's largest gradient on input_fn's first batch; None: not measured, taken as 1)
    into a step more than VISIBLE_AMPLIFICATION x `noise` of the largest's: the variables
    the CS gives the noise floor (wafer.grad_transforms' `noise_floor`)."""
    upstream = set(data_upstream(loss.op))
    amplified = [v for v, config in optimizers.items() if amplifies(config, largest, noise)
                 and _added_across_the_batch(loss.graph.get_operation_by_name(v), upstream)]
    if not amplified:
        return ()
    centred = batch_centred(loss.graph)
    return tuple(v for v in amplified if v in centred)


def _added_across_the_batch(handle: tf.Operation, upstream: set[tf.Operation]) -> bool:
    """Whether every read of the variable on the way to the loss (ops in `upstream`) is
    added, unscaled, to a tensor it is broadcast along (a bias: BiasAdd, x + b, a
    normalization's offset), so that each element of its gradient is a plain sum of the
    output gradient over the batch (and positions)."""
    stack, seen = [handle.outputs[0]], set()
    while stack:
        tensor = stack.pop()
        for op in tensor.consumers():
            if op not in upstream or (op, tensor.ref()) in seen:
                continue
            seen.add((op, tensor.ref()))
            index = [i for i, t in enumerate(op.inputs) if t is tensor]
            out = op.outputs[0] if op.outputs else None
            if op.type in ("ReadVariableOp", "Identity", "Cast", "Neg") or (
                    op.type in _ADDS and out is not None and out.shape == tensor.shape):
                stack.extend(op.outputs)  # (the variable's own shape: not broadcast yet)
            elif (op.type == "BiasAdd" and index == [1]) or \
                    (op.type.startswith("FusedBatchNorm") and index == [2]) or \
                    (op.type in _ADDS and len(index) == 1 and out is not None
                     and out.shape.num_elements() != tensor.shape.num_elements()):
                continue
            else:
                return False
    return True


def check_noise(graph: tf.Graph, gradients: dict[str, tuple[OptimizerConfig, float]],
                noise: float) -> None:
    """Refuse (as the module docstring says) the first variable of `gradients` (its
    optimizer, its largest gradient) whose noise the optimizer turns into visible steps and
    which reaches a batch normalization in training."""
    largest = max((g for _, g in gradients.values()), default=0.0)
    if not largest > 0:
        return
    centred = None
    for variable, (config, g) in gradients.items():
        if not 0 < g <= noise * largest:
            continue
        step = relative_step(config, g, largest)
        if step <= VISIBLE_AMPLIFICATION * noise:
            continue
        centred = batch_centred(graph) if centred is None else centred
        if variable in centred:
            name = _NAMES.get(config.type, config.type)
            raise fail(graph.get_operation_by_name(variable),
                        f"the gradient of {variable} is rounding noise ({g / largest:.1g} of the "
                        f"largest: zero, as the batch normalization '{centred[variable].name}' "
                        f"subtracts the batch's mean) and {name} turns it into steps "
                        f"{step:.2g} of the largest's: the CS's noise is not TensorFlow's, so "
                        "it would train differently",
                        hint=_without_bias(variable))


def check_moving_shift(graph: tf.Graph, ends: dict[str, tuple[OptimizerConfig, frozenset[str]]],
                       normalized: Mapping[str, frozenset[str]],
                       averages: Sequence[StatisticAverage], largest: float | None,
                       noise: float) -> None:
    """Refuse the first variable of `ends` (proven 0 by shift.py: its optimizer, the tensors
    whose batch normalization in training ends its paths) whose optimizer amplifies noise
    and one of whose normalizations has its batch mean followed by a moving statistic: TF's
    float32 gradient there is rounding noise that moves the variable by steps of the
    learning rate, and the moving mean follows it (and evaluation reads x + b − moving
    mean), while the CS's exact 0 keeps it: they would differ (a Dense bias before a
    hand-written tf.nn.moments normalization, momentum 0.9, Adam: moving means 3.3e-3 apart
    after 10 steps). Under SGD or momentum TF's steps stay at the noise's size: the exact 0
    stands."""
    moving = {mean: a for a in averages
              if (mean := _batch_mean(graph, a.statistic, normalized)) is not None}
    for variable, (config, tensors) in ends.items():
        followed = next((moving[t] for t in sorted(tensors) if t in moving), None)
        if followed is None or not amplifies(config, largest, noise):
            continue
        name = _NAMES.get(config.type, config.type)
        raise fail(graph.get_operation_by_name(variable),
                   f"the gradient of {variable} is 0 in exact arithmetic (a batch normalization "
                   f"subtracts the batch's mean), but TensorFlow's is rounding noise that {name} "
                   f"turns into steps of the learning rate, and {followed.variable} (at "
                   f"{followed.source}) follows the batch's mean, {variable} in it: with the "
                   "CS's exact 0 it would differ from TensorFlow's",
                   hint=_without_bias(variable))


def _without_bias(variable: str) -> str:
    """The hint for a bias before a batch normalization that the CS cannot train as TF."""
    return (f"build the layer before the batch normalization with use_bias=False, or leave "
            f"{variable} out of the optimizer's var_list")


def _batch_mean(graph: tf.Graph, statistic: str,
                normalized: Mapping[str, frozenset[str]]) -> str | None:
    """The tensor normalized (a key of `normalized`) whose batch mean the tensor `statistic`
    is (through views), or None (a variance)."""
    t = graph.get_tensor_by_name(statistic)
    while t.op.type in ("Identity", "Squeeze", "Reshape", "Cast", "StopGradient"):
        t = t.op.inputs[0]
    for x, ops in normalized.items():
        if t.op.name in ops and (t.op.type == "Mean" and t.op.inputs[0].name == x or
                                 t.op.type.startswith("FusedBatchNorm") and t.value_index == 1):
            return x
    return None
