"""Keras 3 weight regularizers whose penalty model_fn never computes (get_regularization_loss()
does not see them) are said once a run, on the CPU path and at compile; a model adding
model.losses or layer.losses trains on the CS like TF, its penalty included."""
from __future__ import annotations

import cs_inprocess
import numpy as np
import pytest
import regularizer_models as reg
from keras.src.layers.layer import Layer

from launcher.estimator import CSEstimator, CSRunConfig

PARAMS = {"batch_size": 8}
WARNING = ("csrun: warning: weights sequential/conv2d/kernel, sequential/dense/kernel have Keras "
           "regularizers whose penalty model_fn never computes")
HINT = "hint: add tf.add_n(model.losses) (or each layer's layer.losses) to the loss"


def estimator(model_dir, penalty: str) -> CSEstimator:
    return CSEstimator(reg.model_fn, model_dir=str(model_dir), config=CSRunConfig(tf_random_seed=1),
                       params={**PARAMS, "penalty": penalty})


def warnings(said: str) -> list[str]:
    return [line for line in said.splitlines() if line.startswith("csrun: warning")]


def test_regularizers_get_regularization_loss_misses_are_said_once_on_the_cpu_and_at_compile(tmp_path, capsys):
    """A Conv2D and a Dense with kernel_regularizer=l2, get_regularization_loss() added."""
    add_weight = Layer.add_weight
    estimator(tmp_path / "cpu", "collection").train(reg.input_fn, max_steps=3)
    said = warnings(capsys.readouterr().out)
    assert len(said) == 1 and said[0].startswith(WARNING) and HINT in said[0]
    compiled = estimator(tmp_path / "cs", "collection").compile(reg.input_fn, validate_only=True)
    said = warnings(capsys.readouterr().out)
    assert len(said) == 1 and said[0].startswith(WARNING)
    assert ("Weights sequential/conv2d/kernel, sequential/dense/kernel: Keras regularizers whose "
            "penalty model_fn never computes") in compiled.report_text
    assert Layer.add_weight is add_weight  # Keras' own method again after model_fn


@pytest.mark.parametrize("penalty", ["model_losses", "layer_losses", "none"])
def test_no_warning_when_the_loss_adds_the_keras_losses_or_nothing_is_regularized(tmp_path, capsys, penalty):
    compiled = estimator(tmp_path, penalty).compile(reg.input_fn, validate_only=True)
    assert warnings(capsys.readouterr().out) == []
    assert "Keras regularizers" not in compiled.report_text


def test_the_penalty_of_model_losses_trains_on_the_cs_like_tf(tmp_path):
    """Its first loss is the unpenalized model's plus 0.05 x the kernels' squares, from the
    same initial weights; both train like TF."""
    runs = {penalty: cs_inprocess.compare(reg.model_fn, reg.input_fn,
                                          {**PARAMS, "penalty": penalty, "runconfig": {"tf_random_seed": 3}},
                                          str(tmp_path / penalty), steps=4)
            for penalty in ("model_losses", "collection")}
    assert [cs_inprocess.mismatches(run) for run in runs.values()] == [[], []]
    weights = runs["model_losses"].compiled.initial_weights
    penalty = 0.05 * sum(float(np.sum(np.square(w))) for name, w in weights.items() if "kernel" in name)
    for losses in (runs["model_losses"].cs.losses, runs["model_losses"].reference.losses):
        assert losses[0] == pytest.approx(runs["collection"].reference.losses[0] + penalty, rel=1e-5)
