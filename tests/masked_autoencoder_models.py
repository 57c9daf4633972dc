"""A masked autoencoder (MAE) as its paper's reference code writes it, on 16x16 images: each
image's patches shuffled by tf.argsort of its own uniform noise, the first quarter kept and
encoded (tf.gather(tokens, ids_keep, batch_dims=1)), the binary mask of the dropped patches
restored to the image's order by gathering a constant row of the batch
(tf.gather(tf.concat([zeros, ones], 1), ids_restore, batch_dims=1)), mask tokens appended and
unshuffled, and the loss the squared error on the dropped patches only."""
import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

params = {"batch_size": 8, "size": 16, "patch": 4, "dim": 32, "mask_ratio": 0.75,
          "learning_rate": 1e-3}


def input_fn(params):
    rng = np.random.RandomState(5)
    s = params["size"]
    ramp = np.linspace(0.0, 1.0, s, dtype=np.float32)
    images = rng.rand(64, s, s, 1).astype(np.float32) * 0.2 + ramp[None, :, None, None]
    labels = np.zeros(64, np.int32)
    return tf.data.Dataset.from_tensor_slices((images, labels)).repeat().batch(
        params["batch_size"], drop_remainder=True)


def model_fn(features, labels, mode, params):
    p, d = params["patch"], params["dim"]
    n = (params["size"] // p) ** 2
    keep = int(n * (1 - params["mask_ratio"]))
    patches = tf.reshape(tf.image.extract_patches(features, [1, p, p, 1], [1, p, p, 1],
                                                  [1, 1, 1, 1], "VALID"), [-1, n, p * p])
    batch = tf.shape(patches)[0]
    noise = tf.random.uniform([batch, n])
    ids_shuffle = tf.argsort(noise, axis=1)
    ids_restore = tf.argsort(ids_shuffle, axis=1)
    tokens = tf.keras.layers.Dense(d, name="embed")(patches)
    visible = tf.gather(tokens, ids_shuffle[:, :keep], batch_dims=1)
    h = tf.keras.layers.Dense(d, activation="gelu", name="encoder")(visible)
    mask = tf.concat([tf.zeros([batch, keep]), tf.ones([batch, n - keep])], axis=1)
    mask = tf.gather(mask, ids_restore, batch_dims=1)  # 1: the patch was dropped
    mask_token = tf.compat.v1.get_variable("mask_token", [1, 1, d], initializer=tf.zeros_initializer())
    full = tf.concat([h, tf.tile(mask_token, [batch, n - keep, 1])], axis=1)
    full = tf.gather(full, ids_restore, batch_dims=1)
    reconstruction = tf.keras.layers.Dense(p * p, name="decoder")(full)
    per_patch = tf.reduce_mean(tf.square(reconstruction - patches), axis=-1)
    predictions = {"reconstruction": reconstruction, "mask": mask}
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode=mode, predictions=predictions)
    loss = tf.reduce_sum(per_patch * mask) / tf.reduce_sum(mask)
    train_op = None
    if mode == ModeKeys.TRAIN:
        train_op = tf.compat.v1.train.AdamOptimizer(params["learning_rate"]).minimize(
            loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op, predictions=predictions,
                           eval_metric_ops={"masked_mse": tf.compat.v1.metrics.mean(
                               tf.reduce_sum(per_patch * mask, 1) / tf.reduce_sum(mask, 1))})
