"""The registry of the jobs `csrun_wse` starts: what `csrun_job` reads, in one place.

A job's folder (`csrun_wse --job-dir`, default `./csrun_jobs/<time>-<id>/`) holds, beside
submitit's task logs and results:

- `job.json` (`JobRecord`): written by `csrun_wse` once the backend took the job: its id
  (the Slurm job id, or the local controller's pid: what `csrun_wse` prints), backend,
  command, tasks, CS, and the launcher's pid while it follows the job (None: `--detach`);
- `progress.json` (`Progress`): written by the chief as it trains (`ProgressFile`): step,
  end step, loss, samples/s (wall clock and simulated), the newest checkpoint;
- `job_end.json`: how the job ended, written by the launcher that followed it, or by
  `csrun_job cancel`;
- `launcher.heartbeat` (`slurm.heartbeat`): an attached launcher's sign of life.

Each user's index (`$CSRUN_STATE_DIR/jobs`, default `~/.local/state/csrun/jobs`) links every
id to its folder, so `csrun_job` finds a job from any directory. A job's state comes from the
end record, else the backend (Slurm's controller and accounting; a local job's controller
process), else the tasks' results.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pwd
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

from common.errors import CSRunError
from common.task_failure import read_failures
from slurm import slurm_backend
from slurm.blame import blame
from slurm.submitit_api import task_log, task_result
from slurm.task import TaskFailed
from slurm.task_logs import last_error_line

RECORD = "job.json"
END = "job_end.json"
PROGRESS = "progress.json"
STATE_DIR_ENV = "CSRUN_STATE_DIR"
_ACTIVE = ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "REQUEUED", "RESIZING", "SUSPENDED")


def _write_json(path: Path, value: dict[str, Any]) -> None:
    """Write atomically: a reader sees the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    tmp.write_text(json.dumps(value, indent=1) + "\n")
    os.replace(tmp, path)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def index_dir() -> Path:
    base = os.environ.get(STATE_DIR_ENV) or os.path.join(
        os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state"), "csrun")
    return Path(base) / "jobs"


@dataclasses.dataclass(frozen=True)
class JobRecord:
    """What `csrun_wse` knows of a job it submitted (`job.json`)."""

    job_id: str
    backend: str
    folder: str
    workdir: str
    command: tuple[str, ...]
    num_tasks: int
    cs_ip: str
    embedded: bool         # the CS is an embedded simulator the launcher runs
    host: str              # where the launcher runs
    started: float         # time.time() at submission
    launcher_pid: int | None = None  # None: --detach

    @property
    def path(self) -> Path:
        return Path(self.folder)

    def task_log(self, rank: int) -> Path:
        return task_log(self.path, self.job_id, rank)

    @staticmethod
    def read(folder: Path) -> "JobRecord | None":
        value = _read_json(folder / RECORD)
        if value is None:
            return None
        try:
            value["command"] = tuple(value["command"])
            return JobRecord(**value)
        except TypeError:
            return None


def register(record: JobRecord) -> str | None:
    """Write the job's record and link its id in this user's index; why not (a folder that
    cannot be written: the job runs on, unregistered), else None."""
    try:
        _write_json(record.path / RECORD, dataclasses.asdict(record))
        index = index_dir()
        index.mkdir(parents=True, exist_ok=True)
        link = index / record.job_id
        tmp = index / f".{record.job_id}.tmp-{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(record.path)
        os.replace(tmp, link)  # a local id (a pid) used again names the newer job
    except OSError as error:
        return f"{error.filename}: {error.strerror}"
    return None


def record_end(folder: Path, exit_code: int, how: str) -> None:
    """How the job ended (the launcher that followed it, or `csrun_job cancel`); a job
    folder that is gone or full loses only this record."""
    try:
        _write_json(folder / END, {"exit_code": exit_code, "how": how, "ended": time.time()})
    except OSError:
        pass


def owner(folder: Path) -> str:
    uid = (folder / RECORD).stat().st_uid
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def find(job_id: str) -> JobRecord:
    """The job `job_id` names (an id from this user's index, or a job folder), or one line
    saying why there is none: unknown, another user's, not a csrun job."""
    link = index_dir() / job_id
    folder = link if link.is_symlink() else Path(job_id)
    if not (folder / RECORD).is_file():
        if link.is_symlink():
            raise CSRunError(f"job {job_id}: its folder {os.readlink(link)} is gone",
                             "csrun_job list shows the jobs whose folders remain")
        raise CSRunError(f"no job {job_id} of yours{_whose(job_id)}",
                         "csrun_job list shows your jobs (the id csrun_wse printed, or a job folder)")
    if (folder / RECORD).stat().st_uid != os.getuid():
        raise CSRunError(f"job {job_id} is user {owner(folder)}'s, not yours",
                         "csrun_job acts on your own jobs only")
    record = JobRecord.read(folder)
    if record is None:
        raise CSRunError(f"job {job_id}: its record {folder / RECORD} cannot be read",
                         "the folder was not written by this csrun_wse")
    return record


def _whose(job_id: str) -> str:
    """What Slurm knows of an id that is not in the index (another user's job)."""
    if not job_id.isdigit() or not slurm_backend.slurm_answers(2.0):
        return ""
    fields = slurm_backend.job_fields(job_id)
    if fields is None:
        return ""
    user = fields.get("UserId", "").split("(")[0]
    mine = pwd.getpwuid(os.getuid()).pw_name
    return f": Slurm job {job_id} is user {user}'s" if user and user != mine else \
        f": Slurm job {job_id} was not started by csrun_wse"


def all_jobs() -> list[JobRecord]:
    """This user's jobs whose folders remain, newest first."""
    index = index_dir()
    records = [JobRecord.read(link) for link in index.iterdir() if link.is_symlink()] if index.is_dir() else []
    return sorted((r for r in records if r is not None), key=lambda r: r.started, reverse=True)


# --- the chief's progress -----------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Progress:
    """Where a training run is (`progress.json`)."""

    step: int
    start_step: int
    end_step: int
    batch_size: int
    loss: float
    samples_per_sec: float       # wall clock, since the run's first step
    sim_samples_per_sec: float   # the simulated CS system's
    checkpoint: str              # the newest checkpoint written ("" before the first)
    started: float               # time.time() of the run's start
    updated: float
    finished: bool = False
    starvation: str = ""         # at the end: how the CS waited for input, "" when it kept up

    @property
    def eta_s(self) -> float | None:
        """Seconds to the end step at the wall-clock rate so far (None when unknown)."""
        if self.finished or self.samples_per_sec <= 0:
            return None
        return (self.end_step - self.step) * self.batch_size / self.samples_per_sec

    @staticmethod
    def read(folder: Path) -> "Progress | None":
        value = _read_json(folder / PROGRESS)
        try:
            return Progress(**value) if value is not None else None
        except TypeError:
            return None


class ProgressFile:
    """The chief's writer of `progress.json` in its job folder: at most once a second as the
    steps come, and at every checkpoint and at the end."""

    def __init__(self, folder: Path, start_step: int, end_step: int, batch_size: int):
        self.path = folder / PROGRESS
        self._start = time.time()
        self._base = Progress(start_step, start_step, end_step, batch_size, float("nan"), 0.0, 0.0, "",
                              self._start, self._start)
        self._current = self._base
        self._written = 0.0

    def step(self, step: int, loss: float, sim_samples_per_sec: float) -> None:
        now = time.time()
        samples = (step - self._base.start_step) * self._base.batch_size
        self._current = dataclasses.replace(self._current, step=step, loss=loss, updated=now,
                                            samples_per_sec=samples / max(now - self._start, 1e-9),
                                            sim_samples_per_sec=sim_samples_per_sec)
        if now - self._written >= 1.0:
            self._write()

    def saved(self, checkpoint: str) -> None:
        self._current = dataclasses.replace(self._current, checkpoint=checkpoint)
        self._write()

    def finished(self, starvation: str = "") -> None:
        self._current = dataclasses.replace(self._current, finished=True, starvation=starvation)
        self._write()

    def _write(self) -> None:
        self._written = time.time()
        try:
            _write_json(self.path, dataclasses.asdict(self._current))
        except OSError:  # a job folder gone or full costs the status, never the run
            pass


# --- a job's state, and stopping it ----------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class JobState:
    state: str          # PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, ...
    detail: str = ""    # Slurm's reason while queued; how it failed

    @property
    def ended(self) -> bool:
        return self.state not in _ACTIVE

    def __str__(self) -> str:
        return f"{self.state} ({self.detail})" if self.detail else self.state


def _local_controller_alive(record: JobRecord) -> bool:
    """Whether the local job's controller (pid = its id) still runs this job."""
    try:
        cmdline = Path(f"/proc/{int(record.job_id)}/cmdline").read_bytes()
    except (OSError, ValueError):
        return False
    return record.folder.encode() in cmdline


def _from_results(record: JobRecord) -> JobState | None:
    results = [task_result(record.path, record.job_id, rank) for rank in range(record.num_tasks)]
    failed = [r for r in results if r is not None and not r.succeeded]
    if failed:  # named as the launcher names it (`slurm.blame`), the job being over
        verdict = blame(failed, read_failures(record.path), record.num_tasks, True)
        if verdict.cs:
            return JobState("FAILED", f"its tasks lost the CS system at {record.cs_ip}")
        first = min(failed, key=lambda r: (r.written_ns, r.rank))
        rank = first.rank if verdict.rank is None else verdict.rank
        result = next((r for r in failed if r.rank == rank), None)
        code = TaskFailed.exit_code_in(result.text) if result is not None else 1
        return JobState("FAILED", f"task {rank}: {last_error_line(record.task_log(rank), code)}")
    return JobState("COMPLETED") if results and all(r is not None for r in results) else None


def job_state(record: JobRecord) -> JobState:
    end = _read_json(record.path / END)
    if end is not None:
        code = int(end.get("exit_code", 1))
        how = str(end.get("how", ""))
        return JobState("COMPLETED" if code == 0 else "CANCELLED" if "cancelled" in how else "FAILED",
                        how if code != 0 else "")
    if record.backend == "slurm":
        try:
            state, reason = slurm_backend.job_state(record.job_id)
        except OSError:  # no Slurm commands here: what the tasks left says the rest
            state, reason = "UNKNOWN", ""
        if state in _ACTIVE:
            return JobState(state, reason if state == "PENDING" and reason not in ("", "None") else "")
        if state in ("CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY", "DEADLINE"):
            return JobState(state)
        return _from_results(record) or JobState(state)
    if _local_controller_alive(record):
        return JobState("RUNNING")
    return _from_results(record) or JobState("FAILED", "its processes ended without a result (killed)")


def requeues(record: JobRecord) -> int:
    """How often Slurm requeued the job (its `Restarts`, while the controller knows the job)."""
    if record.backend != "slurm":
        return 0
    try:
        fields = slurm_backend.job_fields(record.job_id) or {}
    except OSError:  # no Slurm commands here
        return 0
    return int(fields.get("Restarts", "0") or 0)


def launcher_alive(record: JobRecord) -> bool:
    """Whether the csrun_wse that follows the job still runs (on this host)."""
    if record.launcher_pid is None or record.host != socket.gethostname():
        return False
    try:
        cmdline = Path(f"/proc/{record.launcher_pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"csrun_wse" in cmdline


def cancel(record: JobRecord, timeout_s: float = 10.0) -> JobState:
    """Stop every task of the job (and the embedded CS): through its launcher when one
    follows it here (it stops the tasks and the simulator as Ctrl-C does), else through the
    backend (scancel; SIGTERM to the local controller, which forwards it to every task)."""
    if launcher_alive(record):
        os.kill(int(record.launcher_pid or 0), signal.SIGTERM)
    elif record.backend == "slurm":
        slurm_backend.scancel(record.job_id)
    elif _local_controller_alive(record):
        os.kill(int(record.job_id), signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and (launcher_alive(record) or not _stopped(record)):
        time.sleep(0.2)
    if not _stopped(record) and record.backend == "local" and _local_controller_alive(record):
        os.kill(int(record.job_id), signal.SIGKILL)
    if not (record.path / END).exists():
        record_end(record.path, 143, "cancelled (csrun_job cancel)")
    return job_state(record)


def _stopped(record: JobRecord) -> bool:
    if record.backend == "slurm":
        return slurm_backend.job_state(record.job_id)[0] not in _ACTIVE
    return not _local_controller_alive(record)
