"""Calling the user's Estimator-style functions: input_fn's batch signature and model_fn.

Shared by the CPU path, the compiler and the chief so the user's code is called one way.
"""
from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import tensorflow as tf

from launcher.errors import CSRunError
from launcher.estimator_spec import CSEstimatorSpec


@dataclass(frozen=True)
class BatchSignature:
    """The structure of one input_fn element: (features, labels) TensorSpecs, batch dim included."""

    features: Any  # tf.TensorSpec or dict of them
    labels: Any  # tf.TensorSpec, dict, or None

    def placeholders(self) -> tuple[Any, Any]:
        """Placeholders shaped like a batch, in the current (v1) graph."""

        def make(spec, name):
            return tf.compat.v1.placeholder(spec.dtype, spec.shape, name=name)

        features = (
            {k: make(s, f"features.{k}") for k, s in self.features.items()}
            if isinstance(self.features, dict) else make(self.features, "features"))
        labels = None if self.labels is None else make(self.labels, "labels")
        return features, labels


@contextlib.contextmanager
def model_graph(params: dict) -> Iterator[tf.Graph]:
    """A fresh default graph to build model_fn in, the same way on every path.

    Keras's global layer-name counters are reset, so variables get the same names in every
    build (checkpoints depend on them); with `runconfig.tf_random_seed` the graph seed and
    Keras's initializer seeds (Python, NumPy) are set, so the CPU path and the compiler's
    initial weights are equal. Build placeholders or iterators *after* entering, in the
    same order on every path: op-level seeds depend on the ops created before.
    """
    tf.keras.backend.clear_session()
    graph = tf.Graph()
    with graph.as_default():
        seed = (params.get("runconfig") or {}).get("tf_random_seed")
        if seed is not None:
            tf.keras.utils.set_random_seed(int(seed))
        yield graph


def make_dataset(input_fn: Callable, params: dict) -> tf.data.Dataset:
    """Call input_fn(params) and check it returns a tf.data.Dataset."""
    dataset = input_fn(params)
    if not isinstance(dataset, tf.data.Dataset):
        raise CSRunError(f"input_fn returned {type(dataset).__name__}, not a tf.data.Dataset",
                         "return a dataset of (features, labels) batches")
    return dataset


def batch_signature(dataset: tf.data.Dataset) -> BatchSignature:
    spec = dataset.element_spec
    if isinstance(spec, tuple) and len(spec) == 2:
        features, labels = spec
    elif isinstance(spec, (tf.TensorSpec, dict)):
        features, labels = spec, None
    else:
        raise CSRunError(f"input_fn yields {spec}, not (features, labels)",
                         "make the dataset yield (features, labels) tuples")
    return BatchSignature(features, labels)


def call_model_fn(model_fn: Callable, features: Any, labels: Any, mode: str,
                  params: dict) -> CSEstimatorSpec:
    """Call model_fn(features, labels, mode, params) and check what it returns."""
    accepted = inspect.signature(model_fn).parameters
    kwargs = {k: v for k, v in (("features", features), ("labels", labels), ("mode", mode),
                                ("params", params)) if k in accepted}
    spec = model_fn(**kwargs)
    if not isinstance(spec, CSEstimatorSpec):
        raise CSRunError(f"model_fn returned {type(spec).__name__}, not a CSEstimatorSpec",
                         "return launcher.estimator.CSEstimatorSpec(mode=..., loss=..., ...)")
    return spec
