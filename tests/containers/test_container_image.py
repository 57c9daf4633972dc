"""Every task really inside the Charliecloud image built from containers/csrun.def.

A probe script, run as the user's command, reports from inside each task its /etc/os-release,
its Python's prefix, where `launcher` was imported from and the image's stamp, then runs
the example's run.py. The losses of a containerised FC-MNIST run equal the host run's.
"""
from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from fc_mnist_runs import ENV, EXAMPLE, fc_mnist_params, losses

from containers.image import image_stamp

pytestmark = [pytest.mark.container, pytest.mark.slow]

PROBE = '''import json, os, runpy, sys
import launcher
report = {"os_release": open("/etc/os-release").read(), "prefix": sys.prefix,
          "launcher": launcher.__file__, "rank": os.environ.get("SUBMITIT_LOCAL_GLOBALID", os.environ.get("SLURM_PROCID", "0")),
          "stamp": open("/ch/csrun-image-stamp").read().strip()}
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), f"report-{os.getpid()}.json"), "w") as out:
    json.dump(report, out)
script = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
runpy.run_path(script, run_name="__main__")
'''


def site(tmp_path: Path, image: Path) -> dict[str, str]:
    """A csrun.yaml that runs every task in `image` with Charliecloud, tmp_path bound."""
    config = tmp_path / "csrun.yaml"
    config.write_text(yaml.safe_dump({"container": {"image": str(image), "runtime": "charliecloud"},
                                      "mount_dirs": [str(tmp_path)]}))
    (tmp_path / "probe.py").write_text(PROBE)
    return {**ENV, "CSRUN_CONFIG": str(config)}


def reports(tmp_path: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(tmp_path.glob("report-*.json"))]


def assert_inside(report: dict, image: Path) -> None:
    assert report["os_release"] == (image / "etc" / "os-release").read_text()
    assert 'VERSION_CODENAME=bookworm' in report["os_release"]
    assert report["prefix"] == "/usr"  # the image's Python, not the host's venv
    assert report["launcher"].startswith("/usr/local/lib/python3.11/dist-packages/launcher/")
    assert report["stamp"] == image_stamp(image)


def run(argv: list[str], env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=EXAMPLE, env=env, capture_output=True, text=True, timeout=timeout)


def test_csrun_cpu_validates_inside_the_image(tmp_path, container_image):
    env = site(tmp_path, container_image)
    done = run(["csrun_cpu", "python", str(tmp_path / "probe.py"), "run.py", "--validate_only",
                "-o", str(tmp_path / "model")], env)
    assert done.returncode == 0, done.stdout + done.stderr
    (report,) = reports(tmp_path)
    assert_inside(report, container_image)


def host_run(folder: Path) -> dict[int, float]:
    """The losses of FC-MNIST's short run (TRAIN) under csrun_wse on the host, 3 tasks."""
    params = fc_mnist_params(folder, steps=6, every=3)
    host = run(["csrun_wse", "--tasks-per-node", "3", "--job-dir", str(folder / "host-job"), "--",
                "python", "run.py", "--mode", "train", "-p", str(params), "-o", str(folder / "host-model")], ENV)
    assert host.returncode == 0, host.stdout + host.stderr
    assert len(losses(host.stdout)) == 6
    return losses(host.stdout)


@pytest.fixture(scope="module", autouse=True)
def host_run_meanwhile(tmp_path_factory) -> Iterator[Future]:
    """The host run starts with the module, before the image is built (on a fresh machine the
    build, mostly downloads and unpacking, takes minutes; the host run meanwhile)."""
    with ThreadPoolExecutor(1) as meanwhile:
        yield meanwhile.submit(host_run, tmp_path_factory.mktemp("host"))


@pytest.fixture(scope="module")
def host_losses(host_run_meanwhile) -> dict[int, float]:
    return host_run_meanwhile.result()


def test_csrun_wse_trains_fc_mnist_inside_the_image_with_the_host_losses(tmp_path, container_image,
                                                                          host_losses):
    params = fc_mnist_params(tmp_path, steps=6, every=3)
    train = ["--mode", "train", "-p", str(params)]
    env = site(tmp_path, container_image)
    inside = run(["csrun_wse", "--tasks-per-node", "3", "--job-dir", str(tmp_path / "job"), "--",
                  "python", str(tmp_path / "probe.py"), "run.py", *train, "-o", str(tmp_path / "model")], env)
    assert inside.returncode == 0, inside.stdout + inside.stderr
    found = reports(tmp_path)
    assert sorted(r["rank"] for r in found) == ["0", "1", "2"]  # the chief and two input workers
    for report in found:
        assert_inside(report, container_image)
    assert losses(inside.stdout) == host_losses


@pytest.mark.slurm
def test_a_slurm_job_trains_with_every_task_inside_the_image(slurm_cluster, tmp_path, container_image,
                                                             host_losses):
    params = fc_mnist_params(tmp_path, steps=6, every=3)
    train = ["--mode", "train", "-p", str(params)]
    env = {**site(tmp_path, container_image), "SLURM_CONF": slurm_cluster.env["SLURM_CONF"]}
    job = run(["csrun_wse", "--total-nodes", "1", "--tasks-per-node", "3", "--job-dir", str(tmp_path / "job"),
               "--", "python", str(tmp_path / "probe.py"), "run.py", *train, "-o", str(tmp_path / "model")], env)
    assert job.returncode == 0, job.stdout + job.stderr
    assert "through the slurm backend" in job.stderr
    found = reports(tmp_path)
    assert sorted(r["rank"] for r in found) == ["0", "1", "2"]
    for report in found:
        assert_inside(report, container_image)
    assert losses(job.stdout) == host_losses
