"""The other tf.compat.v1.train optimizers on the CS: Adadelta and FTRL with a learning-rate
schedule, FTRL (ApplyFtrl and, with l2 shrinkage, ApplyFtrlV2; lr_power other than -0.5 refused),
ProximalAdagrad and ProximalGradientDescent (l1 and l2) train a user-style model as
TensorFlow does, their slots under TF's names; all also on an embedding's sparse gradient
(FTRL on a table of one column too). An optimizer the CS does not carry out is refused in one
line whose hint names the ones it does."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from cs_inprocess import assert_resume_is_unbroken, assert_same_training, compare, compile_checked

from common.errors import CSRunError
from tf_model.estimator_spec import CSEstimatorSpec

v1 = tf.compat.v1.train


def _decayed(rate: float):
    return v1.exponential_decay(rate, v1.get_or_create_global_step(), 3, 0.5, staircase=True)


OPTIMIZERS = {
    "adadelta_schedule": lambda: v1.AdadeltaOptimizer(_decayed(1.0), rho=0.9, epsilon=1e-6),
    "ftrl": lambda: v1.FtrlOptimizer(0.1, l1_regularization_strength=0.001,
                                     l2_regularization_strength=0.01),
    "ftrl_v2_schedule": lambda: v1.FtrlOptimizer(_decayed(0.1), initial_accumulator_value=0.2,
                                        l1_regularization_strength=0.001,
                                        l2_regularization_strength=0.01,
                                        l2_shrinkage_regularization_strength=0.02),
    "ftrl_power": lambda: v1.FtrlOptimizer(0.1, learning_rate_power=-0.3),
    "adadelta_rho_schedule": lambda: v1.AdadeltaOptimizer(1.0, rho=1.0 - _decayed(0.1)),
    "proximal_adagrad": lambda: v1.ProximalAdagradOptimizer(0.1, l1_regularization_strength=1e-3,
                                                            l2_regularization_strength=1e-2),
    "proximal_sgd": lambda: v1.ProximalGradientDescentOptimizer(
        0.1, l1_regularization_strength=1e-3, l2_regularization_strength=1e-2),
    "adagrad_da": lambda: v1.AdagradDAOptimizer(0.1, v1.get_or_create_global_step()),
}


def input_fn(params):
    rng = np.random.default_rng(2)
    ids = rng.integers(0, 20, size=(64, 5)).astype(np.int32)  # ids repeat in every batch
    labels = (ids[:, 0] % 4).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((ids, labels)).repeat().batch(16, drop_remainder=True)


def model_fn(features, labels, mode, params):
    """Embedding (or one-hot features) -> Dense relu -> logits, the optimizer by name."""
    if params["embedding"]:  # its columns
        table = tf.keras.layers.Embedding(20, params["embedding"], name="embedding")
        hidden = tf.reduce_mean(table(features), 1)
    else:
        hidden = tf.reduce_sum(tf.one_hot(features, 20), 1)
    hidden = tf.keras.layers.Dense(12, activation="relu", name="dense")(hidden)
    logits = tf.keras.layers.Dense(4, name="logits")(hidden)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    train_op = OPTIMIZERS[params["optimizer"]]().minimize(
        loss, global_step=v1.get_or_create_global_step())
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op)


@pytest.mark.slow
@pytest.mark.parametrize("optimizer, embedding, line", [
    ("adadelta_schedule", 0, "adadelta, learning rate from a schedule, rho 0.9, epsilon 1e-06"),
    ("adadelta_schedule", 8, "adadelta, learning rate from a schedule, rho 0.9, epsilon 1e-06"),
    ("ftrl", 0, "ftrl, learning rate 0.1, lr_power -0.5, l1 0.001, l2 0.01, l2_shrinkage 0, "
                    "initial accumulator 0.1"),
    # (FtrlOptimizer's l2 is l2 + beta / (2 * max(lr, 1e-36)): a schedule too)
    ("ftrl_v2_schedule", 8, "ftrl, learning rate from a schedule, lr_power -0.5, l1 0.001, "
                            "l2 from a schedule, l2_shrinkage 0.02, initial accumulator 0.2"),
    # (a table of one column: TF's scalar path, its square roots by glibc's powf)
    ("ftrl", 1, "ftrl, learning rate 0.1, lr_power -0.5, l1 0.001, l2 0.01, l2_shrinkage 0, "
                    "initial accumulator 0.1"),
    ("proximal_adagrad", 8, "proximal_adagrad, learning rate 0.1, l1 0.001, l2 0.01, "
                                "initial accumulator 0.1"),
    ("proximal_sgd", 8, "proximal_sgd, learning rate 0.1, l1 0.001, l2 0.01"),
], ids=["adadelta_schedule", "adadelta_schedule_sparse", "ftrl", "ftrl_v2_schedule_sparse",
        "ftrl_one_column_sparse",
        "proximal_adagrad_sparse", "proximal_sgd_sparse"])
def test_trains_as_tensorflow_trains(optimizer, embedding, line, tmp_path):
    """8 steps on the CS and on TF from the same weights: losses, weights and slots within
    1e-5 (Adadelta and ProximalAdagrad: TF's approximate rsqrt, a few ULP per step)."""
    params = {"optimizer": optimizer, "embedding": embedding}
    run = compare(model_fn, input_fn, params, str(tmp_path), steps=8)
    assert_same_training(run, rtol=1e-5)
    slots = {"adadelta": ("Adadelta", "Adadelta_1"), "ftrl": ("Ftrl", "Ftrl_1"),
             "proximal_adagrad": ("ProximalAdagrad",), "proximal_sgd": ()}[line.split(",")[0]]
    trained = ("dense/kernel", "embedding/embeddings") if embedding else ("dense/kernel",)
    assert {f"{v}/{s}" for v in trained for s in slots} <= set(run.cs.state)
    report = run.compiled.report_text
    assert f"Optimizer: {line}\n" in report
    if embedding:
        assert "sparse updates: embedding/embeddings" in report


@pytest.mark.slow
def test_a_run_resumed_from_a_checkpoint_continues_ftrl(tmp_path):
    """4 steps on the CS, its state (slots <var>/Ftrl, Ftrl_1) written as a checkpoint and
    read back: the next 4 steps are those of an unbroken run, and TF resumed from the same
    state agrees."""
    params = {"optimizer": "ftrl", "embedding": 0}
    assert_resume_is_unbroken(model_fn, input_fn, params, str(tmp_path),
                              {"dense/kernel/Ftrl", "dense/kernel/Ftrl_1"})


@pytest.mark.parametrize("optimizer, embedding, says", [
    ("adagrad_da", 0, "with ResourceApplyAdagradDA, an optimizer update the CS does not "
                          "carry out (ResourceApplyAdagradDA '"),
    ("ftrl_power", 0, "FTRL's learning_rate_power is -0.3: the CS carries out -0.5 only"),
    ("adadelta_rho_schedule", 0, "the rho of the adadelta optimizer is computed per step; "
                                 "the CS takes schedules of its learning_rate only"),
], ids=["adagrad_da", "ftrl_power", "adadelta_rho_schedule"])
def test_an_optimizer_the_cs_does_not_carry_out_is_refused_naming_those_it_does(
        optimizer, embedding, says, tmp_path):
    with pytest.raises(CSRunError) as error:
        compile_checked(model_fn, input_fn, {"optimizer": optimizer, "embedding": embedding},
                        str(tmp_path))
    message = error.value.message
    assert "\n" not in message and says in message and "test_compiler_optimizers.py:" in message
    assert "AdadeltaOptimizer, FtrlOptimizer, ProximalAdagradOptimizer, " \
           "ProximalGradientDescentOptimizer" in error.value.hint
