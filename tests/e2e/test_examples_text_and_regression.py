"""The transformer text classifier and the raw-ops regression: each learns on the CPU path,
and trains on the CS (in process) with TensorFlow's losses and weights."""
from __future__ import annotations

import importlib
import os

import cs_inprocess
import pytest
import yaml

from launcher.estimator import CSEstimator, CSRunConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.slow


def example(name: str):
    """(model module, data module, params) of examples/<name>."""
    with open(os.path.join(ROOT, "examples", name, "configs", "params.yaml")) as f:
        params = yaml.safe_load(f)
    return (importlib.import_module(f"examples.{name}.model"),
            importlib.import_module(f"examples.{name}.data"), params)


def trained_on_cpu(name: str, steps: int, model_dir: str) -> dict:
    model, data, params = example(name)
    estimator = CSEstimator(model.model_fn, model_dir=model_dir, params=params,
                            config=CSRunConfig(tf_random_seed=params["runconfig"]["tf_random_seed"]))
    estimator.train(data.train_input_fn, max_steps=steps, use_cs=False)
    return estimator.evaluate(data.eval_input_fn)


def test_transformer_text_classifier_learns_the_rule_on_the_cpu(tmp_path):
    metrics = trained_on_cpu("transformer_text", 200, str(tmp_path))
    assert metrics["accuracy"] > 0.9  # 4 classes: chance is 0.25


def test_raw_regression_predicts_diabetes_progression_on_the_cpu(tmp_path):
    metrics = trained_on_cpu("raw_regression", 300, str(tmp_path))
    assert metrics["rmse"] < 0.8  # standardised target: predicting the mean scores 1.0


@pytest.mark.parametrize("name", ["transformer_text", "raw_regression"])
def test_example_trains_on_the_cs_like_tensorflow(name, tmp_path):
    model, data, params = example(name)
    result = cs_inprocess.compare(model.model_fn, data.train_input_fn, params, str(tmp_path),
                                  steps=20)
    cs_inprocess.assert_same_training(result)
    for mismatch in (cs_inprocess.evaluation_mismatch, cs_inprocess.prediction_mismatch):
        problem = mismatch(model.model_fn, data.eval_input_fn, params, str(tmp_path), result)
        assert not problem, problem
