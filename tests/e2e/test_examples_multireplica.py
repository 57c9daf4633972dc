"""Multireplica through an example's run.py (in process, against a CS system serving on a
local port): the `--multireplica` flag and the `runconfig.num_replicas` key reach the
compiler, a run resumes across replica counts, evaluation runs one copy saying so, and the
CPU path says that copies exist on the CS only."""
from __future__ import annotations

import glob
import json
import os

import pytest
import yaml

from examples.fc_mnist.data import eval_input_fn, train_input_fn
from examples.fc_mnist.model import PARAMS_SPEC, model_fn
from launcher.run_flow import run
from tf_model import checkpoints

HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                    "examples", "fc_mnist")


def fc_mnist(*argv: str) -> None:
    run(model_fn, train_input_fn, eval_input_fn, here=HERE, argv=list(argv), params_spec=PARAMS_SPEC)


def replica_counts(model_dir) -> list[int]:
    """The replicas of each compile in model_dir, in the order they were written."""
    reports = sorted(glob.glob(os.path.join(model_dir, "cs_compile", "*", "compile_report.json")),
                     key=os.path.getmtime)
    counts = []
    for path in reports:
        with open(path) as f:
            counts.append(json.load(f)["replicas"]["count"])
    return counts


@pytest.mark.slow
def test_the_flag_and_the_key_reach_the_cs_through_run_py(tmp_path, server, capsys):
    model_dir = str(tmp_path / "model_dir")
    fc_mnist("--mode", "train", "--multireplica", "--cs_ip", server.address, "--max_steps", "2",
             "-o", model_dir)
    chosen = replica_counts(model_dir)
    assert len(chosen) == 1 and chosen[0] > 1 and 256 % chosen[0] == 0  # the compiler's choice
    with open(os.path.join(model_dir, "params.yaml")) as f:
        assert yaml.safe_load(f)["runconfig"]["multireplica"] is True
    assert checkpoints.checkpoint_step(checkpoints.latest_checkpoint(model_dir)) == 2

    with open(os.path.join(HERE, "configs", "params.yaml")) as f:
        params = yaml.safe_load(f)
    params["runconfig"]["num_replicas"] = 2
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    fc_mnist("-p", str(path), "--mode", "train", "--cs_ip", server.address, "--max_steps", "3",
             "-o", model_dir)  # resumes from step 2 with two replicas
    assert replica_counts(model_dir) == [chosen[0], 2]
    assert checkpoints.checkpoint_step(checkpoints.latest_checkpoint(model_dir)) == 3
    capsys.readouterr()

    fc_mnist("-p", str(path), "--mode", "eval", "--eval_steps", "1", "--cs_ip", server.address,
             "-o", model_dir)
    out = capsys.readouterr().out
    assert "multireplica is for training (as on the original CS system): eval runs on one copy " \
           "of the network" in out
    assert replica_counts(model_dir)[-1] == 1

    fc_mnist("-p", str(path), "--mode", "eval", "--eval_steps", "1", "-o", model_dir)  # the CPU
    assert "multireplica: copies of the network run on the CS system only; on the CPU the model " \
           "runs as one copy (the same updates)" in capsys.readouterr().out
