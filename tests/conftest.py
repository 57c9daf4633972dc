"""The one-host Slurm for tests marked `slurm`: started once per session by
`slurm/cluster/cluster.sh up` (which installs what is missing), stopped at the end if this
session started it. Without root or packages the tests skip; under CI (CI=true) the
cluster must come up, or they fail."""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CLUSTER_SH = ROOT / "slurm" / "cluster" / "cluster.sh"


@dataclass(frozen=True)
class SlurmCluster:
    """A running cluster; `env` reaches it (SLURM_CONF). Only tests using it see it."""

    env: dict[str, str]

    def run(self, argv: list[str], cwd: Path | None = None, timeout: float = 120, **env: str):
        return subprocess.run(argv, cwd=cwd, env={**self.env, **env}, capture_output=True, text=True,
                              timeout=timeout)

    def csrun_wse(self, args: list[str], cwd: Path, timeout: float = 120, **env: str):
        """Run `csrun_wse ARGS` against this cluster, to its end."""
        return self.run([sys.executable, "-m", "launcher.csrun_wse", *args], cwd, timeout, **env)

    def csrun_wse_process(self, args: list[str], cwd: Path) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "launcher.csrun_wse", *args], cwd=cwd, env=self.env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _cluster(command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(CLUSTER_SH), command], capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="session")
def slurm_cluster():
    conf = Path(os.environ.get("CSRUN_SLURM_DIR", "/tmp/csrun-slurm")) / "etc" / "slurm.conf"
    was_up = _cluster("status").returncode == 0
    if not was_up:
        if os.geteuid() != 0 and os.environ.get("CI") != "true":
            pytest.skip("the one-host Slurm needs root (make cluster-up)")
        up = _cluster("up")
        if up.returncode != 0:
            message = f"the one-host Slurm did not start: {up.stderr.strip()}"
            if os.environ.get("CI") == "true":
                pytest.fail(message)
            pytest.skip(message)
    yield SlurmCluster({**os.environ, "SLURM_CONF": str(conf), "PYTHONPATH": str(ROOT)})
    if not was_up:
        _cluster("down")


@pytest.fixture(scope="session")
def container_image() -> Path:
    """The Charliecloud image from containers/csrun.def (`make image`: built once, then
    reused while its stamp matches). Without root or network the tests skip; under CI
    (CI=true) the image must build, or they fail."""
    done = subprocess.run(["make", "-C", str(ROOT), "image", f"VENV={sys.prefix}"], capture_output=True,
                          text=True, timeout=1800)
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        message = f"the container image did not build: {lines[-1] if lines else 'make image failed'}"
        if os.environ.get("CI") == "true" or os.geteuid() == 0:
            pytest.fail(message)
        pytest.skip(message)
    return ROOT / ".cache" / "csrun-image"
