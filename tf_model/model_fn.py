"""Calling the user's Estimator-style functions: input_fn's batch signature and model_fn.

Shared by the CPU path, the compiler and the chief so the user's code is called one way.
"""
from __future__ import annotations

import contextlib
import functools
import gc
import inspect
import os
import sysconfig
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterator, TypeVar

import numpy as np
import tensorflow as tf

from common.errors import CSRunError
from common.layers import package_dirs
from common.params_reads import recording, say_once, say_unread
from common.run_kinds import RunKind
from tf_model.estimator_spec import CSEstimatorSpec
from tf_model.keras_regularizers import record_unpenalized, unpenalized_warning, watching_regularizers

F = TypeVar("F", bound=Callable[..., Any])

_LIBRARY_DIRS = tuple(os.path.realpath(d) + os.sep for d in {
    sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"],
    sysconfig.get_paths()["platlib"]}) + package_dirs()


def is_user_file(filename: str) -> bool:
    """Whether a traceback's file is the user's (not Python's, a library's or csrun's)."""
    return _is_user_file(filename, os.getcwd())


@functools.lru_cache(maxsize=4096)
def _is_user_file(filename: str, cwd: str) -> bool:
    """(by directory: a relative name is below `cwd`; cached, every op's traceback asks)"""
    path = os.path.realpath(os.path.join(cwd, filename))
    return not (filename.startswith("<") or path.startswith(_LIBRARY_DIRS))


UNKNOWN_SOURCE = "<unknown source>"
_ORIGIN = "_csrun_origin"  # on an op the compiler imported: (the user's op's name, that op)


def mark_imported(op: tf.Operation, name: str, original: tf.Operation) -> None:
    """Record that the compiler's `op` is a copy of the user's `original` (an op in a
    tf.cond's branch), which the user knows as `name`: refusals name that op and its line."""
    setattr(op, _ORIGIN, (name, original))


def user_name(op: tf.Operation) -> str:
    """The name the user knows `op` by (of a compiler's copy, its original's)."""
    return getattr(op, _ORIGIN, (op.name, op))[0]


def user_source(op: tf.Operation) -> str:
    """The user's "file:line" that created `op` (its innermost frame outside libraries;
    relative to the working directory when below it); of a gradient op (tf.gradients',
    minimize's), its forward op's if the user's code made it: the line to change, not the
    tf.gradients call; of a compiler's copy (mark_imported), its original's."""
    op = getattr(op, _ORIGIN, (op.name, op))[1]
    forward = op
    while forward._original_op is not None:  # (TF sets it on a gradient function's ops)
        forward = forward._original_op
    for made in (forward, op):
        for frame in reversed(made.traceback or []):
            if is_user_file(frame.filename):
                return _source_line(frame.filename, frame.lineno)
    return UNKNOWN_SOURCE


def function_source(fn: Callable) -> str:
    """The "file:line" where the user's function `fn` (input_fn) is defined, else its name."""
    try:
        return _source_line(inspect.getsourcefile(fn) or "", inspect.getsourcelines(fn)[1])
    except (OSError, TypeError):
        return getattr(fn, "__name__", UNKNOWN_SOURCE)


def _source_line(filename: str, lineno: int) -> str:
    path, cwd = os.path.realpath(filename), os.getcwd() + os.sep
    return f"{path[len(cwd):] if path.startswith(cwd) else path}:{lineno}"


@dataclass(frozen=True)
class BatchSignature:
    """The structure of one input_fn element: (features, labels) TensorSpecs, batch dim included."""

    features: Any  # tf.TensorSpec or dict of them
    labels: Any  # tf.TensorSpec, dict, or None

    def placeholders(self) -> tuple[Any, Any]:
        """Placeholders shaped like a batch, in the current (v1) graph, each named after the
        program input it stands for (`named_inputs`)."""

        def make(spec: Any, name: str) -> Any:
            if isinstance(spec, dict):
                return {k: tf.compat.v1.placeholder(s.dtype, s.shape, name=f"{name}.{k}")
                        for k, s in spec.items()}
            return tf.compat.v1.placeholder(spec.dtype, spec.shape, name=name)

        return make(self.features, "features"), None if self.labels is None else make(self.labels, "labels")


def named_inputs(features: Any, labels: Any) -> dict[str, Any]:
    """An input_fn element (or its specs, or its placeholders) by program input name:
    "features" or "features.<key>" for a dict, "labels" or "labels.<key>"."""
    named: dict[str, Any] = {}
    for name, value in (("features", features), ("labels", labels)):
        if isinstance(value, dict):
            named.update({f"{name}.{k}": v for k, v in value.items()})
        elif value is not None:
            named[name] = value
    return named


@functools.cache
def _freeze_imported_once() -> None:
    gc.freeze()


@contextlib.contextmanager
def model_graph(params: dict) -> Iterator[tf.Graph]:
    """A fresh default graph to build model_fn in, the same way on every path.

    Keras's global layer-name counters are reset, so variables get the same names in every
    build (checkpoints depend on them); with `runconfig.tf_random_seed` the graph seed and
    Keras's initializer seeds (Python, NumPy) are set, so the CPU path and the compiler's
    initial weights are equal. Build placeholders or iterators *after* entering, in the
    same order on every path: op-level seeds depend on the ops created before.

    The first call freezes what the process holds by then (TensorFlow's and Keras' ~300,000
    module objects) out of the garbage collector's view: clear_session runs a full collection
    on every call, which otherwise walks them all each time (0.1-1 s).
    """
    _freeze_imported_once()
    tf.keras.backend.clear_session()
    graph = tf.Graph()
    with graph.as_default():
        seed = (params.get("runconfig") or {}).get("tf_random_seed")
        if seed is not None:
            tf.keras.utils.set_random_seed(int(seed))
        yield graph


def local_init_op() -> tf.Operation:
    """What Estimator's Scaffold initializes beside the global variables, in the default
    graph: local variables (metrics) and lookup tables (vocabulary-list feature columns)."""
    return tf.group(tf.compat.v1.local_variables_initializer(), tf.compat.v1.tables_initializer())


_INPUT_HINT = ("check the input sections of params.yaml (train_input, eval_input) and input_fn; "
               "--debug shows the traceback")
_MODEL_HINT = ("check the model sections of params.yaml and model_fn (labels must suit the "
               "loss); --debug shows the traceback")
# An AttributeError naming these: a Keras 3 optimizer asked for a tf.compat.v1 graph's train op.
_KERAS_OPTIMIZER = ("'minimize'", "'compute_gradients'", "keras.optimizers.legacy")
_KERAS_OPTIMIZER_HINT = ("Keras 3 optimizers (tf.keras.optimizers.*; its legacy module is gone) "
                         "build no train op in model_fn's graph: use a tf.compat.v1.train "
                         "optimizer (AdamOptimizer, MomentumOptimizer, AdagradOptimizer, "
                         "FtrlOptimizer, ...) and its minimize(loss, global_step=...)")


def user_code_error(what: str, error: BaseException, hint: str, context: str = "") -> CSRunError:
    """One line for an exception raised by the user's own code (input_fn, model_fn): its
    type and message and the user's innermost source line."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if is_user_file(f.filename)]
    where = f" at {_source_line(frames[-1].filename, frames[-1].lineno or 0)}" if frames else ""
    text = str(error).strip().splitlines()
    return CSRunError(f"{what} raised {type(error).__name__}{where}{context}"
                      f"{': ' + text[0] if text else ''}", hint)


def op_error_text(error: tf.errors.OpError) -> str:
    """TensorFlow's own line of an op's error, without "Graph execution error:", where the
    node was made and the node's name."""
    said = [line for line in (error.message or "").splitlines() if line.strip()
            and not line.startswith((" ", "\t", "Graph execution error", "Detected at node", "Node: "))]
    return said[0].split(".  ")[0] if said else type(error).__name__


def graph_op_error(error: tf.errors.OpError) -> CSRunError:
    """One line for a TensorFlow op that failed while the model ran (a label out of range, a
    bad reshape): the op, the user's source line that made it, TensorFlow's first line."""
    op = getattr(error, "op", None)
    source = user_source(op) if op is not None else UNKNOWN_SOURCE
    where = f" at {source}" if source != UNKNOWN_SOURCE else ""
    what = f"{op.type} '{op.name}'" if op is not None else "a TensorFlow op"
    return CSRunError(f"{what}{where} failed on a batch: {op_error_text(error)}",
                      "check the batch's values against what the model expects (--debug shows "
                      "TensorFlow's traceback)")


def op_errors_in_one_line(run: F) -> F:
    """Decorate a CPU-path run (train, evaluate, predict): a TensorFlow op failing on a batch
    is `graph_op_error`'s one line, not TensorFlow's traceback."""

    @functools.wraps(run)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        try:
            return run(*args, **kwargs)
        except tf.errors.OpError as error:
            raise graph_op_error(error) from error

    return wrapped  # type: ignore[return-value]


def _describe_inputs(features: Any, labels: Any) -> str:
    return ", ".join(f"{k} {tuple(v.shape.as_list())} {v.dtype.name}"
                     for k, v in named_inputs(features, labels).items() if isinstance(v, tf.Tensor))


def make_dataset(input_fn: Callable, params: dict) -> tf.data.Dataset:
    """Call input_fn(params) and check it returns a tf.data.Dataset."""
    try:
        with recording(params):
            dataset = input_fn(params)
    except CSRunError:
        raise
    except Exception as error:  # the user's code: one line, the traceback with --debug
        raise user_code_error("input_fn", error, _INPUT_HINT) from error
    if not isinstance(dataset, tf.data.Dataset):
        raise CSRunError(f"input_fn returned {type(dataset).__name__}, not a tf.data.Dataset",
                         "return a dataset of (features, labels) batches")
    batch_signature(dataset)  # its element structure and dtypes, checked before any work
    return dataset


# What a run's input is called in its errors, and what to do when it runs out.
RUN_INPUTS = {
    RunKind.TRAIN: ("training", "make the training input repeat (dataset.repeat()) or lower the steps"),
    RunKind.EVALUATE: ("evaluation", "lower --eval_steps or make the eval input repeat"),
    RunKind.PREDICT: ("prediction", "lower num_samples"),
}


def input_ran_out(kind: RunKind, detail: str, who: str = "") -> CSRunError:
    """One line for a run whose input ended before the batches it needs (`detail`: how far it got)."""
    what, hint = RUN_INPUTS[RunKind(kind)]
    return CSRunError(f"{who}the {what} input ran out {detail}", hint)


def run_batches(dataset: tf.data.Dataset, kind: RunKind, steps: int | None, flag: str) -> int:
    """The batches an evaluation or prediction takes of `dataset`: `steps`, or all of a
    finite dataset when None (counted by running it when tf.data cannot tell: a filter, a
    generator). One line when it repeats forever and `flag` (--eval_steps, num_samples)
    does not say how much to take, or when it is known to hold fewer than `steps`."""
    what = RUN_INPUTS[RunKind(kind)][0]
    count = int(dataset.cardinality())
    if steps is not None:
        if 0 <= count < steps:
            raise input_ran_out(kind, f"after {count} of {steps} batches")
        return steps
    if count == int(tf.data.INFINITE_CARDINALITY):
        raise CSRunError(f"the {what} input repeats forever and no {flag} is given",
                         f"give {flag} or make the {what} input end")
    if count == int(tf.data.UNKNOWN_CARDINALITY):
        try:
            count = int(dataset.reduce(np.int64(0), lambda n, _: n + 1))
        except tf.errors.OpError as error:
            raise user_code_error("input_fn's dataset", error, _INPUT_HINT) from error
    return count


def numpy_batches(dataset: tf.data.Dataset) -> Iterator[Any]:
    """The dataset's elements as numpy; a failure inside input_fn's pipeline (a map
    function that raises, a file that cannot be read) is one line."""
    iterator = dataset.as_numpy_iterator()
    while True:
        try:
            element = next(iterator)
        except StopIteration:
            return
        except tf.errors.OpError as error:
            raise user_code_error("input_fn's dataset", error, _INPUT_HINT) from error
        yield element


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
    """Call model_fn(features, labels, mode, params) and check what it returns; warn once
    of Keras regularizers whose penalty it never computes (`keras_regularizers`)."""
    accepted = inspect.signature(model_fn).parameters
    kwargs = {k: v for k, v in (("features", features), ("labels", labels), ("mode", mode),
                                ("params", params)) if k in accepted}
    try:
        with recording(params), watching_regularizers() as watch:
            spec = model_fn(**kwargs)
    except CSRunError:
        raise
    except Exception as error:  # the user's code: one line, the traceback with --debug
        keras = isinstance(error, AttributeError) and any(k in str(error) for k in _KERAS_OPTIMIZER)
        raise user_code_error("model_fn", error, _KERAS_OPTIMIZER_HINT if keras else _MODEL_HINT,
                              f" on batches of {_describe_inputs(features, labels)}") from error
    say_unread(params)  # after the first model_fn: input_fn has run before it
    if unpenalized := watch.unpenalized():
        record_unpenalized(tf.compat.v1.get_default_graph(), unpenalized)
        say_once(params, unpenalized_warning(unpenalized))
    if not isinstance(spec, CSEstimatorSpec):
        raise CSRunError(f"model_fn returned {type(spec).__name__}, not a CSEstimatorSpec",
                         "return launcher.estimator.CSEstimatorSpec(mode=..., loss=..., ...)")
    if spec.train_op is not None and not isinstance(spec.train_op, (tf.Operation, tf.Tensor)):
        # the value of an assign to a resource variable (v.assign_add(1)): its assign op
        if not isinstance(getattr(spec.train_op, "op", None), tf.Operation):
            raise CSRunError(f"model_fn's train_op is a {type(spec.train_op).__name__}, not a "
                             "TensorFlow op or tensor",
                             "return optimizer.minimize(...) or tf.group(...) of the updates")
        spec.train_op = spec.train_op.op
    return spec
