"""Masked-LM input function in the shape of the original's BERT data processors (features
`input_ids`, `masked_lm_positions`, `masked_lm_weights`; labels `masked_lm_ids`), on token
sequences generated here (no download): each sequence counts up from a random token by a
random stride (wrapping inside the vocabulary), so a masked token follows from its
neighbours and the masked-LM loss falls."""
import numpy as np
import tensorflow as tf

from launcher.estimator import ModeKeys

PAD_ID, MASK_ID = 0, 1  # token 0 pads, token 1 is [MASK]; the sequences use the others
MAX_STRIDE = 4


def synthetic_examples(input_params, seed):
    """(input_ids, masked_lm_positions, masked_lm_weights, masked_lm_ids) of
    `num_examples` sequences, the same for the same params and seed."""
    rng = np.random.default_rng(seed)
    count = input_params["num_examples"]
    length = input_params["max_sequence_length"]
    predictions = input_params["max_predictions_per_seq"]
    tokens = input_params["vocab_size"] - 2
    start = rng.integers(0, tokens, size=(count, 1))
    stride = rng.integers(1, MAX_STRIDE + 1, size=(count, 1))
    original = (2 + (start + stride * np.arange(length)) % tokens).astype(np.int32)
    positions = np.sort(np.argsort(rng.random((count, length)), axis=1)[:, :predictions], axis=1)
    positions = positions.astype(np.int32)
    masked_ids = np.take_along_axis(original, positions, axis=1)
    input_ids = original.copy()
    np.put_along_axis(input_ids, positions, MASK_ID, axis=1)
    weights = np.ones((count, predictions), np.float32)
    return input_ids, positions, weights, masked_ids


def input_fn(params, mode=ModeKeys.TRAIN):
    """Batches of ({"input_ids", "masked_lm_positions", "masked_lm_weights"}, masked_lm_ids)
    from params["train_input"] (training) or params["eval_input"]."""
    training = mode == ModeKeys.TRAIN
    input_params = params["train_input"] if training else params["eval_input"]
    input_ids, positions, weights, masked_ids = synthetic_examples(input_params, 0 if training else 1)
    features = {"input_ids": input_ids, "masked_lm_positions": positions, "masked_lm_weights": weights}
    ds = tf.data.Dataset.from_tensor_slices((features, masked_ids))
    if training and input_params.get("shuffle", True):
        ds = ds.shuffle(len(masked_ids), seed=input_params.get("shuffle_seed"))
    if training:
        ds = ds.repeat()
    ds = ds.batch(input_params["batch_size"], drop_remainder=True)
    return ds.prefetch(tf.data.AUTOTUNE)


def train_input_fn(params):
    return input_fn(params, mode=ModeKeys.TRAIN)


def eval_input_fn(params):
    return input_fn(params, mode=ModeKeys.EVAL)
