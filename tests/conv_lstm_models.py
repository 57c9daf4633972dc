"""Next-frame models written the way users write them (issue 21): Keras ConvLSTM2D over
short clips of small frames, then a 1x1 sigmoid Conv2D predicting the next frame, trained
with log loss and Adam; the recurrent layer returns its last state or every step's. Beside
it, the same over its other forms: dilated ConvLSTM2D, ConvLSTM1D (a frame's rows as
channels) and ConvLSTM3D (a frame as a one-deep volume)."""
import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

L = tf.keras.layers
STEPS, SIZE = 4, 8


def clip_input_fn(params):
    """Clips of STEPS frames of SIZE x SIZE pixels; the label is the next frame (and, for a
    model returning sequences, every step's next frame)."""
    rng = np.random.default_rng(params.get("data_seed", 3))
    frames = rng.uniform(size=(32, STEPS + 1, SIZE, SIZE, 1)).astype(np.float32)
    labels = frames[:, 1:] if params.get("return_sequences") else frames[:, -1]
    return tf.data.Dataset.from_tensor_slices((frames[:, :-1], labels)).batch(
        8, drop_remainder=True)


def _spec(mode, labels, frame):
    loss = tf.compat.v1.losses.log_loss(labels, frame)
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode=mode, loss=loss, eval_metric_ops={
            "mse": tf.compat.v1.metrics.mean_squared_error(labels, frame)})
    train_op = tf.compat.v1.train.AdamOptimizer(1e-3).minimize(
        loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op)


def next_frame(features, labels, mode, params):
    """ConvLSTM2D(8, 3, padding="same") then Conv2D(1, 1, sigmoid): the next frame."""
    sequences = bool(params.get("return_sequences"))
    x = L.ConvLSTM2D(8, 3, padding="same", return_sequences=sequences)(features)
    frame = (L.TimeDistributed(L.Conv2D(1, 1, activation="sigmoid")) if sequences
             else L.Conv2D(1, 1, activation="sigmoid"))(x)
    return _spec(mode, labels, frame)


def dilated_next_frame(features, labels, mode, params):
    """ConvLSTM2D with dilation_rate=2 (its input convolutions dilated), read backwards."""
    x = L.ConvLSTM2D(4, 3, padding="same", dilation_rate=2, go_backwards=True)(features)
    return _spec(mode, labels, L.Conv2D(1, 1, activation="sigmoid")(x))


def next_frame_1d(features, labels, mode, params):
    """ConvLSTM1D over a frame's columns, its rows as channels, then Conv1D per column."""
    x = L.ConvLSTM1D(4, 3, padding="same")(tf.squeeze(features, -1))
    return _spec(mode, labels, L.Conv1D(SIZE, 1, activation="sigmoid")(x)[..., None])


def next_frame_3d(features, labels, mode, params):
    """ConvLSTM3D over frames as one-deep volumes (VALID padding), then a transposed conv."""
    x = L.ConvLSTM3D(2, (3, 3, 1), padding="valid")(features[..., None])
    frame = L.Conv2DTranspose(1, 3, activation="sigmoid")(tf.reduce_mean(x, axis=-1))
    return _spec(mode, labels, frame)
