"""csrun_wse refuses, before it submits anything, what a run would refuse only once it ran:
run.py flags, params, a model_dir held by another run, a CS that does not answer."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from common.errors import CSRunError
from launcher.command_checks import check_run
from launcher.csrun_wse import free_port
from tests.fc_mnist_runs import ENV, EXAMPLE
from tf_model.model_dir_lock import lock_model_dir, release_model_dir


@pytest.fixture
def user_dir(tmp_path) -> Path:
    """FC-MNIST's run.py and params in a folder of the user's."""
    (tmp_path / "configs").mkdir()
    (tmp_path / "run.py").write_text((EXAMPLE / "run.py").read_text())
    (tmp_path / "configs" / "params.yaml").write_text((EXAMPLE / "configs" / "params.yaml").read_text())
    return tmp_path


def refused(command: str, workdir: Path, cs_ip: str | None = None) -> str:
    with pytest.raises(CSRunError) as error:
        check_run(tuple(command.split()), workdir, cs_ip)
    return str(error.value)


def test_bad_flags_and_params_are_refused_naming_them(user_dir):
    assert refused("python run.py --mode trian", user_dir).startswith(
        "argument -m/--mode: invalid choice: 'trian'")
    assert refused("python run.py --max_steps ten", user_dir).startswith(
        "argument --max_steps: invalid int value: 'ten'")
    assert refused("python run.py -p nope.yaml", user_dir) == (
        f"run.py: params file nope.yaml not found in {user_dir} (hint: give its path with -p; nothing was started)")
    params = yaml.safe_load((user_dir / "configs" / "params.yaml").read_text())
    params["runconfig"]["max_stepz"] = 10
    (user_dir / "bad.yaml").write_text(yaml.safe_dump(params))
    assert "max_stepz" in refused("python run.py -p bad.yaml", user_dir)
    check_run(("python", "run.py", "--mode", "train"), user_dir, None)  # a good run passes
    check_run(("python", "other.py", "--anything"), user_dir / "configs", None)  # no params: its own business


def test_a_held_model_dir_and_a_silent_cs_are_refused(user_dir):
    model_dir = user_dir / "m"
    lock_model_dir(str(model_dir))
    try:
        message = refused(f"python run.py -o {model_dir}", user_dir)
        assert message.startswith(f"model_dir {model_dir} is in use by another run: pid {os.getpid()} on host ")
        check_run(("python", "run.py", "-o", str(model_dir), "--mode", "eval"), user_dir, None)  # eval reads only
    finally:
        release_model_dir(str(model_dir))
    check_run(("python", "run.py", "-o", str(model_dir)), user_dir, None)
    port = free_port()
    assert refused("python run.py", user_dir, f"127.0.0.1:{port}") == (
        f"cannot reach the CS system at 127.0.0.1:{port}: Connection refused (hint: start it (wse_sim serve) or "
        "check --cs_ip; nothing was queued)")
    # run.py's own --cs_ip wins over the job's, as in the task
    assert f"127.0.0.1:{port}" in refused(f"python run.py --cs_ip 127.0.0.1:{port}", user_dir, "127.0.0.1:1")
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        check_run(("python", "run.py"), user_dir, "127.0.0.1:%d" % listening.getsockname()[1])
    check_run(("python", "run.py", "--validate_only"), user_dir, f"127.0.0.1:{port}")  # never meets the CS


def test_csrun_wse_refuses_before_anything_is_submitted(user_dir):
    job = user_dir / "job"
    done = subprocess.run([sys.executable, "-m", "launcher.csrun_wse", "--job-dir", str(job), "python", "run.py",
                           "--mode", "trian"], cwd=user_dir, env=ENV, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "csrun_wse: error: argument -m/--mode: invalid choice: 'trian' (choose from 'train', 'eval', 'eval_all', "
        "'train_and_eval', 'predict') (hint: see run.py --help)"]
    assert not job.exists()
