"""Training analysis: what the train_op does, proven from the graph, or one line naming the op
and the user's source line (coordinator.compiler.training)."""
import inspect

import cs_inprocess
import numpy as np
import pytest
import tensorflow as tf
import tf_reference
import training_models as tm

from common.errors import CSRunError
from coordinator.compiler import compile_model
from coordinator.compiler.extract import extract
from coordinator.compiler.training import analyze_training
from launcher.estimator import CSEstimatorSpec
from tests.wse_sim.test_wse_parity import assert_parity, train_on_server
from wafer.grad_transforms import GradientTransform

F32 = lambda x: float(np.float32(x))  # noqa: E731  TF's float32 constants, exactly
# the train_op's updates, compute_gradients' order: the variables' creation order
CREATED = ("hidden/kernel", "hidden/bias", "logits/kernel", "logits/bias")


def analyze(model_fn, input_fn=tm.input_fn, **params):
    return analyze_training(extract(model_fn, input_fn, {"batch_size": 16, **params}))


def refusal(model_fn, input_fn=tm.input_fn, **params) -> CSRunError:
    with pytest.raises(CSRunError) as info:
        analyze(model_fn, input_fn, **params)
    error = info.value
    assert "\n" not in str(error) and error.detail.count("\n") >= 1
    return error


def line_of(fragment):
    lines = inspect.getsource(tm).splitlines()
    return f"training_models.py:{next(i for i, line in enumerate(lines) if fragment in line) + 1}"


def names(spec):
    return tuple(v.name for v in spec.variables)


def test_plain_sgd_trains_every_variable_dense_without_transforms():
    spec = analyze(tm.sgd)
    assert spec.optimizer.type == "sgd" and spec.optimizer.learning_rate == pytest.approx(0.05)
    assert names(spec) == CREATED and spec.trained == frozenset(CREATED)
    assert {v.update for v in spec.variables} == {"dense"} and spec.transforms == ()
    assert all(v.slots == () for v in spec.variables)


def test_adam_with_keras_dropout_names_slots_as_tf_does():
    spec = analyze(tm.keras_dropout_adam)  # the seed generator's state write is allowed
    o = spec.optimizer
    assert (o.type, o.beta1, o.beta2, o.epsilon) == ("adam", pytest.approx(0.8),
                                                      pytest.approx(0.99), pytest.approx(1e-7))
    assert spec.variables[0].slots == ("hidden/kernel/Adam", "hidden/kernel/Adam_1")


def test_var_list_trains_only_the_listed_variables():
    spec = analyze(tm.fine_tune_last_layer)
    assert names(spec) == ("head/kernel", "head/bias")
    assert spec.update("body/kernel") == "" and spec.update("head/kernel") == "dense"
    assert spec.optimizer.use_nesterov and spec.optimizer.momentum == pytest.approx(0.9)


def test_clip_by_global_norm_is_one_transform_over_the_group_in_tfs_order():
    spec = analyze(tm.clip_global_norm)
    assert spec.transforms == (GradientTransform("clip_by_global_norm", value=0.5,
                                                 variables=CREATED),)


def test_clip_by_norm_then_clip_by_value_per_variable():
    spec = analyze(tm.clip_value_and_norm)
    # per variable: its own norm, then the value clip (equal steps merged, order kept)
    assert spec.transforms == (
        GradientTransform("clip_by_norm", value=1.0, variables=("hidden/kernel",
                                                                "logits/kernel")),
        GradientTransform("clip_by_value", low=F32(-0.1), high=F32(0.1), variables=CREATED))


def test_scaled_gradients_are_a_scale_transform():
    spec = analyze(tm.scaled_gradients)
    assert spec.transforms == (GradientTransform("scale", value=0.5, variables=CREATED),)


def test_loss_scaling_folds_away_or_stays_around_a_clip():
    assert analyze(tm.loss_scaling).transforms == ()
    everything = CREATED
    clipped = analyze(tm.loss_scaling, clip=True, loss_scale=128.0).transforms
    assert clipped == (GradientTransform("scale", value=128.0, variables=everything),
                       GradientTransform("clip_by_value", low=-1.0, high=1.0,
                                         variables=everything),
                       GradientTransform("scale", value=1 / 128.0, variables=everything))


@pytest.mark.parametrize("centered", [False, True])
def test_rmsprop_hyper_parameters_and_slots(centered):
    spec = analyze(tm.rmsprop, centered=centered)
    o = spec.optimizer
    assert (o.type, o.centered) == ("rmsprop", centered)
    assert (o.decay, o.momentum, o.epsilon) == (pytest.approx(0.8), pytest.approx(0.5),
                                                 pytest.approx(1e-6))
    suffixes = ("RMSProp", "RMSProp_1", "RMSProp_2") if centered else ("RMSProp", "RMSProp_1")
    assert spec.variables[0].slots == tuple(f"hidden/kernel/{s}" for s in suffixes)


def test_adagrad_initial_accumulator_value_is_read_from_the_graph():
    spec = analyze(tm.adagrad)
    assert spec.optimizer.type == "adagrad"
    assert spec.optimizer.initial_accumulator_value == pytest.approx(0.25)
    assert spec.variables[0].slots == ("hidden/kernel/Adagrad",)


@pytest.mark.parametrize("optimizer, suffix, keras", [
    ("adam", "Adam", False), ("momentum", "Momentum", False), ("sgd", "", False),
    ("adagrad", "Adagrad", True), ("adam", "Adam", True)])
def test_embedding_tables_are_updated_sparse(optimizer, suffix, keras):
    spec = analyze(tm.embedding_bag, tm.ids_input_fn, optimizer=optimizer, keras=keras)
    table = "table/embeddings" if keras else "table"
    assert spec.update(table) == "sparse" and spec.update("dense/kernel") == "dense"
    assert names(spec) == (table, "dense/kernel", "dense/bias") and spec.transforms == ()
    assert [v.slots[:1] for v in spec.variables] == [
        (f"{v}/{suffix}",) if suffix else () for v in names(spec)]


@pytest.fixture(scope="module")
def at_micro_batch(tmp_path_factory):
    return cs_inprocess.micro_batch_comparisons(tm.ids_input_fn, tmp_path_factory, steps=4)


@pytest.mark.parametrize("micro", [16, 4])
def test_clip_by_norm_of_a_sparse_gradient_clips_its_looked_up_rows_as_tensorflow_does(at_micro_batch, micro):
    """tf.clip_by_norm of an embedding table's IndexedSlices: the norm of its values (a row
    per lookup, duplicates included), the whole batch's in micro-batches too."""
    params = {"batch_size": 16, "optimizer": "momentum", "keras": True, "clip": 0.05,  # (Adam: scale-free)
              "runconfig": {"tf_random_seed": 3}}
    result = at_micro_batch(tm.embedding_bag, params, micro)
    assert [(t.kind, tuple(t.variables)) for t in result.compiled.program.gradient_transforms] == \
        [("clip_by_norm", ("table/embeddings", "dense/kernel", "dense/bias"))]  # each by its own norm
    assert {p.variable: p.update for k in result.compiled.program.kernels for p in k.params}[
        "table/embeddings"] == "sparse"
    cs_inprocess.assert_same_training(result, rtol=1e-5)


def test_float16_variable_is_refused_at_compile_time_naming_it():
    error = refusal(tm.float16_layer)
    assert error.message.startswith("variable w16 at ")
    assert line_of("float16 variable line") in error.message and "float16" in error.message


def test_a_learning_rate_schedule_is_lowered_naming_its_line():
    (schedule,) = analyze(tm.lr_schedule).schedules
    assert schedule.hyper_parameter == "learning_rate"
    assert schedule.source.endswith(line_of("schedule line"))


def test_the_analysis_alone_refuses_minimizing_another_loss_naming_both():
    """(match gives the analysis the minimized loss as model_fn's and reports the returned
    one apart: tests/coordinator/test_reported_loss.py.)"""
    error = refusal(tm.other_loss)
    assert error.message.startswith("the train_op minimizes Mean:0 computed at ")
    assert f"{line_of('other loss line')}, not the loss" in error.message
    assert "not the loss model_fn returns" in error.message


def test_a_weight_decay_term_is_part_of_the_loss_minimized():
    assert analyze(tm.weight_decay_term).trained == frozenset(CREATED)
    error = refusal(tm.weight_decay_term, data_only=True)
    assert error.message.startswith("the train_op minimizes part of the loss model_fn returns")
    assert line_of("data = v1.losses") in error.message


def test_gradient_noise_is_refused_one_line_per_variable():
    error = refusal(tm.noisy_gradients)
    assert "is transformed with random numbers" in error.message
    lines = error.detail.splitlines()[1:]
    assert len(lines) == 4  # one per variable
    assert all("(RandomStandardNormal '" in line and f"{line_of('noise line')})" in line
               for line in lines)


def test_sign_gradients_are_a_gradient_program():
    transforms = analyze(tm.sign_gradients).transforms
    assert [t.kind for t in transforms] == ["program"] * 4
    assert all([k.type for k in t.program.kernels] == ["activation"] for t in transforms)


def test_swapped_gradients_are_refused_by_structure_and_by_numbers(monkeypatch):
    # b's matmul reads a's output, so a/kernel's structure passes (TF's gradient functions
    # pass gradients through); b/kernel's gradient comes from ops a/kernel alone feeds.
    error = refusal(tm.swapped_gradients)
    assert error.message.startswith("the gradient applied to b/kernel is the gradient of "
                                    "another tensor (a_1/MatMul's input at ")
    # the numeric check on the first batch catches it on its own
    monkeypatch.setattr("coordinator.compiler.training.gradients._check_source", lambda *args: None)
    error = refusal(tm.swapped_gradients)
    assert error.message.startswith("the gradient applied to a/kernel is not the gradient of "
                                    "the loss model_fn returns")
    assert line_of("swap line") in error.message


def test_other_writes_in_the_train_op_are_refused():
    error = refusal(tm.weight_decay_by_assign)
    assert error.message.startswith("the train_op writes hidden/kernel")
    assert line_of("decay line") in error.message


def test_state_the_train_op_keeps_is_refused_saying_what_to_do_instead():
    error = refusal(tm.power_iteration_state)
    assert error.message.startswith("the train_op writes u, which is not an optimizer update")
    assert line_of("power iteration line") in error.message
    assert error.hint.startswith("the CS keeps no state but weights, optimizer slots and moving "
                                 "statistics: compute the value anew every step")


def test_sums_a_cond_applies_and_never_zeroes_are_refused_naming_the_addition():
    """(its train_op, an assign_add's value rather than an op, is read as the assign op)"""
    error = refusal(tm.accumulated_gradients)
    assert error.message.startswith("the train_op adds to head/")
    assert "outside the tf.cond applying the updates, which does not zero it" in error.message
    assert line_of("added line") in error.message


def test_program_carries_frozen_params_updates_and_transforms(tmp_path):
    result = compile_model(tm.fine_tune_last_layer, tm.input_fn, {"batch_size": 16},
                           str(tmp_path))
    program = result.program
    params = {p.variable: p for k in program.kernels for p in k.params}
    assert params["body/kernel"].frozen and params["body/kernel"].update == ""
    assert not params["head/kernel"].frozen and params["head/kernel"].update == "dense"
    assert program.optimizer.type == "momentum" and program.optimizer.use_nesterov
    clipped = compile_model(tm.clip_global_norm, tm.input_fn, {"batch_size": 16},
                            str(tmp_path / "clip")).program
    assert [GradientTransform.from_message(t) for t in clipped.gradient_transforms] == [
        GradientTransform("clip_by_global_norm", value=0.5, variables=CREATED)]
    assert np.isclose(clipped.optimizer.epsilon, 1e-8)


def test_validation_report_lists_optimizer_frozen_weights_and_transforms(tmp_path):
    text = compile_model(tm.rmsprop, tm.input_fn, {"batch_size": 16, "centered": True},
                         str(tmp_path), validate_only=True).report_text
    assert "Optimizer: rmsprop, learning rate 0.01, decay 0.8, momentum 0.5, epsilon 1e-06, " \
           "centered" in text
    text = compile_model(tm.fine_tune_last_layer, tm.input_fn, {"batch_size": 16},
                         str(tmp_path), validate_only=True).report_text
    assert "Frozen weights (not updated by the train_op): body/kernel, body/bias" in text
    text = compile_model(tm.clip_value_and_norm, tm.input_fn, {"batch_size": 16},
                         str(tmp_path), validate_only=True).report_text
    assert "Gradient transform: clip_by_norm 1 of hidden/kernel, logits/kernel" in text


def test_numeric_checks_are_skipped_above_their_memory_budget(monkeypatch):
    monkeypatch.setattr("coordinator.compiler.training.gradients._check_source", lambda *args: None)
    monkeypatch.setattr("coordinator.compiler.training.numbers.NUMERIC_CHECK_VALUES", 10)
    analyze(tm.swapped_gradients)  # only the structure is proven: no Session runs


@pytest.mark.parametrize("model_fn, params", [
    (tm.fine_tune_last_layer, {}), (tm.clip_value_and_norm, {}),
    (tm.clip_norm_with_a_temperature, {}), (tm.scalar_offset_reshaped, {}),
    (tm.loss_scaling, {"clip": True, "loss_scale": 128.0}),
    pytest.param(tm.clip_global_norm, {}, marks=pytest.mark.slow),
    pytest.param(tm.scaled_gradients, {}, marks=pytest.mark.slow)])
def test_the_cs_trains_these_train_ops_as_tensorflow_does(tmp_path, server, model_fn, params):
    params = {"batch_size": 16, "runconfig": {"tf_random_seed": 3}, **params}
    compiled = compile_model(model_fn, tm.input_fn, params, str(tmp_path))
    data = tf_reference.batches(tm.input_fn, params, 10)
    reference = tf_reference.run(model_fn, tm.input_fn, params, compiled.initial_weights, data)
    losses, state = train_on_server(server.address, compiled, data, [10])
    assert_parity(losses, state, reference)
    moved = {n for n in compiled.initial_weights
             if not np.array_equal(state[n], compiled.initial_weights[n])}
    assert moved == {v.variable for k in compiled.program.kernels for v in k.params
                     if not v.frozen}


def test_ftrl_made_under_the_update_ops_trains_as_tensorflow_does(tmp_path, server):
    """Its folded hyper-parameter carries control inputs: the compiler evaluated them too and
    failed on the uninitialised variables the batch normalization's update reads (found by
    random models)."""
    params = {"batch_size": 16, "runconfig": {"tf_random_seed": 3}}
    compiled = compile_model(tm.ftrl_after_update_ops, tm.input_fn, params, str(tmp_path))
    data = tf_reference.batches(tm.input_fn, params, 10)
    reference = tf_reference.run(tm.ftrl_after_update_ops, tm.input_fn, params,
                                 compiled.initial_weights, data)
    losses, state = train_on_server(server.address, compiled, data, [10])
    assert_parity(losses, state, reference)


def nan_gradient(features, labels, mode, params):
    """sqrt of a ReLU's output: infinite slopes where the ReLU is zero, NaN gradients (0 x inf)."""
    hidden = tf.keras.layers.Dense(8, activation="relu")(features)
    loss = tf.reduce_mean(tf.sqrt(hidden))
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
        loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op)


def test_a_nan_gradient_on_the_first_batch_is_refused_not_let_through():
    """The numeric check compares with <=, so a NaN (which compares false) fails it."""
    error = refusal(nan_gradient)
    assert "is not finite on input_fn's first batch" in error.message
