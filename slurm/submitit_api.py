"""Every use csrun makes of submitit beyond its public API, in one place.

submitit runs each task of a job through its task wrapper (`python -m submitit.core._submit
FOLDER`), which writes the task's log and its result pickle in the job folder. csrun relies
on these parts of submitit that it does not document as its API:

- `submitit.slurm.slurm._make_sbatch_string` renders the sbatch script (`sbatch_script`); its
  fixed `#SBATCH --time=5` line is replaced by the request's time, or dropped.
- `PicklingExecutor._make_submission_file_text` and `_num_tasks`, overridden by
  `ScriptExecutor` so that submitit submits a script rendered beforehand, as it is.
- `submitit.local.local.LocalJob._process`: the local controller process
  (`local_controller`), which csrun stops with SIGTERM before submitit's own SIGINT.
- The job folder's files (`JobPaths`) and a task's result pickle, `("success"|"error",
  value)` with the error's value the task's traceback text (`task_result`).
- Its lines in a task's log (`LOG_PREFIX`, `ERROR_MARKER`) and the local tasks' rank
  variables (`LOCAL_RANK_ENV`, `LOCAL_NTASKS_ENV`).

A submitit release that changes one of them raises `SubmititChanged` here, at its first use,
and fails tests/slurm/test_slurm_submitit_api.py, which checks each of them against the installed
submitit (the version pinned in constraints.txt).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

import submitit
from submitit.core import utils as submitit_utils
from submitit.local.local import LocalJob
from submitit.slurm.slurm import _make_sbatch_string

TASK_MODULE = "submitit.core._submit"  # the task wrapper every task runs
LOCAL_RANK_ENV = "SUBMITIT_LOCAL_GLOBALID"  # a local task's rank ...
LOCAL_NTASKS_ENV = "SUBMITIT_LOCAL_NTASKS"  # ... and the job's task count
LOG_PREFIX = "submitit "  # submitit's own lines in a task's log: `submitit INFO (date) - ...`
ERROR_MARKER = "\nsubmitit ERROR "  # its line before the traceback of a task that raised
_SUBMITIT_TIME = "#SBATCH --time=5\n"  # the time limit _make_sbatch_string always writes


class SubmititChanged(RuntimeError):
    """The installed submitit no longer behaves as this module expects."""

    def __init__(self, what: str):
        super().__init__(f"submitit {submitit.__version__} changed {what}; slurm/submitit_api.py "
                         "was written for the submitit pinned in constraints.txt")


def task_wrapper_command(python: str, folder: Path) -> str:
    """The command each task of a submitit job runs (submitit's `_submitit_command_str`)."""
    return f"{python} -u -m {TASK_MODULE} {shlex.quote(str(Path(folder).expanduser().absolute()))}"


def sbatch_script(folder: Path, python: str, job_name: str, setup: Iterable[str], srun_args: Iterable[str],
                  sbatch: Mapping[str, Any], additional: Mapping[str, Any], time: str | None) -> str:
    """submitit's sbatch script running its task wrapper through `srun` (task output to the task's log);
    `sbatch`: `_make_sbatch_string`'s own parameters, `additional`: any other `#SBATCH` flag;
    `time`: the time limit, None for the partition's default."""
    try:
        text = _make_sbatch_string(
            command=task_wrapper_command(python, folder), folder=folder, job_name=job_name,
            stderr_to_stdout=True, setup=list(setup), srun_args=list(srun_args),
            additional_parameters=dict(additional) or None, **sbatch)
    except TypeError as error:
        raise SubmititChanged(f"_make_sbatch_string's parameters ({error})") from None
    if _SUBMITIT_TIME not in text:
        raise SubmititChanged("_make_sbatch_string's time line (no `#SBATCH --time=5`)")
    return text.replace(_SUBMITIT_TIME, f"#SBATCH --time={shlex.quote(time)}\n" if time else "")


class ScriptExecutor(submitit.SlurmExecutor):
    """submitit's Slurm executor submitting a script rendered beforehand (`sbatch_script`), as it is."""

    def __init__(self, folder: Path, script: str, num_tasks: int):
        super().__init__(folder)
        self._script = script
        self._tasks = num_tasks

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        if command != task_wrapper_command(self.python, self.folder):
            raise SubmititChanged(f"the command its tasks run ({command!r}, not what task_wrapper_command writes)")
        return self._script

    def _num_tasks(self) -> int:
        return self._tasks


def submit_script(folder: Path, script: str, num_tasks: int, task: Callable[[], object]) -> submitit.Job:
    """Submit `script` (from `sbatch_script`) with sbatch; its `num_tasks` tasks each run `task`.
    Raises submitit's FailedJobError when sbatch refuses the job."""
    job = ScriptExecutor(folder, script, num_tasks).submit(task)
    submitted = task_paths(folder, job.job_id).submission_file
    if job.num_tasks != num_tasks or not submitted.exists() or submitted.read_text() != script:
        job.cancel(check=False)
        raise SubmititChanged("how an executor renders its submission file (_make_submission_file_text, "
                              f"_num_tasks): job {job.job_id} was not submitted as rendered, and is cancelled")
    return job


def submit_local(folder: Path, task: Callable[[], object], tasks_per_node: int, name: str,
                 timeout_min: int, detached: bool = False) -> submitit.Job:
    """Start `tasks_per_node` processes on this host, each running `task` (output to its log).
    `detached`: the controller's own standard streams go to `folder/controller.log`, not the
    launcher's (a `$(csrun_wse --detach …)` returns at once, not when the job ends)."""
    executor = submitit.LocalExecutor(folder=folder)
    executor.update_parameters(tasks_per_node=tasks_per_node, timeout_min=timeout_min, stderr_to_stdout=True,
                               name=name)
    # The controller (a Python started in the launcher's process group) ignores SIGINT: a
    # Ctrl-C at the terminal reaches the launcher, which stops the job; without this the
    # controller printed its own KeyboardInterrupt traceback. Tasks do not inherit it: their
    # wrapper handles SIGINT, and what it runs starts with the default.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    with _streams_to(folder / "controller.log" if detached else None):
        try:
            return executor.submit(task)
        finally:
            signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def _streams_to(log: Path | None) -> Iterator[None]:
    """While the controller starts (it inherits them): stdin from /dev/null, stdout and
    stderr to `log`; nothing when None."""
    if log is None:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(fd) for fd in (0, 1, 2)]
    try:
        with open(os.devnull, "rb") as null, open(log, "ab") as out:
            os.dup2(null.fileno(), 0)
            os.dup2(out.fileno(), 1)
            os.dup2(out.fileno(), 2)
        yield
    finally:
        for fd, copy in enumerate(saved):
            os.dup2(copy, fd)
            os.close(copy)


def local_controller(job: submitit.Job) -> subprocess.Popen | None:
    """A local job's controller process (None once it is forgotten): it forwards SIGTERM to
    every task, SIGINT interrupts them."""
    process = getattr(job, "_process", False)
    if not isinstance(job, LocalJob) or not (process is None or isinstance(process, subprocess.Popen)):
        raise SubmititChanged("LocalJob._process (the local controller process)")
    return process


def task_paths(folder: Path, job_id: str, rank: int = 0) -> submitit_utils.JobPaths:
    return submitit_utils.JobPaths(folder, job_id, rank)


def task_log(folder: Path, job_id: str, rank: int) -> Path:
    """The file holding task `rank`'s output (stdout and stderr)."""
    return task_paths(folder, job_id, rank).stdout


@dataclasses.dataclass(frozen=True)
class TaskResult:
    """What submitit's task wrapper wrote when task `rank` ended."""

    rank: int
    succeeded: bool
    text: str          # the task's return value, or the traceback of what it raised
    written_ns: int    # when (the result file's mtime)


def task_result(folder: Path, job_id: str, rank: int) -> TaskResult | None:
    """Task `rank`'s result, or None while it has none."""
    path = task_paths(folder, job_id, rank).result_pickle
    if not path.exists():
        return None
    try:
        result = submitit_utils.pickle_load(path)
        written = path.stat().st_mtime_ns
    except Exception:  # written but not complete yet
        return None
    if not (isinstance(result, tuple) and len(result) == 2 and result[0] in ("success", "error")):
        raise SubmititChanged(f"its result pickle ({type(result).__name__}, not ('success'|'error', value))")
    return TaskResult(rank, result[0] == "success", str(result[1]), written)
