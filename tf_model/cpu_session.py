"""The CPU path: model_fn in a tf.compat.v1 graph, run with a Session on this machine.

It is the reference every CS result is compared against, so it follows the contracts of
docs/design.md: the graph is built as the compiler builds it (`model_graph`, batch placeholders,
then model_fn), so variable names and initial weights are equal on every path; batch k of a
run is batch k of `input_fn(params)`, and a run resumed at step S continues with batch S.
Checkpoints, events and log lines go through `checkpoints`, `events` and `progress`, which
the CS chief uses too.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import tensorflow as tf

from common.errors import CSRunError
from common.run_kinds import RunKind
from common.run_settings import RunSettings, check_steps, end_step
from tf_model import checkpoints, progress
from tf_model.estimator_spec import ModeKeys
from tf_model.events import EventWriter, eval_dir
from tf_model.metrics import EvalMetrics, MetricValue
from tf_model.model_dir_lock import model_dir_locked
from tf_model.model_fn import (
    batch_signature,
    call_model_fn,
    input_ran_out,
    local_init_op,
    make_dataset,
    model_graph,
    numpy_batches,
    op_errors_in_one_line,
)
from tf_model.predictions import PredictionGraph, Predictions, write_predictions

_PREFETCH = 2


def _seed(params: dict) -> None:
    """The graph seed input workers set before calling input_fn, for the same batches."""
    seed = (params.get("runconfig") or {}).get("tf_random_seed")
    if seed is not None:
        tf.random.set_seed(int(seed))


def batches(input_fn: Callable, params: dict, start: int = 0) -> tuple[Any, Iterator[Any]]:
    """(batch signature, numpy batches start, start + 1, … of input_fn(params))."""
    _seed(params)
    dataset = make_dataset(input_fn, params)
    return batch_signature(dataset), numpy_batches(dataset.skip(start).prefetch(_PREFETCH))


def _is_finite(input_fn: Callable, params: dict) -> bool:
    return int(make_dataset(input_fn, params).cardinality()) != int(tf.data.INFINITE_CARDINALITY)


def _feed(placeholders: Sequence[Any], batch: Any) -> dict:
    return dict(zip(tf.nest.flatten(placeholders), tf.nest.flatten(batch)))


def _batch_size(batch: Any) -> int:
    return int(np.shape(tf.nest.flatten(batch)[0])[0])


@dataclass(frozen=True)
class _TrainGraph:
    graph: tf.Graph
    inputs: tuple[Any, Any]
    loss: Any
    train_op: Any
    global_step: Any
    summaries: Any  # merged user summaries, or None
    variables: list
    trainable: list


def _build_train_graph(model_fn: Callable, signature: Any, params: dict) -> _TrainGraph:
    with model_graph(params) as graph:
        features, labels = signature.placeholders()
        spec = call_model_fn(model_fn, features, labels, ModeKeys.TRAIN, params)
        global_step = tf.compat.v1.train.get_global_step()
        if global_step is None:
            raise CSRunError("model_fn's train_op does not count the global step",
                             "pass global_step=tf.compat.v1.train.get_or_create_global_step() "
                             "to optimizer.minimize")
        return _TrainGraph(graph, (features, labels), spec.loss, spec.train_op, global_step,
                           tf.compat.v1.summary.merge_all(), tf.compat.v1.global_variables(),
                           tf.compat.v1.trainable_variables())


def _start_session(built: _TrainGraph, settings: RunSettings) -> tf.compat.v1.Session:
    """A session with the newest checkpoint restored, or initial (warm-started) weights."""
    session = tf.compat.v1.Session(graph=built.graph)
    latest = checkpoints.latest_checkpoint(settings.model_dir, set_aside=True)
    with built.graph.as_default():
        session.run([tf.compat.v1.global_variables_initializer(), local_init_op()])
    if latest is not None:
        progress.restoring(latest)
        stored = dict(tf.train.list_variables(latest))
        names = [v.op.name for v in built.variables]
        restored = built.variables
        if checkpoints.optimizer_changed(latest, stored, checkpoints.optimizer_of(names)):
            restored = [v for v in built.variables if not checkpoints.is_optimizer_state(v.op.name)]
        checkpoints.restore_variables(session, restored, latest)
    elif settings.warm_start_from is not None:
        warm = settings.warm_start_from
        source = _checkpoint_of(warm.checkpoint)
        chosen = [v for v in built.trainable if re.match(warm.variables, v.op.name)]
        left = "" if len(chosen) == len(built.trainable) else f" ({len(built.trainable) - len(chosen)} left initial)"
        print(f"Warm-starting the trainable variables from {source}{left}", flush=True)
        checkpoints.restore_variables(session, chosen, source)
    return session


def _checkpoint_of(path: str) -> str:
    """A checkpoint prefix, or the newest checkpoint of a model_dir."""
    if os.path.isdir(path):
        latest = checkpoints.latest_checkpoint(path)
        if latest is None:
            raise CSRunError(f"{path} holds no checkpoint", "name a model_dir with a checkpoint "
                             "index or a model.ckpt-N prefix")
        return latest
    return path


def _save(session: tf.compat.v1.Session, built: _TrainGraph, settings: RunSettings, step: int) -> None:
    values = session.run({v.op.name: v for v in built.variables})
    checkpoints.write_checkpoint(settings.model_dir, step, values, settings.keep_checkpoint_max)
    progress.TrainingProgress.saved(step, settings.model_dir)


def _every(n: int | None, step: int) -> bool:
    return bool(n and step % n == 0)


@op_errors_in_one_line
def train(model_fn: Callable, input_fn: Callable, settings: RunSettings, steps: int | None = None,
          max_steps: int | None = None, hooks: Sequence[Any] = ()) -> int:
    """Train from the newest checkpoint (or initial weights) to `max_steps` (absolute) or
    `steps` more; returns the final global step. `hooks` are tf.compat.v1.train.SessionRunHooks."""
    check_steps(steps, max_steps)
    with model_dir_locked(settings.model_dir):
        return _train(model_fn, input_fn, settings, steps, max_steps, hooks)


def _train(model_fn: Callable, input_fn: Callable, settings: RunSettings, steps: int | None,
           max_steps: int | None, hooks: Sequence[Any]) -> int:
    params = settings.params
    signature = batch_signature(make_dataset(input_fn, params))
    built = _build_train_graph(model_fn, signature, params)
    with built.graph.as_default():
        for hook in hooks:
            hook.begin()
    session = _start_session(built, settings)
    try:
        step = int(session.run(built.global_step))
        end = end_step(step, steps, max_steps)
        if end <= step:
            progress.skipping(step)
            return step
        for hook in hooks:
            hook.after_create_session(session, None)
        step = _train_loop(session, built, settings, input_fn, step, end, hooks)
        for hook in hooks:
            hook.end(session)
        return step
    finally:
        session.close()


def _train_loop(session: tf.compat.v1.Session, built: _TrainGraph, settings: RunSettings,
                input_fn: Callable, step: int, end: int, hooks: Sequence[Any]) -> int:
    _, stream = batches(input_fn, settings.params, start=step)
    base = {"loss": built.loss, "train_op": built.train_op}
    summaries = dict(base, summary=built.summaries) if built.summaries is not None else base
    rate = progress.StepRate(step)
    log = None
    loss = math.nan
    first = step + 1
    stop = False
    unmoved = True  # TF's global step has not moved yet
    with EventWriter(settings.model_dir) as events:
        for batch in stream:
            if log is None:
                log = progress.TrainingProgress(step, _batch_size(batch), settings.log_step_count_steps)
            summarize = _every(settings.save_summary_steps, step + 1)
            fetches = summaries if summarize else base
            feed = _feed(built.inputs, batch)
            if hooks:
                out, stop = _run_with_hooks(session, fetches, feed, hooks)
            else:
                out = session.run(fetches, feed)
            step += 1
            loss = float(out["loss"])
            if not math.isfinite(loss):
                raise checkpoints.non_finite_loss(loss, step, settings.model_dir)
            if unmoved:  # (dynamic loss scaling's skipped steps leave it, so not only the first)
                unmoved = int(session.run(built.global_step)) == first - 1
            log.step(step, loss)
            if summarize:
                tags = events.summary(step, out["summary"]) if "summary" in out else set()
                scalars = {"global_step/sec": rate(step)}
                if "loss" not in tags:
                    scalars["loss"] = loss
                events.scalars(step, scalars)
            if _every(settings.save_checkpoints_steps, step) or step == end or stop:
                events.flush()
                _save(session, built, settings, step)
            if step == end or stop:
                break
    if unmoved and step >= first:
        raise CSRunError("model_fn's train_op does not increment the global step",
                         "pass global_step=tf.compat.v1.train.get_or_create_global_step() "
                         "to optimizer.minimize")
    if step < end and not stop:
        raise CSRunError(f"input_fn ran out after {step} steps, the run needs {end}",
                         "make the training input repeat (dataset.repeat()) or lower the steps")
    assert log is not None, "a run that took no batch ended above"
    log.finished(step, loss)
    return step


def _run_with_hooks(session: tf.compat.v1.Session, fetches: dict, feed: dict,
                    hooks: Sequence[Any]) -> tuple[dict, bool]:
    """One step with the SessionRunHook protocol: (the fetched values, stop requested)."""
    context = tf.compat.v1.train.SessionRunContext(fetches, session)
    requests = [hook.before_run(context) for hook in hooks]
    extra = {i: r.fetches for i, r in enumerate(requests) if r is not None and r.fetches is not None}
    for r in requests:
        if r is not None and r.feed_dict:
            feed = {**feed, **r.feed_dict}
    out = session.run({"user": fetches, "hooks": extra}, feed)
    for i, hook in enumerate(hooks):
        hook.after_run(context, tf.compat.v1.train.SessionRunValues(
            results=out["hooks"].get(i), options=None, run_metadata=None))
    return out["user"], context.stop_requested


@op_errors_in_one_line
def evaluate(model_fn: Callable, input_fn: Callable, settings: RunSettings, steps: int | None = None,
             checkpoint_path: str | None = None) -> dict[str, MetricValue]:
    """Evaluate a checkpoint (the newest by default) on `steps` batches (all when None):
    the metrics are printed, written to `model_dir/eval` events and returned with
    `global_step`."""
    params = settings.params
    if steps is None and not _is_finite(input_fn, params):
        raise CSRunError("the evaluation input repeats forever and no eval_steps is given",
                         "give --eval_steps or make the eval input end")
    path = checkpoints.chosen_checkpoint(settings.model_dir, checkpoint_path)
    step = checkpoints.checkpoint_step(path)
    with EvalMetrics(model_fn, input_fn, params, checkpoint=path) as metrics:
        _, stream = batches(input_fn, params)
        done = 0
        for batch in stream:
            if steps is not None and done == steps:
                break
            metrics.update(dict(zip(metrics.input_names, tf.nest.flatten(batch))))
            done += 1
        if steps is not None and done < steps:
            raise input_ran_out(RunKind.EVALUATE, f"after {done} of {steps} batches")
        results = metrics.results()
    progress.eval_results(step, results)
    with EventWriter(eval_dir(settings.model_dir)) as events:
        events.scalars(step, results)
    return {**results, "global_step": step}


@op_errors_in_one_line
def predict(model_fn: Callable, input_fn: Callable, settings: RunSettings,
            checkpoint_path: str | None = None, num_samples: int | None = None) -> Predictions:
    """Predictions for `num_samples` samples (the whole input when None) from a checkpoint,
    written to `model_dir/predict/predictions-<step>.npz` and returned."""
    params = settings.params
    if num_samples is None and not _is_finite(input_fn, params):
        raise CSRunError("the prediction input repeats forever and no num_samples is given",
                         "give num_samples or make the input end")
    path = checkpoints.chosen_checkpoint(settings.model_dir, checkpoint_path)
    signature, stream = batches(input_fn, params)
    collected: dict[str, list[np.ndarray]] = {}
    count = batch_size = 0
    with PredictionGraph(model_fn, signature, params, path) as graph:
        names = [t.name for t in tf.nest.flatten(graph.inputs)]
        for batch in stream:
            if num_samples is not None and count >= num_samples:
                break
            for key, value in graph.run(dict(zip(names, tf.nest.flatten(batch)))).items():
                collected.setdefault(key, []).append(value)
            batch_size = batch_size or _batch_size(batch)
            count += _batch_size(batch)
    return write_predictions(settings.model_dir, checkpoints.checkpoint_step(path), collected,
                             num_samples, graph.keyed, batch_size)
