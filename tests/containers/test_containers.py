"""containers/: the runtime's exec command, runtime and image checks, the definition file."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from common.errors import CSRunError
from common.layers import PACKAGES
from containers.recipes import DEFINITION, dockerfile_to_definition, missing_sources, read_definition
from containers.runtime import ContainerRuntime, check_binds, check_image, find_runtime

ROOT = Path(__file__).resolve().parents[2]


def executable(path: Path) -> Path:
    """A test double of a runtime's binary: only its presence on PATH matters."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


def test_exec_command_binds_unsets_and_runs_after_the_image():
    runtime = ContainerRuntime("apptainer", "/usr/bin/apptainer")
    argv = runtime.exec_command("/img/csrun.sif", ["python", "run.py", "--mode", "train"],
                                ["/data", "/scratch:/mnt/s", "/data"], "/home/u/model")
    assert argv == ["env", "-u", "PYTHONPATH", "-u", "LD_LIBRARY_PATH",
                    "apptainer", "exec", "--bind", "/data,/scratch:/mnt/s,/home/u/model",
                    "--pwd", "/home/u/model", "/img/csrun.sif", "python", "run.py", "--mode", "train"]


def test_exec_command_binds_the_workdir_once():
    runtime = ContainerRuntime("singularity", "/opt/bin/singularity")
    argv = runtime.exec_command("i.sif", ["true"], ["/w"], "/w")
    assert argv[5:10] == ["singularity", "exec", "--bind", "/w", "--pwd"]


def test_a_bind_with_a_comma_is_refused():
    with pytest.raises(CSRunError, match="cannot bind 'a,b'"):
        ContainerRuntime("apptainer", "x").exec_command("i.sif", ["true"], ["a,b"], "/w")


def test_find_runtime_prefers_apptainer_then_singularity(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    executable(tmp_path / "ch-run")
    assert find_runtime() == ContainerRuntime("charliecloud", str(tmp_path / "ch-run"))
    executable(tmp_path / "singularity")
    assert find_runtime() == ContainerRuntime("singularity", str(tmp_path / "singularity"))
    executable(tmp_path / "apptainer")
    assert find_runtime().name == "apptainer"
    assert find_runtime("singularity").name == "singularity"


def test_find_runtime_names_what_it_looked_for(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(CSRunError) as error:
        find_runtime()
    assert "apptainer or singularity or ch-run not found on PATH" in error.value.message
    executable(tmp_path / "singularity")
    with pytest.raises(CSRunError, match=r"\(apptainer not found on PATH\)"):
        find_runtime("apptainer")
    with pytest.raises(CSRunError, match="unknown container runtime 'docker'"):
        find_runtime("docker")


def test_charliecloud_command_sets_user_binds_src_dst_and_clears_the_host_paths(monkeypatch):
    monkeypatch.setenv("USER", "alice")
    argv = ContainerRuntime("charliecloud", "/usr/bin/ch-run").exec_command(
        "/img/csrun", ["python", "run.py"], ["/data", "/scratch:/mnt/s", "/data"], "/home/u/model")
    assert argv == ["env", "-u", "PYTHONPATH", "-u", "LD_LIBRARY_PATH", "USER=alice", "ch-run", "--set-env",
                    "-b", "/data:/data", "-b", "/scratch:/mnt/s", "-b", "/home/u/model:/home/u/model",
                    "-c", "/home/u/model", "/img/csrun", "--", "python", "run.py"]


def test_charliecloud_refuses_mount_options_and_makes_mount_points(tmp_path):
    runtime = ContainerRuntime("charliecloud", "/usr/bin/ch-run")
    with pytest.raises(CSRunError, match="ch-run takes SRC or SRC:DST, no mount options"):
        runtime.exec_command("img", ["true"], ["/data:/data:ro"], "/w")
    image = tmp_path / "image"
    image.write_bytes(b"SIF")
    with pytest.raises(CSRunError, match="is not a directory: ch-run runs directory images"):
        runtime.prepare(str(image), [], "/w")
    image.unlink()
    image.mkdir()
    runtime.prepare(str(image), [f"{tmp_path}:/mnt/host"], "/home/u/model")
    assert (image / "mnt" / "host").is_dir() and (image / "home" / "u" / "model").is_dir()


def test_check_image(tmp_path):
    image = tmp_path / "csrun.sif"
    with pytest.raises(CSRunError, match=f"container image {image} not found") as error:
        check_image(str(image))
    assert "containers/csrun.def" in error.value.hint
    image.write_bytes(b"SIF")
    check_image(str(image))
    check_image("docker://python:3.11")  # the runtime pulls URIs itself


def test_check_binds_names_a_missing_source(tmp_path):
    check_binds([str(tmp_path), f"{tmp_path}:/mnt/x"])
    with pytest.raises(CSRunError, match=f"cannot bind {tmp_path}/nope into the container"):
        check_binds([f"{tmp_path}/nope:/mnt"])


def test_the_shipped_definition_parses_and_copies_what_exists():
    definition = read_definition()
    assert definition.base_image == "python:3.11-slim-bookworm"
    assert ("constraints.txt", "/opt/csrun/constraints.txt") in definition.files
    copied = {source for source, _ in definition.files}
    assert set(PACKAGES) <= copied, f"the image lacks {sorted(set(PACKAGES) - copied)}"
    assert any("-c /opt/csrun/constraints.txt /opt/csrun" in line for line in definition.post)
    assert missing_sources(definition, ROOT) == []
    assert missing_sources(definition, ROOT / "tests") != []


def test_a_definition_without_docker_bootstrap_is_refused(tmp_path):
    path = tmp_path / "x.def"
    path.write_text("Bootstrap: library\nFrom: ubuntu:22.04\n")
    with pytest.raises(CSRunError, match="Only docker is supported"):
        read_definition(path)
    with pytest.raises(CSRunError, match="definition file .*nope.def not found"):
        read_definition(tmp_path / "nope.def")


def test_dockerfile_converts_to_a_definition(tmp_path):
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("FROM python:3.11-slim\nENV CSRUN_SITE=lab\nRUN pip install numpy\n")
    text = dockerfile_to_definition(dockerfile)
    assert text.startswith("Bootstrap: docker\nFrom: python:3.11-slim\n")
    assert "pip install numpy" in text and "export CSRUN_SITE=lab" in text
    converted = tmp_path / "site.def"
    converted.write_text(text)
    assert read_definition(converted).base_image == "python:3.11-slim"


def test_cli_check_and_convert(tmp_path):
    cmd = [sys.executable, "-m", "containers"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([*cmd, "check"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.endswith(": ok\n")
    bad = subprocess.run([*cmd, "check", str(DEFINITION), "--root", str(tmp_path)],
                         capture_output=True, text=True, env=env, cwd=tmp_path)
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert bad.stderr.startswith("python -m containers: error: ") and "setup.cfg" in bad.stderr
    (tmp_path / "Dockerfile").write_text("FROM debian:12\n")
    done = subprocess.run([*cmd, "convert", "Dockerfile", "-o", "out.def"], capture_output=True,
                          text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0 and (tmp_path / "out.def").read_text().startswith("Bootstrap: docker")


def test_a_failing_recipe_step_names_the_step_its_line_and_its_last_output(tmp_path):
    from containers.image import run_step

    log = tmp_path / "build.log"
    post = "set -e\necho fetching\nls /no/such/folder\necho never"
    with pytest.raises(CSRunError) as error:
        run_step("%post", ["/bin/sh", "-exc", post], log)
    assert error.value.message.startswith("image recipe step %post at `ls /no/such/folder` failed (exit 2): ")
    assert error.value.message.endswith("No such file or directory")
    assert str(log) in error.value.hint and "fetching" in log.read_text()


def test_the_image_is_rebuilt_only_when_its_stamp_changes(tmp_path):
    from containers.image import STAMP, build_image, stamp_of

    image = tmp_path / "image"
    (image / STAMP).parent.mkdir(parents=True)
    (image / STAMP).write_text(stamp_of(read_definition()) + "\n")
    assert build_image(image) is False  # up to date: nothing runs
    changed = tmp_path / "csrun.def"
    changed.write_text(DEFINITION.read_text().replace("From: python:3.11-slim-bookworm", "From: python:3.12-slim"))
    assert stamp_of(read_definition(changed)) != stamp_of(read_definition())
    with pytest.raises(CSRunError, match="no Debian base stands for From: python:3.12-slim here"):
        build_image(image, changed)
