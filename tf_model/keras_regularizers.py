"""Keras 3 weight regularizers model_fn never applies.

In a tf.compat.v1 graph, Keras 3 puts a weight's regularizer (`kernel_regularizer=l2(1e-4)`)
in no collection: tf.compat.v1.losses.get_regularization_loss() does not see it, and its
penalty exists only if model_fn reads `layer.losses` / `model.losses`. `watching_regularizers`
records, while model_fn runs, the regularized weights Keras creates and those whose penalty a
`losses` read computes, by hooks on Keras' Layer that it removes on leaving; the model then
trains without the others' penalties, on the CPU and on the CS alike (a warning, not an error).
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import Any, Iterator

import tensorflow as tf
from keras.src.layers.layer import Layer

_ON_GRAPH = "_csrun_unpenalized_regularizers"

UNPENALIZED = ("Keras regularizers whose penalty model_fn never computes (Keras 3 puts none "
               "in tf.compat.v1's REGULARIZATION_LOSSES: get_regularization_loss() does not see "
               "them): training applies no weight decay to them, on the CPU as on the CS")
UNPENALIZED_HINT = ("add tf.add_n(model.losses) (or each layer's layer.losses) to the loss "
                    "model_fn minimizes")


@dataclass
class RegularizerWatch:
    """The regularized trainable weights Keras created (by id) and those penalized."""

    created: dict[int, Any] = field(default_factory=dict)  # id -> the Keras variable
    penalized: set[int] = field(default_factory=set)

    def unpenalized(self) -> tuple[str, ...]:
        """The paths ("dense/kernel") of the trainable regularized weights never penalized."""
        return tuple(v.path for i, v in self.created.items()
                     if i not in self.penalized and v.trainable and v.regularizer is not None)


# Keras' own methods; the hooks below replace them only while some thread watches.
_ADD_WEIGHT, _PENALTIES = Layer.add_weight, Layer._get_regularization_losses
_LOCK = threading.Lock()
_WATCHES: dict[int, RegularizerWatch] = {}  # thread id -> its watch (model_fn running there)


def _recording_add_weight(self: Layer, *args: Any, **kwargs: Any) -> Any:
    variable = _ADD_WEIGHT(self, *args, **kwargs)
    watch = _WATCHES.get(threading.get_ident())
    if watch is not None and variable.regularizer is not None:
        watch.created[id(variable)] = variable
    return variable


def _recording_penalties(self: Layer) -> list:
    if (watch := _WATCHES.get(threading.get_ident())) is not None:
        watch.penalized.update(id(v) for v in self.trainable_weights if v.regularizer is not None)
    return _PENALTIES(self)


@contextlib.contextmanager
def watching_regularizers() -> Iterator[RegularizerWatch]:
    """Record the regularized weights Keras layers create in the block (in this thread), and
    which of them a read of `losses` penalizes (Layer._get_regularization_losses)."""
    watch, thread = RegularizerWatch(), threading.get_ident()
    with _LOCK:
        outer = _WATCHES.get(thread)
        _WATCHES[thread] = watch
        Layer.add_weight, Layer._get_regularization_losses = _recording_add_weight, _recording_penalties
    try:
        yield watch
    finally:
        with _LOCK:
            if outer is not None:
                _WATCHES[thread] = outer
            else:
                del _WATCHES[thread]
            if not _WATCHES:
                Layer.add_weight, Layer._get_regularization_losses = _ADD_WEIGHT, _PENALTIES


def record_unpenalized(graph: tf.Graph, paths: tuple[str, ...]) -> None:
    """Keep `paths` (RegularizerWatch.unpenalized) with the model's graph, for its report."""
    setattr(graph, _ON_GRAPH, paths)


def unpenalized_regularizers(graph: tf.Graph) -> tuple[str, ...]:
    """The regularized Keras weights whose penalty model_fn, built in `graph`, never computed."""
    return getattr(graph, _ON_GRAPH, ())


def unpenalized_warning(paths: tuple[str, ...]) -> str:
    return (f"csrun: warning: weights {', '.join(paths)} have {UNPENALIZED} "
            f"(hint: {UNPENALIZED_HINT})")
