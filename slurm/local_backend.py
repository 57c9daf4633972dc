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
from pathlib import Path
from typing import Callable, TextIO

import submitit

from common.errors import CSRunError
from slurm.backend import JobOutcome, JobRequest, LaunchBackend, LaunchedJob, Submission
from slurm.fork_server import PRELOAD, ForkServer, interpreter, script_of
from slurm.submitit_api import LOCAL_RANK_ENV, local_controller, submit_local
from slurm.task import TaskCommand

# The local executor kills tasks at its timeout: make it effectively unbounded (30 days).
_TIMEOUT_MIN = 30 * 24 * 60
# After one task fails, the others get this long to stop before they are killed.
_STOP_GRACE_S = 10.0


def render(request: JobRequest) -> str:
    """The local request as text: the environment and the command every task runs."""
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(request.env.items()))
    cmd = shlex.join(request.command)
    lines = [
        f"# local backend (submitit LocalExecutor): {request.num_tasks} task(s) on this host",
        f"# job folder: {request.folder}",
        f"# rank 0 is the chief, ranks 1.. are input workers ({LOCAL_RANK_ENV})",
        f"cd {shlex.quote(str(request.workdir))}",
    ]
    if script_of(request.command) is not None:
        lines.append(f"# followed to its end, each task starts as a fork of one {request.command[0]} that "
                     f"imported {', '.join(PRELOAD)} (slurm/fork_server.py)")
    for rank in range(request.num_tasks):
        lines.append(f"{LOCAL_RANK_ENV}={rank} {env} {cmd}".replace("  ", " "))
    return "\n".join(lines) + "\n"


class LocalBackend(LaunchBackend):
    name = "local"

    def __init__(self) -> None:
        self._servers: dict[Path, ForkServer] = {}  # by job folder, from warm_up to submit

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
        return Submission(request, self.name, render(request), task, request.num_tasks)

    def warm_up(self, submission: Submission) -> None:
        """Start the job's fork server (a `python SCRIPT.py` command only): it imports
        TensorFlow while the caller prepares the rest, and dies with this process."""
        request = submission.request
        env = {**os.environ, **request.env, "PYTHONUNBUFFERED": "1"}
        python = interpreter(request.command, env, str(request.workdir))
        if script_of(request.command) is None or python is None or request.folder in self._servers:
            return
        request.folder.mkdir(parents=True, exist_ok=True)
        self._servers[request.folder] = ForkServer(python, request.command, str(request.workdir), env,
                                                   submission.num_tasks, log=request.folder / "fork_server.log")

    def submit(self, submission: Submission) -> "LocalJob":
        request = submission.request
        request.folder.mkdir(parents=True, exist_ok=True)
        server = self._servers.pop(request.folder, None)
        task = submission.task if server is None else dataclasses.replace(submission.task, fork_server=server.address)
        try:
            job = submit_local(request.folder, task, request.tasks_per_node, request.name, _TIMEOUT_MIN,
                               request.detached)
        except BaseException:
            if server is not None:
                server.stop()
            raise
        return LocalJob(job, request.folder, submission.num_tasks, server)


class LocalJob(LaunchedJob):
    def __init__(self, job: submitit.Job, folder: Path, num_tasks: int, fork_server: ForkServer | None = None):
        super().__init__(job, folder, num_tasks)
        self._fork_server = fork_server

    def follow(self, stream: TextIO, on_poll: Callable[[], None] | None = None) -> JobOutcome:
        try:
            return super().follow(stream, on_poll)
        finally:
            self._stop_fork_server()

    def _stop_fork_server(self) -> None:
        if self._fork_server is not None:
            self._fork_server.stop()

    def _ended_state(self) -> str | None:
        state = self._job.state  # submitit's: RUNNING, then FINISHED or INTERRUPTED
        return None if state == "RUNNING" else state

    def _without_result(self, state: str) -> JobOutcome:
        return JobOutcome(1, None, "the job's tasks stopped without a result")

    def _stop(self) -> None:
        try:
            self._stop_tasks()
        finally:
            self._stop_fork_server()

    def _stop_tasks(self) -> None:
        process = local_controller(self._job)
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
