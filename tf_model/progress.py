"""The training log lines, in the original's shape, for the CPU path and the CS chief:

    global step 100: loss = 0.3127 (212.4 steps/sec)
    Saving checkpoints for 100 into model_dir/model.ckpt.
    Training finished with 25600 samples in 1.234 seconds, 20745.54 samples/second.
    Loss for final step: 0.3127.
"""
from __future__ import annotations

import os
import time
from typing import Mapping

import numpy as np


class StepRate:
    """Steps per second between successive calls (the first measures from construction)."""

    def __init__(self, step: int):
        self._step, self._time = step, time.perf_counter()

    def __call__(self, step: int) -> float:
        now = time.perf_counter()
        rate = (step - self._step) / max(now - self._time, 1e-9)
        self._step, self._time = step, now
        return rate


def _say(line: str) -> None:
    print(line, flush=True)


class TrainingProgress:
    """Prints a run's log lines: a step line every `log_every` steps, one per checkpoint,
    and the summary at the end."""

    def __init__(self, start_step: int, batch_size: int, log_every: int | None):
        self.start_step = start_step
        self.batch_size = batch_size
        self.log_every = log_every
        self._rate = StepRate(start_step)
        self._start = time.perf_counter()

    def step(self, step: int, loss: float) -> None:
        if self.log_every and step % self.log_every == 0:
            _say(f"global step {step}: loss = {loss:.6g} ({self._rate(step):.4g} steps/sec)")

    @staticmethod
    def saved(step: int, model_dir: str) -> None:
        _say(f"Saving checkpoints for {step} into {os.path.join(model_dir, 'model.ckpt')}.")

    def finished(self, step: int, loss: float) -> None:
        seconds = time.perf_counter() - self._start
        samples = (step - self.start_step) * self.batch_size
        _say(f"Training finished with {samples} samples in {seconds:.3f} seconds, "
             f"{samples / max(seconds, 1e-9):.2f} samples/second.")
        _say(f"Loss for final step: {loss}.")


def skipping(step: int) -> None:
    _say(f"Skipping training since max_steps has already saved: {step}")


def restoring(path: str) -> None:
    _say(f"Restoring parameters from {path}")


def eval_results(step: int, results: Mapping[str, float | np.ndarray]) -> None:
    items = ", ".join(f"{k} = {v:.6g}" if np.ndim(v) == 0 else f"{k} = {np.array2string(np.asarray(v), precision=6)}"
                      for k, v in sorted({**results, "global_step": step}.items()))
    _say(f"Saving dict for global step {step}: {items}")
