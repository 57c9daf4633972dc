"""Predictions of model_fn in PREDICT mode, computed on the host from fed numpy values, and
the file they go to (`model_dir/predict/predictions-<step>.npz`).

The CPU path feeds the input batches; the CS chief feeds the kernel outputs the CS streams
back (at the kernels' TF tensor names), so both paths share one graph and one writer.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

import numpy as np
import tensorflow as tf

from common.errors import CSRunError
from tf_model import checkpoints
from tf_model.estimator_spec import ModeKeys
from tf_model.model_fn import BatchSignature, call_model_fn, model_graph

PREDICT_DIR = "predict"


class PredictionGraph:
    """model_fn built in PREDICT mode with a checkpoint's weights restored."""

    def __init__(self, model_fn: Any, signature: BatchSignature, params: dict, checkpoint: str):
        with model_graph(params) as graph:
            self.inputs = signature.placeholders()
            spec = call_model_fn(model_fn, *self.inputs, ModeKeys.PREDICT, params)
            if spec.predictions is None:
                raise CSRunError("model_fn in predict mode returned no predictions",
                                 "return CSEstimatorSpec(mode, predictions=...)")
            variables = tf.compat.v1.global_variables()
        predictions = spec.predictions
        self.outputs = predictions if isinstance(predictions, dict) else {"predictions": predictions}
        self.session = tf.compat.v1.Session(graph=graph)
        checkpoints.restore_variables(self.session, variables, checkpoint)

    def run(self, values: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The predictions of one batch; `values` maps tensor names to numpy values."""
        graph = self.session.graph
        return self.session.run(self.outputs, {graph.get_tensor_by_name(n): v for n, v in values.items()})

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> "PredictionGraph":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_predictions(model_dir: str, step: int, batches: Mapping[str, list[np.ndarray]],
                      num_samples: int | None) -> dict[str, np.ndarray]:
    """Concatenate per-batch predictions (cut to `num_samples`), write them atomically to
    `model_dir/predict/predictions-<step>.npz`, say so, and return them."""
    results = {k: np.concatenate(v)[:num_samples] if v else np.zeros((0,)) for k, v in batches.items()}
    out_dir = os.path.join(model_dir, PREDICT_DIR)
    os.makedirs(out_dir, exist_ok=True)
    target = os.path.join(out_dir, f"predictions-{step}.npz")
    tmp = f"{target}.tmp-{os.getpid()}.npz"
    np.savez(tmp, allow_pickle=False, **results)
    os.replace(tmp, target)
    count = len(next(iter(results.values()))) if results else 0
    print(f"Wrote {count} predictions of step {step} to {target}", flush=True)
    return results
