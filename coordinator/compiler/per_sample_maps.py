"""Functions mapped over the samples of a batch: tf.map_fn (and tf.compat.v1's) builds a While
over the samples, which the CS cannot pipeline. During recurrences' second build of model_fn
a map_fn runs as tf.vectorized_map of the same function (TF's own pfor: each op of the
function turned into its batched form, no loop), and recurrences then proves the batched
graph computes the user's loss and gradients. pfor convolves by a per-sample filter (a
dynamic filter network's, CondConv's) by folding the samples into one image's channels,
which would mix samples on the CS; here such a convolution is each sample's patches
(tf.image.extract_patches) times its own filter (tf.einsum over the batch letter), the
convolution's own im2col. The same rule serves a user's tf.vectorized_map.

A map_fn whose function pfor cannot batch (a TensorArray, a stateful op, a
convolution of explicit padding by per-sample filters) stays TF's While, which the matcher
refuses naming it."""
from __future__ import annotations

import contextlib
import inspect
from typing import Any, Callable, Iterator

import tensorflow as tf
from tensorflow.python.framework import func_graph
from tensorflow.python.ops.parallel_for import pfor

from coordinator.compiler.operands import VARIABLE_OPS
from coordinator.compiler.static_loops import recorded


def stateful(op: tf.Operation) -> bool:
    """Whether `op` has state other than a variable's value it reads (a random op: batched,
    it draws other numbers than op by op)."""
    return op.op_def.is_stateful and op.type not in VARIABLE_OPS | {"ReadVariableOp"}


def _patches(x: tf.Tensor, window: tuple[int, int], attrs: Any) -> tf.Tensor | None:
    """[B, n, oh, ow, kh * kw * C] windows of the stacked images `x` [B, n, H, W, C] in a
    filter's (kh, kw, C) order; None where the convolution is not NHWC of SAME or VALID."""
    if attrs("data_format") not in (b"NHWC", "NHWC") or \
            attrs("padding") not in (b"SAME", b"VALID", "SAME", "VALID"):
        return None
    padding = attrs("padding")
    padding = padding.decode() if isinstance(padding, bytes) else padding
    b, n, h, w, c = x.shape.as_list()
    found = tf.image.extract_patches(tf.reshape(x, [b * n, h, w, c]), [1, *window, 1],
                                     list(attrs("strides")), list(attrs("dilations")), padding)
    return tf.reshape(found, [b, n, *found.shape.as_list()[1:]])


def _per_sample_filter(original: Callable, depthwise: bool) -> Callable:
    """pfor's converter of a Conv2D (or DepthwiseConv2dNative) whose filter differs between
    samples: each sample's patches times its own filter; `original` where the filter is
    shared."""
    def convert(pfor_input: Any) -> Any:
        if not pfor_input.input(1).is_stacked:
            return original(pfor_input)
        pfor_input.stack_inputs([0, 1])
        x, filt = pfor_input.stacked_input(0), pfor_input.stacked_input(1)
        b, kh, kw, c, o = filt.shape.as_list()
        patches = _patches(x, (kh, kw), pfor_input.get_attr)
        if patches is None or None in (b, kh, kw, c, o) or not x.shape.is_fully_defined():
            raise ValueError("a convolution by per-sample filters of explicit padding")
        if depthwise:
            windows = tf.reshape(patches, [*patches.shape.as_list()[:4], kh * kw, c])
            out = tf.einsum("bnhwkc,bkcm->bnhwcm", windows, tf.reshape(filt, [b, kh * kw, c, o]))
            out = tf.reshape(out, [*out.shape.as_list()[:4], c * o])
        else:
            out = tf.einsum("bnhwk,bko->bnhwo", patches, tf.reshape(filt, [b, kh * kw * c, o]))
        return pfor.wrap(out, True)
    return convert


@contextlib.contextmanager
def per_sample_convolutions() -> Iterator[None]:
    """pfor (tf.vectorized_map) built meanwhile convolves each sample by its own filter."""
    registry = pfor._pfor_converter_registry
    saved = {op: registry[op] for op in ("Conv2D", "DepthwiseConv2dNative")}
    registry["Conv2D"] = _per_sample_filter(saved["Conv2D"], depthwise=False)
    registry["DepthwiseConv2dNative"] = _per_sample_filter(saved["DepthwiseConv2dNative"],
                                                           depthwise=True)
    try:
        yield
    finally:
        registry.update(saved)


def has_folded_convolutions(graph: tf.Graph) -> bool:
    """Whether a tf.vectorized_map of `graph` convolves by per-sample filters as pfor does it
    (the samples folded into one image's channels)."""
    return any(op.type == "DepthwiseConv2dNative" and "/pfor/" in op.name
               for op in graph.get_operations())


def _stateful(fn: Callable, elems: Any) -> bool:
    """Whether `fn` on one sample of `elems` runs a stateful op other than a variable's read
    (random numbers map_fn draws sample by sample from one stream, pfor at once: other
    numbers; a write), or cannot be traced."""
    signature = tf.nest.map_structure(lambda e: tf.TensorSpec(e.shape[1:], e.dtype), elems)
    collections = tf.compat.v1.get_default_graph()._collections  # (as while_v2 passes them)
    try:
        traced = func_graph.func_graph_from_py_func(
            "map_fn", lambda *args: fn(tf.nest.pack_sequence_as(elems, list(args))), [], {},
            signature=tf.nest.flatten(signature),
            func_graph=func_graph.FuncGraph("map_fn", collections=collections))
    except Exception:  # (map_fn's own While then says what is wrong with the function)
        return True
    return any(stateful(op) for op in traced.get_operations())


def _vectorized_map_fn(original: Callable) -> Callable:
    signature = inspect.signature(original)

    def map_fn(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        fn, elems = a["fn"], a["elems"]
        try:
            flat = [tf.convert_to_tensor(e) for e in tf.nest.flatten(elems)]
        except (TypeError, ValueError):  # (ragged or sparse elements: TF's While)
            return original(*args, **kwargs)
        if not flat or any(e.shape.rank in (None, 0) for e in flat) or \
                _stateful(fn, tf.nest.pack_sequence_as(elems, flat)):
            return original(*args, **kwargs)
        try:
            with tf.name_scope(a.get("name") or "map"):
                return tf.vectorized_map(fn, tf.nest.pack_sequence_as(elems, flat),
                                         fallback_to_while_loop=False)
        except Exception:  # (pfor cannot batch an op of fn: TF's While, refused named)
            return original(*args, **kwargs)
    return map_fn


@contextlib.contextmanager
def vectorized_maps(created: set[str]) -> Iterator[None]:
    """tf.map_fn (and tf.compat.v1's) built meanwhile run as tf.vectorized_map, convolutions
    by per-sample filters as each sample's patches times its filter; the names of the ops
    the maps add are added to `created`."""
    v1 = tf.compat.v1
    saved = [(tf, "map_fn", tf.map_fn), (v1, "map_fn", v1.map_fn)]
    for module, name, function in saved:
        setattr(module, name, recorded(_vectorized_map_fn(function), created))
    try:
        with per_sample_convolutions():
            yield
    finally:
        for module, name, function in saved:
            setattr(module, name, function)
