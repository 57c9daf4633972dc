"""run_utils (params, flags, checks) and the one-line errors of `python run.py`."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest
import yaml

from common.errors import CSRunError
from coordinator.roles import run_cs_ip
from launcher.estimator import CSRunConfig, FullConfig, cs_disable_summaries, cs_enable_summaries
from launcher.params_spec import check_params
from launcher.run_utils import (
    check_env,
    create_arg_parser,
    create_warm_start_settings,
    get_csconfig,
    get_csrunconfig_dict,
    get_params,
    is_cs,
    save_params,
    save_predictions,
    update_params_from_args,
)

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


def test_the_jobs_cs_overrides_the_yaml_and_the_flag_overrides_both(tmp_path, monkeypatch):
    """Inside a csrun_wse task (CSRUN_CS_IP) the job's CS is the default of the original's
    two-argument `update_params_from_args` and of `is_cs`; run.py's --cs_ip still wins."""
    parser = create_arg_parser("/default/model_dir")
    path = write_params(tmp_path / "p.yaml", {"cs_ip": "yaml-cs"})
    for flags, job, expected in (([], None, "yaml-cs:9000"), ([], "job-cs:1", "job-cs:1"),
                                 (["--cs_ip", "flag-cs:2"], "job-cs:1", "flag-cs:2")):
        if job:
            monkeypatch.setenv("CSRUN_CS_IP", job)
        rc = get_params(path)["runconfig"]
        update_params_from_args(parser.parse_args(flags), rc)
        assert rc["cs_ip"] == expected
    assert run_cs_ip() == "job-cs:1" and is_cs({"cs_ip": None})  # a script that skips update_params_from_args
    monkeypatch.delenv("CSRUN_CS_IP")
    assert run_cs_ip() is None and not is_cs({"cs_ip": None})


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


def test_only_the_chief_of_a_job_saves_params(tmp_path, monkeypatch):
    """A modelzoo run.py calls save_params in every task; an input worker writes nothing (the
    chief's model_dir lock clears other writers' temporary files)."""
    monkeypatch.setenv("CSRUN_TASK_RANK", "1")
    monkeypatch.setenv("CSRUN_NUM_TASKS", "3")
    save_params({"runconfig": {}}, str(tmp_path / "md"))
    assert not (tmp_path / "md").exists()


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


# ---- the original's params keys and flags (issue 20) ----
ORIGINAL_PARAMS = """
description: "every key the original documents"
train_input: {data_dir: ./tfds, batch_size: 16, shuffle: true, shuffle_seed: 1, num_parallel_calls: 0,
              shuffle_buffer: 100, num_parallel_reads: 4, repeat: true}
eval_input: {data_dir: [./a, ./b], batch_size: 16, shuffle: false}
model: {mixed_precision: false, boundary_casting: true, tf_summary: false, hidden_sizes: [8]}
optimizer: {optimizer_type: adam, learning_rate: 0.001, epsilon: '1e-6', loss_scaling_factor: dynamic,
            initial_loss_scale: 32768.0, max_loss_scale: 2147483648.0, max_gradient_norm: 1.0}
csconfig: {use_cbfloat16: true, some_stack_setting: 3}
runconfig: {mode: train, max_steps: 10, multireplica: false, enable_distributed: false, throttle_secs: 0,
            num_wgt_servers: 12, enable_gpu_optimizations: false, checkpoint_path: null,
            disable_standard_logs: true, disable_input_pipeline_ckpt: true, device: /gpu:0}
"""


def test_every_original_key_is_accepted_and_those_meaning_nothing_here_say_so_once(tmp_path, capsys):
    params = get_params(write_params(tmp_path / "p.yaml", text=ORIGINAL_PARAMS))
    update_params_from_args(create_arg_parser("md").parse_args(["--multireplica"]), params["runconfig"])
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note: ")]
    noted = sorted(line.split(" = ")[0].removeprefix("note: ") for line in notes)
    assert noted == ["csconfig.some_stack_setting", "csconfig.use_cbfloat16", "model.boundary_casting",
                     "runconfig.device", "runconfig.disable_input_pipeline_ckpt",
                     "runconfig.num_wgt_servers"], notes
    assert all(": not used" in n or "this host's CPU" in n for n in notes)
    rc = params["runconfig"]
    assert rc["multireplica"] is True and rc["disable_standard_logs"] is True  # carried in params
    assert get_csrunconfig_dict(rc)["log_step_count_steps"] is None  # disable_standard_logs honoured
    assert params["model"]["mixed_precision"] is False and params["csconfig"]["some_stack_setting"] == 3


def test_the_originals_run_py_flags(tmp_path):
    rc = get_params(write_params(tmp_path / "p.yaml", {}))["runconfig"]
    assert (rc["multireplica"], rc["checkpoint_path"], rc["device"]) == (False, None, None)
    flags = ["--multireplica", "--checkpoint_path", "md/model.ckpt-4", "--device", "/cpu:0"]
    update_params_from_args(create_arg_parser("md").parse_args(flags), rc)
    assert (rc["multireplica"], rc["checkpoint_path"], rc["device"]) == (True, "md/model.ckpt-4", "/cpu:0")


def test_the_default_params_file_is_beside_run_py():
    assert create_arg_parser("/ex/model_dir").parse_args([]).params == "/ex/configs/params.yaml"


@pytest.mark.parametrize("text, message", [
    ("runconfig: {multireplca: false}", "unknown runconfig key 'multireplca' .* did you mean 'multireplica'"),
    ("runconfig: {throttle_sec: 5}", "unknown runconfig key 'throttle_sec' .* did you mean 'throttle_secs'"),
    ("runconfig: {save_every: 5}", "unknown runconfig key 'save_every' .*known keys: "),
    ("model: {mixed_precison: true}", "unknown model key 'mixed_precison' .* did you mean 'mixed_precision'"),
    ("optimizer: {loss_scaling_factr: 2.0}", "did you mean 'loss_scaling_factor'"),
    ("runconfg: {max_steps: 5}", "unknown params section key 'runconfg' .* did you mean 'runconfig'"),
    ("runconfig: {multireplica: 'yes'}", "runconfig.multireplica in .* is 'yes', not true or false"),
    ("runconfig: {throttle_secs: -1}", "runconfig.throttle_secs in .* is -1, not a number >= 0"),
])
def test_a_misspelt_or_mistyped_key_is_refused_naming_the_nearest(tmp_path, text, message):
    with pytest.raises(CSRunError, match=message):
        get_params(write_params(tmp_path / "p.yaml", text=text))


def test_a_misspelt_model_key_is_refused_naming_the_specs_key(tmp_path):
    from examples.fc_mnist.model import PARAMS_SPEC
    params = yaml.safe_load(open(os.path.join(FC_MNIST, "configs", "params.yaml")))
    params["model"]["hiden_sizes"] = params["model"].pop("hidden_sizes")
    with pytest.raises(CSRunError, match="unknown model key 'hiden_sizes' .*did you mean 'hidden_sizes'"):
        check_params(params, PARAMS_SPEC, "p.yaml")
    params["model"]["hidden_sizes"] = params["model"].pop("hiden_sizes")
    params["model"]["my_own_setting"] = 1  # a key the model may read: left to it
    check_params(params, PARAMS_SPEC, "p.yaml")


def test_every_flag_named_for_a_runconfig_key_overrides_the_yaml(tmp_path):
    """As the original's update_params_from_args: a run.py's own flags (the GPT-2's
    --save_checkpoints_steps, --save_summary_steps) count, not only csrun's parser's; a bad
    value is one line naming the flag."""
    parser = create_arg_parser("md")
    parser.add_argument("--save_checkpoints_steps", type=int)
    parser.add_argument("--save_summary_steps", type=int)
    rc = get_params(write_params(tmp_path / "p.yaml", {"save_checkpoints_steps": 100}))["runconfig"]
    update_params_from_args(parser.parse_args(["--save_checkpoints_steps", "2", "--save_summary_steps", "3"]), rc)
    assert (rc["save_checkpoints_steps"], rc["save_summary_steps"]) == (2, 3)
    assert get_csrunconfig_dict(rc)["save_checkpoints_steps"] == 2
    with pytest.raises(CSRunError, match="--save_summary_steps -3 is not a whole number >= 0"):
        update_params_from_args(parser.parse_args(["--save_summary_steps", "-3"]), rc)


def test_the_originals_helpers_read_their_keys_of_any_dict(tmp_path, monkeypatch):
    """`is_cs(params)` with the whole params, or a runconfig the script keeps more keys in,
    answers as the original's (inside a job: the job's CS), not 'unknown runconfig key'."""
    params = {"description": "FC-MNIST", "train_input": {"batch_size": 8},
              "runconfig": {"mode": "eval", "cs_ip": None, "params": "configs/params.yaml"}}
    monkeypatch.delenv("CSRUN_CS_IP", raising=False)
    assert not is_cs(params) and not is_cs(params["runconfig"])
    monkeypatch.setenv("CSRUN_CS_IP", "job-cs:1")
    assert is_cs(params) and is_cs(params["runconfig"]) and is_cs(CSRunConfig())
    check_env(params["runconfig"])
    assert get_csrunconfig_dict({**params["runconfig"], "save_summary_steps": 7})["save_summary_steps"] == 7


def test_the_originals_run_config_arguments_summary_switches_and_prediction_files(tmp_path, monkeypatch):
    config = CSRunConfig(cs_ip=None, system_name=None, cs_config=get_csconfig({"use_cbfloat16": False}),
                         stack_params={}, save_checkpoints_steps=3)
    assert config.save_checkpoints_steps == 3 and config.task_id == 0 and "stack_params" not in config.as_dict()
    monkeypatch.setenv("CSRUN_TASK_RANK", "2")
    monkeypatch.setenv("CSRUN_NUM_TASKS", "3")
    assert config.task_id == 2
    for switch in (cs_enable_summaries, cs_disable_summaries):
        with switch():
            pass
    assert create_warm_start_settings({"checkpoint_path": None}) is None
    warm = create_warm_start_settings({"checkpoint_path": "a/model.ckpt-2"}, exclude_string="output_layer")
    assert warm.checkpoint == "a/model.ckpt-2"
    assert re.match(warm.variables, "bert/encoder/kernel") and not re.match(warm.variables, "output_layer/kernel")
    assert save_predictions(str(tmp_path), iter(())) is None  # an input worker's
    path = save_predictions(str(tmp_path), iter([{"classes": 1}, {"classes": 0}]), name="p_0.npz")
    assert path == str(tmp_path / "predict" / "p_0.npz")
    assert [p["classes"] for p in np.load(path, allow_pickle=True)["arr_0"]] == [1, 0]


def test_a_stack_params_full_config_asks_for_the_replicas_runconfig_asks_for(tmp_path):
    """The original fc_mnist's get_custom_stack_params: FullConfig().target_num_replicas = -1
    under --multireplica, as runconfig says; a disagreement, or a Cerebras compiler tuning,
    is one line."""
    parser = create_arg_parser("md")
    rc = get_params(write_params(tmp_path / "p.yaml", {}))["runconfig"]
    update_params_from_args(parser.parse_args(["--multireplica"]), rc)
    config = FullConfig()
    config.target_num_replicas = -1
    assert CSRunConfig(stack_params={"config": config}, **get_csrunconfig_dict(rc)).replicas is None
    assert CSRunConfig(stack_params={}, **get_csrunconfig_dict({})).replicas == 1
    with pytest.raises(CSRunError, match="target_num_replicas = -1 asks for as many as fit, runconfig for one copy"):
        CSRunConfig(stack_params={"config": config})
    with pytest.raises(CSRunError, match="FullConfig.placement is a setting of the Cerebras stack's compiler"):
        config.placement.optimize_buses.deltat_relative_margin = 0.5
