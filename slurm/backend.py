"""The launch-backend interface: how `csrun_wse` starts a job's tasks, shaped like submitit's
(an executor that submits, a job that is followed and cancelled).

One interface here, with the one loop that follows a job (`LaunchedJob.follow`); one module
per backend beside it (`local_backend.py`: submitit's local executor; `slurm_backend.py`:
submitit's Slurm executor), each answering a few questions the loop asks (is the job still
running, why did it fail, how to stop it); `auto.py` picks one (`choose_backend()`, which
asks each backend's `available()`). The CLIs build one `JobRequest` and never branch on
"is this Slurm?" again. What csrun uses of submitit beyond its API is in `submitit_api.py`.

The life of a job, in the order a CLI calls it:

1. `backend.build(request) -> Submission` renders the exact request the backend would
   submit (the sbatch script, or the local command line) without submitting anything.
2. `--dry-run`: print `submission.text` and stop. Dry run and submit share `build`, so the
   printed text is the submitted request, never a second rendering.
3. `backend.warm_up(submission)` (a job the CLI follows to its end) starts what lets the
   tasks start sooner, while the CLI prepares the rest (the embedded simulator);
   `backend.submit(submission) -> LaunchedJob` starts the job.
4. `job.follow(stream) -> JobOutcome` streams the chief's (rank 0) log to `stream` until
   the job ends; if any task fails it cancels the others (within 30 s) and returns the rank
   that failed first with the reason (last error line of that task's log), or the CS
   (`job.cs_gone()`'s line, set by the launcher) when the tasks failed because it went away
   (`slurm.blame`).
5. `job.cancel()` stops every task (Ctrl-C calls it); safe to call twice.

Every task runs the same `request.command`; the role comes from the task's rank, which
the task reads from its environment (`SLURM_PROCID`, or submitit's local
`SUBMITIT_LOCAL_GLOBALID`: see `coordinator.roles.task_role`). `request.env` is added to
every task's environment (e.g. `CSRUN_CS_IP` when the job uses an embedded simulator).
"""
from __future__ import annotations

import abc
import dataclasses
import time
from pathlib import Path
from typing import Callable, Mapping, TextIO

import submitit

from common.task_failure import read_failures
from slurm.blame import BLAME_WAIT_S, blame
from slurm.submitit_api import task_log, task_result
from slurm.task import TaskCommand, TaskFailed
from slurm.task_logs import LogCopy, last_error_line


@dataclasses.dataclass(frozen=True)
class JobRequest:
    """What to run and on how much: the one input of every backend."""

    command: tuple[str, ...]           # the user's command, run by every task
    folder: Path                       # job folder: per-task logs, backend files
    workdir: Path                      # where the command runs (the user's cwd)
    name: str = "csrun_wse"
    total_nodes: int = 1
    tasks_per_node: int = 1
    cpus_per_task: int = 1
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # Backend-specific settings the user asked for (partition, time, cyclic...): a backend
    # rejects keys it does not take, naming them.
    options: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # The site's defaults for such settings (csrun.yaml: partition, gres, time...): used by
    # a backend that takes them, ignored by one that does not (the local backend).
    defaults: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # The tasks reach a service on this host's loopback (the embedded simulator): they
    # must run on this host.
    same_host: bool = False
    # The launcher returns once the job is submitted (--detach): the job must not hold its
    # terminal (the local tasks' output goes to the job folder only).
    detached: bool = False

    @property
    def num_tasks(self) -> int:
        return self.total_nodes * self.tasks_per_node


@dataclasses.dataclass(frozen=True)
class Submission:
    """The rendered request: `text` is what --dry-run prints (an sbatch script, or the
    command lines of the local tasks); every one of its `num_tasks` tasks runs `task`."""

    request: JobRequest
    backend: str
    text: str
    task: TaskCommand
    num_tasks: int


@dataclasses.dataclass(frozen=True)
class JobOutcome:
    """How a job ended: the exit code the CLI returns, and the failing task if any."""

    exit_code: int
    failed_rank: int | None = None
    reason: str = ""

    @property
    def message(self) -> str:
        if self.failed_rank is None:
            return self.reason
        role = "chief" if self.failed_rank == 0 else "input worker"
        return f"task {self.failed_rank} ({role}) failed: {self.reason}"


class LaunchedJob(abc.ABC):
    """A submitted job: `follow` it to its end, `cancel` it. A backend's job answers the
    questions of the one follow loop (`_ended_state`, `_ended`, `_explain_failure`,
    `_without_result`) and says how to stop its tasks (`_stop`)."""

    poll_seconds: float = 0.2  # how often `follow` looks at the job

    def __init__(self, job: submitit.Job, folder: Path, num_tasks: int):
        self._job = job
        self.job_id = str(job.job_id)
        self.folder = folder
        self.num_tasks = num_tasks
        self._cancelled = False
        # why the job's CS went away, None while it answers (the launcher knows its CS)
        self.cs_gone: Callable[[], str | None] = lambda: None
        self._first_failure: float | None = None  # when `_results` first saw a failed task
        self._run_since_ns = 0  # results written before are of a run the backend requeued

    def task_log(self, rank: int) -> Path:
        """The file holding task `rank`'s output (stdout and stderr)."""
        return task_log(self.folder, self.job_id, rank)

    def follow(self, stream: TextIO, on_poll: Callable[[], None] | None = None) -> JobOutcome:
        """Copy the chief's log to `stream` as it grows until the job ends; stop every
        task as soon as one fails (within 30 s) and report which one failed first and why.
        `on_poll` is called at every look at the job (the launcher's progress line)."""
        chief_log = LogCopy(self.task_log(0), stream)
        while True:
            chief_log.copy_new()
            if on_poll is not None:
                on_poll()
            requeued = self._requeued()
            if requeued is not None:
                chief_log.copy_new()  # the run before ends with the chief's checkpoint
                self._rerun(stream, requeued)
            outcome = self._results()
            if outcome is not None and outcome.exit_code != 0:
                explained = self._explain_failure(outcome)
                if explained is None:  # the backend requeued the job: its tasks run again
                    continue
                outcome = explained
                self.cancel()
                if outcome.failed_rank not in (None, 0):
                    return outcome  # the chief's log after the stop is only its interruption
                break
            if outcome is not None:
                break
            state = self._ended_state()
            if state is not None:
                outcome = self._ended(state)
                break
            time.sleep(self.poll_seconds)
        chief_log.copy_new(final=True)
        return outcome

    def cancel(self) -> None:
        """Stop every task of the job (Ctrl-C calls it). Idempotent."""
        if not self._cancelled:
            self._cancelled = True
            self._stop()

    def _results(self, ended: bool = False) -> JobOutcome | None:
        """The outcome the tasks' results give: the task that failed first (`slurm.blame`: a
        task whose failure is its own before one that failed because of it; the CS when the
        tasks failed because it went away), its exit code (carried by `TaskFailed`) and the
        reason from its log; success once every task succeeded; None while neither, or while
        a failure waits (up to BLAME_WAIT_S, the job still running) for the one it follows."""
        results = [r if r is not None and r.written_ns >= self._run_since_ns else None
                   for r in (task_result(self.folder, self.job_id, rank) for rank in range(self.num_tasks))]
        failed = [r for r in results if r is not None and not r.succeeded]
        if not failed:
            return JobOutcome(0) if all(r is not None for r in results) else None
        if self._first_failure is None:
            self._first_failure = time.monotonic()
        waited_out = ended or time.monotonic() - self._first_failure > BLAME_WAIT_S
        verdict = blame(failed, read_failures(self.folder), self.num_tasks, waited_out)
        if verdict.waiting:
            return None
        first = min(failed, key=lambda r: (r.written_ns, r.rank))
        if verdict.cs:
            gone = self.cs_gone()
            if gone is not None:
                return JobOutcome(TaskFailed.exit_code_in(first.text), None, gone)
        rank = first.rank if verdict.rank is None else verdict.rank
        result = results[rank]
        code = TaskFailed.exit_code_in(result.text) if result is not None else 1
        return JobOutcome(code, rank, last_error_line(self.task_log(rank), code))

    def _ended(self, state: str) -> JobOutcome:
        """The outcome of a job the backend saw end (`state`) before the loop saw every result."""
        time.sleep(1.0)  # the last result may still be on its way
        return self._results(ended=True) or self._without_result(state)

    def _explain_failure(self, outcome: JobOutcome) -> JobOutcome | None:
        """What a task's failure (`outcome`) means for the job, before the job is stopped;
        None when it means nothing (the backend requeued the job)."""
        return outcome

    def _requeued(self) -> str | None:
        """A line saying so once the backend requeued the job since the last look (its
        tasks ended and will run again); None otherwise."""
        return None

    def _rerun(self, stream: TextIO, why: str) -> None:
        """The backend runs the job's tasks again (a requeue): the results of the run
        before are ignored from now on (its tasks have ended)."""
        self._run_since_ns = time.time_ns()
        self._first_failure = None
        print(why, file=stream, flush=True)

    @abc.abstractmethod
    def _ended_state(self) -> str | None:
        """The backend's state of the job once it ended, None while it runs."""

    @abc.abstractmethod
    def _without_result(self, state: str) -> JobOutcome:
        """The outcome of a job that ended (`state`) without every task's result."""

    @abc.abstractmethod
    def _stop(self) -> None:
        """Stop every task of the job."""


class LaunchBackend(abc.ABC):
    """A way to start a job's tasks (local processes, Slurm...)."""

    name: str

    @abc.abstractmethod
    def build(self, request: JobRequest) -> Submission:
        """Render the request exactly as `submit` would submit it; submits nothing.
        Raises CSRunError for a request this backend cannot run."""

    def warm_up(self, submission: Submission) -> None:
        """Start, ahead of `submit`, what lets the tasks start sooner, for a job the caller
        follows to its end (the local backend: its fork server). Default: nothing."""
        return None

    @abc.abstractmethod
    def submit(self, submission: Submission) -> LaunchedJob:
        """Start the job built by `build` (and warmed up, if it was)."""

    @classmethod
    def available(cls) -> bool:
        """Whether this machine offers the backend (Slurm: the controller answers)."""
        return True
