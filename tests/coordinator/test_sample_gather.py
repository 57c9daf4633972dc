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
from launcher.estimator import CSEstimatorSpec, ModeKeys
from wafer.kernels.base import build_kernel

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
    picked = {
        "across samples": lambda: tf.gather(x, features["positions"]),
        "constant positions": lambda: tf.gather(x, tf.constant([[0, 1]] * 8), batch_dims=1),
        "constant positions, axis 2": lambda: tf.gather(x, tf.constant([1] * 8), axis=2, batch_dims=1),
    }[params["case"]]()
    logits = tf.keras.layers.Dense(VOCAB)(tf.reshape(picked, [8, -1]))
    loss = v1.losses.sparse_softmax_cross_entropy(labels[:, 0], logits)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=v1.train.GradientDescentOptimizer(0.1).minimize(loss))


@pytest.mark.parametrize("case", ["across samples", "constant positions", "constant positions, axis 2"])
def test_other_gathers_from_a_per_sample_value_are_refused_naming_the_op(tmp_path, case):
    with pytest.raises(CSRunError) as error:
        compile_model(other_gather, input_fn, params(case=case), str(tmp_path), validate_only=True)
    words = cs_inprocess.model_op_words(other_gather, input_fn, params(case=case))
    assert cs_inprocess.refusal_problem(error.value, __file__, words) == ""
    assert str(error.value).startswith("validation failed: GatherV2 ")
    assert "gathers from a per-sample value" in str(error.value)


def along_axis(features, labels, mode, params):
    x = tf.keras.layers.Embedding(VOCAB, HIDDEN)(features["tokens"])
    picked = tf.experimental.numpy.take_along_axis(x, features["positions"][:, :, None], axis=1)
    logits = tf.keras.layers.Dense(VOCAB)(tf.reshape(picked, [8, -1]))
    loss = v1.losses.sparse_softmax_cross_entropy(labels[:, 0], logits)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=v1.train.GradientDescentOptimizer(0.1).minimize(loss))


def test_take_along_axis_is_refused_in_one_line_naming_its_op(tmp_path):
    """NumPy's take_along_axis builds its indices with tf.broadcast_to and unknown inner
    dimensions: refused in one line (tf.gather(x, ids, batch_dims=1) is what trains)."""
    line = cs_inprocess.refusal(along_axis, input_fn, params(), str(tmp_path), __file__)
    assert line.startswith("validation failed: BroadcastTo "), line


QUANTILES = 5


def quantile_regression(features, labels, mode, params):
    """A QR-DQN head: QUANTILES quantiles of every action's return, [batch, quantile, action];
    the taken action's quantiles picked per sample with tf.gather(z, actions, axis=2,
    batch_dims=1) (or, z [batch, action, quantile], tf.gather_nd(z, actions[:, None],
    batch_dims=1)), the quantile Huber loss to the target return; Adam; evaluated with the
    mean Q-value and predicted (Q-values and the greedy action)."""
    state = tf.keras.layers.Embedding(VOCAB, HIDDEN)(features["tokens"])
    hidden = tf.keras.layers.Dense(16, activation="relu")(tf.reshape(state, [-1, LENGTH * HIDDEN]))
    out = tf.keras.layers.Dense(QUANTILES * LENGTH)(hidden)
    actions = features["positions"][:, 0]
    if params["spelling"] == "gather_nd":  # [batch, action, quantile]
        z = tf.reshape(out, [-1, LENGTH, QUANTILES])
        q = tf.reduce_mean(z, 2)
    else:
        z = tf.reshape(out, [-1, QUANTILES, LENGTH])
        q = tf.reduce_mean(z, 1)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"q": q, "action": tf.argmax(q, 1)})
    if params["spelling"] == "gather_nd":
        taken = tf.gather_nd(z, actions[:, None], batch_dims=1)  # [batch, quantile]
    else:
        taken = tf.gather(z, actions, axis=2, batch_dims=1)
    taus = tf.constant((np.arange(QUANTILES) + 0.5) / QUANTILES, tf.float32)
    u = tf.cast(labels[:, :1], tf.float32) / VOCAB - taken
    huber = tf.where(tf.abs(u) <= 1.0, 0.5 * tf.square(u), tf.abs(u) - 0.5)
    loss = tf.reduce_mean(tf.reduce_sum(tf.abs(taus - tf.cast(u < 0, tf.float32)) * huber, 1))
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss, eval_metric_ops={"mean_q": v1.metrics.mean(tf.reduce_max(q, 1))})
    train_op = v1.train.AdamOptimizer(0.01).minimize(loss, global_step=v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode, loss=loss, train_op=train_op)


MEMBERS = 4


def ensemble(features, labels, mode, params):
    """A bootstrapped ensemble of MEMBERS heads stacked on the last axis, [batch, class,
    member]; each sample trains the members it was dealt (tf.gather(logits, members, axis=2,
    batch_dims=1) with members [batch] or [batch, 2]: [batch, class] or [batch, class, 2]);
    cross-entropy, SGD with momentum."""
    state = tf.keras.layers.Embedding(VOCAB, HIDDEN)(features["tokens"])
    hidden = tf.keras.layers.Dense(16, activation="tanh")(tf.reshape(state, [-1, LENGTH * HIDDEN]))
    logits = tf.stack([tf.keras.layers.Dense(VOCAB)(hidden) for _ in range(MEMBERS)], axis=-1)
    members = features["positions"][:, :params["dealt"]] % MEMBERS
    picked = tf.gather(logits, members[:, 0] if params["dealt"] == 1 else members, axis=2, batch_dims=1)
    if params["dealt"] > 1:
        picked = tf.reduce_mean(tf.transpose(picked, [0, 2, 1]), 1)
    loss = v1.losses.sparse_softmax_cross_entropy(labels[:, 0], picked)
    train_op = v1.train.MomentumOptimizer(0.1, 0.9).minimize(loss, global_step=v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode, loss=loss, train_op=train_op)


@pytest.mark.parametrize("spelling", ["axis", "gather_nd"])
def test_a_quantile_heads_taken_action_trains_evaluates_and_predicts_like_tensorflow(tmp_path, spelling):
    run = cs_inprocess.compare(quantile_regression, input_fn, params(spelling=spelling), str(tmp_path), steps=4)
    assert [k.type for k in run.compiled.program.kernels].count("sample_gather") == 1
    cs_inprocess.assert_same_training(run, rtol=1e-5)
    assert cs_inprocess.cpu_path_mismatches(quantile_regression, input_fn, params(spelling=spelling),
                                            str(tmp_path), run) == []


@pytest.mark.parametrize("dealt", [1, 2])
def test_an_ensembles_members_picked_per_sample_train_like_tensorflow(tmp_path, dealt):
    run = cs_inprocess.compare(ensemble, input_fn, params(dealt=dealt), str(tmp_path), steps=4)
    assert [k.type for k in run.compiled.program.kernels].count("sample_gather") == 1
    cs_inprocess.assert_same_training(run, rtol=1e-5)


SIDE, CHANNELS, CLASSES = 6, 2, 3


def images_input_fn(params):
    rng = np.random.default_rng(11)
    images = rng.normal(size=(32, SIDE, SIDE, CHANNELS)).astype(np.float32)
    labels = (images[:, :3, :3, 0].sum((1, 2)) > 0).astype(np.int32) + (images[:, 3:, 3:, 1].sum((1, 2)) > 1)
    return tf.data.Dataset.from_tensor_slices((images, labels.astype(np.int32))).repeat().batch(
        params["batch_size"], drop_remainder=True)


def bilinear_sample(images, x, y):
    """The spatial transformer tutorials' sampler: the four neighbours of each (x, y) picked by
    tf.gather_nd with the batch index tf.range(B) tiled as the first coordinate, clipped at the
    border, blended by their areas."""
    x0, y0 = tf.floor(x), tf.floor(y)
    x1, y1 = x0 + 1, y0 + 1
    batch = tf.tile(tf.range(tf.shape(images)[0])[:, None], [1, tf.shape(x)[1]])

    def pixel(yy, xx):
        yy = tf.cast(tf.clip_by_value(yy, 0, SIDE - 1), tf.int32)
        xx = tf.cast(tf.clip_by_value(xx, 0, SIDE - 1), tf.int32)
        return tf.gather_nd(images, tf.stack([batch, yy, xx], axis=-1))

    return ((x1 - x) * (y1 - y))[..., None] * pixel(y0, x0) + ((x1 - x) * (y - y0))[..., None] * pixel(y1, x0) \
        + ((x - x0) * (y1 - y))[..., None] * pixel(y0, x1) + ((x - x0) * (y - y0))[..., None] * pixel(y1, x1)


def classified(x, labels, mode):
    """The image models' head: a Dense to the classes, cross-entropy, accuracy in EVAL, Adam."""
    logits = tf.keras.layers.Dense(CLASSES)(x)
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode=mode, loss=loss, eval_metric_ops={
            "accuracy": v1.metrics.accuracy(labels, tf.argmax(logits, 1))})
    train_op = v1.train.AdamOptimizer(0.01).minimize(loss, global_step=v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op)


def spatial_transformer(features, labels, mode, params):
    """A localisation net predicts an affine transform per image; the grid it maps is sampled
    bilinearly (bilinear_sample) and classified; Adam; evaluated with accuracy."""
    flat = tf.reshape(features, [-1, SIDE * SIDE * CHANNELS])
    theta = tf.keras.layers.Dense(6, kernel_initializer="zeros",
                                  bias_initializer=tf.constant_initializer([0.9, 0.1, 0.0, -0.1, 0.9, 0.0]))(
        tf.keras.layers.Dense(8, activation="tanh")(flat))
    grid = np.stack(np.meshgrid(np.linspace(-1, 1, SIDE), np.linspace(-1, 1, SIDE)), -1).reshape(-1, 2)
    grid = tf.constant(np.concatenate([grid, np.ones((len(grid), 1))], 1).T, tf.float32)  # (3, SIDE * SIDE)
    mapped = tf.matmul(tf.reshape(theta, [-1, 2, 3]), tf.tile(grid[None], [tf.shape(theta)[0], 1, 1]))
    x = (mapped[:, 0] + 1.0) * (SIDE - 1) / 2.0
    y = (mapped[:, 1] + 1.0) * (SIDE - 1) / 2.0
    sampled = tf.reshape(bilinear_sample(features, x, y), [-1, SIDE * SIDE * CHANNELS])
    return classified(sampled, labels, mode)


def test_a_spatial_transformers_gather_nd_with_the_batch_index_trains_and_evaluates_like_tensorflow(tmp_path):
    run = cs_inprocess.compare(spatial_transformer, images_input_fn, params(), str(tmp_path / "train"), steps=4)
    gathers = [k for k in run.compiled.program.kernels if k.type == "sample_gather"]
    assert len(gathers) == 4 and all(k.attrs["depth"].i == 2 for k in gathers)
    cs_inprocess.assert_same_training(run)
    assert cs_inprocess.evaluation_mismatch(spatial_transformer, images_input_fn, params(),
                                            str(tmp_path / "eval"), run) == ""


def test_a_coordinate_outside_its_axis_is_an_error_naming_the_kernel():
    kernel = build_kernel("sample_gather", "pick", {"depth": 2}, [(3, 4, 2), (5, 2)])
    images = np.arange(2 * 3 * 4 * 2, dtype=np.float32).reshape(2, 3, 4, 2)
    coordinates = np.array([[[0, 0], [2, 3], [1, 2], [0, 3], [2, 0]]] * 2, np.int32)
    out, _ = kernel.forward({}, [images, coordinates], None)
    np.testing.assert_array_equal(out, tf.gather_nd(images, coordinates, batch_dims=1).numpy())
    coordinates[1, 4] = [0, 4]  # in range of the 12 flattened rows, outside the axis of 4
    with pytest.raises(ValueError, match="pick: index 4 is outside each sample's axis 2's 4 rows"):
        kernel.forward({}, [images, coordinates], None)


def keypoint_features(features, labels, mode, params):
    """A keypoint head: a heat map's two hottest pixels per image (tf.math.top_k of the
    flattened map, as (row, column) by // and %), the feature map's vector at each picked by
    tf.gather_nd(maps, keypoints, batch_dims=1), classified; Adam; evaluated with accuracy."""
    maps = tf.keras.layers.Conv2D(4, 3, padding="same", activation="relu")(features)
    heat = tf.reshape(tf.keras.layers.Conv2D(1, 1)(maps), [-1, SIDE * SIDE])
    hottest = tf.math.top_k(heat, 2).indices
    keypoints = tf.stack([hottest // SIDE, hottest % SIDE], -1)  # [batch, 2, 2]
    picked = tf.gather_nd(maps, keypoints, batch_dims=1)  # [batch, 2, 4]
    return classified(tf.reshape(picked, [-1, 8]), labels, mode)


def test_a_gather_nd_with_batch_dims_at_keypoints_trains_and_evaluates_like_tensorflow(tmp_path):
    run = cs_inprocess.compare(keypoint_features, images_input_fn, params(), str(tmp_path / "train"), steps=4)
    gathers = [k for k in run.compiled.program.kernels if k.type == "sample_gather"]
    assert len(gathers) == 1 and gathers[0].attrs["depth"].i == 2
    cs_inprocess.assert_same_training(run, rtol=1e-5)
    assert cs_inprocess.evaluation_mismatch(keypoint_features, images_input_fn, params(),
                                            str(tmp_path / "eval"), run) == ""
