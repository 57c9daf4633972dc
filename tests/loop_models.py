"""Models with hand-written loops whose number of steps is known when the graph is built,
written the way users write them: a custom recurrence over time with tf.scan, a recurrent
cell written with tf.while_loop reading the sequence by its counter, a neural ODE integrated
by Euler steps of a float time, and a loop whose trip count depends on the batch (refused)."""
import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

L, v1 = tf.keras.layers, tf.compat.v1
T, FEATURES, CLASSES = 6, 5, 3


def sequence_input_fn(params):
    """Sequences of T steps of FEATURES values; the class is the sign pattern of their sum."""
    rng = np.random.default_rng(params.get("data_seed", 5))
    x = rng.normal(size=(64, T, FEATURES)).astype(np.float32)
    total = x.sum(1)
    y = ((total[:, 0] > 0).astype(np.int32) + (total[:, 1] > 0)).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(16, drop_remainder=True)


def _spec(mode, labels, logits, optimizer):
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode=mode, loss=loss, eval_metric_ops={
            "accuracy": v1.metrics.accuracy(labels, tf.argmax(logits, 1))})
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=optimizer.minimize(
        loss, global_step=v1.train.get_or_create_global_step()))


def scan_rnn(features, labels, mode, params):
    """An Elman RNN written with tf.scan over the time-major sequence."""
    units = 8
    w_x = v1.get_variable("w_x", [FEATURES, units])
    w_h = v1.get_variable("w_h", [units, units])
    b = v1.get_variable("b", [units], initializer=v1.zeros_initializer())

    def step(h, x_t):
        return tf.tanh(tf.matmul(x_t, w_x) + tf.matmul(h, w_h) + b)

    time_major = tf.transpose(features, [1, 0, 2])
    h0 = tf.zeros([tf.shape(features)[0], units])
    states = tf.scan(step, time_major, initializer=h0)
    logits = L.Dense(CLASSES)(states[-1])
    return _spec(mode, labels, logits, v1.train.AdamOptimizer(1e-2))


def scan_sequence(features, labels, mode, params):
    """tf.scan's states of every step, put back batch-major and pooled over time (a
    minimal gated cell written by hand)."""
    units = 8
    w = v1.get_variable("w", [FEATURES + units, 2 * units])

    def step(h, x_t):
        gate, candidate = tf.split(tf.matmul(tf.concat([x_t, h], 1), w), 2, axis=1)
        z = tf.sigmoid(gate)
        return z * h + (1 - z) * tf.tanh(candidate)

    h0 = tf.zeros([tf.shape(features)[0], units])
    states = tf.transpose(tf.scan(step, tf.transpose(features, [1, 0, 2]), initializer=h0),
                          [1, 0, 2])
    logits = L.Dense(CLASSES)(tf.reduce_mean(states, axis=1))
    return _spec(mode, labels, logits, v1.train.AdamOptimizer(1e-2))


def while_rnn(features, labels, mode, params):
    """A recurrent cell written by hand: a tf.while_loop over the T steps reading
    features[:, i, :] by the loop's counter, one Dense cell reused at every step."""
    cell = L.Dense(16, activation="tanh")

    def body(i, state):
        return i + 1, 0.5 * state + 0.5 * cell(tf.concat([state, features[:, i, :]], 1))

    _, state = tf.while_loop(lambda i, state: i < T, body,
                             [tf.constant(0), tf.zeros([tf.shape(features)[0], 16])])
    return _spec(mode, labels, L.Dense(CLASSES)(state), v1.train.MomentumOptimizer(0.05, 0.9))


def neural_ode(features, labels, mode, params):
    """dz/dt = f(z) by a two-layer MLP, integrated from t = 0 to 1 by Euler steps of 0.25 (the
    loop's condition reads the float time)."""
    z = L.Dense(8)(L.Flatten()(features))
    hidden, out = L.Dense(16, activation="softplus"), L.Dense(8)
    dt = 0.25

    def euler(t, z):
        return t + dt, z + dt * out(hidden(z))

    _, z = tf.while_loop(lambda t, z: t < 1.0, euler, (tf.constant(0.0), z))
    return _spec(mode, labels, L.Dense(CLASSES)(z), v1.train.AdamOptimizer(1e-2))


def until_small(features, labels, mode, params):
    """Halves a value until the batch's largest is below 1: the trip count is the data's."""
    h = L.Dense(8)(L.Flatten()(features))
    h = tf.while_loop(lambda h: tf.reduce_max(tf.abs(h)) > 1.0, lambda h: h * 0.5, [h])[0]
    return _spec(mode, labels, L.Dense(CLASSES)(h), v1.train.AdamOptimizer(1e-2))


def gru_until_small(features, labels, mode, params):
    """A GRU over the fixed-length sequences (a loop the compiler unrolls), then until_small's."""
    h = L.GRU(8)(features)
    h = tf.while_loop(lambda h: tf.reduce_max(tf.abs(h)) > 1.0, lambda h: h * 0.5, [h])[0]
    return _spec(mode, labels, L.Dense(CLASSES)(h), v1.train.AdamOptimizer(1e-2))
