"""TensorBoard event files: the scalar writer of the CPU path and the CS chief.

Training scalars (`loss`, `global_step/sec`, the user's `tf.compat.v1.summary` scalars, and
on the CS `cs/samples_per_sec`) go to `model_dir`, evaluation results to `model_dir/eval`,
where TensorBoard looks. Values are `simple_value` scalars, so TensorBoard's
`EventAccumulator.Scalars(tag)` reads them as an Estimator's would be read.
"""
from __future__ import annotations

import os
import time
from typing import Mapping

import numpy as np
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from common.closing import Closing

EVAL_DIR = "eval"


class EventWriter(Closing):
    """Appends scalar events to a new event file in `logdir` (created if missing)."""

    def __init__(self, logdir: str):
        os.makedirs(logdir, exist_ok=True)
        self.logdir = logdir
        self._writer = EventFileWriter(logdir, flush_secs=5)

    def scalars(self, step: int, values: Mapping[str, float | np.ndarray]) -> None:
        """A scalar summary of each value; a value of several elements (a metric of several
        thresholds) has none, as TF's Estimator skips it."""
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=float(v))
                                             for tag, v in values.items() if np.ndim(v) == 0])
        self._write(step, summary)

    def summary(self, step: int, serialized: bytes) -> set[str]:
        """Write a serialized `Summary` (what `tf.compat.v1.summary.merge_all()` evaluates
        to); returns its tags."""
        summary = summary_pb2.Summary.FromString(serialized)
        self._write(step, summary)
        return {value.tag for value in summary.value}

    def _write(self, step: int, summary: summary_pb2.Summary) -> None:
        self._writer.add_event(event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary))

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def eval_dir(model_dir: str) -> str:
    return os.path.join(model_dir, EVAL_DIR)
