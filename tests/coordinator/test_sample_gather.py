"""tf.gather(x, positions, batch_dims=1) on the CS: each sample's rows of a per-sample value
at its own positions (BERT's masked positions), trained with TensorFlow's numbers, and the
other gathers from a per-sample value refused in one line naming the op."""
from __future__ import annotations

import cs_inprocess
import numpy as np
import pytest
import tensorflow as tf

from common.errors import CSRunError
from coordinator.compiler import compile_model
from launcher.estimator import CSEstimatorSpec

v1 = tf.compat.v1
VOCAB, LENGTH, PREDICTIONS, HIDDEN = 13, 7, 4, 8


def input_fn(params):
    """Token ids, and per sample PREDICTIONS positions to predict, with repeats (a position
    picked twice adds both gradients into its row); labels: the token ids there."""
    rng = np.random.default_rng(3)
    count = 32
    tokens = rng.integers(0, VOCAB, (count, LENGTH)).astype(np.int32)
    positions = rng.integers(0, LENGTH, (count, PREDICTIONS)).astype(np.int32)
    positions[::2, 1] = positions[::2, 0]  # every other sample repeats a position
    positions[::3, 2:] = positions[::3, :1]  # every third, thrice
    labels = np.take_along_axis(tokens, positions, axis=1)
    features = {"tokens": tokens, "positions": positions}
    return tf.data.Dataset.from_tensor_slices((features, labels)).repeat().batch(
        params["batch_size"], drop_remainder=True)


def masked_lm(features, labels, mode, params):
    """Embedding -> Dense over the whole sequence -> the predicted positions' rows (the
    gather), plus an embedding of the tokens there (a gather of integers) -> Dense to the
    vocabulary -> cross-entropy, Adam."""
    policy = "mixed_float16" if params.get("mixed") else "float32"
    x = tf.keras.layers.Embedding(VOCAB, HIDDEN, dtype=policy)(features["tokens"])
    x = tf.keras.layers.Dense(HIDDEN, activation="tanh", dtype=policy)(x)
    if params["spelling"] == "axis":
        picked = tf.gather(x, features["positions"], axis=1, batch_dims=1)
    else:
        picked = tf.gather(x, features["positions"], batch_dims=1)
    masked_tokens = tf.gather(features["tokens"], features["positions"], batch_dims=1)  # integers
    picked += tf.keras.layers.Embedding(VOCAB, HIDDEN, dtype=policy)(masked_tokens)
    logits = tf.cast(tf.keras.layers.Dense(VOCAB, dtype=policy)(picked), tf.float32)
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    train_op = v1.train.AdamOptimizer(0.02).minimize(loss, global_step=v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op)


def params(**extra):
    return {"batch_size": 8, "runconfig": {"tf_random_seed": 2}, **extra}


@pytest.mark.parametrize("spelling", ["batch_dims", "axis"])
def test_a_per_sample_gather_with_repeated_positions_trains_like_tensorflow(tmp_path, spelling):
    run = cs_inprocess.compare(masked_lm, input_fn, params(spelling=spelling), str(tmp_path), steps=6)
    assert [k.type for k in run.compiled.program.kernels].count("sample_gather") == 2
    assert run.cs.losses[-1] < run.cs.losses[0]
    cs_inprocess.assert_same_training(run)


def test_a_float16_per_sample_gather_trains_like_tensorflow(tmp_path):
    run = cs_inprocess.compare(masked_lm, input_fn, params(spelling="batch_dims", mixed=True),
                               str(tmp_path), steps=6)
    assert not cs_inprocess.mismatches(run, rtol=1e-2)


def q_learning(features, labels, mode, params):
    """A DQN's TD loss: Q-values of every action, each sample's own action's value picked
    with tf.gather(q, actions, batch_dims=1) (one index per sample), Huber loss to the
    target, RMSProp; evaluated as well."""
    state = tf.keras.layers.Embedding(VOCAB, HIDDEN)(features["tokens"])
    hidden = tf.keras.layers.Dense(HIDDEN, activation="relu")(tf.reshape(state, [-1, LENGTH * HIDDEN]))
    q_values = tf.keras.layers.Dense(LENGTH)(hidden)
    actions = features["positions"][:, 0]
    if params.get("spelling") == "gather_nd":
        rows = tf.range(tf.shape(q_values)[0])
        chosen = tf.gather_nd(q_values, tf.stack([rows[::params.get("step", 1)], actions], axis=1))
    else:
        chosen = tf.gather(q_values, actions, batch_dims=1)
    target = tf.cast(labels[:, 0], tf.float32) / VOCAB
    loss = v1.losses.huber_loss(target, chosen)
    train_op = v1.train.RMSPropOptimizer(0.01).minimize(loss, global_step=v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op)


@pytest.mark.parametrize("spelling", ["batch_dims", "gather_nd"])
def test_a_gather_of_one_row_per_sample_trains_and_evaluates_like_tensorflow(tmp_path, spelling):
    run = cs_inprocess.compare(q_learning, input_fn, params(spelling=spelling),
                               str(tmp_path / "train"), steps=4)
    assert [k.type for k in run.compiled.program.kernels].count("sample_gather") == 1
    cs_inprocess.assert_same_training(run)
    assert cs_inprocess.evaluation_mismatch(q_learning, input_fn, params(spelling=spelling),
                                            str(tmp_path / "eval"), run) == ""


def test_a_gather_nd_of_other_samples_rows_is_refused_in_one_line(tmp_path):
    """tf.stack([tf.range(B)[::-1], actions], 1): sample i would read sample B - 1 - i's."""
    with pytest.raises(CSRunError) as error:
        compile_model(q_learning, input_fn, params(spelling="gather_nd", step=-1), str(tmp_path),
                      validate_only=True)
    words = cs_inprocess.model_op_words(q_learning, input_fn, params(spelling="gather_nd", step=-1))
    assert cs_inprocess.refusal_problem(error.value, __file__, words) == ""
    assert "picks other samples' values" in str(error.value)


def other_gather(features, labels, mode, params):
    x = tf.keras.layers.Embedding(VOCAB, HIDDEN)(features["tokens"])
    flags = tf.cast(x[:, :, :1] > 0, tf.int32)  # per-sample integers (8, LENGTH, 1)
    picked = {
        "feature axis": lambda: tf.gather(x, flags[:, :2, 0], axis=2, batch_dims=1),
        "across samples": lambda: tf.gather(x, features["positions"]),
        "constant positions": lambda: tf.gather(x, tf.constant([[0, 1]] * 8), batch_dims=1),
        "batch_dims 2": lambda: tf.gather(tf.reshape(x, [8, LENGTH, 2, HIDDEN // 2]), flags,
                                          batch_dims=2),
    }[params["case"]]()
    logits = tf.keras.layers.Dense(VOCAB)(tf.reshape(picked, [8, -1]))
    loss = v1.losses.sparse_softmax_cross_entropy(labels[:, 0], logits)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=v1.train.GradientDescentOptimizer(0.1).minimize(loss))


@pytest.mark.parametrize("case", ["feature axis", "across samples", "constant positions",
                                  "batch_dims 2"])
def test_other_gathers_from_a_per_sample_value_are_refused_naming_the_op(tmp_path, case):
    with pytest.raises(CSRunError) as error:
        compile_model(other_gather, input_fn, params(case=case), str(tmp_path), validate_only=True)
    words = cs_inprocess.model_op_words(other_gather, input_fn, params(case=case))
    assert cs_inprocess.refusal_problem(error.value, __file__, words) == ""
    assert str(error.value).startswith("validation failed: GatherV2 ")
    assert "gathers from a per-sample value" in str(error.value)
