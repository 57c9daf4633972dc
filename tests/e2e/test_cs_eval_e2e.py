"""`csrun_wse python run.py --mode eval` of a model whose loss carries weight penalties
(kernel_regularizer + get_regularization_loss()) and whose eval_metric_ops are AUC,
precision and recall (tests/eval_models.py): without --eval_steps it evaluates the whole
finite eval input on the CS, with the CPU path's metrics on the same checkpoint."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from fc_mnist_runs import ENV, REPO, eval_results
from processes import run_py_in_process

pytestmark = pytest.mark.slow

RUN_PY = f"""\
import os, sys
sys.path.insert(0, {str(REPO / "tests")!r})
from eval_models import eval_input_fn, model_fn, train_input_fn
from launcher.run_flow import run

run(model_fn, train_input_fn, eval_input_fn, here=os.path.dirname(os.path.abspath(__file__)))
"""


def test_csrun_wse_evaluates_a_penalised_model_with_the_cpu_paths_metrics(tmp_path: Path):
    configs = tmp_path / "configs"
    configs.mkdir()
    params = {"input": {"batch_size": 16},
              "model": {"penalty": "keras", "dict_labels": False, "single_prediction": False},
              "runconfig": {"max_steps": 10, "tf_random_seed": 7, "log_step_count_steps": 5}}
    (configs / "params.yaml").write_text(yaml.safe_dump(params))
    (tmp_path / "run.py").write_text(RUN_PY)

    def command(*argv: str) -> list[str]:
        return ["python", "run.py", *argv, "-o", "model"]

    run_py_in_process(tmp_path / "run.py", ["--mode", "train", "-o", "model"], tmp_path)
    on_cs = subprocess.Popen(["csrun_wse", "--job-dir", "job", *command("--mode", "eval")], cwd=tmp_path,
                             env=ENV, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    on_cpu = run_py_in_process(tmp_path / "run.py", ["--mode", "eval", "-o", "model"], tmp_path)  # meanwhile
    out, err = on_cs.communicate(timeout=300)
    assert on_cs.returncode == 0, err
    assert "Traceback" not in out + err
    cpu, cs = eval_results(on_cpu), eval_results(out)
    assert cpu["global_step"] == cs["global_step"] == 10
    assert set(cs) == set(cpu) == {"auc", "precision", "recall", "mean_probability", "mean_logit",
                                   "cross_entropy", "recall_at_0.3", "precision_at", "loss", "global_step"}
    assert len(cs["precision_at"]) == 3  # a metric of three thresholds
    for key in cpu:
        assert cs[key] == pytest.approx(cpu[key], rel=1e-4, abs=1e-6), key
    assert cpu["loss"] > cpu["cross_entropy"]  # the penalties are in the evaluated loss
