"""Concurrent pipeline stages: how the regions are grouped into stages, the per-batch
exchange through which stages hand each other activations and gradients, and the stage
threads (one per stage but the first, which runs in the caller's thread).

numpy's GEMMs release the GIL, so two stages really compute at once on two cores. Every
GEMM runs with one BLAS thread (`one_blas_thread`, entered by the caller around a whole
batch: BLAS's thread count is one setting for the process): the float32 summation order,
and so the result, is the same whatever the machine's BLAS thread count.
"""
from __future__ import annotations

import os
import queue
import threading
from contextlib import AbstractContextManager
from typing import Any, Callable, Hashable, Sequence

import threadpoolctl

_controller: threadpoolctl.ThreadpoolController | None = None


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, e.g. a Slurm allocation)."""
    return len(os.sched_getaffinity(0))


def one_blas_thread() -> AbstractContextManager:
    """Limit BLAS to one thread for the block (cheap: the libraries are scanned once)."""
    global _controller
    if _controller is None:
        _controller = threadpoolctl.ThreadpoolController()
    return _controller.limit(limits=1, user_api="blas")


def partition(costs: Sequence[float], count: int) -> tuple[range, ...]:
    """Split consecutive positions into `count` (at most len(costs)) non-empty ranges
    whose largest total cost is the smallest possible."""
    n = len(costs)
    count = max(1, min(count, n))
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    # best[s][j]: the smallest largest stage cost splitting positions [0, j) into s stages
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(count + 1)]
    cut = [[0] * (n + 1) for _ in range(count + 1)]
    best[0][0] = 0.0
    for s in range(1, count + 1):
        for j in range(s, n + 1):
            for i in range(s - 1, j):
                worst = max(best[s - 1][i], prefix[j] - prefix[i])
                if worst < best[s][j]:
                    best[s][j], cut[s][j] = worst, i
    bounds, j = [], n
    for s in range(count, 0, -1):
        bounds.append(range(cut[s][j], j))
        j = cut[s][j]
    return tuple(reversed(bounds))


class Aborted(Exception):
    """Another stage of the batch failed: this one stops waiting."""


class Board:
    """One batch's exchange: stages put values under keys and take them, waiting until
    they are there; a failure anywhere wakes every waiting stage."""

    def __init__(self) -> None:
        self.items: dict[Hashable, Any] = {}
        self.error: BaseException | None = None
        self.pending = 0  # stages still running
        self._cond = threading.Condition()

    def put(self, key: Hashable, value: Any) -> None:
        with self._cond:
            self.items[key] = value
            self._cond.notify_all()

    def get(self, key: Hashable, *, pop: bool = False) -> Any:
        items = self.items
        if key not in items:
            with self._cond:
                while key not in items:
                    if self.error is not None:
                        raise Aborted
                    self._cond.wait()
        return items.pop(key) if pop else items[key]

    def stage_ended(self, error: BaseException | None = None) -> None:
        with self._cond:
            if error is not None and not isinstance(error, Aborted) and self.error is None:
                self.error = error
            self.pending -= 1
            self._cond.notify_all()

    def wait(self) -> None:
        """Until every stage ended; re-raise the first stage's failure."""
        with self._cond:
            while self.pending:
                self._cond.wait()
        if self.error is not None:
            raise self.error


StageWork = Callable[[int, Board], None]  # run stage s of a batch


class StageThreads:
    """Threads for stages 1..S-1, started on first use and kept until `close`."""

    def __init__(self, stages: int, name: str):
        self.stages = stages
        self.name = name
        self._inboxes: list[queue.SimpleQueue] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.closed = False

    def _start(self) -> None:
        for stage in range(1, self.stages):
            inbox: queue.SimpleQueue = queue.SimpleQueue()
            thread = threading.Thread(target=self._serve, args=(stage, inbox), daemon=True,
                                      name=f"{self.name}-stage-{stage}")
            thread.start()
            self._inboxes.append(inbox)
            self._threads.append(thread)

    @staticmethod
    def _serve(stage: int, inbox: queue.SimpleQueue) -> None:
        while (item := inbox.get()) is not None:
            work, board = item
            error = None
            try:
                work(stage, board)
            except BaseException as failure:  # handed to the caller's thread
                error = failure
            board.stage_ended(error)

    def run(self, work: StageWork, board: Board) -> bool:
        """Run `work` for every stage at once (stage 0 in this thread) and wait for all;
        False (nothing run) once closed."""
        with self._lock:
            if self.closed:
                return False
            board.pending = self.stages
            if not self._threads:
                self._start()
            for inbox in self._inboxes:
                inbox.put((work, board))
        error = None
        try:
            work(0, board)
        except BaseException as failure:
            error = failure
        board.stage_ended(error)
        board.wait()
        return True

    def close(self) -> None:
        """Stop the threads after the batch in progress, and join them."""
        with self._lock:
            self.closed = True
            for inbox in self._inboxes:
                inbox.put(None)
        for thread in self._threads:
            thread.join()
