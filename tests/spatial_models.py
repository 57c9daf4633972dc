"""Image models written the way users write them with Keras' spatial layers: a UNet-like
autoencoder and a MobileNet-style classifier (issue 22's aim), and small models of one
layer kind each (transposed, depthwise, separable and dilated convolutions, upsampling,
pooling of every kind)."""
import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec

L = tf.keras.layers
gs = tf.compat.v1.train.get_or_create_global_step


def image_input_fn(params):
    rng = np.random.default_rng(params.get("data_seed", 0))
    size = params.get("size", 8)
    x = rng.uniform(size=(32, size, size, 3)).astype(np.float32)
    y = (np.arange(32) % 4).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(8, drop_remainder=True)


def unet(features, labels, mode, params):
    """Encoder (Conv2D, MaxPooling2D), decoder (Conv2DTranspose, UpSampling2D), skip
    connections (Concatenate); reconstruction loss."""
    e1 = L.Conv2D(4, 3, padding="same", activation="relu")(features)  # 8x8
    p1 = L.MaxPooling2D()(e1)  # 4x4
    e2 = L.Conv2D(8, 3, padding="same", activation="relu")(p1)
    p2 = L.MaxPooling2D()(e2)  # 2x2
    b = L.Conv2D(8, 3, padding="same", activation="relu")(p2)
    d2 = L.Conv2DTranspose(8, 3, strides=2, padding="same", activation="relu")(b)  # 4x4
    d2 = L.Concatenate()([d2, e2])
    d1 = L.UpSampling2D()(d2)  # 8x8
    d1 = L.Concatenate()([d1, e1])
    d1 = L.Conv2D(4, 3, padding="same", activation="relu")(d1)
    out = L.Conv2D(3, 1)(d1)
    loss = tf.compat.v1.losses.mean_squared_error(features, out)
    opt = tf.compat.v1.train.AdamOptimizer(1e-2)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=opt.minimize(loss, global_step=gs()))


def mobilenet(features, labels, mode, params):
    """Conv2D stem, depthwise-separable blocks (DepthwiseConv2D + 1x1 Conv2D, SeparableConv2D),
    a strided and a dilated depthwise convolution, GlobalAveragePooling2D, Dense head."""
    h = L.Conv2D(8, 3, strides=2, padding="same", activation="relu")(features)  # 4x4
    h = L.DepthwiseConv2D(3, padding="same", depth_multiplier=2, activation="relu")(h)
    h = L.Conv2D(8, 1, activation="relu")(h)
    h = L.SeparableConv2D(12, 3, padding="same", activation="relu")(h)
    h = L.DepthwiseConv2D(3, strides=2, padding="same")(h)  # 2x2
    h = L.DepthwiseConv2D(2, dilation_rate=2, padding="same", use_bias=False)(h)
    h = L.GlobalAveragePooling2D()(h)
    logits = L.Dense(4)(h)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    opt = tf.compat.v1.train.MomentumOptimizer(0.05, 0.9)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=opt.minimize(loss, global_step=gs()))


def sequence_input_fn(params):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(32, 12, 3)).astype(np.float32)
    y = (x[:, :, 0].sum(1) > 0).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(8, drop_remainder=True)


def sequence_layers(features, labels, mode, params):
    """The 1-D forms and pooling of every kind: Conv1DTranspose, SeparableConv1D,
    MaxPooling1D, AveragePooling1D, UpSampling1D, GlobalAveragePooling1D, GlobalMaxPooling1D."""
    h = L.Conv1DTranspose(4, 3, strides=2, padding="same", activation="tanh")(features)  # 24
    h = L.SeparableConv1D(6, 3, padding="same")(h)
    h = L.MaxPooling1D(2)(h)  # 12
    h = L.AveragePooling1D(3, strides=2, padding="same")(h)  # 6
    h = L.UpSampling1D(2)(h)  # 12
    h = L.Concatenate()([L.GlobalAveragePooling1D()(h), L.GlobalMaxPooling1D()(h)])
    logits = L.Dense(2)(h)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    opt = tf.compat.v1.train.AdamOptimizer(1e-2)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=opt.minimize(loss, global_step=gs()))


def resize_layers(features, labels, mode, params):
    """Bilinear UpSampling2D, tf.image.resize (nearest), Conv2DTranspose with
    output_padding and VALID padding, a dilated Conv2D, AveragePooling2D,
    GlobalMaxPooling2D."""
    h = L.UpSampling2D(2, interpolation="bilinear")(features)  # 16
    h = L.Conv2D(4, 3, dilation_rate=2, padding="same", activation="relu")(h)
    h = L.AveragePooling2D(3, strides=2)(h)  # 7
    h = tf.image.resize(h, (5, 6), method="nearest")
    h = L.Conv2DTranspose(3, 3, strides=2, output_padding=1)(h)
    h = L.GlobalMaxPooling2D()(h)
    logits = L.Dense(4)(h)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    opt = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=opt.minimize(loss, global_step=gs()))


def volume_layers(features, labels, mode, params):
    """Conv3D, MaxPooling3D, AveragePooling3D, UpSampling3D, GlobalAveragePooling3D on the
    image seen as a (4, 4, 12, 1) volume."""
    h = tf.reshape(features, [-1, 4, 4, 12, 1])
    h = L.Conv3D(4, 3, padding="same", activation="relu")(h)
    h = L.MaxPooling3D(2)(h)  # (2, 2, 6, 4)
    h = L.AveragePooling3D((1, 2, 3), strides=1, padding="same")(h)
    h = L.Conv3D(3, (1, 2, 2), strides=(1, 1, 2))(L.UpSampling3D((1, 1, 2))(h))
    logits = L.Dense(4)(L.GlobalAveragePooling3D()(h))
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    opt = tf.compat.v1.train.AdamOptimizer(1e-2)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=opt.minimize(loss, global_step=gs()))


def vector_input_fn(params):
    rng = np.random.default_rng(params.get("data_seed", 0))
    x = rng.normal(size=(32, 6)).astype(np.float32)
    y = rng.integers(0, 2, size=(32, 1)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(8, drop_remainder=True)


def tied_volume(features, labels, mode, params):
    """Conv3D then MaxPooling3D over a Dense ReLU's (2, 2, 2) volume: a sample's dead units
    leave windows of equal values (the conv's bias), where TF's MaxPool3DGrad picks which
    values take the gradient, and the conv's bias sums it over every position."""
    h = tf.reshape(L.Dense(8, activation="relu")(features), [-1, 2, 2, 2, 1])
    h = L.MaxPooling3D((1, 1, 2), strides=1, padding="same")(L.Conv3D(1, 2, padding="same")(h))
    logits = L.Dense(1)(tf.reshape(h, [-1, 8]))
    loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits, label_smoothing=0.1)
    opt = tf.compat.v1.train.GradientDescentOptimizer(0.05)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=opt.minimize(loss, global_step=gs()))


def batch_norm_by_hand(x, name):
    mean, variance = tf.nn.moments(x, axes=[0, 1, 2])
    gamma = tf.compat.v1.get_variable(name + "_gamma", [x.shape[-1]], initializer=tf.ones_initializer())
    beta = tf.compat.v1.get_variable(name + "_beta", [x.shape[-1]], initializer=tf.zeros_initializer())
    return tf.nn.batch_normalization(x, mean, variance, beta, gamma, 1e-3)


def refused_layers(features, labels, mode, params):
    """Two hand-written batch norms (BatchNormalization in training, carried out) and a
    named Conv3DTranspose (refused)."""
    h = L.Conv2D(4, 3, padding="same")(features)
    h = tf.nn.relu(batch_norm_by_hand(h, "bn1"))
    h = L.Conv2D(4, 3, padding="same")(h)
    h = tf.nn.relu(batch_norm_by_hand(h, "bn2"))
    h = L.Conv3DTranspose(2, 1, name="volume")(tf.expand_dims(h, 1))
    logits = L.Dense(4)(L.Flatten()(h))
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    opt = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=opt.minimize(loss, global_step=gs()))
