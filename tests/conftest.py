"""The shared fixtures: `server`, a CS system serving on a local port in this process, and
the Slurm clusters of the tests, each started once per session by `slurm/cluster/cluster.sh
up` (which installs what is missing) and stopped at the end if this session started it:
- `slurm_cluster` (tests marked `slurm`): the one-host Slurm on loopback;
- `multinode_cluster` (tests marked `multinode`): three Slurm hosts and the CS system's host,
  network namespaces on a bridge, in its own folder and ports ($CSRUN_MULTINODE_DIR, default
  /tmp/csrun-slurm-multinode; port base $CSRUN_MULTINODE_PORT_BASE, default 16900).
Without root or packages the tests skip; under CI (CI=true) the cluster must come up, or
they fail with the reason."""
from __future__ import annotations

import gc
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from wafer.fabric import get_fabric
from wse_sim.cs_system import CSSystem
from wse_sim.server import CSServer

ROOT = Path(__file__).resolve().parents[1]
# The reference every CS result is compared with is TensorFlow's own CPU kernels, the same
# on every x86 CPU: oneDNN off in this process and in every TensorFlow the suite starts. With
# it on (TF's default on CPUs with AVX-512 VNNI and newer), where the CPU has avx512_fp16 or
# AMX-FP16 TF computes float16 in oneDNN too: MatMul+BiasAdd+Relu fused, rounded once;
# Einsum, Softmax and others in float32 inside (docs/design.md, "Mixed precision").
# tests/common/test_tf_startup.py turns it on for the start-up lines it holds back.
os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
CLUSTER_SH = ROOT / "slurm" / "cluster" / "cluster.sh"


def pytest_collection_finish(session):
    """The modules every test imported (TensorFlow, Keras: some 300,000 objects) leave the
    garbage collector's view: each `tf.keras.backend.clear_session()` (one per graph the
    suite builds: tf_model.model_fn.model_graph) runs a full collection, which otherwise
    walks them all, about 0.4-1.6 s each. Garbage made later is still collected."""
    gc.collect()
    gc.freeze()


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


@dataclass(frozen=True)
class MultiNodeCluster(SlurmCluster):
    """Slurm hosts node1..nodeN (namespaces `netns[node]`, addresses `addresses[node]`) and the
    CS system serving at `cs_ip` on a host of its own."""

    cluster_env: dict[str, str]      # what cluster.sh needs to act on this cluster
    addresses: dict[str, str]
    netns: dict[str, str]            # node (and "cs") -> its network namespace
    cs_ip: str

    def link(self, host: str, up: bool) -> None:
        """Set a host's link into the bridge down (it drops off the network) or up again."""
        veth = f"{self.netns[host].rsplit('-', 1)[0]}v{host.removeprefix('node')}"
        subprocess.run(["ip", "link", "set", veth, "up" if up else "down"], check=True)

    def crash(self, host: str) -> None:
        """The host dies: SIGKILL to every process in its namespace (slurmd, its steps, tasks)."""
        pids = subprocess.run(["ip", "netns", "pids", self.netns[host]], capture_output=True, text=True,
                              check=True).stdout.split()
        subprocess.run(["kill", "-9", *pids], check=False)

    def restore(self) -> None:
        """Every host back on the network and answering Slurm (cluster.sh up is idempotent)."""
        for host in self.netns:
            self.link(host, True)
        up = _cluster("up", self.cluster_env)
        assert up.returncode == 0, up.stderr


def _cluster(command: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(CLUSTER_SH), command], capture_output=True, text=True, timeout=900,
                          env=env)


def _start_or_skip(command_env: dict[str, str] | None, what: str) -> bool:
    """Start a cluster unless it is up; whether this session started it (skip or, under CI, fail)."""
    if _cluster("status", command_env).returncode == 0:
        return False
    if os.geteuid() != 0 and os.environ.get("CI") != "true":
        pytest.skip(f"{what} needs root (make cluster-up)")
    up = _cluster("up", command_env)
    if up.returncode != 0:
        message = f"{what} did not start: {up.stderr.strip()}"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return True


@pytest.fixture(scope="session")
def slurm_cluster():
    conf = Path(os.environ.get("CSRUN_SLURM_DIR", "/tmp/csrun-slurm")) / "etc" / "slurm.conf"
    started = _start_or_skip(None, "the one-host Slurm")
    yield SlurmCluster({**os.environ, "SLURM_CONF": str(conf), "PYTHONPATH": str(ROOT)})
    if started:
        _cluster("down")


MULTINODE_HOSTS = 3


@pytest.fixture(scope="session")
def multinode_cluster():
    folder = Path(os.environ.get("CSRUN_MULTINODE_DIR", "/tmp/csrun-slurm-multinode"))
    base = os.environ.get("CSRUN_MULTINODE_PORT_BASE", "16900")
    cluster_env = {**os.environ, "CSRUN_SLURM_DIR": str(folder), "CSRUN_SLURM_PORT_BASE": base,
                   "CSRUN_SLURM_NODES": str(MULTINODE_HOSTS), "CSRUN_PYTHON": sys.executable}
    started = _start_or_skip(cluster_env, f"the {MULTINODE_HOSTS}-host Slurm (network namespaces)")
    env = {**os.environ, "SLURM_CONF": str(folder / "etc" / "slurm.conf"), "PYTHONPATH": str(ROOT)}
    nodes = subprocess.run(["scontrol", "show", "node", "-o"], env=env, capture_output=True, text=True).stdout
    addresses = dict(re.findall(r"NodeName=(\S+) .*?NodeAddr=(\S+)", nodes))
    cs_ip = re.search(r"--cs_ip (\S+)", _cluster("env", cluster_env).stdout).group(1)
    netns = {host: f"csr{base}-{host}" for host in (*addresses, "cs")}
    cluster = MultiNodeCluster(env, cluster_env, addresses, netns, cs_ip)
    try:
        yield cluster
    finally:
        if started:
            _cluster("down", cluster_env)
            left = [line for command in (["ip", "netns", "list"], ["ip", "-o", "link", "show"])
                    for line in subprocess.run(command, capture_output=True, text=True).stdout.splitlines()
                    if f"csr{base}" in line]
            assert not left, f"cluster.sh down left {left}"  # the machine as the session found it


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


@pytest.fixture
def server():
    """A CS system (wse_sim) serving the CS API on a free local port, in this process."""
    cs_server = CSServer(CSSystem(get_fabric("cs1"), idle_timeout=0, log=lambda line: None),
                         "127.0.0.1", 0).start()
    yield cs_server
    cs_server.stop(grace=0)
