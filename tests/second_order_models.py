"""Models whose loss contains a gradient (tf.gradients inside model_fn), written the way users
write them: physics-informed networks (Burgers' and the heat equation's residual from first
and second derivatives), a WGAN-GP critic's gradient penalty, input-gradient regularisation,
double backprop, a Jacobian norm penalty, Sobolev training, a Hamiltonian neural network, and
a penalty on the weights' gradient."""
import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

L, v1 = tf.keras.layers, tf.compat.v1
BATCH = 16


def _batches(features, labels):
    return tf.data.Dataset.from_tensor_slices((features, labels)).batch(BATCH, drop_remainder=True)


def pde_input_fn(params):
    """Collocation points (x, t) in [-1, 1] x [0, 1] and boundary points with their u."""
    rng = np.random.default_rng(params.get("data_seed", 3))
    colloc = np.stack([rng.uniform(-1, 1, 64), rng.uniform(0, 1, 64)], 1).astype(np.float32)
    boundary = np.stack([rng.choice([-1.0, 1.0], 64), rng.uniform(0, 1, 64)], 1)
    boundary[:16, 1] = 0.0  # the initial condition u(x, 0) = -sin(pi x)
    boundary[:16, 0] = rng.uniform(-1, 1, 16)
    u_b = np.where(boundary[:, 1:] == 0.0, -np.sin(np.pi * boundary[:, :1]), 0.0)
    return _batches({"colloc": colloc, "boundary": boundary.astype(np.float32)},
                    u_b.astype(np.float32))


def points_input_fn(params):
    """Points in R^4 and a smooth target with its gradient (Sobolev) or class (classifiers)."""
    rng = np.random.default_rng(params.get("data_seed", 4))
    x = rng.normal(size=(64, 4)).astype(np.float32)
    f = np.sin(x[:, :1]) + 0.5 * x[:, 1:2] * x[:, 2:3]
    df = np.concatenate([np.cos(x[:, :1]), 0.5 * x[:, 2:3], 0.5 * x[:, 1:2],
                         np.zeros_like(f)], 1)
    return _batches(x, np.concatenate([f, df], 1).astype(np.float32))


def class_input_fn(params):
    rng = np.random.default_rng(params.get("data_seed", 5))
    x = rng.normal(size=(64, 4)).astype(np.float32)
    y = ((x[:, 0] > 0).astype(np.int32) + (x[:, 1] > x[:, 2])).astype(np.int32)
    return _batches(x, y)


def oscillator_input_fn(params):
    """Phase-space points (q, p) of a pendulum and their time derivatives (dq/dt, dp/dt)."""
    rng = np.random.default_rng(params.get("data_seed", 6))
    qp = rng.uniform(-2, 2, size=(64, 2)).astype(np.float32)
    return _batches(qp, np.stack([qp[:, 1], -np.sin(qp[:, 0])], 1).astype(np.float32))


def critic_input_fn(params):
    """Real samples and a generator's fixed fakes for a critic alone (labels unused)."""
    rng = np.random.default_rng(params.get("data_seed", 7))
    real = rng.normal(1.0, 0.5, size=(64, 4)).astype(np.float32)
    return _batches({"real": real, "fake": rng.normal(size=(64, 4)).astype(np.float32)},
                    np.zeros(64, np.float32))


def _train(mode, loss, optimizer, eval_metric_ops=None):
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode=mode, loss=loss, eval_metric_ops=eval_metric_ops or {
            "loss_mean": v1.metrics.mean(loss)})
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=optimizer.minimize(
        loss, global_step=v1.train.get_or_create_global_step()))


def _mlp(widths, activation):
    return tf.keras.Sequential([L.Dense(w, activation=activation) for w in widths] + [L.Dense(1)])


def pinn_burgers(features, labels, mode, params):
    """Burgers' equation u_t + u u_x - (0.01 / pi) u_xx = 0, u = MLP(x, t) with tanh."""
    net = _mlp([16, 16], "tanh")
    x, t = features["colloc"][:, 0:1], features["colloc"][:, 1:2]
    u = net(tf.concat([x, t], 1))
    u_x, u_t = tf.gradients(u, [x, t])
    u_xx = tf.gradients(u_x, x)[0]
    residual = u_t + u * u_x - (0.01 / np.pi) * u_xx
    boundary = net(features["boundary"]) - labels
    loss = tf.reduce_mean(tf.square(residual)) + tf.reduce_mean(tf.square(boundary))
    return _train(mode, loss, v1.train.AdamOptimizer(1e-3))


def pinn_heat(features, labels, mode, params):
    """The heat equation u_t = 0.1 u_xx, a Keras functional model of sigmoid layers whose
    input is the (x, t) pairs; the derivatives are columns of tf.gradients(u, xt)."""
    inputs = tf.keras.Input((2,))
    hidden = L.Dense(16, activation="sigmoid")(L.Dense(16, activation="sigmoid")(inputs))
    net = tf.keras.Model(inputs, L.Dense(1)(hidden))
    xt = features["colloc"]
    u = net(xt)
    du = tf.gradients(u, xt)[0]
    u_x, u_t = du[:, :1], du[:, 1:]
    u_xx = tf.gradients(u_x, xt)[0][:, :1]
    loss = v1.losses.mean_squared_error(tf.zeros_like(u_t), u_t - 0.1 * u_xx) + \
        v1.losses.mean_squared_error(labels, net(features["boundary"]))
    return _train(mode, loss, v1.train.GradientDescentOptimizer(0.05))


def pinn_gelu(features, labels, mode, params):
    """The heat equation by a GELU network (Erf's gradient inside the loss), the second
    derivative from tf.gradients of the first's column."""
    net = _mlp([16, 16], "gelu")
    xt = features["colloc"]
    du = tf.gradients(net(xt), xt)[0]
    u_xx = tf.gradients(du[:, 0], xt)[0][:, :1]
    loss = tf.reduce_mean(tf.square(du[:, 1:] - 0.1 * u_xx)) + \
        tf.reduce_mean(tf.square(net(features["boundary"]) - labels))
    return _train(mode, loss, v1.train.AdamOptimizer(1e-3))


def wgan_gp_critic(features, labels, mode, params):
    """A WGAN-GP critic trained alone against fixed fakes: the Wasserstein estimate plus 10 x
    the penalty (||grad critic(x_hat)|| - 1)^2 at random interpolates x_hat."""
    critic = tf.keras.Sequential([L.Dense(16), L.LeakyReLU(0.2), L.Dense(16), L.LeakyReLU(0.2),
                                  L.Dense(1)])
    real, fake = features["real"], features["fake"]
    eps = tf.random.uniform([tf.shape(real)[0], 1])
    x_hat = eps * real + (1.0 - eps) * fake
    grad = tf.gradients(critic(x_hat), x_hat)[0]
    norm = tf.sqrt(tf.reduce_sum(tf.square(grad), axis=1) + 1e-12)
    penalty = tf.reduce_mean(tf.square(norm - 1.0))
    loss = tf.reduce_mean(critic(fake)) - tf.reduce_mean(critic(real)) + 10.0 * penalty
    return _train(mode, loss, v1.train.AdamOptimizer(1e-3, beta1=0.5, beta2=0.9))


def wgan_gp_conv_critic(features, labels, mode, params):
    """The critic's penalty through a Conv2D (its input gradient: Conv2DBackpropInput)."""
    critic = tf.keras.Sequential([L.Reshape((2, 2, 1)), L.Conv2D(8, 2, padding="same"),
                                  L.LeakyReLU(0.2), L.Flatten(), L.Dense(1)])
    real, fake = features["real"], features["fake"]
    eps = tf.random.uniform([tf.shape(real)[0], 1])
    x_hat = eps * real + (1.0 - eps) * fake
    grad = tf.gradients(critic(x_hat), x_hat)[0]
    norm = tf.sqrt(tf.reduce_sum(tf.square(grad), axis=1) + 1e-12)
    loss = tf.reduce_mean(critic(fake)) - tf.reduce_mean(critic(real)) + \
        10.0 * tf.reduce_mean(tf.square(norm - 1.0))
    return _train(mode, loss, v1.train.AdamOptimizer(1e-3, beta1=0.5, beta2=0.9))


def image_critic_input_fn(params):
    """8x8 real images (a bright blob) and a generator's fixed fakes (noise), labels unused."""
    rng = np.random.default_rng(params.get("data_seed", 8))
    yy, xx = np.mgrid[0:8, 0:8]
    blob = np.exp(-((yy - 3.5) ** 2 + (xx - 3.5) ** 2) / 6.0).astype(np.float32)[None, :, :, None]
    real = blob + 0.1 * rng.normal(size=(64, 8, 8, 1)).astype(np.float32)
    return _batches({"real": real, "fake": rng.normal(size=(64, 8, 8, 1)).astype(np.float32)},
                    np.zeros(64, np.float32))


def r1_pooled_discriminator(features, labels, mode, params):
    """StyleGAN's non-saturating loss with the R1 penalty on real images, its discriminator
    downsampling by AveragePooling2D (the penalty's gradient through it: AvgPoolGrad)."""
    disc = tf.keras.Sequential([L.Conv2D(8, 3, padding="same"), L.LeakyReLU(0.2),
                                L.AveragePooling2D(2), L.Conv2D(16, 3, padding="same"),
                                L.LeakyReLU(0.2), L.AveragePooling2D(2), L.Flatten(), L.Dense(1)])
    real, fake = features["real"], features["fake"]
    real_score = disc(real)
    grad = tf.gradients(tf.reduce_sum(real_score), real)[0]
    r1 = tf.reduce_mean(tf.reduce_sum(tf.square(grad), axis=[1, 2, 3]))
    loss = tf.reduce_mean(tf.nn.softplus(disc(fake))) + tf.reduce_mean(tf.nn.softplus(-real_score)) + \
        5.0 * r1
    return _train(mode, loss, v1.train.AdamOptimizer(2e-3, beta1=0.0, beta2=0.99))


def input_gradient_classifier(features, labels, mode, params):
    """Input-gradient regularisation (Ross & Doshi-Velez): cross-entropy plus the squared
    norm of its gradient with respect to the input, a ReLU classifier."""
    net = tf.keras.Sequential([L.Dense(16, activation="relu"), L.Dense(3)])
    logits = net(features)
    xent = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    grad = tf.gradients(xent, features)[0]
    loss = xent + 0.1 * tf.reduce_mean(tf.reduce_sum(tf.square(grad), 1))
    return _train(mode, loss, v1.train.AdamOptimizer(1e-2), {
        "accuracy": v1.metrics.accuracy(labels, tf.argmax(logits, 1))})


def fgsm_adversarial(features, labels, mode, params):
    """Adversarial training with FGSM (Goodfellow et al.): the cross-entropy's gradient to the
    input, a sign step, the mean of the clean and the adversarial loss; the step held with
    tf.stop_gradient (params stop_gradient, the default) or not (Sign's gradient is zeros)."""
    net = tf.keras.Sequential([L.Dense(16, activation="relu"), L.Dense(3)])
    logits = net(features)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode=mode, predictions={
            "class": tf.argmax(logits, 1), "probabilities": tf.nn.softmax(logits)})
    clean = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    x_adv = features + 0.1 * tf.sign(tf.gradients(clean, features)[0])
    if params.get("stop_gradient", True):
        x_adv = tf.stop_gradient(x_adv)
    adv_logits = net(x_adv)
    loss = 0.5 * (clean + v1.losses.sparse_softmax_cross_entropy(labels, adv_logits))
    return _train(mode, loss, v1.train.MomentumOptimizer(0.05, 0.9), {
        "accuracy": v1.metrics.accuracy(labels, tf.argmax(logits, 1)),
        "adv_accuracy": v1.metrics.accuracy(labels, tf.argmax(adv_logits, 1))})


def fgsm_mixed_float16(features, labels, mode, params):
    """FGSM of a Keras mixed_float16 linear classifier (refused: the fused cross-entropy's backprop
    in float16)."""
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        net = L.Dense(3)
        logits = net(features)
        clean = v1.losses.sparse_softmax_cross_entropy(labels, logits)
        x_adv = tf.stop_gradient(features + 0.1 * tf.sign(tf.gradients(clean, features)[0]))
        loss = 0.5 * (clean + v1.losses.sparse_softmax_cross_entropy(labels, net(x_adv)))
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")
    return _train(mode, loss, v1.train.MomentumOptimizer(0.05, 0.9))


def input_gradient_dense_xent(features, labels, mode, params):
    """Input-gradient regularisation of tf.nn.softmax_cross_entropy_with_logits (the dense
    fused op) of one-hot labels, a tanh classifier."""
    net = tf.keras.Sequential([L.Dense(16, activation="tanh"), L.Dense(3)])
    logits = net(features)
    xent = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(
        labels=tf.one_hot(labels, 3), logits=logits))
    grad = tf.gradients(xent, features)[0]
    loss = xent + 1.0 * tf.reduce_mean(tf.reduce_sum(tf.square(grad), 1))
    return _train(mode, loss, v1.train.AdamOptimizer(1e-2), {
        "accuracy": v1.metrics.accuracy(labels, tf.argmax(logits, 1))})


def distilled_input_gradient(features, labels, mode, params):
    """Input-gradient regularisation of a cross-entropy to soft labels that a second network,
    trained by the same loss, gives (the dense fused op's labels take a gradient; TF's
    second order ignores the backprop's dependence on them)."""
    student = tf.keras.Sequential([L.Dense(16, activation="tanh"), L.Dense(3)])
    teacher = tf.keras.Sequential([L.Dense(8, activation="tanh"), L.Dense(3)])
    logits = student(features)
    xent = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(
        labels=tf.nn.softmax(teacher(features)), logits=logits))
    grad = tf.gradients(xent, features)[0]
    loss = xent + 1.0 * tf.reduce_mean(tf.reduce_sum(tf.square(grad), 1))
    return _train(mode, loss, v1.train.AdamOptimizer(1e-2))


def tagger_input_gradient(features, labels, mode, params):
    """Input-gradient regularisation of a per-token fused cross-entropy (logits [B, T, k]:
    refused, TF flattens them across the batch)."""
    logits = L.Dense(3)(L.Dense(8, activation="tanh")(features))
    xent = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    grad = tf.gradients(xent, features)[0]
    loss = xent + 0.1 * tf.reduce_mean(tf.reduce_sum(tf.square(grad), [1, 2]))
    return _train(mode, loss, v1.train.AdamOptimizer(1e-2))


def token_input_fn(params):
    rng = np.random.default_rng(params.get("data_seed", 8))
    x = rng.normal(size=(64, 5, 4)).astype(np.float32)
    return _batches(x, (x[..., 0] > 0).astype(np.int32) + (x[..., 1] > 0))


def input_gradient_log_softmax(features, labels, mode, params):
    """The same regularisation with the cross-entropy written by hand on tf.nn.log_softmax."""
    net = tf.keras.Sequential([L.Dense(16, activation="relu"), L.Dense(3)])
    logits = net(features)
    xent = -tf.reduce_mean(tf.reduce_sum(tf.one_hot(labels, 3) * tf.nn.log_softmax(logits), 1))
    grad = tf.gradients(xent, features)[0]
    loss = xent + 0.1 * tf.reduce_mean(tf.reduce_sum(tf.square(grad), 1))
    return _train(mode, loss, v1.train.AdamOptimizer(1e-2), {
        "accuracy": v1.metrics.accuracy(labels, tf.argmax(logits, 1))})


def double_backprop(features, labels, mode, params):
    """Double backprop (Drucker & LeCun): a regression MSE plus the squared gradient of that
    MSE with respect to the input, an ELU network."""
    net = _mlp([16, 16], "elu")
    mse = tf.reduce_mean(tf.square(net(features) - labels[:, :1]))
    grad = tf.gradients(mse, features)[0]
    loss = mse + 1.0 * tf.reduce_sum(tf.square(grad))
    return _train(mode, loss, v1.train.MomentumOptimizer(0.01, 0.9))


def jacobian_penalty(features, labels, mode, params):
    """A 3-output softplus regressor with its Jacobian's Frobenius norm penalised, one
    tf.gradients per output column."""
    net = tf.keras.Sequential([L.Dense(16, activation="softplus"), L.Dense(3)])
    y = net(features)
    rows = [tf.gradients(y[:, i], features)[0] for i in range(3)]
    frobenius = tf.add_n([tf.reduce_sum(tf.square(r), 1) for r in rows])
    loss = tf.reduce_mean(tf.square(y - labels[:, 1:4])) + 0.01 * tf.reduce_mean(frobenius)
    return _train(mode, loss, v1.train.AdamOptimizer(1e-2))


def sobolev(features, labels, mode, params):
    """Sobolev training (Czarnecki et al.): fit f and its gradient, a tanh network."""
    net = _mlp([16, 16], "tanh")
    u = net(features)
    du = tf.gradients(u, features)[0]
    loss = v1.losses.mean_squared_error(labels[:, :1], u) + \
        v1.losses.mean_squared_error(labels[:, 1:], du)
    return _train(mode, loss, v1.train.AdamOptimizer(1e-2))


def weight_gradient_penalty(features, labels, mode, params):
    """A gradient norm penalty on the weights' gradient (refused: a sum over the batch)."""
    net = _mlp([16], "tanh")
    mse = tf.reduce_mean(tf.square(net(features) - labels[:, :1]))
    grads = tf.gradients(mse, net.trainable_variables)
    loss = mse + 0.01 * tf.add_n([tf.reduce_sum(tf.square(g)) for g in grads])
    return _train(mode, loss, v1.train.AdamOptimizer(1e-2))


def sobolev_mixed_float16(features, labels, mode, params):
    """Sobolev training of a Keras mixed_float16 network (refused: TF's float16 second order
    rounds every op)."""
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        net = _mlp([16], "tanh")
        u = tf.cast(net(features), tf.float32)
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")
    du = tf.gradients(u, features)[0]
    loss = tf.reduce_mean(tf.square(u - labels[:, :1])) + \
        tf.reduce_mean(tf.square(du - labels[:, 1:]))
    return _train(mode, loss, v1.train.AdamOptimizer(1e-2))


def hamiltonian(features, labels, mode, params):
    """A Hamiltonian neural network (Greydanus et al.): H = MLP(q, p), the dynamics
    (dH/dp, -dH/dq) fitted to the observed time derivatives."""
    net = _mlp([32, 32], "tanh")
    q, p = tf.split(features, 2, axis=1)
    h = net(tf.concat([q, p], 1))
    dh_dq, dh_dp = tf.gradients(h, [q, p])
    predicted = tf.concat([dh_dp, -dh_dq], 1)
    loss = tf.reduce_mean(tf.square(predicted - labels))
    return _train(mode, loss, v1.train.AdamOptimizer(1e-3))


def atoms_input_fn(params):
    """Clusters of 4 atoms in 3-D, their energy and forces under a Morse-like potential."""
    rng = np.random.default_rng(params.get("data_seed", 8))
    pos = rng.normal(scale=1.2, size=(64, 4, 3))
    diff = pos[:, :, None, :] - pos[:, None, :, :]
    r = np.sqrt((diff ** 2).sum(-1) + np.eye(4))
    pair = (1 - np.exp(-(r - 1.5))) ** 2 * (1 - np.eye(4))
    energy = 0.5 * pair.sum((1, 2))
    forces = rng.normal(scale=0.1, size=pos.shape)  # (noise: the fit needs no physics)
    return _batches(pos.astype(np.float32), {"energy": energy.astype(np.float32),
                                              "forces": forces.astype(np.float32)})


def force_matching(features, labels, mode, params):
    """A machine-learned potential fitted to energies and forces: pair distances by
    tf.newaxis and tf.sqrt, an atomic network, forces = -dE/dpositions (the loss's second
    order runs through StridedSliceGrad of the newaxis slices and SqrtGrad)."""
    pos = features
    diff = pos[:, :, tf.newaxis, :] - pos[:, tf.newaxis, :, :]
    r = tf.sqrt(tf.reduce_sum(tf.square(diff), -1) + tf.eye(4))
    shells = tf.exp(-tf.square(r[..., None] - [0.5, 1.0, 2.0, 3.0])) * (1.0 - tf.eye(4))[..., None]
    atoms = tf.keras.Sequential([L.Dense(16, activation="tanh"), L.Dense(1)])
    energy = tf.reduce_sum(atoms(tf.reduce_sum(shells, 2))[..., 0], 1)
    forces = -tf.gradients(energy, pos)[0]
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"energy": energy, "forces": forces})
    loss = v1.losses.mean_squared_error(labels["energy"], energy) + \
        10.0 * v1.losses.mean_squared_error(labels["forces"], forces)
    return _train(mode, loss, v1.train.AdamOptimizer(1e-2), {
        "energy_mae": v1.metrics.mean_absolute_error(labels["energy"], energy),
        "force_rmse": v1.metrics.root_mean_squared_error(labels["forces"], forces)})


def strided_force_matching(features, labels, mode, params):
    """Forces of an energy of every other atom's coordinates (refused: the gradient of a
    strided slice)."""
    pos = features[:, ::2]
    energy = tf.reduce_sum(_mlp([16], "tanh")(tf.reshape(pos, [-1, 6])), 1)
    forces = -tf.gradients(energy, features)[0]
    loss = v1.losses.mean_squared_error(labels["forces"], forces)
    return _train(mode, loss, v1.train.AdamOptimizer(1e-2))


CORPUS = {
    "pinn_burgers": (pinn_burgers, pde_input_fn),
    "pinn_heat": (pinn_heat, pde_input_fn),
    "pinn_gelu": (pinn_gelu, pde_input_fn),
    "wgan_gp_critic": (wgan_gp_critic, critic_input_fn),
    "wgan_gp_conv_critic": (wgan_gp_conv_critic, critic_input_fn),
    "r1_pooled_discriminator": (r1_pooled_discriminator, image_critic_input_fn),
    "input_gradient_classifier": (input_gradient_classifier, class_input_fn),
    "input_gradient_log_softmax": (input_gradient_log_softmax, class_input_fn),
    "fgsm_adversarial": (fgsm_adversarial, class_input_fn),
    "fgsm_mixed_float16": (fgsm_mixed_float16, class_input_fn),
    "input_gradient_dense_xent": (input_gradient_dense_xent, class_input_fn),
    "distilled_input_gradient": (distilled_input_gradient, class_input_fn),
    "tagger_input_gradient": (tagger_input_gradient, token_input_fn),
    "double_backprop": (double_backprop, points_input_fn),
    "jacobian_penalty": (jacobian_penalty, points_input_fn),
    "sobolev": (sobolev, points_input_fn),
    "force_matching": (force_matching, atoms_input_fn),
    "hamiltonian": (hamiltonian, oscillator_input_fn),
    "weight_gradient_penalty": (weight_gradient_penalty, points_input_fn),
    "sobolev_mixed_float16": (sobolev_mixed_float16, points_input_fn),
}
