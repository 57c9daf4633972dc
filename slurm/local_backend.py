"""The local launch backend: a job's tasks as processes on this host, through submitit's
LocalExecutor (used when there is no Slurm)."""
from __future__ import annotations

import shlex
import signal
import subprocess

from common.errors import CSRunError
from slurm.backend import JobOutcome, JobRequest, LaunchBackend, LaunchedJob, Submission
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
    for rank in range(request.num_tasks):
        lines.append(f"{LOCAL_RANK_ENV}={rank} {env} {cmd}".replace("  ", " "))
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
        return Submission(request, self.name, render(request), task, request.num_tasks)

    def submit(self, submission: Submission) -> "LocalJob":
        request = submission.request
        request.folder.mkdir(parents=True, exist_ok=True)
        job = submit_local(request.folder, submission.task, request.tasks_per_node, request.name, _TIMEOUT_MIN)
        return LocalJob(job, request.folder, submission.num_tasks)


class LocalJob(LaunchedJob):
    def _ended_state(self) -> str | None:
        state = self._job.state  # submitit's: RUNNING, then FINISHED or INTERRUPTED
        return None if state == "RUNNING" else state

    def _without_result(self, state: str) -> JobOutcome:
        return JobOutcome(1, None, "the job's tasks stopped without a result")

    def _stop(self) -> None:
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
