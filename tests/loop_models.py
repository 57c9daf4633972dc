"""Models with hand-written loops whose number of steps is known when the graph is built,
written the way users write them: a custom recurrence over time with tf.scan, a recurrent
cell written with tf.while_loop reading the sequence by its counter, a neural ODE integrated
by Euler steps of a float time, a linear-chain CRF (forward algorithm and Viterbi by tf.scan),
a Kalman filter by tf.scan, a Sinkhorn loss over the batch by tf.while_loop, and refused: a loop
whose trip count depends on the batch, a loop over a projection each build draws anew."""
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


def redrawn_projection_rnn(features, labels, mode, params):
    """A tf.while_loop recurrence over a fixed random projection of the inputs drawn by numpy's
    global generator at build time: without a seed each build of model_fn draws another."""
    projection = tf.constant(np.random.normal(size=(FEATURES, 8)).astype(np.float32))
    inputs = tf.tensordot(features, projection, 1)  # [B, T, 8]

    def body(i, state):
        return i + 1, tf.tanh(0.5 * state + inputs[:, i, :])

    _, state = tf.while_loop(lambda i, state: i < T, body,
                             [tf.constant(0), tf.zeros([tf.shape(features)[0], 8])])
    return _spec(mode, labels, L.Dense(CLASSES)(state), v1.train.AdamOptimizer(1e-2))


def scan_max_over_time(features, labels, mode, params):
    """tf.scan's time-major states max-pooled over time, axis 0 (refused: the pooling reads
    the time-major value; transposed back batch-major first, it would not be)."""
    w = v1.get_variable("w", [FEATURES, 8])
    states = tf.scan(lambda h, x_t: tf.tanh(tf.matmul(x_t, w) + h), tf.transpose(features, [1, 0, 2]),
                     initializer=tf.zeros([tf.shape(features)[0], 8]))
    return _spec(mode, labels, L.Dense(CLASSES)(tf.reduce_max(states, axis=0)),
                 v1.train.AdamOptimizer(1e-2))


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


TAGS, WORDS = 4, 12


def tagging_input_fn(params):
    """Words drawn from their tag, tags from a Markov chain: sequences of T (word, tag)."""
    rng = np.random.default_rng(params.get("data_seed", 7))
    tags = np.zeros((64, T), np.int32)
    tags[:, 0] = rng.integers(0, TAGS, 64)
    for t in range(1, T):
        tags[:, t] = (tags[:, t - 1] + rng.integers(0, 2, 64)) % TAGS
    words = (tags * 3 + rng.integers(0, 3, tags.shape)).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((words, tags)).batch(16, drop_remainder=True)


def crf_tagger(features, labels, mode, params):
    """A linear-chain CRF over per-word emissions: the log partition function by the forward
    algorithm, tf.scan over the time-major emissions after the first step; Viterbi decoding by
    a scan carrying (score, int32 backpointers) and a reverse scan backtracking with
    tf.gather(bp, tag, batch_dims=1); the gold path's transition scores by tf.gather_nd."""
    emissions = L.Dense(TAGS)(L.Embedding(WORDS, 8)(features))  # [B, T, K]
    trans = v1.get_variable("transitions", [TAGS, TAGS], initializer=v1.zeros_initializer())
    em_t = tf.transpose(emissions, [1, 0, 2])

    def forward(alpha, em):
        return tf.reduce_logsumexp(alpha[:, :, None] + trans[None], axis=1) + em
    log_z = tf.reduce_logsumexp(tf.scan(forward, em_t[1:], initializer=em_t[0])[-1], axis=1)

    def viterbi(carry, em):
        cand = carry[0][:, :, None] + trans[None]
        return tf.reduce_max(cand, axis=1) + em, tf.argmax(cand, axis=1, output_type=tf.int32)
    scores, backptrs = tf.scan(viterbi, em_t[1:], initializer=(
        em_t[0], tf.zeros([tf.shape(features)[0], TAGS], tf.int32)))
    last = tf.argmax(scores[-1], axis=1, output_type=tf.int32)
    prev = tf.scan(lambda tag, bp: tf.gather(bp, tag, batch_dims=1), backptrs[::-1],
                   initializer=last)
    decoded = tf.transpose(tf.concat([prev[::-1], last[None]], axis=0))  # [B, T]
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode=mode, predictions={"tags": decoded})
    gold_em = tf.reduce_sum(emissions * tf.one_hot(labels, TAGS), axis=[1, 2])
    gold_tr = tf.reduce_sum(tf.gather_nd(trans, tf.stack([labels[:, :-1], labels[:, 1:]], -1)), 1)
    loss = tf.reduce_mean(log_z - gold_em - gold_tr)
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode=mode, loss=loss, eval_metric_ops={
            "tag_accuracy": v1.metrics.accuracy(labels, decoded)})
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=v1.train.AdamOptimizer(1e-2).minimize(
        loss, global_step=v1.train.get_or_create_global_step()))


def tracks_input_fn(params):
    """Noisy positions of T steps of a constant-velocity track."""
    rng = np.random.default_rng(params.get("data_seed", 9))
    velocity = rng.normal(scale=0.5, size=(64, 1))
    positions = np.cumsum(velocity + rng.normal(scale=0.1, size=(64, T)), axis=1)
    observed = positions + rng.normal(scale=0.5, size=positions.shape)
    return tf.data.Dataset.from_tensor_slices((observed.astype(np.float32), positions.astype(
        np.float32))).batch(16, drop_remainder=True)


def kalman_filter(features, labels, mode, params):
    """A constant-velocity Kalman filter by tf.scan over time, its process and measurement
    noise learned by the innovations' negative log-likelihood: the covariance carried by the
    scan is computed from the weights alone (P = F P F^T + Q by tf.matmul of [B, 2, 2])."""
    q = tf.nn.softplus(v1.get_variable("raw_q", [], initializer=tf.constant_initializer(-1.0)))
    r = tf.nn.softplus(v1.get_variable("raw_r", [], initializer=tf.constant_initializer(0.0)))
    F = tf.constant([[1.0, 1.0], [0.0, 1.0]])
    b = tf.shape(features)[0]

    def step(carry, z):
        x, P, _, _ = carry
        x = tf.matmul(x, F, transpose_b=True)
        P = tf.matmul(tf.matmul(F[None], P), tf.tile(tf.transpose(F)[None], [b, 1, 1])) + \
            q * tf.constant([[0.25, 0.5], [0.5, 1.0]])
        S = P[:, 0, 0] + r
        K = P[:, :, 0] / S[:, None]
        innovation = z - x[:, 0]
        x = x + K * innovation[:, None]
        P = P - K[:, :, None] * P[:, 0:1, :]
        nll = 0.5 * (tf.math.log(2 * np.pi * S) + tf.square(innovation) / S)
        return x, P, nll, x[:, 0]
    _, _, nlls, filtered = tf.scan(step, tf.transpose(features), initializer=(
        tf.zeros([b, 2]), tf.tile(tf.eye(2)[None] * 10.0, [b, 1, 1]), tf.zeros([b]), tf.zeros([b])))
    filtered = tf.transpose(filtered)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode=mode, predictions={"filtered": filtered})
    loss = tf.reduce_mean(nlls)
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode=mode, loss=loss, eval_metric_ops={
            "rmse": v1.metrics.root_mean_squared_error(labels, filtered)})
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=v1.train.AdamOptimizer(5e-2).minimize(
        loss, global_step=v1.train.get_or_create_global_step()))


def sinkhorn_loss(features, labels, mode, params):
    """An entropic optimal-transport loss between the batch's outputs and its one-hot labels: 5
    log-domain Sinkhorn iterations of a tf.while_loop over the pairwise cost matrix [B, B]
    (in Keras' floatx: float64 for a high-precision reference)."""
    out = L.Dense(CLASSES)(L.Flatten()(features))
    target = tf.one_hot(labels, CLASSES, dtype=out.dtype)
    cost = tf.reduce_sum(tf.square(out[:, None, :] - target[None, :, :]), axis=-1)  # [B, B]
    n = tf.shape(features)[0]
    log_w = -tf.math.log(tf.cast(n, out.dtype)) * tf.ones([n], out.dtype)

    def body(i, f, g):
        f = -0.1 * tf.reduce_logsumexp((g[None, :] - cost) / 0.1 + log_w[None, :], axis=1)
        g = -0.1 * tf.reduce_logsumexp((f[:, None] - cost) / 0.1 + log_w[:, None], axis=0)
        return i + 1, f, g
    _, f, g = tf.while_loop(lambda i, f, g: i < 5, body,
                            [0, tf.zeros([n], out.dtype), tf.zeros([n], out.dtype)])
    plan = tf.exp((f[:, None] + g[None, :] - cost) / 0.1 + log_w[:, None] + log_w[None, :])
    loss = tf.reduce_sum(plan * cost)
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode=mode, loss=loss)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=v1.train.AdamOptimizer(1e-2).minimize(
        loss, global_step=v1.train.get_or_create_global_step()))
