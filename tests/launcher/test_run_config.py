"""The run's configuration: one typed record built from params.yaml, run.py's flags and the
job's CS, the same for run.py, a script on the original's helpers and the user API."""
from __future__ import annotations

import pytest
import yaml

from common.errors import CSRunError
from common.run_settings import check_steps
from launcher.estimator import CSEstimator, CSRunConfig
from launcher.run_config import run_config
from launcher.run_utils import create_arg_parser, get_csrunconfig_dict, get_params, update_params_from_args


def test_params_flags_and_the_jobs_cs_make_one_typed_record(tmp_path, monkeypatch):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"runconfig": {"max_steps": 50, "save_summary_steps": None,
                                                  "cs_ip": "yaml-cs", "validate_only": None,
                                                  "disable_standard_logs": True}}))
    args = create_arg_parser("/ex/model_dir").parse_args(["--steps", "5", "--compile_only"])
    monkeypatch.setenv("CSRUN_CS_IP", "job-cs")
    config = run_config(get_params(str(path))["runconfig"], str(path), args)
    assert (config.steps, config.max_steps, config.compile_only, config.validate_only) == (5, None, True, False)
    assert (config.model_dir, config.cs_ip, config.mode) == ("/ex/model_dir", "job-cs:9000", "train")
    assert config.save_summary_steps is None and config.keep_checkpoint_max == 5  # YAML's null: never
    assert config.step_log_steps is None  # disable_standard_logs
    # a script on the original's helpers gets the same settings in its dict
    runconfig = get_params(str(path))["runconfig"]
    update_params_from_args(args, runconfig)
    assert runconfig == config.as_dict()
    assert CSRunConfig(**get_csrunconfig_dict(runconfig)).step_log_steps is None


def test_a_number_of_steps_is_checked_by_one_rule_wherever_it_is_given(tmp_path):
    """params.yaml, run.py's flags, CSRunConfig and train(): each one line naming the value."""
    path = tmp_path / "p.yaml"
    path.write_text("runconfig: {save_checkpoints_steps: -2}\n")
    cases = [(lambda: get_params(str(path)), "runconfig.save_checkpoints_steps in .*p.yaml is -2, "
                                              "not a whole number >= 0"),
             (lambda: run_config({}, args=create_arg_parser("md").parse_args(["--max_steps", "-1"])),
              "--max_steps -1 is not a whole number >= 0"),
             (lambda: CSRunConfig(eval_steps=1.5), "CSRunConfig eval_steps=1.5 is not a whole number >= 0"),
             (lambda: check_steps(True, None), "steps=True is not a whole number >= 0")]
    for call, message in cases:
        with pytest.raises(CSRunError, match=message):
            call()


def test_a_bad_cs_address_in_the_params_is_refused_before_the_run(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("runconfig: {cs_ip: 'host:port'}\n")
    with pytest.raises(CSRunError, match="--cs_ip 'host:port' is not HOST:PORT"):
        get_params(str(path))


def test_the_estimator_takes_the_records_cs_and_model_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("CSRUN_CS_IP", raising=False)
    estimator = CSEstimator(lambda *a: None, config=CSRunConfig(model_dir=str(tmp_path), cs_ip="10.0.0.5"))
    assert estimator.model_dir == str(tmp_path) and estimator.config.cs_ip == "10.0.0.5:9000"
    assert estimator.settings.cs_ip == "10.0.0.5:9000"
