"""run_utils (params, flags, checks) and the one-line errors of `python run.py`."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from common.errors import CSRunError
from launcher.run_utils import check_env, create_arg_parser, get_params, is_cs, save_params, update_params_from_args

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FC_MNIST = os.path.join(ROOT, "examples", "fc_mnist")


def write_params(path, runconfig=None, text=None):
    path.write_text(text if text is not None else yaml.safe_dump(
        {"train_input": {"batch_size": 8}, "runconfig": runconfig or {}}))
    return str(path)


def test_params_get_runconfig_defaults_and_keep_their_values(tmp_path):
    params = get_params(write_params(tmp_path / "p.yaml", {"max_steps": 50, "fabric": "cs2"}))
    rc = params["runconfig"]
    assert (rc["max_steps"], rc["fabric"], rc["mode"], rc["keep_checkpoint_max"]) == (50, "cs2", "train", 5)
    assert params["train_input"] == {"batch_size": 8}


@pytest.mark.parametrize("runconfig, text, message", [
    ({"max_stesp": 10}, None, r"unknown runconfig key 'max_stesp' in .*p\.yaml"),
    ({"max_steps": "ten"}, None, r"runconfig.max_steps in .*p\.yaml is 'ten'"),
    ({"mode": "fit"}, None, r"runconfig.mode in .*p\.yaml is 'fit'"),
    (None, "runconfig:\n  max_steps: [1\n", r"not valid YAML at line \d+"),
    (None, "- a\n- b\n", "holds a list, not a mapping"),
])
def test_bad_params_name_the_key_and_the_file(tmp_path, runconfig, text, message):
    path = write_params(tmp_path / "p.yaml", runconfig, text)
    with pytest.raises(CSRunError, match=message):
        get_params(path)


def test_a_missing_params_file_is_named(tmp_path):
    with pytest.raises(CSRunError, match=r"params file .*nope.yaml not found"):
        get_params(str(tmp_path / "nope.yaml"))


def test_flags_override_the_yaml_only_when_given(tmp_path):
    parser = create_arg_parser("/default/model_dir")
    rc = get_params(write_params(tmp_path / "p.yaml", {"max_steps": 50, "model_dir": "yaml_dir",
                                                       "mode": "eval"}))["runconfig"]
    update_params_from_args(parser.parse_args([]), rc)
    assert (rc["max_steps"], rc["model_dir"], rc["mode"], rc["cs_ip"]) == (50, "yaml_dir", "eval", None)
    update_params_from_args(parser.parse_args(["-o", "flag_dir", "--steps", "5", "-m", "train",
                                               "--cs_ip", "10.1.2.3"]), rc)
    assert (rc["model_dir"], rc["steps"], rc["max_steps"], rc["mode"]) == ("flag_dir", 5, None, "train")
    assert rc["cs_ip"] == "10.1.2.3:9000" and is_cs(rc)
    fresh = get_params(write_params(tmp_path / "q.yaml", {}))["runconfig"]
    update_params_from_args(parser.parse_args([]), fresh)
    assert fresh["model_dir"] == "/default/model_dir" and not is_cs(fresh)


def test_the_jobs_cs_overrides_the_yaml_and_the_flag_overrides_both(tmp_path):
    """Under csrun_wse the task's CS (coordinator.roles) is the job's, as if given by --cs_ip."""
    parser = create_arg_parser("/default/model_dir")
    path = write_params(tmp_path / "p.yaml", {"cs_ip": "yaml-cs"})
    for flags, job, expected in (([], None, "yaml-cs:9000"), ([], "job-cs:1", "job-cs:1"),
                                 (["--cs_ip", "flag-cs:2"], "job-cs:1", "flag-cs:2")):
        rc = get_params(path)["runconfig"]
        update_params_from_args(parser.parse_args(flags), rc, job_cs_ip=job)
        assert rc["cs_ip"] == expected


def test_unknown_flags_and_bad_modes_are_one_line_errors():
    parser = create_arg_parser("md")
    with pytest.raises(CSRunError, match="unrecognized arguments: --max-steps"):
        parser.parse_args(["--max-steps", "3"])
    with pytest.raises(CSRunError, match="invalid choice: 'fit'"):
        parser.parse_args(["--mode", "fit"])


@pytest.mark.parametrize("runconfig, message", [
    ({"validate_only": True, "compile_only": True}, "--validate_only and --compile_only"),
    ({"mode": "train_and_eval", "cs_ip": "h:1"}, "train_and_eval runs on the CPU only"),
])
def test_check_env_refuses_what_cannot_run(runconfig, message):
    with pytest.raises(CSRunError, match=message):
        check_env(runconfig)


def test_check_env_accepts_runnable_settings():
    for runconfig in ({"mode": "eval", "cs_ip": "h:1", "eval_steps": 3}, {"mode": "eval", "cs_ip": "h:1"},
                      {"mode": "eval_all"}, {"mode": "eval_all", "cs_ip": "h:1"},
                      {"mode": "train", "cs_ip": "h:1", "compile_only": True}):
        check_env(runconfig)


def test_save_params_writes_params_yaml_and_refuses_an_unwritable_dir(tmp_path):
    path = save_params({"runconfig": {"max_steps": 3}}, str(tmp_path / "md"))
    assert yaml.safe_load(open(path)) == {"runconfig": {"max_steps": 3}}
    (tmp_path / "file").write_text("x")
    with pytest.raises(CSRunError, match=r"cannot write to model_dir .*file/md: Not a directory"):
        save_params({}, str(tmp_path / "file" / "md"))


def bad_run_cases(tmp_path):
    good = yaml.safe_load(open(os.path.join(FC_MNIST, "configs", "params.yaml")))
    unknown = {**good, "runconfig": {**good["runconfig"], "save_every": 5}}
    (tmp_path / "unknown.yaml").write_text(yaml.safe_dump(unknown))
    (tmp_path / "broken.yaml").write_text("model:\n  hidden_sizes: [500, 300\n")
    (tmp_path / "file").write_text("x")
    return {
        "missing params": (["-p", "nope.yaml"], "params file nope.yaml not found"),
        "malformed yaml": (["-p", "broken.yaml"], "params file broken.yaml is not valid YAML at line"),
        "unknown key": (["-p", "unknown.yaml"], "unknown runconfig key 'save_every' in unknown.yaml"),
        "both compile flags": (["--validate_only", "--compile_only"], "--validate_only and --compile_only"),
        "unwritable model_dir": (["-o", "file/md"], "cannot write to model_dir file/md"),
    }


@pytest.mark.slow
def test_bad_run_py_inputs_end_in_one_line_and_exit_1(tmp_path):
    """Each through a real `python run.py`: one `run.py: error: … (hint: …)` line, no traceback."""
    cases = bad_run_cases(tmp_path)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    procs = {name: subprocess.Popen([sys.executable, os.path.join(FC_MNIST, "run.py"), *args],
                                    cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, env=env)
             for name, (args, _) in cases.items()}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=180)
        lines = [line for line in err.splitlines() if line.startswith("run.py: error:")]
        assert proc.returncode == 1, (name, err)
        assert len(lines) == 1 and cases[name][1] in lines[0] and "(hint: " in lines[0], (name, err)
        assert "Traceback" not in err + out, (name, err)
    assert not os.path.exists(tmp_path / "model_dir" / "checkpoint")  # nothing ran
