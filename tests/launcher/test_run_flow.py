"""run.py's mode flow honours the original's run settings: `checkpoint_path` (the checkpoint
eval reads, the one a new training run starts from), `throttle_secs` (train_and_eval) and
`disable_standard_logs`; in process, on the CPU path, FC-MNIST made small."""
from __future__ import annotations

import re

import pytest
import yaml
from fc_mnist_runs import EXAMPLE

from common.errors import CSRunError
from examples.fc_mnist import data, model
from launcher.estimator import CSEstimator, CSRunConfig
from launcher.run_flow import run

EVALUATED = re.compile(r"^Saving dict for global step (\d+):", re.M)


def small_params(folder, **runconfig) -> str:
    params = yaml.safe_load((EXAMPLE / "configs" / "params.yaml").read_text())
    params["model"]["hidden_sizes"] = [16]
    params["train_input"]["batch_size"] = params["eval_input"]["batch_size"] = 32
    params["runconfig"].update(save_checkpoints_steps=1, log_step_count_steps=1, eval_steps=1, **runconfig)
    path = folder / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return str(path)


def run_py(capfd, argv: list) -> str:
    run(model.model_fn, data.train_input_fn, data.eval_input_fn, here=str(EXAMPLE),
        argv=[str(a) for a in argv], params_spec=model.PARAMS_SPEC)
    return capfd.readouterr().out


@pytest.mark.slow
def test_checkpoint_path_throttle_secs_and_disable_standard_logs(tmp_path, capfd):
    throttled = small_params(tmp_path, throttle_secs=3600)
    out = run_py(capfd, ["-p", throttled, "-o", tmp_path / "a", "--mode", "train_and_eval", "--max_steps", 3])
    assert EVALUATED.findall(out) == ["1", "3"]  # the first, then none within the hour but the last
    out = run_py(capfd, ["-p", small_params(tmp_path), "-o", tmp_path / "b", "--mode", "train_and_eval",
                         "--max_steps", 3])
    assert EVALUATED.findall(out) == ["1", "2", "3"]
    assert "global step 3: loss = " in out

    out = run_py(capfd, ["-p", throttled, "-o", tmp_path / "a", "--mode", "eval",
                         "--checkpoint_path", tmp_path / "a" / "model.ckpt-2"])
    assert EVALUATED.findall(out) == ["2"]

    quiet = small_params(tmp_path, disable_standard_logs=True)
    out = run_py(capfd, ["-p", quiet, "-o", tmp_path / "c", "--mode", "train", "--max_steps", 2,
                         "--checkpoint_path", tmp_path / "a" / "model.ckpt-3"])
    assert f"Warm-starting the trainable variables from {tmp_path / 'a' / 'model.ckpt-3'}" in out
    assert "global step" not in out and "Loss for final step" in out


def test_a_warm_start_on_the_cs_is_refused_before_any_work(tmp_path):
    estimator = CSEstimator(model.model_fn, model_dir=str(tmp_path), config=CSRunConfig(cs_ip="127.0.0.1:1"),
                            params={}, warm_start_from=str(tmp_path / "other" / "model.ckpt-3"))
    with pytest.raises(CSRunError, match="warm start, checkpoint_path.* runs on the CPU path only"):
        estimator.train(data.train_input_fn, max_steps=2)
