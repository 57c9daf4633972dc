"""Which launch backend a job gets here (as submitit's AutoExecutor picks an executor)."""
from __future__ import annotations

from slurm.backend import LaunchBackend
from slurm.local_backend import LocalBackend
from slurm.slurm_backend import SlurmBackend


def choose_backend() -> LaunchBackend:
    """The one place that decides: Slurm when `SlurmBackend.available()` (its controller
    answers), else local processes."""
    return SlurmBackend() if SlurmBackend.available() else LocalBackend()
