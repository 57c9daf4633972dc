"""The reliability suite, bad inputs: each kind ends with one `error:` line naming what is
wrong, a non-zero exit, no traceback, and nothing already in the model_dir changed or torn.

Run-flow cases run `launcher.run_flow.run` in this process (FC-MNIST's model_fn on a tiny
config, a model_dir holding a checkpoint); CLI cases run the command."""
from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import yaml

from examples.fc_mnist.data import eval_input_fn, train_input_fn
from examples.fc_mnist.model import PARAMS_SPEC, model_fn
from launcher.csrun_wse import free_port
from launcher.run_flow import run
from tests.fc_mnist_runs import ENV, EXAMPLE
from tf_model import checkpoints

TINY = {"train_input": {"batch_size": 32, "shuffle": True, "shuffle_seed": 1},
        "eval_input": {"batch_size": 33, "shuffle": False},
        "model": {"hidden_sizes": [8], "dropout": 0.0},
        "optimizer": {"optimizer_type": "adam", "learning_rate": 0.01},
        "runconfig": {"max_steps": 2, "save_checkpoints_steps": 1, "log_step_count_steps": 1,
                      "tf_random_seed": 1}}


def write_params(folder: Path, changes: dict | None = None, text: str | None = None) -> Path:
    params = yaml.safe_load(yaml.safe_dump(TINY))
    for dotted, value in (changes or {}).items():
        *sections, key = dotted.split(".")
        place = params
        for section in sections:
            place = place.setdefault(section, {})
        if value is _DELETE:
            place.pop(key, None)
        else:
            place[key] = value
    path = folder / "bad_params.yaml"
    path.write_text(text if text is not None else yaml.safe_dump(params))
    return path


_DELETE = object()


def _digest(model_dir: Path) -> dict[str, str]:
    """The checkpoints and their index, by content."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(model_dir.iterdir())
            if p.name == "checkpoint" or p.name.startswith("model.ckpt-")}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A model_dir with model.ckpt-1 and -2 of the tiny model."""
    folder = tmp_path_factory.mktemp("trained")
    params = write_params(folder)
    run(model_fn, train_input_fn, eval_input_fn, here=str(EXAMPLE),
        argv=["-p", str(params), "-o", str(folder / "model_dir")], params_spec=PARAMS_SPEC)
    return folder / "model_dir"


def _refused(capsys, model_dir: Path, argv: list[str], train_fn=train_input_fn,
             spec=PARAMS_SPEC) -> str:
    """Run the flow, expect exit code 1 and one error line; the model_dir untouched."""
    before = _digest(model_dir)
    capsys.readouterr()
    with pytest.raises(SystemExit) as ended:
        run(model_fn, train_fn, eval_input_fn, here=str(EXAMPLE),
            argv=[*argv, "-o", str(model_dir)], params_spec=spec)
    err = capsys.readouterr().err
    assert ended.value.code == 1
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and ": error: " in lines[0] and "Traceback" not in err, err
    assert _digest(model_dir) == before
    assert not [p for p in model_dir.iterdir() if ".tmp-" in p.name]
    return lines[0]


PARAMS_CASES = {
    "batch_size_text": ({"train_input.batch_size": "abc"}, "train_input.batch_size"),
    "batch_size_zero": ({"train_input.batch_size": 0}, "train_input.batch_size"),
    "learning_rate_text": ({"optimizer.learning_rate": "fast"}, "optimizer.learning_rate"),
    "learning_rate_negative": ({"optimizer.learning_rate": -0.1}, "optimizer.learning_rate"),
    "hidden_sizes_text": ({"model.hidden_sizes": "500"}, "model.hidden_sizes"),
    "dropout_out_of_range": ({"model.dropout": 1.5}, "model.dropout"),
    "optimizer_unknown": ({"optimizer.optimizer_type": "adamw"}, "optimizer.optimizer_type"),
    "section_missing": ({"model": _DELETE}, "no model section"),
    "runconfig_unknown_key": ({"runconfig.max_step": 5}, "unknown runconfig key 'max_step'"),
    "max_steps_text": ({"runconfig.max_steps": "ten"}, "runconfig.max_steps"),
    "save_checkpoints_negative": ({"runconfig.save_checkpoints_steps": -1},
                                  "runconfig.save_checkpoints_steps"),
}


@pytest.mark.parametrize("case", sorted(PARAMS_CASES))
def test_bad_params_are_one_line(case, trained, tmp_path, capsys):
    changes, named = PARAMS_CASES[case]
    line = _refused(capsys, trained, ["-p", str(write_params(tmp_path, changes))])
    assert named in line


def test_params_file_not_yaml(trained, tmp_path, capsys):
    path = write_params(tmp_path, text="model: [1, 2\n  oops: {")
    assert "is not valid YAML" in _refused(capsys, trained, ["-p", str(path)])


def test_params_file_missing(trained, tmp_path, capsys):
    assert "not found" in _refused(capsys, trained, ["-p", str(tmp_path / "nope.yaml")])


@pytest.mark.parametrize("argv, named", [
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--mode", "fly"], "invalid choice: 'fly'"),
    (["--cs_ip", "127.0.0.1:113237"], "port 113237 is not between 1 and 65535"),
    (["--cs_ip", "127.0.0.1:abc"], "is not HOST:PORT"),
    (["--max_steps", "-3"], "--max_steps -3"),
])
def test_bad_flags_are_one_line(argv, named, trained, tmp_path, capsys):
    line = _refused(capsys, trained, ["-p", str(write_params(tmp_path)), *argv])
    assert named in line


def test_model_dir_is_a_file(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    capsys.readouterr()
    with pytest.raises(SystemExit) as ended:
        run(model_fn, train_input_fn, eval_input_fn, here=str(EXAMPLE),
            argv=["-p", str(write_params(tmp_path)), "-o", str(blocker / "model_dir")],
            params_spec=PARAMS_SPEC)
    err = capsys.readouterr().err.strip()
    assert ended.value.code == 1 and err.count("\n") == 0 and "cannot write to model_dir" in err


def _dataset(features: np.ndarray, labels: np.ndarray, repeat: bool = True) -> tf.data.Dataset:
    dataset = tf.data.Dataset.from_tensor_slices((features, labels)).batch(32, drop_remainder=True)
    return dataset.repeat() if repeat else dataset


def _raises(params):
    raise KeyError("train_input.path")


def _labels_shape(params):
    return _dataset(np.zeros((64, 784), np.float32), np.zeros((64, 3), np.int32))


def _labels_dtype(params):
    return _dataset(np.zeros((64, 784), np.float32), np.zeros(64, np.float32))


def _ends_early(params):
    return _dataset(np.zeros((64, 784), np.float32), np.zeros(64, np.int32), repeat=False)


def _not_a_dataset(params):
    return [(np.zeros((32, 784), np.float32), np.zeros(32, np.int32))]


def _fails_while_reading(params):
    def check(x, y):
        tf.debugging.assert_less(y, 0, message="a label is out of range")
        return x, y
    return _dataset(np.zeros((64, 784), np.float32), np.zeros(64, np.int32)).map(check)


INPUT_CASES = {
    "input_fn_raises": (_raises, "input_fn raised KeyError"),
    "labels_wrong_shape": (_labels_shape, "model_fn raised ValueError"),
    "labels_wrong_dtype": (_labels_dtype, "model_fn raised"),
    "dataset_ends_early": (_ends_early, "input_fn ran out after 2 steps"),
    "not_a_dataset": (_not_a_dataset, "not a tf.data.Dataset"),
    "fails_while_reading": (_fails_while_reading, "input_fn's dataset raised InvalidArgumentError"),
}


@pytest.mark.parametrize("case", sorted(INPUT_CASES))
def test_bad_input_fn_is_one_line(case, trained, tmp_path, capsys):
    input_fn, named = INPUT_CASES[case]
    line = _refused(capsys, trained, ["-p", str(write_params(tmp_path)), "--max_steps", "4"],
                    train_fn=input_fn)
    assert named in line


def _copy(trained: Path, tmp_path: Path) -> Path:
    model_dir = tmp_path / "model_dir"
    shutil.copytree(trained, model_dir)
    return model_dir


def _damage(prefix: str, how: str) -> None:
    data = Path(prefix + ".data-00000-of-00001")
    raw = bytearray(data.read_bytes())
    if how == "truncate":
        data.write_bytes(raw[: len(raw) // 2])
    else:
        raw[len(raw) // 2] ^= 0xFF
        data.write_bytes(bytes(raw))


def test_every_checkpoint_damaged_is_refused_naming_it(trained, tmp_path, capsys):
    model_dir = _copy(trained, tmp_path)
    for prefix in checkpoints.all_checkpoints(str(model_dir)):
        _damage(prefix, "truncate")
    line = _refused(capsys, model_dir, ["-p", str(write_params(tmp_path)), "--max_steps", "4"])
    assert "every checkpoint in" in line and "model.ckpt-2" in line


def test_foreign_checkpoint_is_refused(trained, tmp_path, capsys):
    model_dir = _copy(trained, tmp_path)
    line = _refused(capsys, model_dir, ["-p", str(write_params(tmp_path, {"model.hidden_sizes": [9]})),
                                        "--max_steps", "4"])
    assert "other shapes" in line or "another model" in line


def _cli(argv: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], cwd=cwd, env=ENV, capture_output=True, text=True,
                          timeout=timeout)


def _one_line(done: subprocess.CompletedProcess, named: str) -> None:
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert any(named in ln and ": error: " in ln for ln in lines), done.stderr


@pytest.mark.parametrize("argv, named", [
    (["--bogus", "python", "run.py"], "unrecognized arguments: --bogus"),
    ([], "no command to run"),
    (["--cs_ip", "127.0.0.1:113237", "python", "run.py"], "port 113237 is not between 1 and 65535"),
    (["--cs_ip", "127.0.0.1:", "python", "run.py"], "is not HOST:PORT"),
    (["--tasks-per-node", "0", "python", "run.py"], "--tasks-per-node 0"),
])
def test_csrun_wse_bad_flags_are_one_line(argv, named, tmp_path):
    done = _cli(["-m", "launcher.csrun_wse", *argv], tmp_path)
    _one_line(done, named)
    assert len([ln for ln in done.stderr.splitlines() if ln.strip()]) == 1


def test_wse_sim_port_in_use_is_one_line(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _cli(["-m", "wse_sim.cli", "serve", "--port", str(port)], tmp_path, timeout=60)
    _one_line(done, str(port))


def test_user_script_csrun_error_is_one_line(tmp_path):
    """A user's own run.py (get_params, no try/except) gets one line, not a traceback."""
    script = tmp_path / "my_run.py"
    script.write_text("from launcher.run_utils import get_params\nget_params('nowhere.yaml')\n")
    done = _cli([str(script)], tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip() == ("my_run.py: error: params file nowhere.yaml not found "
                                   "(hint: give an existing YAML file with -p/--params)")


@pytest.mark.slow
def test_unreachable_cs_is_one_line(tmp_path):
    params = write_params(tmp_path)
    done = _cli([str(EXAMPLE / "run.py"), "-p", str(params), "-o", str(tmp_path / "m"),
                 "--cs_ip", f"127.0.0.1:{free_port()}"], tmp_path, timeout=300)
    _one_line(done, "cannot reach the CS system")


def test_csrun_wse_missing_command_is_one_line_before_anything_starts(tmp_path):
    done = _cli(["-m", "launcher.csrun_wse", "--job-dir", str(tmp_path / "job"), "no-such-command-x"],
                tmp_path, timeout=300)
    _one_line(done, "command 'no-such-command-x' not found")
    assert done.returncode != 0 and not (tmp_path / "job").exists()



SUBMITIT_TAIL = ("submitit ERROR (2026-11-23) - Submitted job triggered an exception\n"
                 "Traceback (most recent call last):\n  File \"task.py\", line 52, in __call__\n"
                 "slurm.task.TaskFailed: exit code 1\n")


@pytest.mark.parametrize("own, code, reason", [
    ("Traceback (most recent call last):\n  File \"run.py\", line 3, in <module>\n"
     "ModuleNotFoundError: No module named 'launcher'\n", 1, "ModuleNotFoundError: No module named 'launcher'"),
    ("global step 10: loss = 1\nrun.py: error: the loss became nan at step 11 (hint: lower it)\n", 1,
     "run.py: error: the loss became nan at step 11 (hint: lower it)"),
    ("global step 10: loss = 1\n", 137, "killed by SIGKILL (exit code 137)"),
    ("global step 10: loss = 1\n", 3, "exit code 3"),
])
def test_a_failed_tasks_reason_is_its_own_last_error(own, code, reason, tmp_path):
    from slurm.task_logs import last_error_line

    log = tmp_path / "1_log.out"
    log.write_text("submitit INFO (2026-11-23) - Starting with JobEnvironment\n" + own + SUBMITIT_TAIL)
    assert last_error_line(log, code) == reason


@pytest.mark.slow
def test_bad_params_on_the_cs_path_are_one_line(tmp_path):
    """Through csrun_wse (a chief and an input worker): the task's own line, not a
    `TaskFailed: exit code 1`, and no traceback on the terminal."""
    params = write_params(tmp_path, {"optimizer.learning_rate": "fast"})
    done = _cli(["-m", "launcher.csrun_wse", "--tasks-per-node", "2", "--job-dir", str(tmp_path / "job"),
                 "python", str(EXAMPLE / "run.py"), "-p", str(params), "-o", str(tmp_path / "m")],
                tmp_path, timeout=300)
    _one_line(done, "failed: run.py: error: optimizer.learning_rate in")
    assert "TaskFailed" not in done.stderr and "Traceback" not in done.stdout
