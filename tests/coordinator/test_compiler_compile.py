"""Place and emit: compile_model's artifacts, estimates, reuse, initial weights and refusals."""
import json
import os
import sys

import compiler_models as m
import numpy as np
import pytest
import tensorflow as tf
import yaml
from PIL import Image

from common.errors import CSRunError
from coordinator.compiler import compile_model, load_compiled
from coordinator.compiler.extract import extract
from coordinator.compiler.match import match
from coordinator.compiler.placement import equal_area_samples_per_sec, place_model
from tf_model.model_fn import call_model_fn, model_graph
from wafer import timing
from wafer.fabric import get_fabric
from wse_sim.program import check_program

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples")


def fc_mnist(tmp_path, **params):
    params = {"batch_size": 256, **params}
    return compile_model(m.keras_mlp, m.input_fn, params, str(tmp_path), fabric="cs2")


def test_fc_mnist_on_cs2_estimates_the_published_order_and_writes_artifacts(tmp_path):
    result = fc_mnist(tmp_path)
    assert not result.reused
    directory = result.directory
    assert os.path.dirname(directory) == str(tmp_path / "cs_compile")
    for name in ("program.pb", "initial_weights.npz", "compile_report.txt",
                 "compile_report.json", "placement.png"):
        assert os.path.getsize(os.path.join(directory, name)) > 0
    program = result.program
    assert program.fabric == "cs2" and program.batch_size == 256
    assert [k.type for k in program.kernels] == ["dense"] * 3 + [
        "softmax_cross_entropy_with_logits", "loss"]
    assert [(i.name, list(i.shape)) for i in program.inputs] == [("features", [784]),
                                                                  ("labels", [])]
    assert program.kernels[0].attrs["units"].i == 500
    assert program.kernels[0].attrs["activation"].s == "relu"
    assert [(p.role, p.variable, list(p.shape)) for p in program.kernels[0].params] == [
        ("kernel", "dense/kernel", [784, 500]), ("bias", "dense/bias", [500])]
    assert program.loss_kernel == program.kernels[-1].name
    assert program.optimizer.type == "sgd"
    assert program.optimizer.learning_rate == pytest.approx(0.01)
    assert list(program.outputs) == [program.kernels[2].name, "labels"]
    # The published CS-2 compile estimate is ~1.27 M samples/s, compute-bound.
    estimate = program.estimate
    assert 0.6e6 < estimate.compute_samples_per_sec < 2.5e6
    assert estimate.samples_per_sec == estimate.compute_samples_per_sec
    assert estimate.transmission_samples_per_sec > estimate.compute_samples_per_sec
    regions = [k.region for k in program.kernels]
    assert all(r.width > 0 and r.height > 0 for r in regions)
    assert estimate.active_cores == sum(r.width * r.height for r in regions)
    assert all(0 <= k.memory_per_core_bytes <= 48 * 1024 for k in program.kernels)
    assert all(k.memory_per_core_bytes > 0 for k in program.kernels if k.params)
    assert {(r.src, r.dst) for r in program.routes} >= {
        ("features", program.kernels[0].name), (program.kernels[0].name, program.kernels[1].name)}
    # a route carries its source's values per sample: 784 floats of features, 1 int label
    route_bytes = {r.src: r.bytes_per_sample for r in program.routes}
    assert route_bytes["features"] == 784 * 4 and route_bytes["labels"] == 4
    assert route_bytes[program.kernels[2].name] == 10 * 4
    # The CS times the loaded program exactly as the compiler estimated it (routes included).
    simulated = timing.program_timing(program, check_program(program).kernels,
                                      get_fabric("cs2"), training=True)
    assert simulated.fill_seconds == pytest.approx(estimate.pipeline_fill_seconds, rel=1e-9)
    assert simulated.samples_per_sec == pytest.approx(estimate.samples_per_sec, rel=1e-9)
    report = result.report_text
    for line in ("Estimated Overall Performance", "Samples/s:", "Compute Samples/s:",
                 "Transmission Samples/s:", "Active PEs:", "Compute Utilization:",
                 "Ideal bound:", "Balanced-pipeline bound:"):
        assert line in report
    assert f"{estimate.samples_per_sec:,.0f}" in report
    data = json.loads(open(os.path.join(directory, "compile_report.json")).read())
    assert data["estimate"]["fraction_of_balanced_bound"] >= 0.9
    assert [k["name"] for k in data["kernels"]] == [k.name for k in program.kernels]
    with Image.open(os.path.join(directory, "placement.png")) as image:
        assert image.size[0] > 1000 and image.getextrema() != ((255, 255), (255, 255), (255, 255))
    weights = dict(np.load(os.path.join(directory, "initial_weights.npz")))
    assert weights["dense/kernel"].shape == (784, 500) and not weights["dense/bias"].any()


def test_unchanged_graph_is_reused_and_a_changed_hyper_parameter_recompiles(tmp_path):
    first = fc_mnist(tmp_path, hidden=[64])
    again = fc_mnist(tmp_path, hidden=[64])
    assert again.reused and again.directory == first.directory
    assert again.report_text.startswith("Reusing the compile in " + first.directory)
    assert again.program == first.program
    assert again.initial_weights.keys() == first.initial_weights.keys()
    changed = fc_mnist(tmp_path, hidden=[64], learning_rate=0.5)
    assert not changed.reused and changed.directory != first.directory
    assert changed.program.optimizer.learning_rate == pytest.approx(0.5)
    loaded = load_compiled(first.directory)
    assert loaded.program == first.program and loaded.reused
    np.testing.assert_array_equal(loaded.initial_weights["dense/kernel"],
                                  first.initial_weights["dense/kernel"])


@pytest.mark.parametrize("damage", ["garbage program", "empty program", "truncated weights", "no checksums"])
def test_a_damaged_compile_is_said_and_compiled_again(tmp_path, damage):
    first = fc_mnist(tmp_path, hidden=[32])
    name, content = {"garbage program": ("program.pb", b"\x12garbage"), "empty program": ("program.pb", b""),
                     "truncated weights": ("initial_weights.npz", None),
                     "no checksums": ("checksums.json", None)}[damage]
    path = os.path.join(first.directory, name)
    if damage == "truncated weights":
        content = open(path, "rb").read()[:100]
    if content is None:
        os.remove(path)
    else:
        open(path, "wb").write(content)
    with pytest.raises(CSRunError, match=f"is not a complete compile directory: {name} "):
        load_compiled(first.directory)
    again = fc_mnist(tmp_path, hidden=[32])
    assert not again.reused and again.directory == first.directory
    assert again.note.startswith(f"The compile in {first.directory} is damaged ({name} ")
    assert again.report_text.startswith(again.note + "\n")
    assert again.program == first.program
    assert fc_mnist(tmp_path, hidden=[32]).reused  # whole again


def cpu_initial_values(model_fn, params):
    """What a CPU run starts from: model_fn built in model_graph on the batch placeholders."""
    from tf_model.model_fn import batch_signature, make_dataset
    signature = batch_signature(make_dataset(m.input_fn, params))
    with model_graph(params) as graph:
        features, labels = signature.placeholders()
        call_model_fn(model_fn, features, labels, "train", params)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            variables = tf.compat.v1.trainable_variables()
            return dict(zip([v.op.name for v in variables], session.run(variables)))


@pytest.mark.parametrize("model_fn", [m.keras_mlp, m.raw_mlp])
def test_initial_weights_equal_the_cpu_paths_with_the_same_seed(tmp_path, model_fn):
    params = {"batch_size": 32, "hidden": [16], "runconfig": {"tf_random_seed": 7}}
    result = compile_model(model_fn, m.input_fn, params, str(tmp_path))
    cpu = cpu_initial_values(model_fn, params)
    assert cpu and set(cpu) <= set(result.initial_weights)
    for name, value in cpu.items():
        np.testing.assert_array_equal(result.initial_weights[name], value)
    other = compile_model(model_fn, m.input_fn, {**params, "runconfig": {"tf_random_seed": 8}},
                          str(tmp_path))
    name = next(n for n in cpu if n.endswith(("kernel", "w0")))
    assert not np.array_equal(other.initial_weights[name], cpu[name])


def test_cnn_example_compiles(tmp_path):
    sys.path.insert(0, os.path.join(EXAMPLES, "cnn_digits"))
    try:
        import data
        import model
    finally:
        sys.path.pop(0)
    with open(os.path.join(EXAMPLES, "cnn_digits", "configs", "params.yaml")) as f:
        params = yaml.safe_load(f)
    result = compile_model(model.model_fn, data.train_input_fn, params, str(tmp_path))
    types = [k.type for k in result.program.kernels]
    assert types[:4] == ["conv2d", "max_pool", "conv2d", "max_pool"] and "dense" in types
    assert result.program.optimizer.type == "momentum"
    assert list(result.program.inputs[0].shape) == [8, 8, 1]
    data_json = json.loads(open(os.path.join(result.directory, "compile_report.json")).read())
    assert data_json["estimate"]["fraction_of_balanced_bound"] >= 0.9


@pytest.mark.slow
def test_deep_mlp_reaches_90_percent_of_the_bound_and_beats_equal_area():
    fabric = get_fabric("cs1")
    model = match(extract(m.mlp_stack, m.input_fn, {"batch_size": 256, "hidden": [4096] * 23}))
    placed = place_model(model, fabric, "train")
    placement = placed.placement
    achieved = placement.timing.compute_samples_per_sec
    assert placement.balanced_bound < placement.fabric_bound * 1.0001  # wafer-bound
    assert achieved >= 0.9 * placement.balanced_bound
    assert achieved > equal_area_samples_per_sec(placed.kernels, fabric, training=True)


def test_too_large_model_is_refused_with_memory_figures(tmp_path):
    with pytest.raises(CSRunError) as info:
        compile_model(m.mlp_stack, m.input_fn,
                      {"batch_size": 32, "hidden": [50000, 50000], "optimizer": "adam"},
                      str(tmp_path))
    message = str(info.value)
    assert "does not fit on cs1" in message and "the fabric has 18.34 GB" in message
    assert "2,539," in message  # parameters
    assert "billion parameters" in message
    assert not os.path.exists(tmp_path / "cs_compile") or not [
        d for d in os.listdir(tmp_path / "cs_compile") if not d.endswith(".txt")]


@pytest.mark.parametrize("batch_size, shape", [(10 ** 9, (784,)), (40_000, (28, 28, 64))])
def test_a_batch_the_cs_cannot_take_is_refused_before_input_fn_builds_one(tmp_path, batch_size, shape):
    def input_fn(params):  # a repeated dataset: building one batch of 1e9 samples fills the host
        x = np.zeros((4, *shape), np.float32)
        y = np.zeros((4,), np.int32)
        return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(params["batch_size"],
                                                                         drop_remainder=True)

    with pytest.raises(CSRunError, match=rf"input_fn's batches of {batch_size:,} samples hold .* MiB: the CS "
                                         r"takes at most 65,536 samples and 256 MiB a batch \(hint: lower"):
        compile_model(m.keras_mlp, input_fn, {"batch_size": batch_size}, str(tmp_path), validate_only=True)
