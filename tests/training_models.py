"""Train ops written the ordinary way, for the training analysis tests: a small MLP (or an
embedding bag) trained with tf.compat.v1.train optimizers, gradients changed in between."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec

v1 = tf.compat.v1


def input_fn(params):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 12)).astype(np.float32)
    y = (np.arange(64) % 10).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(16, drop_remainder=True)


def ids_input_fn(params):
    rng = np.random.default_rng(1)
    x = rng.integers(0, 20, size=(32, 6)).astype(np.int32)  # repeated ids in every batch
    y = (np.arange(32) % 10).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(16, drop_remainder=True)


def mlp_loss(features, labels, dropout=0.0):
    h = tf.keras.layers.Dense(16, activation="relu", name="hidden")(features)
    if dropout:
        h = tf.keras.layers.Dropout(dropout)(h, training=True)
    logits = tf.keras.layers.Dense(10, name="logits")(h)
    return v1.losses.sparse_softmax_cross_entropy(labels, logits)


def spec(loss, train_op):
    return CSEstimatorSpec(mode="train", loss=loss, train_op=train_op)


def sgd(features, labels, mode, params):
    loss = mlp_loss(features, labels)
    train_op = v1.train.GradientDescentOptimizer(0.05).minimize(
        loss, global_step=v1.train.get_or_create_global_step())
    return spec(loss, train_op)


def keras_dropout_adam(features, labels, mode, params):
    loss = mlp_loss(features, labels, dropout=0.3)
    train_op = v1.train.AdamOptimizer(1e-3, beta1=0.8, beta2=0.99, epsilon=1e-7).minimize(
        loss, global_step=v1.train.get_or_create_global_step())
    return spec(loss, train_op)


def fine_tune_last_layer(features, labels, mode, params):
    h = tf.keras.layers.Dense(16, activation="relu", name="body")(features)
    logits = tf.keras.layers.Dense(10, name="head")(h)
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    head = [v for v in v1.trainable_variables() if v.name.startswith("head/")]
    optimizer = v1.train.MomentumOptimizer(0.1, 0.9, use_nesterov=True)
    return spec(loss, optimizer.minimize(loss, var_list=head))


def clip_global_norm(features, labels, mode, params):
    loss = mlp_loss(features, labels)
    optimizer = v1.train.AdamOptimizer(1e-3)
    grads, variables = zip(*optimizer.compute_gradients(loss))
    grads, _ = tf.clip_by_global_norm(grads, 0.5)  # clip line
    return spec(loss, optimizer.apply_gradients(zip(grads, variables)))


def clip_value_and_norm(features, labels, mode, params):
    loss = mlp_loss(features, labels)
    optimizer = v1.train.MomentumOptimizer(0.01, 0.9)
    clipped = []
    for grad, var in optimizer.compute_gradients(loss):
        if var.name.endswith("kernel:0"):
            grad = tf.clip_by_norm(grad, 1.0)
        clipped.append((tf.clip_by_value(grad, -0.1, 0.1), var))
    return spec(loss, optimizer.apply_gradients(clipped))


def clip_norm_with_a_temperature(features, labels, mode, params):
    """Every gradient clipped by its norm, a learned scalar temperature's too."""
    h = tf.keras.layers.Dense(16, activation="relu", name="hidden")(features)
    temperature = v1.get_variable("temperature", [], initializer=tf.ones_initializer())
    logits = tf.keras.layers.Dense(10, name="logits")(h) / temperature
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    optimizer = v1.train.AdamOptimizer(0.01)
    return spec(loss, optimizer.apply_gradients(
        [(tf.clip_by_norm(g, 0.05), v) for g, v in optimizer.compute_gradients(loss)]))


def scalar_offset_reshaped(features, labels, mode, params):
    """A scalar offset added to the logits seen as a vector (tf.reshape(b0, [1]))."""
    h = tf.keras.layers.Dense(16, activation="relu", name="hidden")(features)
    b0 = v1.get_variable("b0", [], initializer=tf.zeros_initializer())
    logits = tf.keras.layers.Dense(10, name="logits")(h) + tf.reshape(b0, [1])
    loss = v1.losses.sigmoid_cross_entropy(tf.one_hot(labels, 10), logits)
    return spec(loss, v1.train.MomentumOptimizer(0.05, 0.9).minimize(loss))


def ftrl_after_update_ops(features, labels, mode, params):
    """FTRL made under tf.control_dependencies(UPDATE_OPS) (its folded l2 + beta / (2 lr)
    then carries control inputs), after a batch normalization moving its mean."""
    h = tf.keras.layers.Dense(16, use_bias=False, name="hidden")(features)
    mean, variance = tf.nn.moments(h, axes=[0])
    moving = v1.get_variable("moving_mean", [16], trainable=False, initializer=tf.zeros_initializer())
    v1.add_to_collection(v1.GraphKeys.UPDATE_OPS, moving.assign(0.9 * moving + 0.1 * mean))
    h = tf.nn.relu(tf.nn.batch_normalization(h, mean, variance, None, None, 1e-3))
    loss = v1.losses.sparse_softmax_cross_entropy(labels, tf.keras.layers.Dense(10, name="logits")(h))
    with tf.control_dependencies(v1.get_collection(v1.GraphKeys.UPDATE_OPS)):
        return spec(loss, v1.train.FtrlOptimizer(0.1, l2_regularization_strength=1e-3,
                                                 beta=0.5).minimize(loss))


def scaled_gradients(features, labels, mode, params):
    loss = mlp_loss(features, labels)
    optimizer = v1.train.GradientDescentOptimizer(0.1)
    grads_and_vars = [(0.5 * g, v) for g, v in optimizer.compute_gradients(loss)]
    return spec(loss, optimizer.apply_gradients(grads_and_vars))


def loss_scaling(features, labels, mode, params):
    loss = mlp_loss(features, labels)
    scale = params.get("loss_scale", 1024.0)
    optimizer = v1.train.AdamOptimizer(1e-3)
    grads_and_vars = optimizer.compute_gradients(loss * scale)
    if params.get("clip"):
        grads_and_vars = [(tf.clip_by_value(g, -1.0, 1.0), v) for g, v in grads_and_vars]
    grads_and_vars = [(g / scale, v) for g, v in grads_and_vars]
    return spec(loss, optimizer.apply_gradients(grads_and_vars))


def rmsprop(features, labels, mode, params):
    loss = mlp_loss(features, labels)
    optimizer = v1.train.RMSPropOptimizer(0.01, decay=0.8, momentum=0.5, epsilon=1e-6,
                                          centered=params.get("centered", False))
    return spec(loss, optimizer.minimize(loss))


def adagrad(features, labels, mode, params):
    loss = mlp_loss(features, labels)
    optimizer = v1.train.AdagradOptimizer(0.1, initial_accumulator_value=0.25)
    return spec(loss, optimizer.minimize(loss))


def embedding_bag(features, labels, mode, params):
    """Ids -> embedding rows (a repeated id sums its gradients) -> mean -> Dense."""
    if params.get("keras"):
        rows = tf.keras.layers.Embedding(20, 8, name="table")(features)
    else:
        rows = tf.nn.embedding_lookup(v1.get_variable("table", [20, 8]), features)
    logits = tf.keras.layers.Dense(10)(tf.reduce_mean(rows, axis=1))
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    optimizer = {"adam": lambda: v1.train.AdamOptimizer(0.01),
                 "momentum": lambda: v1.train.MomentumOptimizer(0.1, 0.9),
                 "sgd": lambda: v1.train.GradientDescentOptimizer(0.1),
                 "adagrad": lambda: v1.train.AdagradOptimizer(0.1)}[params["optimizer"]]()
    grads_and_vars = optimizer.compute_gradients(loss)
    if params.get("clip"):  # the table's gradient is IndexedSlices: TF clips its values
        grads_and_vars = [(tf.clip_by_norm(g, params["clip"]), v) for g, v in grads_and_vars]
    return spec(loss, optimizer.apply_gradients(grads_and_vars, global_step=v1.train.get_or_create_global_step()))


def float16_layer(features, labels, mode, params):
    w = v1.get_variable("w16", [12, 10], dtype=tf.float16)  # float16 variable line
    logits = tf.cast(tf.matmul(tf.cast(features, tf.float16), w), tf.float32)
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    return spec(loss, v1.train.GradientDescentOptimizer(0.1).minimize(loss))


def lr_schedule(features, labels, mode, params):
    loss = mlp_loss(features, labels)
    step = v1.train.get_or_create_global_step()
    lr = v1.train.exponential_decay(0.1, step, 1000, 0.96)  # schedule line
    return spec(loss, v1.train.GradientDescentOptimizer(lr).minimize(loss, global_step=step))


def other_loss(features, labels, mode, params):
    h = tf.keras.layers.Dense(16, activation="relu")(features)
    logits = tf.keras.layers.Dense(10)(h)
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    penalty = tf.reduce_mean(tf.square(logits))  # other loss line
    return spec(loss, v1.train.GradientDescentOptimizer(0.1).minimize(penalty))


def sign_gradients(features, labels, mode, params):
    loss = mlp_loss(features, labels)
    optimizer = v1.train.GradientDescentOptimizer(0.1)
    grads_and_vars = [(tf.sign(g), v) for g, v in optimizer.compute_gradients(loss)]  # sign line
    return spec(loss, optimizer.apply_gradients(grads_and_vars))


def noisy_gradients(features, labels, mode, params):
    loss = mlp_loss(features, labels)
    optimizer = v1.train.GradientDescentOptimizer(0.1)
    grads_and_vars = [(g + tf.random.normal(tf.shape(g), stddev=0.01), v)  # noise line
                      for g, v in optimizer.compute_gradients(loss)]
    return spec(loss, optimizer.apply_gradients(grads_and_vars))


def swapped_gradients(features, labels, mode, params):
    a = tf.keras.layers.Dense(12, activation="tanh", name="a")(features)
    b = tf.keras.layers.Dense(12, activation="tanh", name="b")(a)
    logits = tf.keras.layers.Dense(10, name="c")(b)
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    optimizer = v1.train.GradientDescentOptimizer(0.1)
    gv = dict((v.name, (g, v)) for g, v in optimizer.compute_gradients(loss))
    ga, va = gv["a/kernel:0"]
    gb, vb = gv["b/kernel:0"]
    rest = [p for k, p in gv.items() if k not in ("a/kernel:0", "b/kernel:0")]
    return spec(loss, optimizer.apply_gradients([(gb, va), (ga, vb)] + rest))  # swap line


def weight_decay_by_assign(features, labels, mode, params):
    loss = mlp_loss(features, labels)
    train_op = v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    decay = [v1.assign(v, v * 0.999) for v in v1.trainable_variables()]  # decay line
    return spec(loss, tf.group(train_op, *decay))


def power_iteration_state(features, labels, mode, params):
    """Spectral normalization keeping its power iteration's vector u between steps."""
    w = v1.get_variable("w", [12, 10])
    u = v1.get_variable("u", [1, 10], trainable=False)
    v = tf.nn.l2_normalize(tf.matmul(u, w, transpose_b=True))
    u_next = tf.nn.l2_normalize(tf.matmul(v, w))
    sigma = tf.reduce_sum(tf.matmul(v, w) * u_next)
    loss = v1.losses.sparse_softmax_cross_entropy(labels, tf.matmul(features, w / sigma))
    with tf.control_dependencies([u.assign(u_next)]):  # power iteration line
        return spec(loss, v1.train.AdamOptimizer(1e-3).minimize(loss))


def accumulated_gradients(features, labels, mode, params):
    """Gradient accumulation: sums in variables, applied every 2nd step in a tf.cond and
    never zeroed (refused); the train_op is the global step's assign_add (a variable's
    value, not an op)."""
    logits = tf.keras.layers.Dense(10, name="head")(features)
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    tvars = v1.trainable_variables()
    sums = [v1.get_variable(v.op.name + "/sum", v.shape, trainable=False,
                            initializer=v1.zeros_initializer()) for v in tvars]
    added = [s.assign_add(g) for s, g in zip(sums, tf.gradients(loss, tvars))]  # added line
    step = v1.train.get_or_create_global_step()

    def apply():
        return v1.train.GradientDescentOptimizer(0.1).apply_gradients(
            [(s / 2.0, v) for s, v in zip(sums, tvars)])
    with tf.control_dependencies(added):
        applied = tf.cond(tf.equal(step % 2, 1), apply, tf.no_op)  # cond line
    with tf.control_dependencies([applied]):
        return spec(loss, v1.assign_add(step, 1))


def weight_decay_term(features, labels, mode, params):
    """L2 weight decay added to the loss; minimize(the data term alone) is refused."""
    h = tf.keras.layers.Dense(16, activation="relu", name="hidden")(features)
    logits = tf.keras.layers.Dense(10, name="logits")(h)
    data = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    decay = 1e-3 * tf.add_n([tf.nn.l2_loss(v) for v in v1.trainable_variables()
                             if "kernel" in v.name])
    loss = data + decay
    minimized = data if params.get("data_only") else loss  # minimized line
    return spec(loss, v1.train.GradientDescentOptimizer(0.1).minimize(minimized))
