"""Learning-rate schedules on the CS: every schedule kind trains with TensorFlow's losses and
weights, its scalar program gives TF's float32 rate bit for bit at the boundaries and at
random steps, a resumed run uses the checkpointed global step, and what cannot be computed
per step is refused naming the op."""
from __future__ import annotations

import cs_inprocess
import numpy as np
import pytest
import schedule_models as sm
import tensorflow as tf
import tf_reference

from common.errors import CSRunError
from coordinator.compiler import compile_model
from cs_api import pb
from tf_model import checkpoints
from tf_model.estimator_spec import CSEstimatorSpec
from tf_model.model_fn import batch_signature, call_model_fn, make_dataset, model_graph
from wafer.moving_averages import FACTOR, MovingAverage
from wafer.schedules import ScalarOp, Schedule, evaluate
from wse_sim.errors import CSError
from wse_sim.program import check_program


def _params(name: str, momentum: bool = False) -> dict:
    return {"batch_size": sm.BATCH, "schedule": name, "momentum": momentum,
            "runconfig": {"tf_random_seed": 7}}  # the same initial weights every run


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(sm.SCHEDULES))
def test_schedule_trains_like_tensorflow_and_its_rate_is_tf_s_bit_for_bit(name, tmp_path):
    result = cs_inprocess.compare(sm.model_fn, sm.input_fn, _params(name, momentum=True),
                                  str(tmp_path), sm.STEPS)
    cs_inprocess.assert_same_training(result, rtol=1e-5)
    (message,) = result.compiled.program.schedules
    schedule = Schedule.from_message(message)
    rng = np.random.default_rng(len(name))
    steps = sorted({*range(12), *sm.BOUNDARIES[name], *rng.integers(0, 10 ** 6, 40).tolist()})
    variables = {v: result.compiled.initial_weights[v] for v in schedule.variables}
    ours = np.asarray([evaluate(schedule, s, variables) for s in steps], np.float32)
    want = sm.tf_values(name, steps)
    differ = [(s, float(a), float(b)) for s, a, b in zip(steps, ours, want)
              if a.tobytes() != b.tobytes()]
    assert not differ, f"(step, CS, TF) where the rates differ: {differ[:5]}"


@pytest.mark.slow
def test_a_resumed_run_continues_the_schedule_from_the_checkpointed_step(tmp_path):
    params = _params("warmup_where", momentum=True)
    compiled = cs_inprocess.compile_checked(sm.model_fn, sm.input_fn, params, str(tmp_path))
    data = tf_reference.batches(sm.input_fn, params, sm.STEPS)
    first = cs_inprocess.run_on_cs(compiled.program, compiled.initial_weights, data[:4])
    resumed = cs_inprocess.run_on_cs(compiled.program, first.state, data[4:], global_step=4,
                                     first_batch=4)
    unbroken = cs_inprocess.run_on_cs(compiled.program, compiled.initial_weights, data)
    assert first.losses + resumed.losses == unbroken.losses
    for name, value in unbroken.state.items():
        np.testing.assert_array_equal(resumed.state[name], value, err_msg=name)
    reference = tf_reference.run(sm.model_fn, sm.input_fn, params,
                                 {**first.state, "global_step": np.int64(4)}, data[4:])
    np.testing.assert_allclose(resumed.losses, reference.losses, rtol=1e-5)


def test_the_compile_report_shows_the_schedule(tmp_path):
    compile_model(sm.model_fn, sm.input_fn, _params("exponential_staircase"), str(tmp_path))
    report = next(tmp_path.glob("cs_compile/*/compile_report.txt")).read_text()
    assert "Schedule of learning_rate" in report
    assert "floor" in report and "schedule_models.py" in report
    assert "step 3: 0.05" in report


def _refused(model_fn, tmp_path) -> str:
    with pytest.raises(CSRunError) as error:
        compile_model(model_fn, sm.input_fn, {"batch_size": sm.BATCH}, str(tmp_path),
                      validate_only=True)
    return str(error.value)


def _spec(loss, train_op):
    return CSEstimatorSpec(mode="train", loss=loss, train_op=train_op)


def _head(features, labels):
    logits = tf.keras.layers.Dense(3)(features)
    return tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)


def test_a_rate_computed_from_the_batch_is_refused_naming_the_input(tmp_path):
    def model_fn(features, labels, mode, params):
        loss = _head(features, labels)
        rate = 0.01 * tf.reduce_mean(features)
        step = tf.compat.v1.train.get_or_create_global_step()
        return _spec(loss, tf.compat.v1.train.GradientDescentOptimizer(rate).minimize(
            loss, global_step=step))

    line = _refused(model_fn, tmp_path)
    assert "model's input features" in line and "test_schedules.py:" in line


def test_a_random_rate_is_refused_naming_the_op(tmp_path):
    def model_fn(features, labels, mode, params):
        loss = _head(features, labels)
        step = tf.compat.v1.train.get_or_create_global_step()
        rate = tf.compat.v1.train.exponential_decay(0.1, step, 3, 0.5) * \
            tf.random.uniform([], 0.5, 1.0)
        return _spec(loss, tf.compat.v1.train.GradientDescentOptimizer(rate).minimize(
            loss, global_step=step))

    line = _refused(model_fn, tmp_path)
    assert "RandomUniform" in line and "test_schedules.py:" in line


def test_a_rate_the_train_op_writes_is_refused(tmp_path):
    def model_fn(features, labels, mode, params):
        loss = _head(features, labels)
        step = tf.compat.v1.train.get_or_create_global_step()
        rate = tf.compat.v1.get_variable("rate", [], trainable=False,
                                         initializer=tf.constant_initializer(0.1))
        update = tf.compat.v1.train.GradientDescentOptimizer(rate).minimize(loss, global_step=step)
        with tf.control_dependencies([update]):
            return _spec(loss, tf.compat.v1.assign(rate, rate * 0.9).op)

    line = _refused(model_fn, tmp_path)
    assert "rate" in line and "test_schedules.py:" in line


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["plain", "num_updates"])
def test_weight_moving_averages_are_kept_on_the_cs_as_tensorflow_keeps_them(kind, tmp_path):
    params = {**_params("piecewise_constant", momentum=True), "moving_average": kind}
    result = cs_inprocess.compare(sm.model_fn, sm.input_fn, params, str(tmp_path), sm.STEPS)
    cs_inprocess.assert_same_training(result, rtol=1e-5)
    shadows = [n for n in result.cs.state if n.endswith("/ExponentialMovingAverage")]
    assert len(shadows) == 4  # two Dense layers' kernels and biases, under TF's names
    assert set(shadows) <= set(result.reference.state)  # compared above, with the weights
    for name in shadows:  # and they moved away from their weights' start
        assert not np.array_equal(result.cs.state[name],
                                  result.compiled.initial_weights[name.rsplit("/", 1)[0]])
    report = next(tmp_path.glob("cs_compile/*/compile_report.txt")).read_text()
    assert "Moving averages" in report
    # the chief's checkpoint of the CS's state restores on the CPU path, shadows included
    path = checkpoints.write_checkpoint(str(tmp_path / "model"), sm.STEPS, {
        **result.cs.state, "global_step": np.asarray(sm.STEPS, np.int64)}, None)
    signature = batch_signature(make_dataset(sm.input_fn, params))
    with model_graph(params) as graph:
        call_model_fn(sm.model_fn, *signature.placeholders(), "train", params)
        variables = [v for v in tf.compat.v1.global_variables() if v.op.name in shadows]
        with tf.compat.v1.Session(graph=graph) as session:
            checkpoints.restore_variables(session, variables, path)
            restored = dict(zip(shadows, session.run(
                [next(v for v in variables if v.op.name == n) for n in shadows])))
    for name in shadows:
        np.testing.assert_array_equal(restored[name], result.cs.state[name], err_msg=name)


def test_a_moving_average_of_a_weight_the_train_op_does_not_train_is_refused(tmp_path):
    def model_fn(features, labels, mode, params):
        loss = _head(features, labels)
        step = tf.compat.v1.train.get_or_create_global_step()
        variables = tf.compat.v1.trainable_variables()
        update = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
            loss, global_step=step, var_list=variables[1:])
        ema = tf.compat.v1.train.ExponentialMovingAverage(0.99)
        with tf.control_dependencies([update]):
            train_op = ema.apply(variables)
        return _spec(loss, train_op)

    line = _refused(model_fn, tmp_path)
    assert "ExponentialMovingAverage" in line and "test_schedules.py:" in line
    assert "\n" not in line


def _program(ops: list[ScalarOp], hyper: str = "learning_rate") -> pb.Program:
    program = pb.Program(name="p", batch_size=2, micro_batch_size=2, optimizer=pb.Optimizer(
        type="sgd", learning_rate=0.1))
    program.inputs.add(name="features", dtype=pb.FLOAT32, shape=[3])
    program.kernels.add(name="d", type="dense", inputs=["features"], output_shape=[2],
                        attrs={"units": pb.AttrValue(i=2), "use_bias": pb.AttrValue(b=False)},
                        params=[pb.Param(role="kernel", variable="w", shape=[3, 2],
                                         dtype=pb.FLOAT32)])
    program.schedules.append(Schedule(hyper, tuple(ops)).to_message(pb))
    return program


@pytest.mark.parametrize("ops, hyper, words", [
    ([ScalarOp("step", "int64"), ScalarOp("cos", "float32", (0,))], "learning_rate",
     "float32 only"),
    ([ScalarOp("const", "float32", (), (), 0.1), ScalarOp("mul", "float32", (0, 5))],
     "learning_rate", "not an earlier one"),
    ([ScalarOp("gamma", "float32")], "learning_rate", "unknown op"),
    ([ScalarOp("const", "float32", (), (), 0.1)], "beta1", "schedules may compute"),
    ([ScalarOp("variable", "float32", name="w")], "learning_rate", "a weight of the program"),
])
def test_the_cs_refuses_a_malformed_schedule_before_anything_is_allocated(ops, hyper, words):
    with pytest.raises(CSError) as error:
        check_program(_program(ops, hyper))
    assert words in str(error.value)


@pytest.mark.parametrize("variable, shadow, offset, words", [
    ("v", "v/ExponentialMovingAverage", 1, "not a weight of the program"),
    ("w", "w", 1, "name is empty or taken"),
    ("w", "w/ExponentialMovingAverage", 2, "step offset of 0 or 1"),
])
def test_the_cs_refuses_a_malformed_moving_average(variable, shadow, offset, words):
    program = _program([ScalarOp("const", "float32", (), (), 0.1)])
    factor = Schedule(FACTOR, (ScalarOp("const", "float32", (), (), 0.01),))
    program.moving_averages.append(MovingAverage(variable, shadow, factor, offset).to_message(pb))
    with pytest.raises(CSError) as error:
        check_program(program)
    assert words in str(error.value)


def test_a_failed_assertion_of_the_schedule_names_the_step():
    schedule = Schedule("learning_rate", (
        ScalarOp("step", "int64"), ScalarOp("const", "int64", (), (), 5.0),
        ScalarOp("less", "bool", (0, 1)), ScalarOp("assert", "bool", (2,), name="check"),
        ScalarOp("const", "float32", (), (3,), 0.5)))
    assert evaluate(schedule, 4, {}) == np.float32(0.5)
    with pytest.raises(ValueError, match="check of the learning_rate schedule failed at step 7"):
        evaluate(schedule, 7, {})


SCALAR_OPS = {"neg": tf.negative, "abs": tf.abs, "floor": tf.floor, "ceil": tf.math.ceil,
              "sqrt": tf.sqrt, "rsqrt": tf.math.rsqrt, "square": tf.square,
              "reciprocal": tf.math.reciprocal, "exp": tf.exp, "log": tf.math.log,
              "log1p": tf.math.log1p, "expm1": tf.math.expm1, "cos": tf.cos, "sin": tf.sin, "add": tf.add, "sub": tf.subtract,
              "mul": tf.multiply, "div": tf.math.truediv, "floordiv": tf.math.floordiv,
              "floormod": tf.math.floormod, "minimum": tf.minimum, "maximum": tf.maximum,
              "pow": tf.pow, "squared_difference": tf.math.squared_difference}


UNARY_OPS = ("neg", "abs", "floor", "ceil", "sqrt", "rsqrt", "square", "reciprocal", "exp",
             "log", "log1p", "expm1", "cos", "sin")


def test_each_float_op_of_a_schedule_computes_tensorflow_s_scalar_bit_for_bit():
    """Random scalars (underflows to denormals included) through each float32 op, against
    TF's kernel for one element (fed at run time: nothing folded)."""
    rng = np.random.default_rng(3)
    a = (rng.uniform(-30, 30, 60) * np.exp(rng.uniform(-3, 3, 60))).astype(np.float32)
    b = rng.uniform(-4, 40, 60).astype(np.float32)
    a[:4], b[:4] = [0.5, 1e-20, 0.9, -2.0], [200.0, 1e-19, 900.0, 3.0]
    positive = ("sqrt", "rsqrt", "log", "log1p")
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        x, y, z = (tf.compat.v1.placeholder(tf.float32, []) for _ in range(3))
        ops = {name: fn(z if name in positive else x) if name in UNARY_OPS else fn(x, y)
               for name, fn in SCALAR_OPS.items()}
        differ = []
        for u, v in zip(a, b):
            want = session.run(ops, {x: u, y: v, z: abs(u)})
            for name, value in want.items():
                arg = abs(u) if name in positive else u
                consts = (ScalarOp("const", "float32", (), (), float(arg)),
                          ScalarOp("const", "float32", (), (), float(v)))
                got = evaluate(Schedule("learning_rate", (*consts, ScalarOp(
                    name, "float32", (0,) if name in UNARY_OPS else (0, 1)))), 0, {})
                if np.float32(got).tobytes() != np.float32(value).tobytes():
                    differ.append((name, float(arg), float(v), float(got), float(value)))
    assert not differ, f"(op, x, y, CS, TF): {differ[:5]}"
