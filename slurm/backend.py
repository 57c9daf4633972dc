"""The launch-backend interface: how `csrun_wse` (and `csrun_cpu`) start a job's tasks.

One small interface, one module per backend (`local_backend.py`: submitit's local
executor; `slurm_backend.py`: submitit's Slurm executor). The CLIs build one `JobRequest`,
pick a backend once (`choose_backend()`, which asks each backend's `available()`) and never branch on "is this Slurm?" again.

The life of a job, in the order a CLI calls it:

1. `backend.build(request) -> Submission` renders the exact request the backend would
   submit (the sbatch script, or the local command line) without submitting anything.
2. `--dry-run`: print `submission.text` and stop. Dry run and submit share `build`, so the
   printed text is the submitted request, never a second rendering.
3. `backend.warm_up(submission)` (a job the CLI follows to its end) starts what lets the
   tasks start sooner, while the CLI prepares the rest (the embedded simulator);
   `backend.submit(submission) -> LaunchedJob` starts the job.
4. `job.follow(stream) -> JobOutcome` streams the chief's (rank 0) log to `stream` until
   the job ends; if any task fails it cancels the others (within 30 s) and returns the
   failing rank with the reason (last error line of that task's log).
5. `job.cancel()` stops every task (Ctrl-C calls it); safe to call twice.

Every task runs the same `request.command`; the role comes from the task's rank, which
the task reads from its environment (`SLURM_PROCID`, or submitit's job environment:
see `coordinator.dispatch.task_rank`). `request.env` is added to every task's environment
(e.g. `CSRUN_CS_IP` when the job uses an embedded simulator).
"""
from __future__ import annotations

import abc
import dataclasses
import re
from pathlib import Path
from typing import Mapping, TextIO


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

    @property
    def num_tasks(self) -> int:
        return self.total_nodes * self.tasks_per_node


@dataclasses.dataclass(frozen=True)
class Submission:
    """The rendered request: `text` is what --dry-run prints (an sbatch script, or the
    command lines of the local tasks); `payload` is whatever the backend's submit needs."""

    request: JobRequest
    backend: str
    text: str
    payload: object = None


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
    """A submitted job."""

    job_id: str
    folder: Path
    num_tasks: int

    @abc.abstractmethod
    def task_log(self, rank: int) -> Path:
        """The file holding task `rank`'s output (stdout and stderr)."""

    @abc.abstractmethod
    def follow(self, stream: TextIO, poll_seconds: float = 0.2) -> JobOutcome:
        """Copy the chief's log to `stream` as it grows until the job ends; stop every
        task as soon as one fails (within 30 s) and report which one and why."""

    @abc.abstractmethod
    def cancel(self) -> None:
        """Stop every task of the job. Idempotent."""


class LaunchBackend(abc.ABC):
    """A way to start a job's tasks (local processes, Slurm...)."""

    name: str

    @abc.abstractmethod
    def build(self, request: JobRequest) -> Submission:
        """Render the request exactly as `submit` would submit it; submits nothing.
        Raises launcher.errors.CSRunError for a request this backend cannot run."""

    def warm_up(self, submission: Submission) -> None:
        """Start, ahead of `submit`, what lets the tasks start sooner, for a job the caller
        follows to its end (the local backend: its fork server). Default: nothing."""

    @abc.abstractmethod
    def submit(self, submission: Submission) -> LaunchedJob:
        """Start the job built by `build` (and warmed up, if it was)."""

    @classmethod
    def available(cls) -> bool:
        """Whether this machine offers the backend (Slurm: the controller answers)."""
        return True

    def dry_run(self, request: JobRequest) -> str:
        """What `--dry-run` prints: the text of the very request `submit` would use."""
        return self.build(request).text


def slurm_answers(timeout_s: float = 5.0) -> bool:
    """Whether a Slurm controller answers here (`scontrol ping` succeeds)."""
    import shutil
    import subprocess

    if shutil.which("scontrol") is None:
        return False
    try:
        done = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and "UP" in done.stdout


def choose_backend() -> LaunchBackend:
    """The one place that decides: Slurm when `slurm.slurm_backend.SlurmBackend.available()`,
    else local processes."""
    from slurm.local_backend import LocalBackend

    try:
        from slurm.slurm_backend import SlurmBackend
    except ImportError:
        return LocalBackend()
    return SlurmBackend() if SlurmBackend.available() else LocalBackend()


def task_result(paths: "submitit_utils.JobPaths") -> tuple[str, object] | None:
    """A submitit task's result pickle ("success"/"error", value), or None while it has none."""
    from submitit.core import utils as submitit_utils

    if not paths.result_pickle.exists():
        return None
    try:
        return submitit_utils.pickle_load(paths.result_pickle)
    except Exception:  # written but not complete yet
        return None


def failed_task(folder: Path, job_id: str, num_tasks: int) -> JobOutcome | None:
    """The task of a submitit job that failed first (its result written first: the others may
    be failing only because the job is being stopped): its exit code (carried by
    `TaskFailed`) and the reason from its log."""
    from submitit.core.utils import JobPaths

    failures = []
    for rank in range(num_tasks):
        paths = JobPaths(folder, job_id, rank)
        result = task_result(paths)
        if result is not None and result[0] == "error":
            failures.append((paths.result_pickle.stat().st_mtime_ns, rank, paths, str(result[1])))
    if not failures:
        return None
    _, rank, paths, text = min(failures)
    marker = "TaskFailed: exit code "
    code = int(text.split(marker)[-1].split()[0]) if marker in text else 1
    return JobOutcome(code or 1, rank, last_error_line(paths.stdout, code or 1))


# Every task's first line: where it runs. `where_task_runs` writes it, `task_hosts` reads it
# back (a failed node's tasks; the tests' placement checks).
_WHERE = re.compile(r"^csrun: task (\d+) of \d+ on (\S+) \((\S+) to the CS system at (\S+)\)$", re.M)


def where_task_runs(env: Mapping[str, str]) -> str:
    """`csrun: task R of N on NODE (ADDRESS to the CS system at CS_IP)`: the task's rank, its
    host (Slurm's node name, else the host name) and the address it reaches the CS from."""
    import socket

    rank = env.get("SLURM_PROCID") or env.get("SUBMITIT_LOCAL_GLOBALID") or "0"
    ntasks = env.get("SLURM_NTASKS") or env.get("SUBMITIT_LOCAL_NTASKS") or "1"
    node = env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    cs_ip = env.get("CSRUN_CS_IP") or "none"
    address = "-"
    host, _, port = cs_ip.rpartition(":")
    if host and port.isdigit():
        try:  # the source address the kernel picks for the CS: nothing is sent
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect((host, int(port)))
                address = probe.getsockname()[0]
        except OSError:
            address = "no-route"
    return f"csrun: task {rank} of {ntasks} on {node} ({address} to the CS system at {cs_ip})"


def task_hosts(log: Path) -> tuple[str, str] | None:
    """(node, address) from a task's log (its `where_task_runs` line), None before it ran."""
    try:
        with open(log, errors="replace") as f:
            head = f.read(4096)
    except OSError:
        return None
    match = _WHERE.search(head)
    return (match.group(2), match.group(3)) if match else None


def all_succeeded(folder: Path, job_id: str, num_tasks: int) -> bool:
    from submitit.core.utils import JobPaths

    results = [task_result(JobPaths(folder, job_id, rank)) for rank in range(num_tasks)]
    return all(r is not None and r[0] == "success" for r in results)


# TensorFlow's C++ start-up lines (absl INFO lines such as "oneDNN custom operations are
# on"): TF_CPP_MIN_LOG_LEVEL does not reach them. Kept in the task logs, not in the terminal.
TF_STARTUP_CHATTER = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|I\d{4} \d\d:\d\d:[\d.]+ +\d+ \S+\.cc:\d+\] )")


def copy_new(path: Path, offset: int, stream: TextIO) -> int:
    """Copy what was appended to `path` since `offset` to `stream`, submitit's own
    bookkeeping lines (and the traceback of its task wrapper that follows them), the task's
    placement line (`where_task_runs`) and TensorFlow's start-up chatter left out; the new offset."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return offset
    if data:
        text = data.decode(errors="replace")
        after = ""  # "submitit": after submitit's lines; "traceback": inside its traceback
        for line in text.splitlines(keepends=True):
            if line.startswith("submitit "):
                after = "submitit"
            elif after and line.startswith(("Traceback (most recent call last):", " ")):
                after = "traceback"
            elif after == "traceback":  # the exception line that ends it
                after = ""
            else:
                after = ""
                if not TF_STARTUP_CHATTER.match(line) and not _WHERE.match(line):
                    stream.write(line)
        stream.flush()
    return offset + len(data)


def last_error_line(log: Path, exit_code: int = 1) -> str:
    """The reason a task failed, from its own output in its log (submitit's lines and its
    wrapper's traceback left out): the signal that killed it, else its last `error:` line,
    else its last traceback's exception line (type and message), else its exit code."""
    import signal

    if exit_code > 128:
        try:
            return f"killed by {signal.Signals(exit_code - 128).name} (exit code {exit_code})"
        except ValueError:
            pass
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return f"exit code {exit_code}; no log"
    own = text.split("\nsubmitit ERROR ", 1)[0].splitlines()  # then submitit's own traceback
    lines = [ln.rstrip() for ln in own if ln.strip() and not ln.startswith("submitit ")]
    for line in reversed(lines):
        if ": error: " in line:
            return line.strip()
    if any(ln.startswith("Traceback (most recent call last):") for ln in lines):
        for line in reversed(lines):
            if not line.startswith((" ", "\t", "Traceback", "During handling", "The above exception")):
                return line
    return f"exit code {exit_code}"
