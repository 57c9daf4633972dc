"""The model on TensorFlow: calling the user's model_fn and input_fn, checkpoints, events,
progress lines, metrics, predictions, and the CPU path that trains in a tf.compat.v1 Session."""
