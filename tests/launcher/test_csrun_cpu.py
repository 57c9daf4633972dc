"""csrun_cpu: the command it runs (container, srun, host), its exit code, its bad inputs."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from common.errors import CSRunError
from launcher.csrun_cpu import CpuArgs, parse_args, plan
from launcher.site_config import ContainerConfig, SiteConfig, SlurmConfig

ROOT = Path(__file__).resolve().parents[2]
CSRUN_CPU = [sys.executable, "-c", "import sys; from launcher.csrun_cpu import main; sys.exit(main())"]

# A TEST DOUBLE of the apptainer binary (none can be installed here): it records its
# arguments, one a line, to $DOUBLE_RECORD, then runs what follows the image argument.
APPTAINER_DOUBLE = """#!/bin/sh
printf '%s\\n' "$@" > "$DOUBLE_RECORD"
while [ "$1" != "$DOUBLE_IMAGE" ]; do shift; done
shift
exec "$@"
"""


def csrun_cpu(args, cwd, path_prefix=None, config=None, extra_env=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(cwd), **(extra_env or {})}
    env.pop("CSRUN_CONFIG", None)
    if config is not None:
        env["CSRUN_CONFIG"] = str(config)
    if path_prefix is not None:
        env["PATH"] = f"{path_prefix}:{env['PATH']}"
    return subprocess.run(CSRUN_CPU + args, cwd=cwd, capture_output=True, text=True, env=env,
                          timeout=60)


def one_error_line(done: subprocess.CompletedProcess, text: str) -> None:
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith("csrun_cpu: error: ") and text in lines[-1], done.stderr


def test_parse_accepts_both_spellings_and_true_false():
    assert parse_args(["--alloc_node=False", "--mount_dirs=/a,/b", "python", "run.py"]) == \
        CpuArgs(False, ("/a", "/b"), False, ("python", "run.py"))
    assert parse_args(["--alloc-node", "true", "--mount-dirs", "/a", "--dry-run", "--", "ls", "-l"]) == \
        CpuArgs(True, ("/a",), True, ("ls", "-l"))
    # flags after the command belong to the command
    assert parse_args(["python", "run.py", "--dry-run"]).command == ("python", "run.py", "--dry-run")
    assert parse_args(["x"]).alloc_node is True


@pytest.mark.parametrize("argv, message", [
    (["--alloc-node=maybe", "ls"], "expected True or False, not 'maybe'"),
    (["--bogus", "ls"], "unrecognized arguments: --bogus"),
    (["--alloc"], "unrecognized arguments: --alloc"),  # no abbreviations
])
def test_parse_rejects_bad_arguments(argv, message):
    with pytest.raises(CSRunError, match=message):
        parse_args(argv)


def test_plan_host_srun_and_container(tmp_path, monkeypatch):
    args = CpuArgs(True, ("/extra",), False, ("python", "run.py"))
    config = SiteConfig(path=tmp_path / "csrun.yaml",
                        slurm=SlurmConfig(partition="cpu", time="30"))
    host = plan(args, config, "/w", slurm_answers=False)
    assert host.argv == ("python", "run.py")
    assert host.where == (f"csrun_cpu: running without a container (no container.image in "
                          f"{tmp_path / 'csrun.yaml'}; --mount-dirs unused), on this host "
                          "(no Slurm controller answers)")
    srun = plan(args, config, "/w", slurm_answers=True)
    assert srun.argv == ("srun", "--nodes=1", "--exclusive", "--job-name=csrun_cpu",
                         "--partition=cpu", "--time=30", "python", "run.py")
    assert srun.where.endswith("on a node of its own through srun (cpu)")
    no_alloc = plan(CpuArgs(False, (), False, ("ls",)), config, "/w", slurm_answers=True)
    assert no_alloc.argv == ("ls",) and no_alloc.where.endswith("on this host (--alloc-node=False)")

    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "singularity").write_text("#!/bin/sh\n")
    (tmp_path / "bin" / "singularity").chmod(0o755)
    (tmp_path / "csrun.sif").write_bytes(b"SIF")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    image = str(tmp_path / "csrun.sif")
    boxed = SiteConfig(container=ContainerConfig(image=image), mount_dirs=(str(tmp_path),),
                       slurm=SlurmConfig())
    args = CpuArgs(True, (str(tmp_path / "bin"),), False, ("python", "run.py"))
    chosen = plan(args, boxed, "/w", slurm_answers=True)
    assert chosen.argv == ("srun", "--nodes=1", "--exclusive", "--job-name=csrun_cpu",
                           "env", "-u", "PYTHONPATH", "-u", "LD_LIBRARY_PATH", "singularity", "exec",
                           "--bind", f"{tmp_path},{tmp_path / 'bin'},/w", "--pwd", "/w", image,
                           "python", "run.py")
    assert chosen.where == (f"csrun_cpu: running in the singularity container {image}, on a node "
                            "of its own through srun (the default partition)")


def test_no_command_is_an_interactive_shell_kept_off_the_cs_node(tmp_path):
    """As the original's: `csrun_cpu` alone (or `bash`) is a shell in the container on an
    allocated node, `srun --pty`, never on the CS's GRES node unless --exclude-gres=False."""
    assert parse_args([]).command == ("bash",) and parse_args(["--dry-run"]).interactive
    assert parse_args(["bash"]).interactive and not parse_args(["bash", "-c", "ls"]).interactive
    config = SiteConfig(slurm=SlurmConfig(partition="cpu", gres_node="csnode"))
    shell = plan(parse_args([]), config, "/w", slurm_answers=True)
    assert shell.argv == ("srun", "--pty", "--nodes=1", "--exclusive", "--job-name=csrun_cpu",
                          "--exclude=csnode", "--partition=cpu", "bash")
    assert shell.where == ("csrun_cpu: running an interactive shell, without a container (no csrun.yaml "
                           "found), on a node of its own through srun (cpu, not csnode (the CS's node))")
    command = plan(parse_args(["--exclude_gres=False", "python", "run.py"]), config, "/w", slurm_answers=True)
    assert command.argv == ("srun", "--nodes=1", "--exclusive", "--job-name=csrun_cpu", "--partition=cpu",
                            "python", "run.py")
    done = csrun_cpu(["--alloc-node=False", "--dry-run"], tmp_path)
    assert (done.returncode, done.stdout) == (0, "bash\n"), done.stderr


def test_runs_through_the_container_runtime_double(tmp_path):
    """End to end: csrun_cpu → (double) apptainer exec → the command, exit code passed back."""
    bin_dir, work, data = tmp_path / "bin", tmp_path / "work", tmp_path / "data"
    for d in (bin_dir, work, data):
        d.mkdir()
    double = bin_dir / "apptainer"
    double.write_text(APPTAINER_DOUBLE)
    double.chmod(0o755)
    image = tmp_path / "csrun.sif"
    image.write_bytes(b"SIF")
    config = tmp_path / "site.yaml"
    config.write_text(f"container: {{image: {image}}}\nmount_dirs: [{data}]\n")
    record = tmp_path / "args.txt"
    probe = ("import json, os, sys; print(json.dumps({k: os.environ.get(k) for k in "
             "('PYTHONPATH', 'LD_LIBRARY_PATH', 'CSRUN_JOB_ID', 'SLURM_JOB_ID')} | "
             "{'cwd': os.getcwd()})); sys.exit(3)")
    done = csrun_cpu(["--alloc-node=False", "--mount-dirs", str(tmp_path), sys.executable, "-c", probe],
                     work, path_prefix=bin_dir, config=config,
                     extra_env={"DOUBLE_RECORD": str(record), "DOUBLE_IMAGE": str(image),
                                "LD_LIBRARY_PATH": "/host/lib", "CSRUN_JOB_ID": "j1",
                                "SLURM_JOB_ID": "42"})
    assert done.returncode == 3, done.stderr
    seen = json.loads(done.stdout)
    assert seen == {"PYTHONPATH": None, "LD_LIBRARY_PATH": None, "CSRUN_JOB_ID": "j1",
                    "SLURM_JOB_ID": "42", "cwd": str(work)}
    assert record.read_text().splitlines() == [
        "exec", "--bind", f"{data},{tmp_path},{work}", "--pwd", str(work), str(image),
        sys.executable, "-c", probe]
    assert done.stderr == (f"csrun_cpu: running in the apptainer container {image}, "
                           "on this host (--alloc-node=False)\n")

    dry = csrun_cpu(["--alloc-node=False", "--dry-run", "python", "run.py"], work,
                    path_prefix=bin_dir, config=config)
    assert dry.returncode == 0
    assert shlex.split(dry.stdout) == ["env", "-u", "PYTHONPATH", "-u", "LD_LIBRARY_PATH",
                                       "apptainer", "exec", "--bind", f"{data},{work}", "--pwd",
                                       str(work), str(image), "python", "run.py"]


def test_host_run_passes_the_exit_code_and_dry_run_runs_nothing(tmp_path):
    done = csrun_cpu(["--alloc-node=False", "sh", "-c", "echo out; exit 5"], tmp_path)
    assert (done.returncode, done.stdout) == (5, "out\n")
    assert "running without a container (no csrun.yaml found), on this host" in done.stderr
    dry = csrun_cpu(["--alloc-node=False", "--dry-run", "sh", "-c", "touch made"], tmp_path)
    assert dry.returncode == 0 and dry.stdout == "sh -c 'touch made'\n"
    assert not (tmp_path / "made").exists()


@pytest.mark.parametrize("config_text, message", [
    ("slurm: {partitoin: cpu}\n", "unknown key 'slurm.partitoin'"),
    ("slurm: {nodes: [1}\n", "is not valid YAML"),
    ("container: {image: missing.sif}\n", "missing.sif not found"),
])
def test_bad_config_is_one_line(tmp_path, config_text, message):
    config = tmp_path / "csrun.yaml"
    config.write_text(config_text)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "apptainer").write_text(APPTAINER_DOUBLE)
    (tmp_path / "bin" / "apptainer").chmod(0o755)
    done = csrun_cpu(["--alloc-node=False", "true"], tmp_path, path_prefix=tmp_path / "bin")
    one_error_line(done, message)
    if "YAML" in message or "key" in message:
        assert str(config) in done.stderr


def test_image_but_no_runtime_is_one_line(tmp_path):
    (tmp_path / "csrun.sif").write_bytes(b"SIF")
    (tmp_path / "csrun.yaml").write_text("container: {image: csrun.sif}\n")
    path = ":".join(p for p in os.environ["PATH"].split(":")
                    if not any(os.path.exists(os.path.join(p, r)) for r in ("apptainer", "singularity", "ch-run")))
    done = csrun_cpu(["--alloc-node=False", "true"], tmp_path, extra_env={"PATH": path})
    one_error_line(done, "no container runtime is installed here (apptainer or singularity or ch-run not found on PATH)")


@pytest.mark.parametrize("argv, message", [
    (["--bogus", "true"], "unrecognized arguments: --bogus"),
    (["--alloc-node=maybe", "true"], "expected True or False, not 'maybe'"),
    (["--alloc-node=False", "no-such-command-xyz"], "command not found: no-such-command-xyz"),
])
def test_bad_arguments_are_one_line(tmp_path, argv, message):
    one_error_line(csrun_cpu(argv, tmp_path), message)


@pytest.mark.slurm
def test_alloc_node_runs_through_srun(tmp_path, slurm_cluster):
    done = csrun_cpu(["sh", "-c", "echo job=$SLURM_JOB_ID; exit 4"], tmp_path,
                     extra_env={"SLURM_CONF": slurm_cluster.env["SLURM_CONF"]})
    assert done.returncode == 4, done.stderr
    assert done.stdout.startswith("job=") and done.stdout.strip()[4:].isdigit()
    assert "on a node of its own through srun" in done.stderr
