"""Models from issue 21's breadth sweep (one tiny model per Keras layer or tf op users
train with), written as users write them, one per construct the sweep found refused or
trained differently."""
import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

L = tf.keras.layers


def image_input_fn(params):
    rng = np.random.default_rng(params.get("data_seed", 0))
    x = rng.normal(size=(32, 8, 8, 3)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((x, rng.integers(0, 3, 32).astype(np.int32))).batch(
        8, drop_remainder=True)


def spec(mode, logits, labels):
    logits = tf.cast(logits, tf.float32)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode=mode, predictions={"probabilities": tf.nn.softmax(logits)})
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode=mode, loss=loss)
    train_op = tf.compat.v1.train.AdamOptimizer(1e-2).minimize(
        loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op)


def upsampling_mixed(features, labels, mode, params):
    """A decoder's nearest upsampling under mixed_float16: UpSampling2D (ExpandDims, Tile,
    Reshape in float16) and a tf.tile of the feature map."""
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    h = L.Conv2D(4, 3, padding="same", activation="relu")(features)
    h = L.UpSampling2D(2)(h)
    h = tf.tile(h, [1, 1, 2, 1])
    h = L.Conv2D(4, 3, strides=2, padding="same")(h)
    logits = L.Dense(3, dtype="float32")(L.GlobalAveragePooling2D()(h))
    return spec(mode, logits, labels)


def transposed_and_dilated_mixed(features, labels, mode, params):
    """A mixed_float16 generator and WaveNet-style stack: Conv2D(dilation_rate=2) (TF's
    SpaceToBatchND, Conv2D, BatchToSpaceND), Conv2DTranspose(strides=2), and their 1-D forms
    over the image's rows."""
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    h = L.Conv2D(4, 3, dilation_rate=2, padding="same", activation="relu")(features)
    h = L.Conv2DTranspose(4, 3, strides=2, padding="same")(h)
    rows = L.Reshape((16 * 16, 4))(h)
    rows = L.Conv1D(4, 3, dilation_rate=2, padding="causal")(rows)
    rows = L.Conv1DTranspose(2, 3, strides=2, padding="same")(rows)
    logits = L.Dense(3, dtype="float32")(L.GlobalAveragePooling1D()(rows))
    return spec(mode, logits, labels)


def pixel_shuffle(features, labels, mode, params):
    """ESPCN's sub-pixel upsampling (Conv2D to 4·C channels, tf.nn.depth_to_space) and YOLO's
    reorg (tf.nn.space_to_depth), under mixed_float16 if params["mixed"]."""
    tf.keras.mixed_precision.set_global_policy("mixed_float16" if params.get("mixed") else "float32")
    h = L.Conv2D(8, 3, padding="same", activation="relu")(features)
    h = tf.nn.depth_to_space(h, 2)  # [16, 16, 2]
    h = L.Conv2D(3, 3, padding="same")(h)
    h = tf.nn.space_to_depth(h, 4)  # [4, 4, 48]
    logits = L.Dense(3, dtype="float32")(L.Flatten()(h))
    return spec(mode, logits, labels)


def vit_patches(features, labels, mode, params):
    """The Keras ViT example's patch encoder: tf.image.extract_patches of 4x4 patches, a
    Dense projection per patch, a learned position embedding; beside it overlapping 3x3
    patches (SAME, stride 2, rate 2), as a patch-based texture model takes them."""
    patches = tf.image.extract_patches(features, [1, 4, 4, 1], [1, 4, 4, 1], [1, 1, 1, 1], "VALID")
    tokens = L.Dense(8)(tf.reshape(patches, [-1, 4, 4 * 4 * 3]))
    tokens = tokens + L.Embedding(4, 8)(tf.range(4))
    overlapping = tf.image.extract_patches(features, [1, 3, 3, 1], [1, 2, 2, 1], [1, 2, 2, 1], "SAME")
    h = tf.concat([L.Flatten()(tokens), L.Flatten()(L.Dense(2)(overlapping))], -1)
    return spec(mode, L.Dense(3)(h), labels)


def sequence_input_fn(params):
    rng = np.random.default_rng(params.get("data_seed", 1))
    x = rng.normal(size=(32, 12, 4)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((x, rng.integers(0, 3, 32).astype(np.int32))).batch(
        8, drop_remainder=True)


def grouped_conv1d(features, labels, mode, params):
    """Grouped 1-D convolutions (Keras Conv1D(groups=), as in grouped temporal convnets):
    strided with a ReLU, then causal with 4 groups (Keras pads, then a VALID one); under
    mixed_float16 if params["mixed"]."""
    tf.keras.mixed_precision.set_global_policy("mixed_float16" if params.get("mixed") else "float32")
    h = L.Conv1D(8, 3, strides=2, padding="same", groups=2, activation="relu")(features)
    h = L.Conv1D(8, 2, padding="causal", groups=4, use_bias=False)(h)
    return spec(mode, L.Dense(3, dtype="float32")(L.GlobalMaxPooling1D()(h)), labels)


def grouped_conv_mixed(features, labels, mode, params):
    """A ResNeXt-style block under mixed_float16: a strided 3x3 Conv2D(groups=3) with a
    ReLU, then the rows through a causal Conv1D(groups=2) (Keras runs grouped convolutions
    as XLA functions); a float32 head."""
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        h = L.Conv2D(6, 3, strides=2, padding="same", groups=3, activation="relu", name="grouped")(features)
        h = L.Conv1D(6, 2, padding="causal", groups=2, name="causal")(tf.reshape(h, [-1, 16, 6]))
        logits = L.Dense(3, dtype="float32", name="head")(L.GlobalAveragePooling1D()(h))
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")
    return spec(mode, logits, labels)


def upsampling_decoder_mixed(features, labels, mode, params):
    """A segmentation-style decoder under mixed_float16: a strided encoder, bilinear
    UpSampling2D (tf.image.resize: ResizeBilinear), a skip connection, tf.image.resize
    nearest to an odd size (ResizeNearestNeighbor) and the v1 align_corners resize; a
    float32 head (params["policy"]: the float32 twin)."""
    tf.keras.mixed_precision.set_global_policy(params.get("policy", "mixed_float16"))
    try:
        skip = L.Conv2D(4, 3, padding="same", activation="relu", name="enc1")(features)
        h = L.Conv2D(6, 3, strides=2, padding="same", activation="relu", name="enc2")(skip)
        h = L.UpSampling2D(interpolation="bilinear")(h)
        h = L.Conv2D(4, 3, padding="same", activation="relu", name="dec")(L.Concatenate()([h, skip]))
        h = tf.image.resize(h, (11, 11), method="nearest")
        h = tf.compat.v1.image.resize_nearest_neighbor(h, (6, 6), align_corners=True)
        logits = L.Dense(3, dtype="float32", name="head")(L.GlobalAveragePooling2D()(h))
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")
    return spec(mode, logits, labels)


def angles_mixed(features, labels, mode, params):
    """Angle features under mixed_float16: tf.math.atan and tan of a projection, asin and
    acos of a tanh-bounded one (params["function"]: tf.math.lgamma in their place)."""
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        h = L.Dense(8, name="proj")(L.Flatten()(features))
        bounded = 0.9 * tf.tanh(h)
        if params.get("function") == "lgamma":
            angles = [tf.math.lgamma(tf.abs(h) + 1.0)]
        else:
            angles = [tf.math.atan(h), tf.math.tan(0.5 * bounded), tf.math.asin(bounded),
                      tf.math.acos(bounded)]
        logits = L.Dense(3, dtype="float32", name="head")(L.Concatenate()(angles))
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")
    return spec(mode, logits, labels)


def ids_input_fn(params):
    """Token ids in [0, 20), 0 padding the end of some rows."""
    rng = np.random.default_rng(params.get("data_seed", 2))
    ids = rng.integers(1, 20, size=(32, 6))
    ids[np.arange(6)[None, :] >= rng.integers(2, 7, 32)[:, None]] = 0
    return tf.data.Dataset.from_tensor_slices((ids.astype(np.int32), (ids[:, 0] % 3).astype(np.int32))).batch(
        8, drop_remainder=True)


def category_encoding(features, labels, mode, params):
    """A bag-of-words classifier on Keras CategoryEncoding: multi-hot and count encodings
    of each row's ids (tf.math.bincount along the row, clamped to num_tokens);
    params["unbounded"]: tf.math.bincount without a maxlength (its size is the batch's
    largest id + 1)."""
    if params.get("unbounded"):
        counts = tf.math.bincount(features, axis=-1, dtype=tf.float32)
        return spec(mode, L.Dense(3)(tf.reshape(counts, [-1, 20])), labels)
    multi_hot = L.CategoryEncoding(20, output_mode="multi_hot")(features)
    counts = L.CategoryEncoding(20, output_mode="count")(features)
    h = L.Dense(8, activation="relu")(tf.concat([multi_hot, counts], -1))
    return spec(mode, L.Dense(3)(h), labels)


def cifar10_tutorial(features, labels, mode, params):
    """The TF1 CIFAR-10 tutorial's convnet, shrunk: conv, max pool, tf.nn.lrn (its
    depth_radius 4, bias 1, alpha 0.001 / 9, beta 0.75), conv, tf.nn.lrn, max pool, dense."""
    h = L.Conv2D(8, 3, padding="same", activation="relu")(features)
    h = tf.nn.max_pool2d(h, 3, 2, "SAME")
    h = tf.nn.lrn(h, 4, bias=1.0, alpha=0.001 / 9.0, beta=0.75)
    h = L.Conv2D(8, 3, padding="same", activation="relu")(h)
    h = tf.nn.local_response_normalization(h, depth_radius=2, bias=2.0, alpha=0.1, beta=0.5)
    h = tf.nn.max_pool2d(h, 3, 2, "SAME")
    return spec(mode, L.Dense(3)(L.Flatten()(h)), labels)


def rotation_augmented(features, labels, mode, params):
    """Keras RandomRotation as the first layer (augmentation in the model)."""
    h = L.RandomRotation(0.1)(features, training=mode == ModeKeys.TRAIN)
    return spec(mode, L.Dense(3)(L.Flatten()(h)), labels)


def std_pooling(features, labels, mode, params):
    """A frame-level Dense, then each feature's standard deviation over time (the std half
    of x-vector statistics pooling): the Dense's bias shifts every frame alike."""
    h = L.Dense(4, name="frames")(features)
    return spec(mode, L.Dense(3)(tf.math.reduce_std(h, axis=1)), labels)


def stick_breaking(features, labels, mode, params):
    """Stick-breaking weights over time (v · exclusive cumprod of 1 − v, as in a stick-breaking
    attention or a survival model's hazards), pooling the frames; under mixed_float16 if
    params["mixed"] (the float32 head aside)."""
    tf.keras.mixed_precision.set_global_policy("mixed_float16" if params.get("mixed") else "float32")
    try:
        v = tf.sigmoid(L.Dense(1)(features))[..., 0]  # [B, T]
        weights = v * tf.math.cumprod(1.0 - v, axis=1, exclusive=True)
        survival = tf.math.cumprod(1.0 - v, axis=1, reverse=True)
        pooled = tf.reduce_sum(tf.cast(features, v.dtype) * weights[..., None], 1)
        logits = L.Dense(3, dtype="float32")(tf.concat([pooled, survival], -1))
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")
    return spec(mode, logits, labels)
