"""Parity through the CS API: the simulator, driven over gRPC from the same initial weights
and batches, trains and evaluates like TensorFlow on the CPU (tests/tf_reference.py)."""
from __future__ import annotations

import functools
import os
import sys
from typing import Sequence

import compiler_models as m
import numpy as np
import pytest
import tensorflow as tf
import tf_reference
import yaml
from doubles import ClientDouble

from coordinator.compiler import compile_model
from cs_api import pb
from cs_api.client import CSClient
from cs_api.tensors import from_tensor

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples")


def named(data):
    return [{"features": x, "labels": y} for x, y in data]


def run(client: CSClient, kind: str, steps: int) -> tuple[list[pb.StepResult], pb.JobSummary]:
    """The chief's Train / Evaluate call: the step results and the job's summary."""
    *results, end = client.run(kind, steps)
    assert end.HasField("summary")
    return [r.step for r in results], end.summary


def train_on_server(address, compiled, data, steps_per_call: Sequence[int]):
    """Train through the chief's client; two input workers (doubles) feed `data`."""
    client = CSClient(address)
    try:
        client.load("job-1", compiled.program, compiled.initial_weights, num_workers=2,
                    global_step=0, first_batch=0)
        workers = ClientDouble(address, client.token)
        feeders = workers.feed_in_background(named(data), num_workers=2)
        losses = []
        for steps in steps_per_call:  # several Train calls continue where the last ended
            results, summary = run(client, "train", steps)
            losses += [r.loss for r in results]
            assert summary.steps == steps and summary.samples == steps * compiled.program.batch_size
        state = client.snapshot()
        client.unload()
    finally:
        client.close()
    for t in feeders:
        t.join(10)
    assert not workers.feed_errors
    return np.array(losses), state


def assert_parity(losses, state, reference):
    np.testing.assert_allclose(losses, reference.losses, rtol=1e-3)
    assert set(state) <= set(reference.state)
    for name, value in state.items():
        np.testing.assert_allclose(value, reference.state[name], rtol=1e-3, atol=1e-5, err_msg=name)


def digits_input_fn(params):
    """MNIST-shaped digits: scikit-learn's 8x8 digits scaled up to 28x28 (784 features)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.kron(digits.images / 16.0, np.ones((3, 3)))  # 24 x 24
    x = np.pad(images, ((0, 0), (2, 2), (2, 2))).reshape(len(images), 784).astype(np.float32)
    y = digits.target.astype(np.int32)
    return (tf.data.Dataset.from_tensor_slices((x, y)).repeat()
            .batch(params["batch_size"], drop_remainder=True))


def mlp_parity(tmp_path, server, steps, **params):
    params = {"batch_size": 64, "runconfig": {"tf_random_seed": 1}, **params}
    compiled = compile_model(m.keras_mlp, digits_input_fn, params, str(tmp_path))
    data = tf_reference.batches(digits_input_fn, params, steps)
    reference = tf_reference.run(m.keras_mlp, digits_input_fn, params, compiled.initial_weights, data)
    losses, state = train_on_server(server.address, compiled, data, [steps // 2, steps - steps // 2])
    assert_parity(losses, state, reference)
    return state


@pytest.mark.slow
@pytest.mark.parametrize("optimizer, steps, extra", [
    ("sgd", 100, {"learning_rate": 0.01}),
    # Adam's sign-like steps amplify float32 rounding chaotically once gradients are small
    # (TF against itself in float64 drifts the same way), so full size runs 10 steps.
    ("adam", 10, {"learning_rate": 2e-4})])
def test_fc_mnist_matches_tensorflow(tmp_path, server, optimizer, steps, extra):
    state = mlp_parity(tmp_path, server, steps, batch_size=256, optimizer=optimizer, **extra)
    if optimizer == "adam":
        assert {"dense/kernel/Adam", "dense/kernel/Adam_1", "beta1_power", "beta2_power"} <= set(state)
        np.testing.assert_allclose(state["beta1_power"], np.float32(0.8) ** (steps + 1), rtol=1e-5)


@pytest.mark.parametrize("optimizer, extra", [
    ("sgd", {"learning_rate": 0.05}), ("momentum", {"learning_rate": 0.05, "momentum": 0.9}),
    ("momentum", {"learning_rate": 0.05, "momentum": 0.9, "nesterov": True}),
    ("adam", {"learning_rate": 0.002})])
def test_small_mlp_every_optimizer_matches_tensorflow(tmp_path, server, optimizer, extra):
    state = mlp_parity(tmp_path, server, 20, hidden=[40, 20], optimizer=optimizer, **extra)
    slots = {"sgd": [], "momentum": ["dense/kernel/Momentum"], "adam": ["dense/kernel/Adam_1"]}
    assert set(slots[optimizer]) <= set(state)


def cnn_example():
    sys.path.insert(0, os.path.join(EXAMPLES, "cnn_digits"))
    try:
        import data
        import model
    finally:
        sys.path.pop(0)
    with open(os.path.join(EXAMPLES, "cnn_digits", "configs", "params.yaml")) as f:
        return model, data, yaml.safe_load(f)


def distance(state, reference) -> float:
    """Relative L2 distance of the trained weights and slots from a reference's."""
    names = [n for n in state if np.ndim(reference.state[n])]
    diff = sum(float(np.sum((np.float64(state[n]) - reference.state[n]) ** 2)) for n in names)
    norm = sum(float(np.sum(np.float64(reference.state[n]) ** 2)) for n in names)
    return (diff / norm) ** 0.5


@pytest.mark.slow
def test_cnn_example_200_steps_is_as_close_to_float64_tensorflow_as_float32_tensorflow(
        tmp_path, server):
    """Two float32 computations that sum in different orders drift apart over a long run
    (momentum amplifies rounding: TF against itself in float64 drifts as much), so the CS
    is held to TF's own standard: no farther from a float64 TF than float32 TF is (2x), and
    equal to float32 TF's losses while the drift is below rounding."""
    model, data, params = cnn_example()
    compiled = compile_model(model.model_fn, data.train_input_fn, params, str(tmp_path))
    batches = tf_reference.batches(data.train_input_fn, params, 200)
    run = functools.partial(tf_reference.run, model.model_fn, data.train_input_fn, params,
                            compiled.initial_weights, batches)
    float32, float64 = run(), run(floatx="float64")
    losses, state = train_on_server(server.address, compiled, batches, [100, 100])
    assert losses[-1] < 0.5 * losses[0]  # it learns
    np.testing.assert_allclose(losses[:30], float32.losses[:30], rtol=1e-4)
    tf_drift = distance(float32.state, float64)
    assert distance(state, float64) <= 2 * tf_drift + 1e-6, (distance(state, float64), tf_drift)
    final = np.mean(losses[-20:]), np.mean(float64.losses[-20:])
    assert abs(final[0] - final[1]) <= 2 * abs(np.mean(float32.losses[-20:]) - final[1]) + 1e-3


def test_evaluation_gives_tensorflows_loss_and_accuracy(tmp_path, server):
    model, data, params = cnn_example()
    trained = tf_reference.run(model.model_fn, data.train_input_fn, params, {},
                               tf_reference.batches(data.train_input_fn, params, 30))
    compiled = compile_model(model.model_fn, data.eval_input_fn, params, str(tmp_path),
                             mode="eval")
    program = compiled.program
    assert not program.HasField("optimizer") or not program.optimizer.type
    weights = {name: trained.state[name] for name in compiled.initial_weights}
    batches = tf_reference.batches(data.eval_input_fn, params, 3)
    logits_kernel = next(k for k in program.kernels if k.name == program.outputs[0])
    reference = tf_reference.run(model.model_fn, data.eval_input_fn, params, weights, batches,
                                 mode="eval", fetch=[logits_kernel.tf_tensor])
    client = CSClient(server.address)
    try:
        client.load("job-1", program, weights, num_workers=1, global_step=0, first_batch=0)
        ClientDouble(server.address, client.token).feed_in_background(named(batches))
        results, summary = run(client, "evaluate", 3)
        assert client.status().global_step == 0  # evaluation does not train
    finally:
        client.close()
    np.testing.assert_allclose([r.loss for r in results], reference.losses, rtol=1e-4)
    for result, (_, y), ref in zip(results, batches, reference.fetched):
        outputs = {t.name: from_tensor(t) for t in result.outputs}
        assert set(outputs) == set(program.outputs)
        np.testing.assert_array_equal(outputs["labels"], y)
        logits = outputs[logits_kernel.name]
        np.testing.assert_allclose(logits, ref[logits_kernel.tf_tensor], rtol=1e-4, atol=1e-5)
        tf_accuracy = np.mean(ref[logits_kernel.tf_tensor].argmax(1) == y)
        assert np.mean(logits.argmax(1) == y) == tf_accuracy
    assert summary.steps == 3 and summary.samples == 3 * program.batch_size
    assert summary.sim_samples_per_sec > 0 and summary.wall_samples_per_sec > 0
