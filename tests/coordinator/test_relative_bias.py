"""A T5 relative-position bias, tf.gather(rel_bias, buckets) at constant buckets computed from
positions alone, makes TF's tf.compat.v1 optimizers update rel_bias sparsely (IndexedSlices):
the CS applies the optimizer's sparse rule to the rows the buckets name (rows never named and
their slots stay untouched, duplicates summed; the raw slices under clip_by_global_norm), and
trains as TensorFlow does, evaluates and predicts as the CPU path does; a table gathered again
(each layer its own tf.gather) stays refused in one line naming the second gather."""
from __future__ import annotations

import cs_inprocess
import numpy as np
import pytest
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

v1 = tf.compat.v1
L = tf.keras.layers
T, D, HEADS, BUCKETS = 6, 8, 2, 12
PARAMS = {"runconfig": {"tf_random_seed": 3}}
OPTIMIZERS = {
    "momentum": lambda: v1.train.MomentumOptimizer(0.1, 0.9),
    "adam": lambda: v1.train.AdamOptimizer(1e-2),
    "adagrad": lambda: v1.train.AdagradOptimizer(0.1),
    # the dense rule would zero the rows the buckets never name (linear stays 0 there)
    "ftrl": lambda: v1.train.FtrlOptimizer(0.1, l1_regularization_strength=0.01,
                                           l2_regularization_strength=0.01),
}


def input_fn(params):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, T, D)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((x, rng.integers(0, 3, 64).astype(np.int32))) \
        .batch(8, drop_remainder=True)


def relative_buckets(num_buckets=BUCKETS, max_distance=16):
    """T5's bidirectional buckets of key - query (relative_position_bucket)."""
    pos = tf.range(T)
    rel = pos[None, :] - pos[:, None]
    num_buckets //= 2
    ret = tf.cast(rel > 0, tf.int32) * num_buckets
    n = tf.abs(rel)
    max_exact = num_buckets // 2
    large = max_exact + tf.cast(tf.math.log(tf.cast(n, tf.float32) / max_exact + 1e-6)
                                / np.log(max_distance / max_exact) * (num_buckets - max_exact),
                                tf.int32)
    return ret + tf.where(n < max_exact, n, tf.minimum(large, num_buckets - 1))


def t5_block(features, labels, mode, params):
    rel_bias = v1.get_variable("rel_bias", [BUCKETS, HEADS],
                               initializer=v1.random_normal_initializer(stddev=0.1))
    bias = tf.transpose(tf.gather(rel_bias, relative_buckets()), [2, 0, 1])[None]  # [1,H,T,T]
    h = features
    for i in range(2):  # both layers add the one bias (or each gathers its own)
        if params.get("gather_per_layer"):
            bias = tf.transpose(tf.gather(rel_bias, relative_buckets()), [2, 0, 1])[None]
        q, k, v = (tf.reshape(L.Dense(D, use_bias=False, name=f"{n}{i}")(h), [-1, T, HEADS, D // HEADS])
                   for n in "qkv")
        scores = tf.einsum("bqhd,bkhd->bhqk", q, k) + bias
        ctx = tf.einsum("bhqk,bkhd->bqhd", tf.nn.softmax(scores, -1), v)
        h = h + L.Dense(D, use_bias=False, name=f"o{i}")(tf.reshape(ctx, [-1, T, D]))
    logits = L.Dense(3, name="head")(tf.reduce_mean(h, 1))
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"class": tf.argmax(logits, 1),
                                                  "probs": tf.nn.softmax(logits)})
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss, eval_metric_ops={
            "accuracy": v1.metrics.accuracy(labels, tf.argmax(logits, 1))})
    opt, step = OPTIMIZERS[params["optimizer"]](), v1.train.get_or_create_global_step()
    if not params.get("clip_norm"):
        return CSEstimatorSpec(mode, loss=loss, train_op=opt.minimize(loss, global_step=step))
    grads, variables = zip(*opt.compute_gradients(loss))
    grads, _ = tf.clip_by_global_norm(list(grads), params["clip_norm"])
    return CSEstimatorSpec(mode, loss=loss,
                           train_op=opt.apply_gradients(zip(grads, variables), global_step=step))


def named_rows() -> np.ndarray:
    with tf.Graph().as_default(), v1.Session() as session:
        return session.run(relative_buckets())


def test_the_buckets_leave_rows_unnamed_and_name_others_more_than_once():
    ids, counts = np.unique(named_rows(), return_counts=True)
    assert len(ids) < BUCKETS and counts.max() > 1


def _trains_like_tensorflow(tmp_path, params: dict) -> cs_inprocess.Comparison:
    result = cs_inprocess.compare(t5_block, input_fn, {**PARAMS, **params}, str(tmp_path), steps=4)
    cs_inprocess.assert_same_training(result, rtol=1e-5)
    start, trained = result.compiled.initial_weights["rel_bias"], result.cs.state["rel_bias"]
    unnamed = np.setdiff1d(np.arange(BUCKETS), named_rows())
    assert np.array_equal(trained[unnamed], start[unnamed])
    assert (trained[named_rows()] != start[named_rows()]).all()
    return result


@pytest.mark.parametrize("optimizer", ["momentum", "adagrad", "ftrl"])
def test_a_relative_bias_gathered_at_constant_buckets_trains_its_named_rows_like_tensorflow(
        tmp_path, optimizer):
    _trains_like_tensorflow(tmp_path, {"optimizer": optimizer})


def test_adam_under_global_norm_clipping_trains_like_tensorflow_and_evaluates_and_predicts_like_the_cpu(
        tmp_path):
    """TF's global norm reads the gather's raw slices (a bucket's duplicates apart), Adam's
    sparse rule decays m and v on every row."""
    params = {"optimizer": "adam", "clip_norm": 0.05}
    result = _trains_like_tensorflow(tmp_path, params)
    assert cs_inprocess.cpu_path_mismatches(t5_block, input_fn, {**PARAMS, **params},
                                            str(tmp_path), result) == []


def test_a_table_gathered_by_each_layer_is_refused_naming_the_second_gather(tmp_path):
    """TF's IndexedSlices then hold each layer's slices apart (their global norm differs from
    the summed view's): the line says to gather once."""
    message = cs_inprocess.refusal(t5_block, input_fn,
                                   {**PARAMS, "optimizer": "momentum", "gather_per_layer": True},
                                   str(tmp_path), __file__)
    assert "the model also reads it here" in message and "gather once" in message
