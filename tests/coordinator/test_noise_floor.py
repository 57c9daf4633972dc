"""A ReLU unit active for every sample of a batch, before BatchNormalization in training,
under Adam: the normalization's backward output sums to 0 over the batch, so the unit's bias
gradient element is 0 in exact arithmetic, and float32 computes rounding noise (~1e-8) that
Adam divides by its own size into steps of the learning rate. The CS sets each gradient
element at most GRADIENT_NOISE of the model's largest to 0 exactly (a `noise_floor`
transform: coordinator/compiler/training/noise.py): those elements stay where float64 TF
keeps them, the rest trains with float32 TF's numbers. SGD and momentum, which step by the
noise's own size, get no floor."""
from __future__ import annotations

import dataclasses
import tempfile

import cs_inprocess
import numpy as np
import pytest
import tensorflow as tf
import tf_reference
from sklearn.datasets import load_digits

from coordinator.compiler.training.noise import floored
from coordinator.compiler.training.numbers import GRADIENT_NOISE
from cs_api import pb
from examples.modelzoo_trainer import build_train_op
from tf_model.estimator_spec import CSEstimatorSpec
from wafer.grad_transforms import GradientTransform, apply_transforms
from wafer.optimizers import OptimizerConfig
from wse_sim.errors import CSError
from wse_sim.program import check_transforms

STEPS = 8
LEARNING_RATE = 1e-3
PARAMS = {"optimizer": "adam", "runconfig": {"tf_random_seed": 1}}
FLOORED = ("dense/bias",)  # (added before the normalization; its kernel multiplies the inputs)
OPTIMIZERS = {
    "adam": lambda: tf.compat.v1.train.AdamOptimizer(LEARNING_RATE),
    "rmsprop": lambda: tf.compat.v1.train.RMSPropOptimizer(LEARNING_RATE),
    "adagrad": lambda: tf.compat.v1.train.AdagradOptimizer(LEARNING_RATE),
    "sgd": lambda: tf.compat.v1.train.GradientDescentOptimizer(0.1),
    "momentum": lambda: tf.compat.v1.train.MomentumOptimizer(0.1, 0.9),
}

ADAMW = {"optimizer_type": "adamw", "learning_rate": LEARNING_RATE, "weight_decay_rate": 0.1,
         "exclude_from_weight_decay": []}


def input_fn(params):
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((x, digits.target.astype(np.int32))).batch(
        16, drop_remainder=True).repeat()


def model_fn(features, labels, mode, params):
    layers = tf.keras.layers
    h = layers.Dense(32, activation="relu", bias_initializer=tf.keras.initializers.Constant(
        params.get("bias", 0.0)))(features)
    h = layers.BatchNormalization()(h, training=mode == "train")
    logits = layers.Dense(10)(h)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    if mode != "train":
        return CSEstimatorSpec(mode=mode, loss=loss)
    step = tf.compat.v1.train.get_or_create_global_step()
    updates = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
    with tf.control_dependencies(updates):
        if params["optimizer"] == "adamw":  # (the modelzoo's, decaying every weight)
            train_op = build_train_op(loss, ADAMW)
        else:
            train_op = OPTIMIZERS[params["optimizer"]]().minimize(loss, step)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("noise_floor"))


@pytest.fixture(scope="module")
def trained(model_dir):
    return cs_inprocess.compare(model_fn, input_fn, PARAMS, model_dir, steps=STEPS)


@pytest.fixture(scope="module")
def exact(trained):
    """float64 TF's run from the same initial weights and batches."""
    data = tf_reference.batches(input_fn, PARAMS, STEPS)
    return tf_reference.run(model_fn, input_fn, PARAMS, trained.compiled.initial_weights, data,
                            floatx="float64").state


def floored_still(trained) -> np.ndarray:
    """The bias elements the CS never moved."""
    start = trained.compiled.initial_weights["dense/bias"]
    return trained.cs.state["dense/bias"] == start


def test_the_compiler_emits_the_noise_floor_last_for_what_reaches_the_normalization(trained):
    transforms = trained.compiled.program.gradient_transforms
    assert [(t.kind, t.value, tuple(t.variables)) for t in transforms][-1:] == \
        [("noise_floor", GRADIENT_NOISE, FLOORED)]
    lines = trained.compiled.report_text.splitlines()
    for variable in FLOORED:
        assert f"{variable}: noise floor (gradient elements at most 1e-06 of the model's " \
               "largest set to 0 exactly: rounding noise of a sum a batch normalization " \
               "cancels, which the optimizer would amplify)" in lines


def test_floored_elements_stay_where_tf_moved_them_by_noise_the_rest_is_tfs(trained):
    still = floored_still(trained)
    start = trained.compiled.initial_weights["dense/bias"]
    tf_moves = np.abs(trained.reference.state["dense/bias"] - start)
    # measured: 9 elements still (units active for every sample, or none), float32 TF moved
    # them by up to 6.2e-4
    assert 0 < still.sum() < still.size
    assert tf_moves[still].max() > 0.1 * LEARNING_RATE
    cs_inprocess.assert_same_training(trained)  # the still elements against their start


def test_the_trained_model_evaluates_on_the_cs_like_the_cpu_path(trained, model_dir):
    assert cs_inprocess.evaluation_mismatch(model_fn, input_fn, PARAMS, model_dir, trained) == ""


def test_the_floored_elements_are_nearer_float64_tf_than_float32_tfs(trained, exact):
    still = floored_still(trained)
    want = exact["dense/bias"][still]
    cs, tf32 = (np.abs(run.state["dense/bias"][still] - want).max()
                for run in (trained.cs, trained.reference))
    assert cs < 1e-9 < 1e-2 * tf32  # measured: CS 3e-12 (float64's own noise), TF 6.2e-4
    for name in FLOORED:  # and the whole variables, the elements the CS moved included
        assert np.abs(trained.cs.state[name] - exact[name]).max() <= \
            np.abs(trained.reference.state[name] - exact[name]).max()


def test_under_adamw_the_floored_elements_only_decay(tmp_path):
    """AdamW decays every weight, the floored bias elements too: the CS's have no gradient
    (their slots stay 0) and move by the decay alone, TF's by its noise besides (biases
    that start at 0.1, which the decay moves). Seed 5: with seeds 1 to 4 some element gets
    noise on one step and a real gradient on another, and ends where exact arithmetic puts
    it, not where float32 TF's noise did (docs/design.md, the noise floor's limits)."""
    params = {**PARAMS, "optimizer": "adamw", "bias": 0.1, "runconfig": {"tf_random_seed": 5}}
    result = cs_inprocess.compare(model_fn, input_fn, params, str(tmp_path), steps=4)
    assert cs_inprocess.noise_floor_variables(result.compiled) == set(FLOORED)
    slots = [v for n, v in result.cs.state.items() if n.startswith("dense/bias/")]
    still = np.logical_and.reduce([slot == 0 for slot in slots])
    start = result.compiled.initial_weights["dense/bias"]
    assert still.any() and not np.array_equal(result.cs.state["dense/bias"][still], start[still])
    cs_inprocess.assert_same_training(result)


def test_a_dropped_real_gradient_is_still_reported(trained):
    """The check accepts a still element only as its optimizer slots agree with TF's: a CS
    that dropped a real gradient element (weight at its start, slots 0) differs."""
    start = trained.compiled.initial_weights["dense/bias"]
    moved = int(np.argmax(np.abs(trained.cs.state["dense/bias"] - start)))
    state = dict(trained.cs.state)
    for name in [n for n in state if n == "dense/bias" or n.startswith("dense/bias/")]:
        state[name] = state[name].copy()
        state[name][moved] = start[moved] if name == "dense/bias" else 0
    dropped = dataclasses.replace(trained, cs=dataclasses.replace(trained.cs, state=state))
    problems = cs_inprocess.mismatches(dropped)
    assert any(p.startswith("dense/bias/Adam: 1 of 32 elements differ") for p in problems)


@pytest.mark.parametrize("optimizer, floor", [("rmsprop", True), ("adagrad", False),
                                              ("sgd", False), ("momentum", False)])
def test_only_an_optimizer_that_amplifies_noise_gets_the_floor(optimizer, floor):
    with tempfile.TemporaryDirectory() as model_dir:
        compiled = cs_inprocess.compile_checked(model_fn, input_fn, {**PARAMS, "optimizer": optimizer},
                                                model_dir)
    kinds = [t.kind for t in compiled.program.gradient_transforms]
    assert kinds == (["noise_floor"] if floor else [])


def test_the_floor_is_for_what_is_added_across_the_batch_before_a_normalization():
    """x @ w + b -> relu -> batch normalization (gamma, beta) -> @ w2 + b2 -> batch
    normalization -> @ w3 + b3, by hand: b, beta and b2 (each element's gradient a plain sum
    over the batch) get the floor; the kernels and gamma (their elements sum products with
    the samples: a real one can be that small by chance, measured in a 2-layer model: 2 to
    31 of 2048 kernel elements a step, which float32 TF computed as float64 TF does) and b3
    (after the last normalization) do not; SGD gets none."""
    def normalized(h, name):
        mean, var = tf.nn.moments(h, [0])
        return tf.nn.batch_normalization(h, mean, var, tf.Variable(tf.zeros([4]), name=f"beta{name}"),
                                         tf.Variable(tf.ones([4]), name=f"gamma{name}"), 1e-3)

    def dense(h, name):
        return h @ tf.Variable(tf.ones([h.shape[1], 4]), name=f"w{name}") + \
            tf.Variable(tf.zeros([4]), name=f"b{name}")

    with tf.Graph().as_default():
        h = normalized(tf.nn.relu(dense(tf.compat.v1.placeholder(tf.float32, [8, 3]), "")), "")
        loss = tf.reduce_sum(dense(normalized(dense(h, "2"), "2"), "3"))
        names = [v.op.name for v in tf.compat.v1.global_variables()]
        tf.compat.v1.train.AdamOptimizer().minimize(loss)  # (its updates read every variable)
    adam = OptimizerConfig("adam", 1e-3, beta1=0.9, beta2=0.999, epsilon=1e-8)
    assert floored(loss, dict.fromkeys(names, adam), 0.5, GRADIENT_NOISE) == ("b", "beta", "b2")
    sgd = OptimizerConfig("sgd", 0.1)
    assert floored(loss, dict.fromkeys(names, sgd), 0.5, GRADIENT_NOISE) == ()


def test_the_floor_zeroes_elements_at_the_noise_level_of_every_gradients_largest():
    grads = {"a": np.array([2.0, -1e-7], np.float32),
             "b": np.array([3e-6, -2e-6, 1e-6, 0.0], np.float32)}
    apply_transforms([GradientTransform("noise_floor", 1e-6, variables=("b",))], grads)
    assert grads["b"].tolist() == [np.float32(3e-6), 0.0, 0.0, 0.0]  # (2e-6 is the floor)
    assert grads["a"].tolist() == [2.0, np.float32(-1e-7)]  # (not named: kept)
    for largest in (np.inf, np.nan):  # no scale to judge noise by: nothing floored
        grads = {"a": np.array([largest], np.float32), "b": np.array([1e-9], np.float32)}
        apply_transforms([GradientTransform("noise_floor", 1e-6, variables=("b",))], grads)
        assert grads["b"][0] == np.float32(1e-9)


@pytest.mark.parametrize("value", [0.0, 1.0, -1e-6, np.nan])
def test_a_program_with_a_floor_outside_0_1_is_invalid(trained, value):
    program = pb.Program()
    program.CopyFrom(trained.compiled.program)
    program.gradient_transforms[-1].value = value
    params = {v: None for v in FLOORED}
    with pytest.raises(CSError, match="noise_floor needs a fraction of the largest gradient "
                                        r"in \(0, 1\)"):
        check_transforms(program, params)
