"""Functions applied to each sample of a batch, as users write them: a CondConv classifier
(per-sample kernels routing(x) @ experts, each sample convolved with its own by tf.split and
tf.concat, or tf.unstack and tf.stack), a dynamic filter network (tf.map_fn of a convolution
of each sample by the filter a layer generates for it), a per-sample map_fn feature (each
sample's values sorted and gathered at its own indices), a hypernetwork (tf.vectorized_map
of a Dense layer whose weights another network generates per sample); and the patterns
that mix samples (the pieces concatenated in another order, a piece convolved with the next
sample's kernel), refused."""
import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

L, v1 = tf.keras.layers, tf.compat.v1
BATCH, SIZE, CHANNELS, CLASSES, EXPERTS = 8, 6, 3, 4, 3


def images_input_fn(params):
    """6x6 RGB images whose class is the quadrant of their brightest blob."""
    rng = np.random.default_rng(params.get("data_seed", 3))
    x = rng.normal(0, 0.3, size=(4 * BATCH, SIZE, SIZE, CHANNELS)).astype(np.float32)
    y = rng.integers(0, CLASSES, 4 * BATCH).astype(np.int32)
    for i, c in enumerate(y):
        r, s = divmod(int(c), 2)
        x[i, 3 * r:3 * r + 3, 3 * s:3 * s + 3] += 1.0
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH, drop_remainder=True)


def _spec(mode, labels, logits):
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"logits": logits,
                                                  "classes": tf.argmax(logits, 1)})
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss, eval_metric_ops={
            "accuracy": v1.metrics.accuracy(labels, tf.argmax(logits, 1))})
    return CSEstimatorSpec(mode, loss=loss, train_op=v1.train.AdamOptimizer(1e-2).minimize(
        loss, global_step=v1.train.get_or_create_global_step()))


def _head(h, labels, mode):
    return _spec(mode, labels, L.Dense(CLASSES, name="logits")(L.GlobalAveragePooling2D()(h)))


def _condconv_kernels(x, out):
    """Each sample's 3x3 kernel: the experts mixed by its routing weights (CondConv)."""
    experts = v1.get_variable("experts", [EXPERTS, 3, 3, CHANNELS, out])
    routing = L.Dense(EXPERTS, activation="sigmoid", name="routing")(
        tf.reduce_mean(x, axis=[1, 2]))
    return tf.tensordot(routing, experts, axes=1)  # [batch, 3, 3, C, out]


def condconv_split(features, labels, mode, params):
    """CondConv as its reference code writes it: tf.split of the batch, a conv per sample by
    its own kernel, tf.concat back."""
    kernels = _condconv_kernels(features, 8)
    pieces = tf.split(features, BATCH, axis=0)
    outputs = [tf.nn.conv2d(x_i, kernels[i], strides=1, padding="SAME")
               for i, x_i in enumerate(pieces)]
    return _head(tf.nn.relu(tf.concat(outputs, axis=0)), labels, mode)


def condconv_unstack(features, labels, mode, params):
    """CondConv by tf.unstack of the images and the kernels, tf.stack back."""
    kernels = tf.unstack(_condconv_kernels(features, 8))
    outputs = [tf.nn.conv2d(x_i[None], k_i, strides=1, padding="SAME")[0]
               for x_i, k_i in zip(tf.unstack(features), kernels)]
    return _head(tf.nn.relu(tf.stack(outputs)), labels, mode)


def dynamic_filter(features, labels, mode, params):
    """A dynamic filter network: a layer generates each sample's depthwise 3x3 filter,
    tf.map_fn convolves each sample with its own."""
    h = L.Conv2D(4, 3, padding="same", activation="relu", name="stem")(features)
    generated = L.Dense(3 * 3 * 4, name="filter_generator")(tf.reduce_mean(h, axis=[1, 2]))
    filters = tf.reshape(generated, [-1, 3, 3, 4, 1])

    def convolve(args):
        image, filt = args
        return tf.nn.depthwise_conv2d(image[None], filt, [1, 1, 1, 1], "SAME")[0]

    h = tf.map_fn(convolve, (h, filters), fn_output_signature=tf.float32)
    return _head(tf.nn.relu(h), labels, mode)


def sorted_features(features, labels, mode, params):
    """tf.map_fn of per-sample features: each sample's channel means sorted, and its
    pixels gathered at the indices of its largest."""
    h = L.Conv2D(4, 3, padding="same", activation="relu", name="stem")(features)
    flat = tf.reshape(h, [-1, SIZE * SIZE, 4])

    def per_sample(x):
        ordered = tf.sort(tf.reduce_mean(x, 0), direction="DESCENDING")
        strongest = tf.math.top_k(x[:, 0], k=5).indices
        return tf.concat([ordered, tf.reshape(tf.gather(x, strongest), [-1])], 0)

    summary = tf.map_fn(per_sample, flat)
    return _spec(mode, labels, L.Dense(CLASSES, name="logits")(summary))


def hypernetwork(features, labels, mode, params):
    """A hypernetwork: an embedding of each image generates the weights of its own Dense
    layer, applied by tf.vectorized_map."""
    pooled = tf.reduce_mean(features, axis=[1, 2])
    z = L.Dense(4, activation="tanh", name="embedding")(pooled)
    weights = tf.reshape(L.Dense(2 * SIZE * CHANNELS * 6, name="hyper")(z), [-1, 2 * SIZE * CHANNELS, 6])
    rows = tf.concat([tf.reduce_mean(features, 1), tf.reduce_mean(features, 2)], 1)
    x = tf.reshape(rows, [-1, 2 * SIZE * CHANNELS])
    h = tf.vectorized_map(lambda a: tf.nn.relu(tf.linalg.matvec(a[1], a[0], transpose_a=True)),
                          (x, weights))
    return _spec(mode, labels, L.Dense(CLASSES, name="logits")(tf.concat([h, z], 1)))


def condconv_reversed(features, labels, mode, params):
    """The per-sample convolutions concatenated in reversed order (sample i gets sample
    B - 1 - i's output): mixes samples."""
    kernels = _condconv_kernels(features, 8)
    outputs = [tf.nn.conv2d(x_i, kernels[i], strides=1, padding="SAME")
               for i, x_i in enumerate(tf.split(features, BATCH, axis=0))]
    return _head(tf.nn.relu(tf.concat(outputs[::-1], axis=0)), labels, mode)


def condconv_shifted(features, labels, mode, params):
    """Each sample convolved with the next sample's kernel: mixes samples."""
    kernels = tf.unstack(_condconv_kernels(features, 8))
    outputs = [tf.nn.conv2d(x_i[None], kernels[(i + 1) % BATCH], strides=1, padding="SAME")[0]
               for i, x_i in enumerate(tf.unstack(features))]
    return _head(tf.nn.relu(tf.stack(outputs)), labels, mode)


def mapped_over_the_batch(features, labels, mode, params):
    """tf.map_fn whose function reads the whole batch (each sample minus the batch's mean
    image, computed inside): mixes samples."""
    h = L.Conv2D(4, 3, padding="same", activation="relu", name="stem")(features)
    centred = tf.map_fn(lambda x: x - tf.reduce_mean(h, 0), h)
    return _head(centred, labels, mode)


def condconv_map_fn(features, labels, mode, params):
    """CondConv by tf.map_fn over the images and their kernels."""
    kernels = _condconv_kernels(features, 8)
    h = tf.map_fn(lambda a: tf.nn.conv2d(a[0][None], a[1], strides=1, padding="SAME")[0],
                  (features, kernels), fn_output_signature=tf.float32)
    return _head(tf.nn.relu(h), labels, mode)


def dynamic_filter_vectorized(features, labels, mode, params):
    """The dynamic filter network with tf.vectorized_map in place of tf.map_fn."""
    h = L.Conv2D(4, 3, padding="same", activation="relu", name="stem")(features)
    generated = L.Dense(3 * 3 * 4, name="filter_generator")(tf.reduce_mean(h, axis=[1, 2]))
    filters = tf.reshape(generated, [-1, 3, 3, 4, 1])
    h = tf.vectorized_map(
        lambda a: tf.nn.depthwise_conv2d(a[0][None], a[1], [1, 1, 1, 1], "SAME")[0], (h, filters))
    return _head(tf.nn.relu(h), labels, mode)


def mapped_keras_layer(features, labels, mode, params):
    """tf.map_fn of a Keras layer, created before the map and called on each sample's rows
    (each sample's rows gated by their own scores, pooled)."""
    rows = tf.reshape(features, [-1, SIZE, SIZE * CHANNELS])
    score = L.Dense(1, activation="sigmoid", name="score")

    def pool(x):
        return tf.reduce_mean(score(x) * x, 0)

    return _spec(mode, labels, L.Dense(CLASSES, name="logits")(tf.map_fn(pool, rows)))


def condconv_first_kernel(features, labels, mode, params):
    """tf.map_fn convolving every sample with the first sample's kernel: mixes samples."""
    kernels = _condconv_kernels(features, 8)
    h = tf.map_fn(lambda x: tf.nn.conv2d(x[None], kernels[0], strides=1, padding="SAME")[0],
                  features)
    return _head(tf.nn.relu(h), labels, mode)


def noisy_map(features, labels, mode, params):
    """tf.map_fn adding noise to each sample (stateful random numbers drawn sample by
    sample): refused as TF's While."""
    h = L.Conv2D(4, 3, padding="same", activation="relu", name="stem")(features)
    return _head(tf.map_fn(lambda x: x + tf.random.normal(tf.shape(x), stddev=0.1), h),
                 labels, mode)


def hyper_conv(features, labels, mode, params):
    """A hypernetwork generating each sample's 3x3 convolution filter from its embedding
    (stride 2, VALID), applied by tf.vectorized_map."""
    z = L.Dense(4, activation="tanh", name="embedding")(tf.reduce_mean(features, axis=[1, 2]))
    filters = tf.reshape(L.Dense(3 * 3 * CHANNELS * 6, name="hyper")(z), [-1, 3, 3, CHANNELS, 6])
    h = tf.vectorized_map(
        lambda a: tf.nn.conv2d(a[0][None], a[1], strides=2, padding="VALID")[0], (features, filters))
    return _head(tf.nn.relu(h), labels, mode)
