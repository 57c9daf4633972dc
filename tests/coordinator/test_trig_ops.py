"""Inverse trigonometry on the CS (unseen10: a von Mises mixture's tf.math.atan2, ArcFace's
tf.acos of a clipped cosine): models written the ordinary way train like TF and evaluate
like the CPU path."""
from __future__ import annotations

import cs_inprocess
import numpy as np
import tensorflow as tf

from cs_api.attrs import from_attr
from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

PARAMS = {"runconfig": {"tf_random_seed": 4}}
L = tf.keras.layers


def input_fn(params):
    rng = np.random.default_rng(9)
    angle = rng.uniform(-np.pi, np.pi, 96).astype(np.float32)
    x = np.stack([np.cos(angle), np.sin(angle), rng.normal(size=96)], 1).astype(np.float32)
    y = (angle > 0).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(16, drop_remainder=True)


def angles(features, labels, mode, params):
    """A predicted direction's angle (atan2) against the true one, an ArcFace-style margin on
    the angle between an embedding and class centres (acos of a clipped cosine), tan/asin/atan
    of bounded values."""
    h = L.Dense(8, activation="tanh")(features)
    direction = L.Dense(2)(h)
    theta = tf.math.atan2(direction[:, 1], direction[:, 0])
    true = tf.math.atan2(features[:, 1], features[:, 0])
    embedding = tf.math.l2_normalize(L.Dense(4)(h), axis=1)
    centres = tf.math.l2_normalize(tf.Variable(tf.random.normal([4, 2], seed=1), name="centres"), axis=0)
    cosine = tf.clip_by_value(tf.matmul(embedding, centres), -0.999, 0.999)
    logits = 8.0 * tf.cos(tf.acos(cosine) + 0.2 * tf.one_hot(labels, 2))
    extra = tf.reduce_mean(tf.math.tan(0.5 * h) + tf.math.asin(0.9 * h) + tf.math.atan(3.0 * h), 1)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits) + \
        tf.reduce_mean(1.0 - tf.cos(theta - true)) + 0.01 * tf.reduce_mean(tf.square(extra))
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss, eval_metric_ops={"angle": tf.compat.v1.metrics.mean(theta)})
    train_op = tf.compat.v1.train.AdamOptimizer(0.01).minimize(
        loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode, loss=loss, train_op=train_op)


def test_atan2_acos_tan_asin_atan_train_like_tensorflow_and_evaluate_like_the_cpu(tmp_path):
    result = cs_inprocess.compare(angles, input_fn, PARAMS, str(tmp_path), steps=4)
    functions = {from_attr(k.attrs[key]) for k in result.compiled.program.kernels
                 for key in ("function", "op") if key in k.attrs}
    assert {"atan2", "acos", "tan", "asin", "atan"} <= functions
    cs_inprocess.assert_same_training(result, rtol=1e-5)
    assert not cs_inprocess.evaluation_mismatch(angles, input_fn, PARAMS, str(tmp_path), result)

