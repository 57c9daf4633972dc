"""Models whose learning rate follows a schedule, written the way modelzoo scripts write them
(tf.compat.v1.train schedules from the global step, warmups with tf.where / tf.cond /
tf.minimum, a rate held in a non-trainable variable), for tests/coordinator/test_schedules.py.

`SCHEDULES[name](step)` builds the learning rate; `BOUNDARIES[name]` are the steps where it
changes course (warmup end, piecewise boundaries, decay_steps multiples, cycle restarts)."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec

train = tf.compat.v1.train
BATCH = 8
STEPS = 10


def _warmup_where(step):  # BERT: linear warmup, then polynomial decay
    warm = tf.cast(step, tf.float32) / 4.0 * 0.1
    decayed = train.polynomial_decay(0.1, step, 9, end_learning_rate=0.0, power=1.0)
    return tf.where(step < 4, warm, decayed)


def _warmup_cond(step):
    return tf.cond(step < 3, lambda: 0.1 * tf.cast(step + 1, tf.float32) / 3.0,
                   lambda: train.exponential_decay(0.1, step - 3, 7, 0.5))


def _warmup_minimum(step):
    warm = 0.02 * tf.cast(step + 1, tf.float32)
    return tf.minimum(warm, train.cosine_decay(0.1, step, 9, alpha=0.1))


def _log_warmup(step):  # QANet: a logarithmic warmup (Grappler makes log(s + 1) a Log1p)
    return 0.1 * tf.minimum(1.0, tf.math.log(tf.cast(step, tf.float32) + 1.0) / np.log(6.0))


def _variable(step):
    base = tf.compat.v1.get_variable("base_learning_rate", [], trainable=False,
                                     initializer=tf.constant_initializer(0.05))
    return base * train.exponential_decay(1.0, step, 3, 0.7, staircase=True)


SCHEDULES = {
    "exponential": lambda s: train.exponential_decay(0.1, s, 7, 0.8),
    "exponential_staircase": lambda s: train.exponential_decay(0.1, s, 3, 0.5, staircase=True),
    "exponential_staircase_49": lambda s: train.exponential_decay(0.1, s, 49, 0.96,
                                                                  staircase=True),
    "piecewise_constant": lambda s: train.piecewise_constant(s, [2, 5], [0.1, 0.05, 0.01]),
    "polynomial": lambda s: train.polynomial_decay(0.1, s, 7, 0.01, power=2.0),
    "polynomial_cycle": lambda s: train.polynomial_decay(0.1, s, 3, 0.01, power=0.5,
                                                         cycle=True),
    "cosine": lambda s: train.cosine_decay(0.1, s, 7, alpha=0.1),
    "cosine_restarts": lambda s: train.cosine_decay_restarts(0.1, s, 3, t_mul=2.0,
                                                             m_mul=0.5, alpha=0.01),
    "inverse_time": lambda s: train.inverse_time_decay(0.1, s, 3, 0.5),
    "inverse_time_staircase": lambda s: train.inverse_time_decay(0.1, s, 3, 0.5,
                                                                 staircase=True),
    "natural_exp": lambda s: train.natural_exp_decay(0.1, s, 3, 0.3),
    "warmup_where": _warmup_where,
    "warmup_cond": _warmup_cond,
    "warmup_minimum": _warmup_minimum,
    "log_warmup": _log_warmup,
    "variable": _variable,
}
BOUNDARIES = {
    "exponential": [0, 7, 14, 700], "exponential_staircase": [2, 3, 4, 6, 9, 30, 300, 3000],
    "exponential_staircase_49": [48, 49, 50, 98, 147, 196, 245, 49 * 50, 49 * 333],
    "piecewise_constant": [1, 2, 3, 4, 5, 6],
    "polynomial": [6, 7, 8, 70], "polynomial_cycle": [2, 3, 4, 5, 6, 7, 9, 12, 300, 301],
    "cosine": [6, 7, 8], "cosine_restarts": [2, 3, 4, 8, 9, 10, 20, 21, 22, 45, 46],
    "inverse_time": [3, 6], "inverse_time_staircase": [2, 3, 4, 6, 300],
    "natural_exp": [3, 6], "warmup_where": [3, 4, 5, 9, 10], "warmup_cond": [2, 3, 4, 10],
    "warmup_minimum": [3, 4, 5, 9], "log_warmup": [4, 5, 6, 7], "variable": [2, 3, 4, 6],
}


def input_fn(params):
    rng = np.random.default_rng(7)
    x = rng.normal(size=(BATCH * STEPS, 6)).astype(np.float32)
    y = rng.integers(0, 3, BATCH * STEPS).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH, drop_remainder=True)


def model_fn(features, labels, mode, params):
    h = tf.keras.layers.Dense(8, activation="relu")(features)
    logits = tf.keras.layers.Dense(3)(h)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    step = train.get_or_create_global_step()
    learning_rate = SCHEDULES[params["schedule"]](step)
    optimizer = train.MomentumOptimizer(learning_rate, 0.9) if params.get("momentum") else \
        train.GradientDescentOptimizer(learning_rate)
    train_op = optimizer.minimize(loss, global_step=step)
    if params.get("moving_average"):  # "plain" or "num_updates"
        ema = train.ExponentialMovingAverage(
            0.9, num_updates=step if params["moving_average"] == "num_updates" else None)
        with tf.control_dependencies([train_op]):
            train_op = ema.apply(tf.compat.v1.trainable_variables())
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op)


def tf_values(name: str, steps: list[int]) -> np.ndarray:
    """TensorFlow's learning rate at each global step, as a training step uses it: a
    variable at 0 with gradient -1 under GradientDescent becomes exactly the rate."""
    with tf.Graph().as_default():
        step = train.get_or_create_global_step()
        probe = tf.compat.v1.get_variable("probe", [], initializer=tf.zeros_initializer())
        train_op = train.GradientDescentOptimizer(SCHEDULES[name](step)).minimize(
            -probe, global_step=step)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            values = []
            for s in steps:
                step.load(s, session)
                probe.load(0.0, session)
                session.run(train_op)
                values.append(session.run(probe))
    return np.asarray(values, np.float32)
