"""A script without a declared params spec (the modelzoo-shaped FC-MNIST: its own get_params,
model_fn reading `dropout` with a default) gets one note, not an error, for a params key its
model_fn and input_fn never read, naming the nearest key they read; its params.yaml as
shipped (the original's keys) gets none. In process, one CPU training step each."""
from __future__ import annotations

from pathlib import Path

import yaml

from common.params_reads import ReadParams, recording
from examples.modelzoo_fc_mnist import data, model
from examples.modelzoo_fc_mnist.utils import get_params
from launcher.estimator import CSEstimator
from tests.fc_mnist_runs import REPO

PARAMS = REPO / "examples" / "modelzoo_fc_mnist" / "configs" / "params.yaml"


def _train_one_step(tmp_path: Path, change=None) -> None:
    params = yaml.safe_load(PARAMS.read_text())
    params["model"]["mixed_precision"] = False
    if change:
        change(params)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    CSEstimator(model.model_fn, model_dir=str(tmp_path / "m"), params=get_params(str(path))).train(
        data.train_input_fn, steps=1)


def _misspell_dropout(params: dict) -> None:
    params["model"]["dropuot"] = params["model"].pop("dropout")


def test_a_key_model_fn_never_reads_is_noted_with_the_nearest_key_it_reads(tmp_path, capsys):
    _train_one_step(tmp_path, _misspell_dropout)  # trains (the model's default dropout, 0.0)
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("params: ")]
    assert notes == ["params: model.dropuot is never read by model_fn or input_fn; the nearest key "
                     "they read is model.dropout (a misspelling?)"]


def test_the_modelzoo_params_as_shipped_get_no_note(tmp_path, capsys):
    _train_one_step(tmp_path)
    assert "params: " not in capsys.readouterr().out


def test_only_sections_the_code_opens_and_reads_of_the_whole_count():
    params = ReadParams({"train_input": {"batch_size": 4, "shufle": True}, "eval_input": {"batch_size": 9},
                         "model": {"units": 3, "extra": 1}, "runconfig": {"max_steps": 1}},
                        quiet={"train_input": ["batch_size"]})
    with recording(params):
        params["train_input"].get("batch_size")
        dict(params["model"])  # the whole section: every key read
        params["train_input"]["depth"] = 2  # a key the model's code sets is its own
    params["train_input"]["shufle"]  # the toolkit's reads, outside the model's code, do not count
    assert params.unread() == ["params: train_input.shufle is never read by model_fn or input_fn; "
                               "the nearest key they read is train_input.batch_size (a misspelling?)"]
    with recording(params):
        list(params.items())  # the params whole: nothing can be said
    assert params.unread() == []
