"""Models that rotate and flip images by a constant, as users write them: tf.image.rot90(x, k)
of a Python k (TF builds a tf.case of tf.conds on k % 4, constant when the graph builds) and
tf.image.flip_left_right, in a classifier pooling one convolution over the four rotations
(rotation-invariant features); RotNet's pretext task (Gidaris et al. 2018: predict which of
the four rotations an image shows) with the rotations stacked on a sample axis and folded
into the batch sample-major, labels tf.tile(tf.range(4), [B]); and RotNet's rotations
concatenated along the batch copy-major (refused, with that hint)."""
import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

L = tf.keras.layers
v1 = tf.compat.v1
SIZE, SAMPLES = 12, 64


def images_input_fn(params):
    """SIZE x SIZE images of an "L" (recognisable orientation) plus noise; the label is
    whether the L is the large one (the same under any rotation)."""
    rng = np.random.RandomState(12)
    img = np.zeros((SAMPLES, SIZE, SIZE, 1), np.float32)
    label = rng.randint(0, 2, SAMPLES).astype(np.int32)
    for i in range(SAMPLES):
        arm = 4 + 3 * label[i]
        x0, y0 = rng.randint(1, SIZE - arm, 2)
        img[i, y0:y0 + arm, x0:x0 + 2] = 1
        img[i, y0 + arm - 2:y0 + arm, x0:x0 + arm] = 1
    img += 0.1 * rng.randn(*img.shape).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((img, label)).batch(params["batch_size"],
                                                                  drop_remainder=True)


def _features(x):
    """A small CNN's pooled features of images x (Keras layers named once: shared weights
    when called again)."""
    h = L.MaxPooling2D(2)(L.Conv2D(8, 3, padding="same", activation="relu", name="conv1")(x))
    h = L.Conv2D(16, 3, padding="same", activation="relu", name="conv2")(h)
    return L.GlobalAveragePooling2D()(h)


def _classifier_spec(mode, labels, logits, learning_rate=1e-2):
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels,
                                                                         logits=logits))
    train_op = None
    if mode == ModeKeys.TRAIN:
        train_op = v1.train.AdamOptimizer(learning_rate).minimize(
            loss, global_step=v1.train.get_or_create_global_step())
    pred = tf.argmax(logits, -1, output_type=tf.int32)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op,
                           predictions={"class": pred, "logits": logits},
                           eval_metric_ops={"accuracy": v1.metrics.accuracy(labels, pred)})


def rotation_pooled(features, labels, mode, params):
    """One convolution stack over the image rotated by 0, 90, 180 and 270 degrees and over
    its mirror image, the features averaged (rotation-invariant), a Dense classifier."""
    conv1 = L.Conv2D(8, 3, padding="same", activation="relu", name="conv1")
    pool = L.GlobalAveragePooling2D()
    views = [tf.image.rot90(features, k) for k in range(4)]
    views.append(tf.image.flip_left_right(features))
    feat = tf.add_n([pool(conv1(v)) for v in views]) / len(views)
    logits = L.Dense(2, name="logits")(feat)
    return _classifier_spec(mode, labels, logits)


def rotnet_stacked(features, labels, mode, params):
    """RotNet's pretext task with the four rotations stacked on a sample axis and folded
    into the batch sample-major ([B, 4, H, W, C] -> [4B, H, W, C]), the rotation labels in
    the same order, tf.tile(tf.range(4), [B]), the mean cross-entropy of the 4B rows; the
    accuracy of each image's 4 rotations and the upright image's features (predictions) read
    back as [B, 4, ...]."""
    B = tf.shape(features)[0]
    x = tf.reshape(tf.stack([tf.image.rot90(features, k) for k in range(4)], axis=1),
                   [-1, SIZE, SIZE, 1])
    rot_labels = tf.tile(tf.range(4), [B])
    feat = _features(x)
    logits = L.Dense(4, name="rot")(L.Dense(16, activation="relu", name="fc")(feat))
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=rot_labels,
                                                                         logits=logits))
    train_op = None
    if mode == ModeKeys.TRAIN:
        train_op = v1.train.AdamOptimizer(1e-3).minimize(
            loss, global_step=v1.train.get_or_create_global_step())
    pred = tf.argmax(tf.reshape(logits, [-1, 4, 4]), -1, output_type=tf.int32)
    upright = tf.reshape(feat, [-1, 4, feat.shape[-1]])[:, 0]
    accuracy = v1.metrics.accuracy(tf.reshape(rot_labels, [-1, 4]), pred)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op,
                           predictions={"features": upright},
                           eval_metric_ops={"rot_accuracy": accuracy})


def rotnet_concatenated(features, labels, mode, params):
    """RotNet's pretext task as its papers' code writes it: the four rotations concatenated
    along the batch (copy-major), labels tf.repeat(tf.range(4), B) (refused, with a hint)."""
    B = tf.shape(features)[0]
    x = tf.concat([tf.image.rot90(features, k) for k in range(4)], axis=0)
    rot_labels = tf.repeat(tf.range(4), B)
    logits = L.Dense(4, name="rot")(_features(x))
    return _classifier_spec(mode, rot_labels, logits, 1e-3)
