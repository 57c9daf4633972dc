"""A stop the chief finishes with a checkpoint: SIGTERM (scancel, `scontrol requeue`, a
preemption, csrun_job cancel) or SIGUSR2 (Slurm's `--signal` before a time limit, which
submitit asks for) while it trains. The training loop runs the CS in pieces of about
PIECE_S of wall time; after the piece in progress it snapshots the CS at the step reached,
writes the checkpoint and stops (`common.errors.Stopped`), so a rerun, or the requeued job,
resumes from that step exactly. The input workers get the same signal: they keep streaming
for up to WORKER_LINGER_S (`linger_on_stop`), so that the chief's last piece gets its batches.
"""
from __future__ import annotations

import os
import signal
import threading
from typing import Any

PIECE_S = 1.0  # wall seconds of CS steps between two looks at a stop request
WORKER_LINGER_S = 5.0  # how long a stopped input worker keeps streaming for the chief's last piece
SIGNALS = (signal.SIGTERM, signal.SIGUSR2)


class StopRequest:
    """While entered (in the main thread; elsewhere signals keep their handling): the stop
    signal received, if any, in `signum`."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def _request(self, signum: int, _frame: object) -> None:
        if self.signum is None:
            self.signum = signum

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._request) for sig in SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def next_piece(steps: int, seconds: float, left: int) -> int:
    """The steps of the next piece: about PIECE_S of wall time at the rate of the last piece
    (`steps` in `seconds`), at most four times the last, at least one, at most `left`."""
    rate_steps = int(steps * PIECE_S / seconds) if seconds > 0 else steps * 4
    return max(1, min(rate_steps, steps * 4, left))


def linger_on_stop() -> None:
    """In an input worker (main thread): a SIGTERM ends the process WORKER_LINGER_S later
    (exit code 128 + SIGTERM, as the signal's own ending gives), unless it ended before with
    its job; the further SIGTERMs a Slurm stop sends (slurmstepd, srun, the task) are ignored."""

    def later(signum: int, _frame: object) -> None:
        signal.signal(signum, signal.SIG_IGN)
        timer = threading.Timer(WORKER_LINGER_S, os._exit, (128 + signum,))
        timer.daemon = True
        timer.start()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, later)
