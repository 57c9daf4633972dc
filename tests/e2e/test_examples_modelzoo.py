"""A run.py in the original modelzoo's shape (`launcher.run_utils` helpers called as the
original's are: `update_params_from_args(args, params["runconfig"])`, then
`use_cs=is_cs(runconfig)`) trains on the job's CS under `csrun_wse`, with the CPU path's losses."""
from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from fc_mnist_runs import ENV, fc_mnist_params, losses

STEPS = 6
MODELZOO_RUN_PY = '''
import os
import sys

from examples.fc_mnist.data import train_input_fn
from examples.fc_mnist.model import model_fn
from launcher.estimator import CSEstimator, CSRunConfig
from launcher.run_utils import check_env, create_arg_parser, get_params, is_cs, save_params, update_params_from_args


def main():
    parser = create_arg_parser(os.path.join(os.path.dirname(os.path.abspath(__file__)), "model_dir"))
    args = parser.parse_args(sys.argv[1:])
    params = get_params(args.params)
    runconfig = params["runconfig"]
    update_params_from_args(args, runconfig)
    save_params(params, model_dir=runconfig["model_dir"])
    use_cs = is_cs(runconfig)
    check_env(runconfig)
    config = CSRunConfig(cs_ip=runconfig["cs_ip"], log_step_count_steps=runconfig["log_step_count_steps"],
                         save_checkpoints_steps=runconfig["save_checkpoints_steps"])
    est = CSEstimator(model_fn=model_fn, model_dir=runconfig["model_dir"], config=config, params=params)
    est.train(input_fn=train_input_fn, steps=runconfig["steps"], max_steps=runconfig["max_steps"], use_cs=use_cs)


if __name__ == "__main__":
    main()
'''


def run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    result = subprocess.run(command, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.mark.slow
def test_a_modelzoo_shaped_run_py_trains_on_the_jobs_cs_in_every_task(tmp_path):
    (tmp_path / "run.py").write_text(MODELZOO_RUN_PY)
    params = fc_mnist_params(tmp_path, steps=STEPS, every=STEPS)
    cpu = run(["python", "run.py", "--mode", "train", "-p", str(params), "-o", "cpu"], tmp_path)
    cs = run(["csrun_wse", "--tasks-per-node", "3", "--job-dir", "job", "python", "run.py",
              "--mode", "train", "-p", str(params), "-o", "cs"], tmp_path)
    assert "Simulated CS system:" in cs.stdout, cs.stdout + cs.stderr  # the chief trained on the CS
    assert sorted(losses(cs.stdout)) == list(range(1, STEPS + 1))
    np.testing.assert_allclose([losses(cs.stdout)[s] for s in range(1, STEPS + 1)],
                               [losses(cpu.stdout)[s] for s in range(1, STEPS + 1)], rtol=1e-3)
    for worker in ("1", "2"):  # both input workers streamed to it
        log = next((tmp_path / "job").glob(f"*_{worker}_log.out")).read_text()
        assert f"input worker {int(worker) - 1}: sent" in log, log
