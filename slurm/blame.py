"""Which failure of a job its launcher's one line names: the process that failed first, and
why. A task's failure is its own (an input_fn error, a bad param, a NaN loss, a task killed)
or a consequence of another's, as the task recorded it (`common.task_failure`): the CS
went away, or another task's input stream broke. The line names a task whose failure is its
own; failing that, the CS when every consequence leads to it (the launcher then asks the CS
itself); failing that, the task whose result came first.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from common.task_failure import CS, OWN, TaskFailure, caused_rank
from slurm.submitit_api import TaskResult

BLAME_WAIT_S = 10.0  # how long a consequence waits for the failure it follows to be reported


@dataclass(frozen=True)
class Blame:
    """The verdict: `rank` (a task), or `cs` (the CS, to be asked), or neither while the
    failure a consequence follows has not been reported yet (`waiting`)."""

    rank: int | None = None
    cs: bool = False

    @property
    def waiting(self) -> bool:
        return self.rank is None and not self.cs


def blame(failed: Sequence[TaskResult], failures: Mapping[int, TaskFailure], num_tasks: int,
          waited_out: bool) -> Blame:
    """The verdict on a job's failed task results `failed` (at least one) and the failure
    records its tasks wrote (`failures`, by rank); `waited_out`: no more waiting for a
    failure a consequence follows."""
    results = {r.rank: r for r in failed}

    def own(rank: int) -> bool:
        record = failures.get(rank)
        return (record.caused_by == OWN or not 0 <= (caused_rank(record.caused_by) or 0) < num_tasks
                if record is not None else rank in results)

    def when(rank: int) -> tuple[int, int]:
        record = failures.get(rank)
        return (record.time_ns if record is not None else results[rank].written_ns, rank)

    roots = [rank for rank in {*results, *failures} if own(rank)]
    if roots:
        return Blame(rank=min(roots, key=when))
    unresolved = False
    for start in results:
        rank, seen = start, set()
        while rank not in seen and rank in failures:
            seen.add(rank)
            cause = failures[rank].caused_by
            if cause == CS:
                return Blame(cs=True)
            next_rank = caused_rank(cause)
            if next_rank is None:
                break
            rank = next_rank
        else:
            unresolved |= rank not in seen  # the failure it follows is not reported yet
    if unresolved and not waited_out:
        return Blame()
    return Blame(rank=min(results, key=when))
