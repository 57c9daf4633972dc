"""Models of blind testers' findings, as they wrote them: a GCN whose input_fn yields float64
node features (numpy's default after `+ labels * 0.3`) read through Keras' Dense (autocast to
float32); a controlled-capacity beta-VAE whose batch-level loss term gamma * |mean(KL) - C|
reads a schedule of the global step; mixup's Beta draw as the ratio of two tf.random.gamma. Then float64 images flattened before
the Dense (a view, then the autocast), and scaled in float64 before it (read as float64)."""
import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

GCN_PARAMS = {"batch_size": 16, "num_nodes": 12, "num_features": 8, "hidden": 32,
          "num_classes": 3, "learning_rate": 0.05, "momentum": 0.9}


def gcn_input_fn(params):
    rng = np.random.RandomState(0)
    n, nn, f = 256, params["num_nodes"], params["num_features"]
    labels = rng.randint(0, params["num_classes"], size=n).astype(np.int32)
    adj = np.zeros((n, nn, nn), np.float32)
    for i in range(n):
        p = 0.1 + 0.2 * labels[i]
        upper = np.triu((rng.rand(nn, nn) < p).astype(np.float32), 1)
        adj[i] = upper + upper.T
    x = rng.randn(n, nn, f).astype(np.float32) + labels[:, None, None] * 0.3
    ds = tf.data.Dataset.from_tensor_slices(({"x": x, "adj": adj}, labels))
    return ds.repeat().batch(params["batch_size"], drop_remainder=True)


def gcn_layer(a_norm, h, units, activation, name):
    hw = tf.keras.layers.Dense(units, use_bias=False, name=name)(h)
    out = tf.matmul(a_norm, hw)
    bias = tf.compat.v1.get_variable(name + "_bias", [units], initializer=tf.zeros_initializer())
    out = out + bias
    return activation(out) if activation is not None else out


def gcn(features, labels, mode, params):
    x, adj = features["x"], features["adj"]
    nn = params["num_nodes"]
    a_hat = adj + tf.eye(nn)
    deg = tf.reduce_sum(a_hat, axis=-1)
    d_inv_sqrt = tf.math.rsqrt(deg)
    a_norm = d_inv_sqrt[:, :, None] * a_hat * d_inv_sqrt[:, None, :]

    h = gcn_layer(a_norm, x, params["hidden"], tf.nn.relu, "gcn1")
    h = gcn_layer(a_norm, h, params["hidden"], tf.nn.relu, "gcn2")
    graph = tf.reduce_mean(h, axis=1)
    logits = tf.keras.layers.Dense(params["num_classes"], name="classifier")(graph)

    predictions = {"class": tf.argmax(logits, -1), "probabilities": tf.nn.softmax(logits)}
    loss = train_op = eval_metric_ops = None
    if mode != ModeKeys.PREDICT:
        loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
        eval_metric_ops = {"accuracy": tf.compat.v1.metrics.accuracy(labels, predictions["class"])}
        if mode == ModeKeys.TRAIN:
            opt = tf.compat.v1.train.MomentumOptimizer(params["learning_rate"], params["momentum"])
            train_op = opt.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op, predictions=predictions,
                           eval_metric_ops=eval_metric_ops)

CAPACITY_VAE_PARAMS = {"batch_size": 16, "latent": 8, "gamma": 100.0, "capacity_max": 25.0,
          "capacity_steps": 1000, "learning_rate": 5e-4}


def capacity_vae_input_fn(params):
    rng = np.random.RandomState(17)
    n = params["batch_size"] * 8
    x = np.zeros((n, 16, 16, 1), np.float32)
    for i in range(n):  # one random box per image (dSprites-like)
        r, c = rng.randint(0, 10, size=2)
        s = rng.randint(3, 7)
        x[i, r:r + s, c:c + s, 0] = 1.0
    return tf.data.Dataset.from_tensor_slices((x, x)).batch(params["batch_size"], drop_remainder=True)


def capacity_vae(features, labels, mode, params):
    z_dim = params["latent"]
    h = tf.keras.layers.Conv2D(32, 4, strides=2, padding="same", activation="relu")(features)
    h = tf.keras.layers.Conv2D(32, 4, strides=2, padding="same", activation="relu")(h)
    h = tf.keras.layers.Flatten()(h)
    h = tf.keras.layers.Dense(128, activation="relu")(h)
    mu = tf.keras.layers.Dense(z_dim)(h)
    logvar = tf.keras.layers.Dense(z_dim)(h)
    eps = tf.random.normal(tf.shape(mu))
    z = mu + tf.exp(0.5 * logvar) * eps
    d = tf.keras.layers.Dense(128, activation="relu")(z)
    d = tf.keras.layers.Dense(4 * 4 * 32, activation="relu")(d)
    d = tf.keras.layers.Reshape((4, 4, 32))(d)
    d = tf.keras.layers.Conv2DTranspose(32, 4, strides=2, padding="same", activation="relu")(d)
    x_logits = tf.keras.layers.Conv2DTranspose(1, 4, strides=2, padding="same")(d)
    predictions = {"mean": mu, "log_var": logvar, "reconstruction": tf.sigmoid(x_logits)}
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode=mode, predictions=predictions)

    recon = tf.reduce_mean(tf.reduce_sum(
        tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=x_logits), axis=[1, 2, 3]))
    kl = tf.reduce_mean(-0.5 * tf.reduce_sum(1.0 + logvar - tf.square(mu) - tf.exp(logvar), axis=1))
    global_step = tf.compat.v1.train.get_or_create_global_step()
    capacity = tf.minimum(params["capacity_max"],
                          params["capacity_max"] * tf.cast(global_step, tf.float32)
                          / params["capacity_steps"])
    loss = recon + params["gamma"] * tf.abs(kl - capacity)
    train_op = None
    if mode == ModeKeys.TRAIN:
        train_op = tf.compat.v1.train.AdamOptimizer(params["learning_rate"]).minimize(
            loss, global_step=global_step)
    metrics = {"reconstruction": tf.compat.v1.metrics.mean(recon),
               "kl": tf.compat.v1.metrics.mean(kl)}
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op, predictions=predictions,
                           eval_metric_ops=metrics)

MIXUP_PARAMS = {"batch_size": 16, "num_classes": 10, "alpha": 0.2, "learning_rate": 0.05}


def mixup_input_fn(params):
    rng = np.random.RandomState(71)
    n = params["batch_size"] * 8
    y = rng.randint(0, params["num_classes"], size=n).astype(np.int32)
    x = rng.normal(scale=0.5, size=(n, 16, 16, 1)).astype(np.float32)
    x[np.arange(n), y, :, 0] += 1.5  # the class's row lights up
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(params["batch_size"], drop_remainder=True)


def network(x, num_classes):
    h = tf.keras.layers.Conv2D(32, 3, padding="same", activation="relu")(x)
    h = tf.keras.layers.MaxPooling2D(2)(h)
    h = tf.keras.layers.Conv2D(64, 3, padding="same", activation="relu")(h)
    h = tf.keras.layers.MaxPooling2D(2)(h)
    h = tf.keras.layers.Flatten()(h)
    h = tf.keras.layers.Dense(64, activation="relu")(h)
    return tf.keras.layers.Dense(num_classes)(h)


def mixup(features, labels, mode, params):
    k = params["num_classes"]
    if mode == ModeKeys.TRAIN:
        alpha = params["alpha"]
        g1 = tf.random.gamma([], alpha)
        g2 = tf.random.gamma([], alpha)
        lam = g1 / (g1 + g2)
        index = tf.random.shuffle(tf.range(tf.shape(features)[0]))
        onehot = tf.one_hot(labels, k)
        x = lam * features + (1.0 - lam) * tf.gather(features, index)
        y = lam * onehot + (1.0 - lam) * tf.gather(onehot, index)
    else:
        x, y = features, (tf.one_hot(labels, k) if labels is not None else None)
    logits = network(x, k)
    classes = tf.argmax(logits, -1)
    predictions = {"classes": classes, "probabilities": tf.nn.softmax(logits)}
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode=mode, predictions=predictions)
    loss = tf.compat.v1.losses.softmax_cross_entropy(y, logits)
    train_op = None
    if mode == ModeKeys.TRAIN:
        global_step = tf.compat.v1.train.get_or_create_global_step()
        lr = tf.compat.v1.train.piecewise_constant(global_step, [100, 150],
                                                   [params["learning_rate"], 0.005, 0.0005])
        train_op = tf.compat.v1.train.MomentumOptimizer(lr, 0.9).minimize(loss, global_step=global_step)
    metrics = {"accuracy": tf.compat.v1.metrics.accuracy(labels, classes)}
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op, predictions=predictions,
                           eval_metric_ops=metrics)


def float64_images_input_fn(params):
    rng = np.random.RandomState(0)
    x = rng.randn(64, 4, 4)  # float64, numpy's default
    y = (x[:, 0, 0] > 0).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(params["batch_size"],
                                                                     drop_remainder=True)


def _classifier(logits, labels, mode):
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=step)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op)


def flattened_float64(features, labels, mode, params):
    h = tf.keras.layers.Flatten()(features)
    h = tf.keras.layers.Dense(16, activation="relu")(h)
    return _classifier(tf.keras.layers.Dense(2)(h), labels, mode)


def scaled_before_the_cast(features, labels, mode, params):
    """A float64 product before the Dense's cast: TF computes it in float64."""
    h = tf.keras.layers.Flatten()(features * 0.5)
    return _classifier(tf.keras.layers.Dense(2)(h), labels, mode)


def capacity_kept_in_a_variable(features, labels, mode, params):
    """gamma * |mean(KL) - C|, C the step's ramp plus a variable the train_op raises every
    step: no schedule of the global step alone."""
    h = tf.keras.layers.Flatten()(features)
    mu = tf.keras.layers.Dense(params["latent"])(h)
    logvar = tf.keras.layers.Dense(params["latent"])(h)
    kl = tf.reduce_mean(-0.5 * tf.reduce_sum(1.0 + logvar - tf.square(mu) - tf.exp(logvar), axis=1))
    raised = tf.compat.v1.get_variable("raised", [], initializer=tf.zeros_initializer(),
                                       trainable=False)
    global_step = tf.compat.v1.train.get_or_create_global_step()
    capacity = tf.minimum(params["capacity_max"], raised + tf.cast(global_step, tf.float32))
    loss = tf.reduce_mean(tf.square(mu)) + params["gamma"] * tf.abs(kl - capacity)
    train_op = tf.group(tf.compat.v1.train.AdamOptimizer(1e-3).minimize(loss, global_step=global_step),
                        raised.assign_add(1.0))
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op)
