"""A task's place in its job: rank, number of tasks, the job's id, folder and CS system.

Every task of a CS job runs the same user command; the rank decides the role: rank 0 is
the chief, the others are input workers. The rank comes from, in order:

- `CSRUN_TASK_RANK` / `CSRUN_NUM_TASKS` (set by hand, e.g. to run a worker in a shell),
- submitit's local launcher (`SUBMITIT_LOCAL_GLOBALID` / `SUBMITIT_LOCAL_NTASKS`): it is
  more specific than Slurm's variables, which a local job started inside an allocation
  inherits,
- Slurm (`SLURM_PROCID` / `SLURM_NTASKS`),
- otherwise a job of one task (rank 0 of 1): `python run.py --cs_ip …` by hand.

The job's CS system reaches a task by one channel: `CSRUN_CS_IP`, which `csrun_wse` (and
its sbatch template) sets for every task, whatever the command; it is read here only, by
`run_cs_ip`, the one place that decides which CS a run uses (`launcher.run_config.the_cs`
normalises it for run.py, the original's helpers and `CSEstimator`); input workers take the
address from the chief's rendezvous.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from common import task_env
from common.errors import CSRunError, on_report
from common.task_failure import TaskFailure, write_failure

_SOURCES = (
    (task_env.TASK_RANK, task_env.NUM_TASKS, task_env.JOB_ID),
    ("SUBMITIT_LOCAL_GLOBALID", "SUBMITIT_LOCAL_NTASKS", "SUBMITIT_LOCAL_JOB_ID"),
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_ID"),
)
_RESTARTS = "SLURM_RESTART_COUNT"  # set by Slurm in a requeued job: its runs before this one


@dataclass(frozen=True)
class TaskRole:
    rank: int
    num_tasks: int
    job_id: str          # the launch's id: the rendezvous is keyed on it
    job_dir: Path | None  # the launcher's job folder (CSRUN_JOB_DIR), if any
    cs_wait_s: float = 0.0  # how long the chief waits for a CS busy with another job (task_env.CS_WAIT_S)
    restarts: int = 0  # how often Slurm requeued the job before this run (SLURM_RESTART_COUNT)

    @property
    def is_chief(self) -> bool:
        return self.rank == 0

    @property
    def num_workers(self) -> int:
        """Input streams: the tasks other than the chief, or one inside a lone chief."""
        return max(self.num_tasks - 1, 1)

    @property
    def worker_id(self) -> int:
        """This task's worker index (0-based); the lone chief's in-process worker is 0."""
        return max(self.rank - 1, 0)


def task_role(environ: dict[str, str] | None = None) -> TaskRole:
    env = os.environ if environ is None else environ
    job_dir = Path(env[task_env.JOB_DIR]) if env.get(task_env.JOB_DIR) else None
    cs_wait_s = float(env.get(task_env.CS_WAIT_S) or 0)
    restarts = int(env.get(_RESTARTS) or 0)
    for rank_key, count_key, job_key in _SOURCES:
        if env.get(rank_key, "") != "":
            rank, count = int(env[rank_key]), int(env.get(count_key) or 1)
            if not 0 <= rank < count:
                raise ValueError(f"{rank_key}={rank} is not below {count_key}={count}")
            job_id = env.get(task_env.JOB_ID) or env.get(job_key) or "local"
            return TaskRole(rank, count, job_id, job_dir, cs_wait_s, restarts)
    return TaskRole(0, 1, env.get(task_env.JOB_ID) or f"pid{os.getpid()}", job_dir, cs_wait_s)


def run_cs_ip(given: str | None = None, configured: str | None = None,
              environ: dict[str, str] | None = None) -> str | None:
    """The CS system a run uses: the one given for this run (run.py's `--cs_ip`,
    `CSRunConfig.cs_ip`), else the CS of the `csrun_wse` job this process is a task of
    (`CSRUN_CS_IP`), else the configured one (params.yaml's `runconfig.cs_ip`); None: the CPU."""
    env = os.environ if environ is None else environ
    return given or env.get(task_env.CS_IP) or configured or None


def record_failure(error: CSRunError) -> None:
    """As a task of a launcher's job reports its error: write its failure record (when it
    failed, and whether it was its own: `common.task_failure`) into the job folder."""
    role = task_role()
    if role.job_dir is None:
        return
    try:
        write_failure(role.job_dir, TaskFailure(role.rank, time.time_ns(), error.caused_by))
    except OSError:
        pass  # without it the launcher takes the failure for the task's own


on_report(record_failure)
