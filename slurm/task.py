"""What every task of a job runs, on either backend: the user's command, under submitit's
task wrapper, which carries a failure back to the launcher as `TaskFailed`.

Requeue (Slurm): Slurm's `--signal=USR2@90` (submitit's, before a time limit; `scancel -s
USR2`) reaches every process of the job. The command starts with SIGUSR2 ignored (an input
worker must not die of it; the chief handles it: `coordinator.stop_request`). On rank 0
submitit's wrapper then calls `TaskCommand.checkpoint`: the command is stopped with SIGTERM
and waited for (the chief writes a checkpoint at the step it reached, then stops), and with
`requeue` the same task is handed back, which submitit requeues (`scontrol requeue`); the
requeued job resumes from that checkpoint."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from submitit.helpers import DelayedSubmission

from slurm.fork_server import ForkedTask, request_fork
from slurm.heartbeat import HEARTBEAT_ENV, HEARTBEAT_TIMEOUT_S, watch_heartbeat
from slurm.task_logs import command_started, where_task_runs

_EXIT_CODE = "TaskFailed: exit code "  # how a TaskFailed ends the traceback in a task's result
REQUEUE_STOP_S = 60.0  # how long the requeue hook waits for the chief to checkpoint and stop
_running: list[subprocess.Popen | ForkedTask] = []  # the command this task runs (for `checkpoint`)


class TaskFailed(Exception):
    """A task's command exited non-zero (carried back to the launcher by submitit)."""

    def __init__(self, exit_code: int):
        super().__init__(f"exit code {exit_code}")
        self.exit_code = exit_code

    @staticmethod
    def exit_code_in(traceback_text: str) -> int:
        """The exit code a task's result (the traceback of what it raised) carries; 1 for
        anything but a TaskFailed."""
        if _EXIT_CODE not in traceback_text:
            return 1
        return int(traceback_text.split(_EXIT_CODE)[-1].split()[0]) or 1


@dataclass(frozen=True)
class TaskCommand:
    """What every task runs: the user's command, its output going to the task's log
    (submitit redirects this process's stdout/stderr there), forked by the job's fork server
    when there is one and it takes the command. Picklable for submitit."""

    command: tuple[str, ...]
    workdir: str
    env: tuple[tuple[str, str], ...]
    fork_server: str | None = None  # the socket address of the job's `slurm.fork_server.ForkServer`
    requeue: bool = False  # requeue the job when Slurm signals it (`checkpoint`)

    def _start(self, env: dict[str, str]) -> subprocess.Popen | ForkedTask:
        """The command in a session of its own, so that stopping the task stops everything
        it started."""
        forked = request_fork(self.fork_server, self.command, self.workdir, env) if self.fork_server else None
        return forked or subprocess.Popen(list(self.command), cwd=self.workdir, env=env, start_new_session=True,
                                          preexec_fn=_ignore_usr2)

    def checkpoint(self) -> DelayedSubmission | None:
        """submitit's hook on rank 0 when Slurm signals the job (SIGUSR2): stop the command
        (the chief checkpoints at the step it reached) and wait for it, up to
        REQUEUE_STOP_S; then this task again for submitit to requeue, or None (no requeue:
        the job ends) without `requeue`."""
        if _running:
            process = _running[0]
            print(f"csrun: Slurm signalled the job: stopping the command for a checkpoint"
                  f"{' and a requeue' if self.requeue else ''}", flush=True)
            _signal_group(process, signal.SIGTERM)
            deadline = time.monotonic() + REQUEUE_STOP_S
            while not _exited(process.pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            _signal_group(process, signal.SIGKILL)
        return DelayedSubmission(self) if self.requeue else None

    def __call__(self) -> int:
        env = {**os.environ, **dict(self.env), "PYTHONUNBUFFERED": "1"}
        where = where_task_runs(env)
        print(where, flush=True)
        started: list[subprocess.Popen | ForkedTask] = []
        early: list[int] = []  # a stop that came while the command was starting

        def forward(signum, _frame):
            if started:
                _signal_group(started[0], signum)
            else:
                early.append(signum)

        # before the command starts: submitit's own handler would swallow a SIGTERM
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, forward)
        process = self._start(env)
        started.append(process)
        _running[:] = [process]
        for signum in early:
            _signal_group(process, signum)
        # one write: the command already writes to the same log, and a line printed in two
        # writes (text, then its newline) could take the command's first line into it
        sys.stdout.write(command_started(where.split()[2], process.pid) + "\n")
        sys.stdout.flush()
        if env.get(HEARTBEAT_ENV):
            watch_heartbeat(Path(env[HEARTBEAT_ENV]), lambda: _launcher_died(process))
        try:
            code = _wait(process)
        finally:
            _signal_group(process, signal.SIGKILL)  # leftovers of the command (its children)
        if code != 0:
            raise TaskFailed(code if code > 0 else 128 - code)
        return code


def _wait(process: subprocess.Popen | ForkedTask) -> int:
    """The command's exit code, waited for in short slices: a stop signal that the kernel
    hands to another thread of this process (submitit's, a heartbeat's) runs its Python
    handler only when the main thread wakes, which a plain blocking wait never does."""
    while True:
        try:
            return process.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            continue


def _exited(pid: int) -> bool:
    """Whether the process ended (a zombie, or gone): read from /proc, not by waiting for
    it, which the wait this hook interrupted may hold."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def _ignore_usr2() -> None:
    """In the command's process before it runs: SIGUSR2 ignored (inherited across exec)."""
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


def _launcher_died(process: subprocess.Popen | ForkedTask) -> None:
    """The launcher following the job stopped beating: stop the command (SIGTERM, then
    SIGKILL), so the task ends and with it the job."""
    print(f"csrun: error: the launcher (csrun_wse) of this job died: its heartbeat stopped for "
          f"{HEARTBEAT_TIMEOUT_S:.0f} s; stopping the task", file=sys.stderr, flush=True)
    _signal_group(process, signal.SIGTERM)
    time.sleep(10)  # the task ends as soon as the command does; this thread with it
    _signal_group(process, signal.SIGKILL)


def _signal_group(process: subprocess.Popen | ForkedTask, signum: int) -> None:
    try:
        os.killpg(process.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass
