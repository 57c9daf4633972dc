"""Predictions of model_fn in PREDICT mode, computed on the host from fed numpy values, and
the file they go to (`model_dir/predict/predictions-<step>.npz`).

The CPU path feeds the input batches; the CS chief feeds the kernel outputs the CS streams
back (at the kernels' TF tensor names), so both paths share one graph and one writer.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Collection, Iterator, Mapping, Sequence

import numpy as np
import tensorflow as tf

from common.closing import Closing
from common.errors import CSRunError
from tf_model import checkpoints, host_graph
from tf_model.estimator_spec import ModeKeys
from tf_model.model_fn import BatchSignature, call_model_fn, local_init_op, model_graph

PREDICT_DIR = "predict"
SINGLE_KEY = "predictions"  # the file's key when model_fn's predictions are one tensor


class PredictionGraph(Closing):
    """model_fn built in PREDICT mode with a checkpoint's weights restored. `streamed`: the
    tensor names the chief feeds from the CS's outputs (the graph is cut at them:
    `host_graph.feed_only`)."""

    def __init__(self, model_fn: Any, signature: BatchSignature, params: dict, checkpoint: str,
                 streamed: Collection[str] | None = None):
        with model_graph(params) as graph:
            self.inputs = signature.placeholders()
            spec = call_model_fn(model_fn, *self.inputs, ModeKeys.PREDICT, params)
            if spec.predictions is None:
                raise CSRunError("model_fn in predict mode returned no predictions",
                                 "return CSEstimatorSpec(mode, predictions=...)")
            variables = tf.compat.v1.global_variables()
            init = local_init_op()
        predictions = spec.predictions
        self.keyed = isinstance(predictions, dict)
        self.outputs = predictions if self.keyed else {SINGLE_KEY: predictions}
        self.stand_ins = {} if streamed is None else host_graph.feed_only(graph, streamed)
        self.session = tf.compat.v1.Session(graph=graph)
        self.session.run(init)
        checkpoints.restore_variables(self.session, variables, checkpoint)

    def run(self, values: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The predictions of one batch; `values` maps tensor names to numpy values."""
        return host_graph.run(self.session, self.outputs, values, self.stand_ins)

    def close(self) -> None:
        self.session.close()


@dataclass(frozen=True)
class Predictions:
    """A run's predictions: an array per key (model_fn's dict keys, or `SINGLE_KEY` when
    `keyed` is False: its predictions were one tensor), the samples along the first axis."""

    arrays: dict[str, np.ndarray]
    keyed: bool
    batch_size: int

    def __len__(self) -> int:
        return len(next(iter(self.arrays.values()))) if self.arrays else 0

    def iterate(self, predict_keys: Sequence[str] | None = None,
                yield_single_examples: bool = True) -> Iterator[Any]:
        """What tf.estimator.Estimator.predict yields: a dict per sample of model_fn's keys (only
        `predict_keys` when given), or an array per sample when its predictions were one
        tensor; per batch with `yield_single_examples=False`."""
        arrays = self.arrays
        if predict_keys is not None:
            if not self.keyed:
                raise CSRunError("predict_keys given, but model_fn's predictions are one tensor",
                                 "leave predict_keys out, or return predictions as a dict")
            unknown = [k for k in predict_keys if k not in arrays]
            if unknown:
                raise CSRunError(f"predict_keys {unknown[0]!r} is not a key of model_fn's predictions",
                                 f"its keys: {', '.join(sorted(arrays))}")
            arrays = {k: arrays[k] for k in predict_keys}
        return self._samples(arrays, 0 if yield_single_examples else max(self.batch_size, 1))

    def _samples(self, arrays: dict[str, np.ndarray], batch: int) -> Iterator[Any]:
        for start in range(0, len(self), batch or 1):
            part = {k: v[start:start + batch] if batch else v[start] for k, v in arrays.items()}
            yield part if self.keyed else part[SINGLE_KEY]


def write_predictions(model_dir: str, step: int, batches: Mapping[str, list[np.ndarray]],
                      num_samples: int | None, keyed: bool, batch_size: int) -> Predictions:
    """Concatenate per-batch predictions (cut to `num_samples`), write them atomically to
    `model_dir/predict/predictions-<step>.npz`, say so, and return them."""
    results = {k: np.concatenate(v)[:num_samples] if v else np.zeros((0,)) for k, v in batches.items()}
    out_dir = os.path.join(model_dir, PREDICT_DIR)
    os.makedirs(out_dir, exist_ok=True)
    target = os.path.join(out_dir, f"predictions-{step}.npz")
    tmp = f"{target}.tmp-{os.getpid()}.npz"
    np.savez(tmp, allow_pickle=False, **results)
    os.replace(tmp, target)
    predictions = Predictions(results, keyed, batch_size)
    print(f"Wrote {len(predictions)} predictions of step {step} to {target}", flush=True)
    return predictions
