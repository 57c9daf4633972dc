"""What a failed task of a job tells its launcher: when it failed and whether the failure was
its own or a consequence of another's (the CS went away, another task's stream broke), so
that the launcher's one line names the process that failed first (`slurm.blame`).

A task writes `<job folder>/failures/<rank>.json` as it reports its one-line error
(`common.errors.report`, through the hook `coordinator.roles` installs); a task that died
without reporting (a traceback, a signal) has none, and its failure counts as its own.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

OWN = ""          # the task's own failure: an input_fn error, a bad param, a NaN loss…
CS = "cs"         # the CS system went away (unreachable, stopped answering)
FAILURES_DIR = "failures"


def rank_cause(rank: int) -> str:
    """The cause of a failure that follows task `rank`'s (its input stream broke)."""
    return f"rank {rank}"


def worker_cause(worker: int) -> str:
    """The cause of a failure that follows input worker `worker`'s: it is task worker + 1
    (`coordinator.roles`: rank 0 is the chief)."""
    return rank_cause(worker + 1)


def caused_rank(caused_by: str) -> int | None:
    """The task a `rank_cause` names, None for another cause."""
    kind, _, number = caused_by.partition(" ")
    return int(number) if kind == "rank" and number.isdigit() else None


@dataclass(frozen=True)
class TaskFailure:
    rank: int
    time_ns: int      # time.time_ns() when the task reported it
    caused_by: str    # OWN, CS or rank_cause(N)


def failure_path(job_dir: Path, rank: int) -> Path:
    return Path(job_dir) / FAILURES_DIR / f"{rank}.json"


def write_failure(job_dir: Path, failure: TaskFailure) -> None:
    """Write `failure` whole (a temporary file renamed): the launcher never reads half of it."""
    path = failure_path(job_dir, failure.rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.write_text(json.dumps(asdict(failure)))
    temporary.replace(path)


def read_failures(job_dir: Path) -> dict[int, TaskFailure]:
    """Every task's failure written in `job_dir`, by rank."""
    failures = {}
    for path in (Path(job_dir) / FAILURES_DIR).glob("*.json"):
        try:
            failure = TaskFailure(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            continue
        failures[failure.rank] = failure
    return failures
