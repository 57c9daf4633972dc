"""The shared run flow through the CNN digits example: every CPU mode of run.py."""
from __future__ import annotations

import os

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from examples.cnn_digits import data, model
from launcher.run_flow import run
from tf_model.checkpoints import all_checkpoints

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.join(ROOT, "examples", "cnn_digits")


def flow(*argv: str) -> None:
    run(model.model_fn, data.train_input_fn, data.eval_input_fn, here=HERE, argv=list(argv))


@pytest.mark.slow
def test_every_cpu_mode_of_the_run_flow(tmp_path, capsys):
    with open(os.path.join(HERE, "configs", "params.yaml")) as f:
        params = yaml.safe_load(f)
    params["runconfig"].update(save_checkpoints_steps=10, keep_checkpoint_max=5)
    params["eval_input"]["batch_size"] = 99
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    md = str(tmp_path / "md")
    flow("-p", str(path), "-o", md, "--mode", "train_and_eval", "--max_steps", "20")
    out = capsys.readouterr().out
    assert "Saving dict for global step 10: accuracy = " in out
    assert "Saving dict for global step 20: accuracy = " in out
    assert yaml.safe_load(open(os.path.join(md, "params.yaml")))["runconfig"]["max_steps"] == 20

    flow("-p", str(path), "-o", md, "--mode", "train", "--steps", "10")
    assert [p.rsplit("-", 1)[1] for p in all_checkpoints(md)] == ["10", "20", "30"]
    flow("-p", str(path), "-o", md, "--mode", "eval_all", "--eval_steps", "2")
    flow("-p", str(path), "-o", md, "--mode", "predict")
    out = capsys.readouterr().out
    for step in (10, 20, 30):
        assert f"Saving dict for global step {step}: accuracy = " in out
    assert "Wrote 297 predictions of step" in out and os.path.exists(
        os.path.join(md, "predict", "predictions-30.npz"))
    acc = EventAccumulator(os.path.join(md, "eval"))
    acc.Reload()
    assert sorted({e.step for e in acc.Scalars("accuracy")}) == [10, 20, 30]


@pytest.mark.parametrize("mode, graph", [("train", "train"), ("train_and_eval", "train"), ("eval", "eval"),
                                         ("eval_all", "eval"), ("predict", "infer")])
def test_validate_only_prints_the_compilers_verdict_on_the_graph_of_the_mode(tmp_path, capsys, mode, graph):
    flow("-o", str(tmp_path), "--mode", mode, "--validate_only")
    out = capsys.readouterr().out
    assert "Validation successful" in out and f"Mode: {graph}," in out
