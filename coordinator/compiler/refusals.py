"""Refusals in the user's terms: the ops the compiler refuses, grouped by the layer the user
wrote (a Keras layer, or a TF function such as a hand-written batch norm's tf.nn.moments),
one line per layer naming its class, its source line and what to do; the ops follow.

An op is attributed when it is refused (`attribute`): to its Keras layer (the op's name
scope and traceback), or, when it reads a value reduced over the batch, to the op that
reduced it (the batch statistics' tf.nn.moments, not the ops that use them)."""
from __future__ import annotations

import functools
import linecache
import os
import re
from dataclasses import dataclass
from typing import Callable, Sequence

import tensorflow as tf

from coordinator.compiler import lowering_spatial
from coordinator.compiler.extract import each_once, user_name, user_source
from coordinator.compiler.ir import UnsupportedOp
from tf_model.model_fn import is_user_file

KERAS_FILES = f"{os.sep}keras{os.sep}src{os.sep}layers{os.sep}"
# Default scopes of Keras models, whose layers are the next scope down.
MODELS = ("sequential", "functional", "model")
# TF functions whose name scope says what the user wrote, when their ops are refused.
TF_FUNCTIONS = {"moments": "BatchNormalization (hand-written: tf.nn.moments)",
                "batchnorm": "BatchNormalization (hand-written: tf.nn.batch_normalization)"}
NO_KERNEL = "no CS kernel computes this op"
BATCH_STATISTICS = ("the batch's mean and variance mix samples: the CS carries them out only in "
                    "BatchNormalization in training, as tf.nn.moments over every axis but the "
                    "last feeding tf.nn.batch_normalization (Keras' BatchNormalization) or "
                    "FusedBatchNormV3; else use LayerNormalization, or BatchNormalization with "
                    "training=False")


@functools.cache
def keras_layers() -> dict[str, str]:
    """Keras layer classes by their lower-case name without underscores (up_sampling2d too);
    read when a refused op came from Keras, so that compiling imports no more of it."""
    return {name.lower(): name for name in dir(tf.keras.layers) if name[:1].isupper()}


def _default_name(component: str) -> str:
    """The Keras class a scope component names by default (conv2d_transpose_1), or ""."""
    return keras_layers().get(re.sub(r"_\d+$", "", component).replace("_", ""), "")


def keras_layer(op: tf.Operation) -> tuple[str, str]:
    """(class, name scope) of the Keras layer that created `op` (("", "") if none did): the
    deepest scope named like a layer class (a layer inside a Sequential model included),
    else the first scope below any model's, its class the one Keras layer class named on the
    user's line that called it ("Keras layer" if the line names none or several)."""
    frames = list(op.traceback or [])
    if not any(KERAS_FILES in f[0] for f in frames):
        return "", ""
    components = op.name.split("/")[:-1] or op.name.split("/")
    for depth in range(len(components), 0, -1):
        if _default_name(components[depth - 1]):
            return _default_name(components[depth - 1]), "/".join(components[:depth])
    depth = 1
    while depth < len(components) and re.sub(r"_\d+$", "", components[depth - 1]) in MODELS:
        depth += 1
    user = [f for f in frames if is_user_file(f[0])]
    line = linecache.getline(user[-1][0], user[-1][1]) if user else ""
    named = {keras_layers()[w.lower()] for w in re.findall(r"\b([A-Z]\w*)\s*\(", line)
             if w.lower() in keras_layers()}
    return (named.pop() if len(named) == 1 else "Keras layer"), "/".join(components[:depth])


def _batch_reduction(op: tf.Operation, tail: set[str],
                     is_batched: Callable[[tf.Tensor], bool]) -> tf.Operation | None:
    """The op that reduced over the batch a value `op` reads (None if it reads none): the
    first op back through the loss tail's tensors (`tail`) that reads a batched tensor."""
    stack = [t for t in op.inputs if t.name in tail]
    for tensor in each_once(stack):
        source = tensor.op
        if any(is_batched(t) for t in source.inputs):
            return source
        stack.extend(t for t in source.inputs if t.name in tail)
    return None


def attribute(op: tf.Operation, reason: str, tail: set[str],
              is_batched: Callable[[tf.Tensor], bool]) -> UnsupportedOp:
    """The refused op, attributed to the layer the user wrote (an op reading the loss tail's
    `tail` tensors: to the op that reduced over the batch)."""
    origin = _batch_reduction(op, tail, is_batched) or op
    layer, scope = keras_layer(origin)
    function = re.sub(r"_\d+$", "", origin.name.split("/", 1)[0])
    if not layer and function in TF_FUNCTIONS:
        layer, scope = TF_FUNCTIONS[function], origin.name.split("/", 1)[0]
    return UnsupportedOp(op.type, user_name(op), user_source(op), reason, layer=layer,
                         scope=scope if layer else "", layer_source=user_source(origin) if layer else "")


@dataclass(frozen=True)
class Refusal:
    """The refused ops of one layer the user wrote (or one op outside any layer)."""

    ops: tuple[UnsupportedOp, ...]

    @property
    def source(self) -> str:
        return self.ops[0].layer_source or self.ops[0].source

    @property
    def reason(self) -> str:
        first = self.ops[0]
        if first.layer.startswith("BatchNormalization (hand-written"):
            return BATCH_STATISTICS
        if first.reason == NO_KERNEL:
            return f"{NO_KERNEL} ({first.type}); " + lowering_spatial.INSTEAD.get(
                first.type, "the README's 'Supported operations' lists what the CS computes")
        return first.reason

    def headline(self) -> str:
        """`Conv2DTranspose at model.py:21 (layer 'dec2_1': Conv2DBackpropInput
        'dec2_1/conv_transpose')`, or the op and its line outside a layer."""
        first = self.ops[0]
        op = f"{first.type} '{first.name}'"
        if not first.layer:
            return f"{op} at {self.source}"
        more = f" and {len(self.ops) - 1} more op{'s' if len(self.ops) > 2 else ''}" if len(self.ops) > 1 else ""
        return f"{first.layer} at {self.source} (layer '{first.scope}': {op}{more})"


def group(unsupported: Sequence[UnsupportedOp]) -> list[Refusal]:
    """One refusal per layer, in the order their first ops were refused."""
    groups: dict[tuple[str, str], list[UnsupportedOp]] = {}
    for index, op in enumerate(unsupported):
        key = (op.scope, op.layer_source) if op.layer else (str(index), "")
        groups.setdefault(key, []).append(op)
    return [Refusal(tuple(ops)) for ops in groups.values()]


def detail_lines(refusals: Sequence[Refusal]) -> list[str]:
    """A line per layer (its class, source line and reason), its ops indented under it."""
    lines = [f"Unsupported layers and operations ({len(refusals)}):"]
    for refusal in refusals:
        lines.append(f"  {refusal.headline()}: {refusal.reason}")
        if refusal.ops[0].layer:
            lines += [f"      {op.line()}" for op in refusal.ops]
    return lines
