"""The local launch backend: a job's tasks as processes on this host, through submitit's
LocalExecutor (used when there is no Slurm). When the job runs `python SCRIPT.py …` and the
launcher follows it to its end, the tasks start as forks of one Python that imported
TensorFlow once (`slurm.fork_server`), started by `warm_up` ahead of the job."""
from __future__ import annotations

import dataclasses
import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import submitit
from submitit.core import utils as submitit_utils

from launcher.errors import CSRunError
from slurm.backend import (JobOutcome, JobRequest, LaunchBackend, LaunchedJob, Submission, all_succeeded,
                           copy_new, failed_task, where_task_runs)
from slurm.fork_server import PRELOAD, ForkedTask, ForkServer, interpreter, request_fork, script_of

# The local executor kills tasks at its timeout: make it effectively unbounded (30 days).
_TIMEOUT_MIN = 30 * 24 * 60
# After one task fails, the others get this long to stop before they are killed.
_STOP_GRACE_S = 10.0


class TaskFailed(Exception):
    """A task's command exited non-zero (carried back to the launcher by submitit)."""

    def __init__(self, exit_code: int):
        super().__init__(f"exit code {exit_code}")
        self.exit_code = exit_code


@dataclass(frozen=True)
class TaskCommand:
    """What every local task runs: the user's command, its output going to the task's log
    (submitit redirects this process's stdout/stderr there), forked by the job's fork server
    when there is one and it takes the command. Picklable for submitit."""

    command: tuple[str, ...]
    workdir: str
    env: tuple[tuple[str, str], ...]
    fork_server: str | None = None  # the socket of the job's `ForkServer`

    def _start(self, env: dict[str, str]) -> subprocess.Popen | ForkedTask:
        """The command in a session of its own, so that stopping the task stops everything
        it started."""
        forked = request_fork(self.fork_server, self.command, self.workdir, env) if self.fork_server else None
        return forked or subprocess.Popen(list(self.command), cwd=self.workdir, env=env, start_new_session=True)

    def __call__(self) -> int:
        env = {**os.environ, **dict(self.env), "PYTHONUNBUFFERED": "1"}
        print(where_task_runs(env), flush=True)
        process = self._start(env)

        def forward(signum, _frame):
            _signal_group(process, signum)

        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, forward)
        try:
            code = process.wait()
        finally:
            _signal_group(process, signal.SIGKILL)  # leftovers of the command (its children)
        if code != 0:
            raise TaskFailed(code if code > 0 else 128 - code)
        return code


def _signal_group(process: subprocess.Popen | ForkedTask, signum: int) -> None:
    try:
        os.killpg(process.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass

def render(request: JobRequest) -> str:
    """The local request as text: the environment and the command every task runs."""
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(request.env.items()))
    cmd = shlex.join(request.command)
    lines = [
        f"# local backend (submitit LocalExecutor): {request.num_tasks} task(s) on this host",
        f"# job folder: {request.folder}",
        "# rank 0 is the chief, ranks 1.. are input workers (SUBMITIT_LOCAL_GLOBALID)",
        f"cd {shlex.quote(str(request.workdir))}",
    ]
    if script_of(request.command) is not None:
        lines.append(f"# followed to its end, each task starts as a fork of one {request.command[0]} that "
                     f"imported {', '.join(PRELOAD)} (slurm/fork_server.py)")
    for rank in range(request.num_tasks):
        lines.append(f"SUBMITIT_LOCAL_GLOBALID={rank} {env} {cmd}".replace("  ", " "))
    return "\n".join(lines) + "\n"


class LocalBackend(LaunchBackend):
    name = "local"

    def build(self, request: JobRequest) -> Submission:
        if request.total_nodes != 1:
            raise CSRunError(
                f"--total-nodes {request.total_nodes}: without Slurm the job runs on this host only",
                "use --total-nodes 1, or run csrun_wse where Slurm answers",
            )
        if request.tasks_per_node < 1:
            raise CSRunError(f"--tasks-per-node {request.tasks_per_node}: a job needs at least one task")
        if request.options:
            raise CSRunError(
                f"the local backend does not take {', '.join('--' + k.replace('_', '-') for k in sorted(request.options))}",
                "these settings only apply to Slurm",
            )
        task = TaskCommand(tuple(request.command), str(request.workdir), tuple(sorted(request.env.items())))
        return Submission(request=request, backend=self.name, text=render(request), payload=task)

    def __init__(self) -> None:
        self._servers: dict[Path, ForkServer] = {}  # by job folder, from warm_up to submit

    def warm_up(self, submission: Submission) -> None:
        """Start the job's fork server (a `python SCRIPT.py` command only): it imports
        TensorFlow while the caller prepares the rest, and dies with this process."""
        request = submission.request
        env = {**os.environ, **request.env, "PYTHONUNBUFFERED": "1"}
        python = interpreter(request.command, env, str(request.workdir))
        if script_of(request.command) is None or python is None or request.folder in self._servers:
            return
        request.folder.mkdir(parents=True, exist_ok=True)
        self._servers[request.folder] = ForkServer(python, request.command, str(request.workdir), env, request.num_tasks,
                                                   log=request.folder / "fork_server.log")

    def submit(self, submission: Submission) -> "LocalJob":
        request = submission.request
        request.folder.mkdir(parents=True, exist_ok=True)
        server = self._servers.pop(request.folder, None)
        task = submission.payload if server is None else dataclasses.replace(submission.payload,
                                                                             fork_server=server.path)
        executor = submitit.LocalExecutor(folder=request.folder)
        executor.update_parameters(
            tasks_per_node=request.tasks_per_node,
            timeout_min=_TIMEOUT_MIN,
            stderr_to_stdout=True,
            name=request.name,
        )
        try:
            job = executor.submit(task)
        except BaseException:
            if server is not None:
                server.stop()
            raise
        return LocalJob(job, request.folder, request.num_tasks, server)


class LocalJob(LaunchedJob):
    def __init__(self, job: submitit.local.local.LocalJob, folder: Path, num_tasks: int,
                 fork_server: ForkServer | None = None):
        self._job = job
        self.job_id = str(job.job_id)
        self.folder = folder
        self.num_tasks = num_tasks
        self._cancelled = False
        self._fork_server = fork_server

    def task_log(self, rank: int) -> Path:
        return submitit_utils.JobPaths(self.folder, self.job_id, rank).stdout

    def _failure(self) -> JobOutcome | None:
        return failed_task(self.folder, self.job_id, self.num_tasks)

    def follow(self, stream: TextIO, poll_seconds: float = 0.2) -> JobOutcome:
        log = self.task_log(0)
        offset = 0
        outcome: JobOutcome | None = None
        while outcome is None:
            offset = copy_new(log, offset, stream)
            outcome = self._failure()
            if outcome is not None:
                self.cancel()
                if outcome.failed_rank != 0:
                    return outcome  # the chief's log after the stop is only its interruption
                break
            if all_succeeded(self.folder, self.job_id, self.num_tasks):
                outcome = JobOutcome(0)
                break
            if self._job.state != "RUNNING":
                time.sleep(1.0)  # the last result may still be on its way
                outcome = self._failure() or (
                    JobOutcome(0) if all_succeeded(self.folder, self.job_id, self.num_tasks)
                    else JobOutcome(1, None, "the job's tasks stopped without a result")
                )
                break
            time.sleep(poll_seconds)
        copy_new(log, offset, stream)
        self._stop_fork_server()
        return outcome

    def _stop_fork_server(self) -> None:
        if self._fork_server is not None:
            self._fork_server.stop()

    def cancel(self) -> None:
        if self._cancelled:
            return
        self._cancelled = True
        try:
            self._cancel_tasks()
        finally:
            self._stop_fork_server()

    def _cancel_tasks(self) -> None:
        process = self._job._process
        if process is None or process.poll() is not None:
            return
        # SIGTERM: the controller forwards it to every task, each task to its command.
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(_STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self._job.cancel(check=False)  # SIGINT: the controller interrupts, then kills, every task
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
