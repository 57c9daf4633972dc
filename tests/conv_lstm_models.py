"""Next-frame models written the way users write them (issue 21): Keras ConvLSTM2D over
short clips of small frames, then a 1x1 sigmoid Conv2D predicting the next frame, trained
with log loss and Adam; the recurrent layer returns its last state or every step's."""
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


def next_frame(features, labels, mode, params):
    """ConvLSTM2D(8, 3, padding="same") then Conv2D(1, 1, sigmoid): the next frame."""
    sequences = bool(params.get("return_sequences"))
    x = L.ConvLSTM2D(8, 3, padding="same", return_sequences=sequences)(features)
    frame = (L.TimeDistributed(L.Conv2D(1, 1, activation="sigmoid")) if sequences
             else L.Conv2D(1, 1, activation="sigmoid"))(x)
    loss = tf.compat.v1.losses.log_loss(labels, frame)
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode=mode, loss=loss, eval_metric_ops={
            "mse": tf.compat.v1.metrics.mean_squared_error(labels, frame)})
    train_op = tf.compat.v1.train.AdamOptimizer(1e-3).minimize(
        loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op)
