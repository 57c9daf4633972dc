"""CSEstimator / CSRunConfig: the original's signatures, and where each call runs."""
from __future__ import annotations

import dataclasses
import inspect
import socket

import pytest

from common.errors import CSRunError
from examples.fc_mnist import data, model
from launcher import estimator as api
from launcher.estimator import CSEstimator, CSRunConfig


def test_signatures_are_the_originals():
    def names(fn):
        return list(inspect.signature(fn).parameters)

    assert names(CSEstimator.__init__) == ["self", "model_fn", "model_dir", "compile_dir", "config",
                                           "params", "warm_start_from"]
    assert names(CSEstimator.compile) == ["self", "input_fn", "validate_only", "mode"]
    assert names(CSEstimator.train) == ["self", "input_fn", "steps", "max_steps", "hooks", "use_cs"]
    assert names(CSEstimator.evaluate) == ["self", "input_fn", "steps", "checkpoint_path", "use_cs"]
    assert names(CSEstimator.predict) == ["self", "input_fn", "predict_keys", "checkpoint_path",
                                          "yield_single_examples", "num_samples", "use_cs"]
    assert {"CSEstimatorSpec", "ModeKeys"} <= set(api.__all__)


def test_run_config_is_frozen_and_checks_its_numbers():
    config = CSRunConfig(save_checkpoints_steps=10)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.save_checkpoints_steps = 5  # type: ignore[misc]
    with pytest.raises(CSRunError, match="save_summary_steps=-1"):
        CSRunConfig(save_summary_steps=-1)
    with pytest.raises(CSRunError, match="keep_checkpoint_max='5'"):
        CSRunConfig(keep_checkpoint_max="5")  # type: ignore[arg-type]


def test_the_seed_and_a_csrun_wse_cs_address_reach_the_estimator(tmp_path, monkeypatch):
    monkeypatch.setenv("CSRUN_CS_IP", "10.0.0.5:9000")
    params = {"model": {"hidden_sizes": [4]}}
    est = CSEstimator(model.model_fn, str(tmp_path), config=CSRunConfig(tf_random_seed=3), params=params)
    assert est.config.cs_ip == "10.0.0.5:9000"
    assert est.params["runconfig"]["tf_random_seed"] == 3 and "runconfig" not in params


def test_train_goes_to_the_cs_when_one_is_configured_and_to_the_cpu_otherwise(tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{s.getsockname()[1]}"
    params = {"train_input": {"batch_size": 16, "data_dir": None}, "model": {"hidden_sizes": [8]},
              "optimizer": {"optimizer_type": "sgd", "learning_rate": 0.1}}
    est = CSEstimator(model.model_fn, str(tmp_path), params=params,
                      config=CSRunConfig(cs_ip=closed, log_step_count_steps=None))
    with pytest.raises(CSRunError, match=f"cannot reach the CS system at {closed}"):
        est.train(data.train_input_fn, max_steps=2)
    est.train(data.train_input_fn, max_steps=2, use_cs=False)
    assert (tmp_path / "model.ckpt-2.index").exists()
    with pytest.raises(CSRunError, match="both steps and max_steps"):
        est.train(data.train_input_fn, steps=1, max_steps=2, use_cs=False)


def test_recorded_compiles_hand_over_what_the_estimator_compiled(tmp_path, capsys):
    params = {"train_input": {"batch_size": 16, "data_dir": None}, "model": {"hidden_sizes": [8]},
              "optimizer": {"optimizer_type": "sgd", "learning_rate": 0.1}}
    est = CSEstimator(model.model_fn, str(tmp_path), params=params)
    with api.recorded_compiles() as outer:
        est.compile(data.train_input_fn, validate_only=True)
        with api.recorded_compiles() as inner:
            compiled = est.compile(data.train_input_fn)
    est.compile(data.train_input_fn)  # no recorder open: nothing recorded
    assert [c.result for c in outer] == [outer[0].result, compiled] and inner[0].result is compiled
    assert outer[0].result.program is None and compiled.program.batch_size == 16
    call = inner[0]
    assert (call.input_fn, call.params, call.mode) == (data.train_input_fn, est.params, "train")
    assert len(outer) == 2 and len(inner) == 1 and not api.recorders
    assert "Validation successful" in capsys.readouterr().out
