"""Extract and match: user graphs (Keras layers and raw tf.nn code) become library kernels."""
import inspect
import os

import compiler_models as m
import pytest

from common.errors import CSRunError
from coordinator.compiler import compile_model
from coordinator.compiler.extract import extract
from coordinator.compiler.match import match
from examples import mlp


def matched(model_fn, mode="train", input_fn=m.input_fn, **params):
    params.setdefault("batch_size", 32)
    model = match(extract(model_fn, input_fn, params, mode))
    assert not model.unsupported, [op.line() for op in model.unsupported]
    return model


def summary(model):
    return [(k.type, k.inputs, k.output_shape) for k in model.kernels]


def test_keras_mlp_is_three_dense_kernels_and_a_mean_loss(tmp_path):
    result = compile_model(m.keras_mlp, m.input_fn, {"batch_size": 256}, str(tmp_path),
                           validate_only=True)
    assert result.program is None and result.report_text.startswith("Validation successful")
    assert (tmp_path / "cs_compile" / "validation_report.txt").read_text() == result.report_text
    model = matched(m.keras_mlp, batch_size=256)
    dense = [k for k in model.kernels if k.type == "dense"]
    assert [k.attrs for k in dense] == [
        {"units": 500, "use_bias": True, "activation": "relu"},
        {"units": 300, "use_bias": True, "activation": "relu"},
        {"units": 10, "use_bias": True, "activation": "linear"}]
    assert [[(p.role, p.shape) for p in k.params] for k in dense] == [
        [("kernel", (784, 500)), ("bias", (500,))], [("kernel", (500, 300)), ("bias", (300,))],
        [("kernel", (300, 10)), ("bias", (10,))]]
    assert dense[0].params[0].variable == "dense/kernel"
    assert dense[0].inputs == ("features",) and dense[1].inputs == (dense[0].name,)
    xent, loss = model.kernels[-2:]
    assert (xent.type, xent.attrs, xent.inputs) == (
        "softmax_cross_entropy_with_logits", {"sparse": True}, (dense[2].name, "labels"))
    # tf.compat.v1.losses' weight 1.0 and num_present fold into the mean: 1 / 256.
    assert (loss.type, loss.attrs, loss.inputs) == ("loss", {"scale": 1 / 256}, (xent.name,))
    assert model.loss_kernel == loss.name and loss.output_shape == ()
    assert model.optimizer.type == "sgd" and model.optimizer.learning_rate == pytest.approx(0.01)
    # host_call reads the logits and the labels: both are streamed back.
    assert model.outputs == (dense[2].name, "labels")
    assert dense[2].tf_tensor.endswith("BiasAdd:0")
    assert dense[0].source.endswith("examples/mlp.py:" + str(
        inspect.getsource(mlp).splitlines().index(
            '        h = tf.keras.layers.Dense(units, activation="relu")(h)') + 1))


def test_raw_tf_code_matches_the_same_kernels_with_dropout():
    model = matched(m.raw_mlp, hidden=[50, 30], optimizer="momentum", nesterov=True)
    assert [k.type for k in model.kernels] == [
        "dense", "dropout", "dense", "dropout", "dense", "softmax_cross_entropy_with_logits",
        "loss"]
    assert model.kernels[0].attrs == {"units": 50, "use_bias": True, "activation": "tanh"}
    assert [p.variable for p in model.kernels[0].params] == ["w0", "b0"]
    assert model.kernels[1].attrs["rate"] == pytest.approx(0.25)
    assert model.optimizer.type == "momentum" and model.optimizer.momentum == pytest.approx(0.9)
    assert model.optimizer.use_nesterov is True


def test_keras_and_raw_cnns_match_conv_pool_reshape():
    model = matched(m.keras_cnn, shape=(8, 8, 1), optimizer="adam", learning_rate=0.002)
    assert [k.type for k in model.kernels] == [
        "conv2d", "max_pool", "conv2d", "reshape", "dense", "dense",
        "softmax_cross_entropy_with_logits", "loss"]
    conv = model.kernels[0]
    assert conv.attrs == {"filters": 8, "kernel_size": [3, 3], "strides": [1, 1],
                          "padding": "SAME", "use_bias": True, "activation": "relu"}
    assert [p.shape for p in conv.params] == [(3, 3, 1, 8), (8,)]
    assert model.kernels[1].attrs == {"pool_size": [2, 2], "strides": [2, 2], "padding": "VALID"}
    assert model.kernels[2].attrs["padding"] == "VALID" and model.kernels[2].output_shape == (2, 2, 16)
    assert model.kernels[3].attrs == {"shape": [64]}
    o = model.optimizer
    assert (o.type, o.beta1, o.beta2) == ("adam", pytest.approx(0.8), pytest.approx(0.99))
    assert o.learning_rate == pytest.approx(0.002) and o.epsilon == pytest.approx(1e-7)

    raw = matched(m.raw_cnn, shape=(8, 8, 1))
    assert [k.type for k in raw.kernels] == [
        "conv2d", "avg_pool", "reshape", "dense", "softmax_cross_entropy_with_logits", "loss"]
    assert raw.kernels[0].attrs == {"filters": 4, "kernel_size": [3, 3], "strides": [2, 2],
                                    "padding": "SAME", "use_bias": True, "activation": "relu6"}
    assert raw.kernels[3].attrs["use_bias"] is False
    assert raw.kernels[-1].attrs["scale"] == 1.0  # a reduce_sum


def test_residual_add_concat_and_separate_leaky_relu():
    model = matched(m.residual, shape=(20,))
    kinds = [(k.type, k.attrs) for k in model.kernels]
    assert ("activation", {"function": "leaky_relu", "alpha": pytest.approx(0.1)}) in kinds
    add = next(k for k in model.kernels if k.type == "binary")
    concat = next(k for k in model.kernels if k.type == "concat")
    assert add.attrs == {"op": "add", "operands": "ii"} and len(add.inputs) == 2
    assert concat.attrs == {"axis": 0} and concat.output_shape == (32,)
    assert model.kernels[-3].attrs["activation"] == "sigmoid"


@pytest.mark.parametrize("loss, kernels", [
    # losses.mean_squared_error: squared differences, meaned over 32 x 3 values
    ("mse", [("binary", {"op": "squared_difference", "operands": "ii"}),
             ("loss", {"scale": 1 / 96})]),
    # tf.nn's logistic loss, op by op (max(x, 0) - x z + log1p(exp(-|x|)) as TF writes it)
    ("sigmoid", [("binary", {"op": "add", "operands": "ii"}), ("loss", {"scale": 1 / 96})]),
    ("softmax", [("softmax_cross_entropy_with_logits", {"sparse": False}),
                 ("loss", {"scale": 1 / 32})]),
])
def test_losses_lower_to_their_ops_and_a_measured_batch_reduction(loss, kernels):
    model = matched(m.regression, input_fn=m.regression_input_fn, loss=loss)
    assert [(k.type, {a: v for a, v in k.attrs.items() if not a.startswith("c")})
            for k in model.kernels[-2:]] == kernels
    assert model.kernels[0].attrs["activation"] == "softplus"


def test_one_hot_labels_are_a_one_hot_kernel_on_the_labels():
    model = matched(m.one_hot_softmax, shape=(20,))
    one_hot = next(k for k in model.kernels if k.type == "one_hot")
    assert one_hot.inputs == ("labels",) and one_hot.attrs == {
        "depth": 10, "on_value": 1.0, "off_value": 0.0}
    xent = model.kernels[-2]  # losses.softmax_cross_entropy stops the labels' gradient
    stop = next(k for k in model.kernels if k.name == xent.inputs[1])
    assert stop.type == "stop_gradient" and stop.inputs == (one_hot.name,)
    assert xent.inputs[0] == model.kernels[0].name and xent.attrs == {"sparse": False}


def test_eval_and_predict_modes():
    evaluated = matched(m.keras_mlp, mode="eval", hidden=[20])
    assert evaluated.optimizer is None and evaluated.loss_kernel
    assert [k.type for k in evaluated.kernels][-2:] == ["softmax_cross_entropy_with_logits", "loss"]
    predicted = matched(m.keras_mlp, mode="infer", hidden=[20])
    assert predicted.loss_kernel == "" and [k.type for k in predicted.kernels] == ["dense", "dense"]
    assert predicted.outputs == (predicted.kernels[-1].name,)


def source_line(fragment):
    lines = inspect.getsource(m).splitlines()
    return f"compiler_models.py:{next(i for i, line in enumerate(lines) if fragment in line) + 1}"


def test_every_unsupported_op_is_listed_with_its_source_line(tmp_path):
    with pytest.raises(CSRunError) as info:
        compile_model(m.unsupported, m.input_fn, {"batch_size": 32}, str(tmp_path),
                      validate_only=True)
    error = info.value
    assert "\n" not in str(error)
    eig_line, svd_line = source_line("tf.linalg.eigvalsh("), source_line("tf.linalg.svd")
    # The first one in the user's terms, then how many more.
    assert error.message.startswith(f"validation failed: SelfAdjointEigV2 'SelfAdjointEigV2' at tests/{eig_line}: "
                                    "no CS kernel computes this op (SelfAdjointEigV2)")
    assert "(and 1 more unsupported layer or operation)" in error.message
    lines = error.detail.splitlines()
    assert any("SelfAdjointEigV2 'SelfAdjointEigV2'" in line and eig_line in line for line in lines)
    assert any(line.strip().startswith("Svd 'Svd'") and svd_line in line for line in lines)
    assert "Supported (see README" in error.detail
    report = (tmp_path / "cs_compile" / "validation_report.txt").read_text()
    assert "Validation failed" in report and svd_line in report and eig_line in report


def test_input_shapes_that_model_fn_rejects_name_both_shapes(tmp_path):
    with pytest.raises(CSRunError) as info:
        compile_model(m.fixed_input, m.input_fn, {"batch_size": 32, "shape": [64]},
                      str(tmp_path), validate_only=True)
    message = str(info.value)
    assert "features (32, 64) float32" in message and "784" in message
    assert source_line("logits = tf.matmul(features, w)") in message


def test_a_learning_rate_schedule_is_lowered_not_refused():
    schedules = matched(m.decayed_lr).training.schedules
    assert len(schedules) == 1 and "learning_rate" in str(schedules[0])


def test_unknown_batch_size_is_refused(tmp_path):
    def input_fn(params):
        return m.input_fn(params).unbatch().batch(32)  # drop_remainder=False

    with pytest.raises(CSRunError, match="no fixed batch size"):
        compile_model(m.keras_mlp, input_fn, {}, str(tmp_path), validate_only=True)


def test_cli_prints_every_unsupported_op_then_one_error_line(tmp_path):
    import subprocess
    import sys
    import textwrap
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))!r})
        import compiler_models as m
        from coordinator.compiler import compile_model
        from common.errors import cli_entry

        @cli_entry("run.py")
        def main():
            compile_model(m.unsupported, m.input_fn, {{"batch_size": 32}}, {str(tmp_path)!r},
                          validate_only=True)

        main()
    """)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "oneDNN" not in line and "absl" not in line]
    start = lines.index("Unsupported layers and operations (2):")
    listed = lines[start + 1:start + 3]
    assert [line.split()[0] for line in listed] == ["SelfAdjointEigV2", "Svd"]
    assert source_line("tf.linalg.eigvalsh(") in listed[0] and source_line("tf.linalg.svd") in listed[1]
    assert lines[-1].startswith("run.py: error: validation failed: SelfAdjointEigV2 'SelfAdjointEigV2' at "
                                "tests/compiler_models.py:")
    assert "(hint: " in lines[-1]


def test_dict_features_are_named_inputs():
    model = matched(m.two_inputs, input_fn=m.dict_input_fn)
    assert {(s.name, s.shape) for s in model.inputs} == {
        ("features.image", (12,)), ("features.extra", (4,)), ("labels", ())}
    concat = next(k for k in model.kernels if k.type == "concat")
    assert concat.inputs[1] == "features.extra" and concat.input_shapes == ((8,), (4,))
