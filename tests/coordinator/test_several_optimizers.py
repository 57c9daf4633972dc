"""Several optimizers minimizing model_fn's loss in one step, each with its own var_list
(a learning rate per part of the model, SGD on a pretrained body and Adam on a new head, a
second AdamOptimizer with its own beta powers): the CS runs one backward pass and updates
each variable with its group's optimizer, with TF's numbers, slots and step counters; a
checkpoint resumes; the trained model evaluates on the CS. (Two losses trained at once, a
GAN's: test_gans.py.)"""
from __future__ import annotations

import inspect
import json
import os

import numpy as np
import pytest
import tensorflow as tf
import tf_reference
from cs_inprocess import (
    Comparison,
    assert_resume_is_unbroken,
    assert_same_training,
    at_micro_batch,
    cached_comparisons,
    evaluation_mismatch,
    run_on_cs,
)

from common.errors import CSRunError
from coordinator.compiler import compile_model
from cs_api import pb
from tf_model.estimator_spec import CSEstimatorSpec
from wse_sim.errors import CSError
from wse_sim.program import check_program

v1 = tf.compat.v1


def input_fn(params):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(64, 12)).astype(np.float32)
    y = (np.arange(64) % 4).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(16, drop_remainder=True)


def _parts(features, labels):
    """Body (Dense relu) -> head (Dense logits), the cross-entropy, and each part's variables."""
    hidden = tf.keras.layers.Dense(16, activation="relu", name="body")(features)
    logits = tf.keras.layers.Dense(4, name="head")(hidden)
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    body = [v for v in v1.trainable_variables() if v.name.startswith("body/")]
    head = [v for v in v1.trainable_variables() if v.name.startswith("head/")]
    return loss, body, head


def model_fn(features, labels, mode, params):
    """One loss, two optimizers on disjoint var_lists, grouped (or the head's after the
    body's update: `ordered`)."""
    loss, body, head = _parts(features, labels)
    if mode != "train":
        return CSEstimatorSpec(mode=mode, loss=loss)
    step = v1.train.get_or_create_global_step()
    first, second = {
        "sgd_adam": (lambda: v1.train.GradientDescentOptimizer(0.05),
                     lambda: v1.train.AdamOptimizer(0.01)),
        "two_adams": (lambda: v1.train.AdamOptimizer(1e-3),
                      lambda: v1.train.AdamOptimizer(2e-2, beta1=0.5)),
        "momentum_rmsprop": (lambda: v1.train.MomentumOptimizer(0.05, 0.9),
                             lambda: v1.train.RMSPropOptimizer(0.01, momentum=0.5)),
    }[params["optimizers"]]
    body_train = first().minimize(loss, var_list=body)
    if params.get("ordered"):
        with tf.control_dependencies([body_train]):  # (TF still differentiates the one forward)
            head_train = second().minimize(loss, var_list=head, global_step=step)
    else:
        head_train = second().minimize(loss, var_list=head, global_step=step)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=tf.group(body_train, head_train))


def ids_input_fn(params):
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 20, size=(64, 6)).astype(np.int32)  # ids repeat in every batch
    return tf.data.Dataset.from_tensor_slices((ids, ids[:, 0] % 4)).repeat().batch(
        16, drop_remainder=True)


def embedding_model_fn(features, labels, mode, params):
    """An embedding table trained by Adagrad (its sparse rule), the layers above by an Adam
    whose gradients are clipped by their global norm."""
    table = tf.keras.layers.Embedding(20, 8, name="embedding")(features)
    loss, body, head = _parts(tf.reduce_mean(table, 1), labels)
    embedding = [v for v in v1.trainable_variables() if v.name.startswith("embedding/")]
    table_train = v1.train.AdagradOptimizer(0.1).minimize(loss, var_list=embedding)
    adam = v1.train.AdamOptimizer(0.01, beta1=0.8)
    gradients, variables = zip(*adam.compute_gradients(loss, var_list=body + head))
    clipped, _ = tf.clip_by_global_norm(gradients, 0.5)
    layers_train = adam.apply_gradients(zip(clipped, variables),
                                        global_step=v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=tf.group(table_train, layers_train))


CASES = {"sgd_adam": (model_fn, input_fn, {"optimizers": "sgd_adam"}),
         "two_adams": (model_fn, input_fn, {"optimizers": "two_adams"}),
         "two_adams_two_replicas": (model_fn, input_fn, {"optimizers": "two_adams", "runconfig": {
             "tf_random_seed": 1, "num_replicas": 2}}),
         "momentum_rmsprop_ordered": (model_fn, input_fn, {"optimizers": "momentum_rmsprop",
                                                           "ordered": True}),
         "sparse_adagrad_clipped_adam": (embedding_model_fn, ids_input_fn, {})}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return cached_comparisons(CASES, {}, tmp_path_factory)


@pytest.mark.parametrize("case, slots, report", [
    ("sgd_adam", {"head/kernel/Adam", "head/kernel/Adam_1", "beta1_power", "beta2_power"},
     "sgd, learning rate 0.05 for body/kernel, body/bias\n  adam, learning rate 0.01, beta1 0.9, "
     "beta2 0.999, epsilon 1e-08 for head/kernel, head/bias\n"),
    ("two_adams", {"body/kernel/Adam", "head/kernel/Adam_1", "beta1_power", "beta2_power",
                   "beta1_power_1", "beta2_power_1"},
     "adam, learning rate 0.001, beta1 0.9, beta2 0.999, epsilon 1e-08 for body/kernel, body/bias"
     "\n  adam, learning rate 0.02, beta1 0.5, beta2 0.999, epsilon 1e-08 for head/kernel, "
     "head/bias (step counters beta1_power_1, beta2_power_1)\n"),
    ("two_adams_two_replicas", {"beta1_power_1", "head/kernel/Adam_1"},
     "adam, learning rate 0.001, beta1 0.9, beta2 0.999, epsilon 1e-08 for body/kernel, body/bias"
     "\n  adam, learning rate 0.02, beta1 0.5, beta2 0.999, epsilon 1e-08 for head/kernel, "
     "head/bias (step counters beta1_power_1, beta2_power_1)\n"),
    ("sparse_adagrad_clipped_adam", {"embedding/embeddings/Adagrad", "body/kernel/Adam_1"},
     "adagrad, learning rate 0.1, initial accumulator 0.1 for embedding/embeddings\n  adam, "
     "learning rate 0.01, beta1 0.8, beta2 0.999, epsilon 1e-08 for body/kernel, body/bias, "
     "head/kernel, head/bias\n"),
    ("momentum_rmsprop_ordered", {"body/kernel/Momentum", "head/kernel/RMSProp",
                                  "head/kernel/RMSProp_1"},
     "momentum, learning rate 0.05, momentum 0.9 for body/kernel, body/bias\n  rmsprop, "
     "learning rate 0.01, decay 0.9, momentum 0.5, epsilon 1e-10 for head/kernel, head/bias\n"),
])
def test_each_group_trains_with_its_own_optimizer_as_tensorflow(trained, case, slots, report):
    """4 steps on the CS and on TF from the same weights: losses, weights, each optimizer's
    slots and step counters within 1e-5 (the CS holds TF's slots and no others); the report
    and its JSON show the optimizers."""
    run = trained(case)
    assert_same_training(run, rtol=1e-5)
    assert slots <= set(run.cs.state)
    assert not any("power" in name for name in run.compiled.host_variables)
    assert run.compiled.program.num_replicas == (2 if "replicas" in case else 1)
    assert "Optimizers (one backward pass of the loss; each updates its variables from the " \
           "gradients before the step): " + report in run.compiled.report_text
    with open(os.path.join(run.compiled.directory, "compile_report.json")) as report_json:
        groups = json.load(report_json)["optimizer_groups"]
    assert len(groups) == 1 and groups[0]["variables"][-2:] == ["head/kernel", "head/bias"]


@pytest.mark.parametrize("change, words", [
    (lambda g: g.variables.append("head/kernel"), "'head/kernel' is named twice"),
    (lambda g: g.variables.append("nowhere"), "'nowhere' is not a trained weight"),
    (lambda g: g.optimizer.ClearField("scalar_names"), "two optimizers keep the scalars "
                                                       "beta1_power, beta2_power, beta1_power"),
], ids=["twice", "unknown", "same_scalars"])
def test_the_cs_refuses_a_malformed_optimizer_group_before_anything_is_allocated(
        trained, change, words):
    program = pb.Program()
    program.CopyFrom(trained("two_adams").compiled.program)
    change(program.optimizer_groups[0])
    with pytest.raises(CSError) as error:
        check_program(program)
    assert words in str(error.value)


def test_micro_batches_change_nothing(trained):
    """The batch of 16 streamed as 4 micro-batches of 4: each group's gradient accumulated
    over them, TF's numbers still."""
    run = trained("two_adams")
    data = tf_reference.batches(input_fn, {"optimizers": "two_adams"}, 4)
    cs = run_on_cs(at_micro_batch(run.compiled.program, 4), run.compiled.initial_weights, data)
    assert_same_training(Comparison(run.compiled, cs, run.reference), rtol=1e-5)


def test_the_trained_model_evaluates_on_the_cs_as_on_the_cpu(trained, tmp_path):
    assert evaluation_mismatch(model_fn, input_fn, {"optimizers": "two_adams"}, str(tmp_path),
                               trained("two_adams")) == ""


@pytest.mark.slow
def test_a_run_resumed_from_a_checkpoint_continues_both_optimizers(tmp_path):
    """4 steps, a checkpoint (both Adams' slots and beta powers under TF's names) read back
    as the chief resumes: the next 4 steps are an unbroken run's, and TF's from that state."""
    assert_resume_is_unbroken(model_fn, input_fn, {"optimizers": "two_adams"}, str(tmp_path),
                              {"body/kernel/Adam", "head/kernel/Adam_1", "beta1_power",
                               "beta2_power_1"})


def twice_counted(features, labels, mode, params):
    loss, body, head = _parts(features, labels)
    step = v1.train.get_or_create_global_step()
    body_train = v1.train.GradientDescentOptimizer(0.05).minimize(loss, var_list=body,
                                                                  global_step=step)
    head_train = v1.train.AdamOptimizer(0.01).minimize(  # second count line
        loss, var_list=head, global_step=step)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=tf.group(body_train, head_train))


def _line(fragment: str) -> str:
    lines = inspect.getsource(inspect.getmodule(_line)).splitlines()
    return f"test_several_optimizers.py:{next(i for i, s in enumerate(lines) if fragment in s) + 1}"


def test_the_global_step_counted_by_two_optimizers_is_refused(tmp_path):
    with pytest.raises(CSRunError) as info:
        compile_model(twice_counted, input_fn, {}, str(tmp_path), validate_only=True)
    assert info.value.message.startswith("the train_op increments the global step twice a step")
    assert _line("second count line") in info.value.message
    assert info.value.hint == "pass global_step to one optimizer only"
