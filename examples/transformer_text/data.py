"""input_fn of the transformer text classifier: token sequences generated deterministically
(no download) whose class is a rule the model must learn from the whole sequence.

Each sequence holds `seq_len` tokens of a `vocab_size` vocabulary. Tokens 1..num_classes
are markers, the rest filler. The class is the marker that occurs most often: the true
marker is placed 2-4 times at random positions, every other marker fewer times, so the
answer depends on counting tokens anywhere in the sequence, not on one position.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from examples.digits import INPUT_KEYS, batched
from launcher.params_spec import Key

SEQUENCE_KEYS = {**INPUT_KEYS, "num_samples": Key("int", minimum=1), "seq_len": Key("int", minimum=1),
                 "vocab_size": Key("int", minimum=2), "num_classes": Key("int", minimum=2)}
INPUT_SPEC = {"train_input": SEQUENCE_KEYS, "eval_input": SEQUENCE_KEYS}
SEEDS = {True: 0, False: 1}  # train / eval samples


def sequences(config: dict, training: bool) -> tuple[np.ndarray, np.ndarray]:
    """(tokens (N, seq_len) int32, labels (N,) int32) of the train or eval split."""
    n, length = config["num_samples"], config["seq_len"]
    classes, vocab = config["num_classes"], config["vocab_size"]
    rng = np.random.default_rng(SEEDS[training])
    tokens = rng.integers(classes + 1, vocab, size=(n, length))
    labels = rng.integers(0, classes, size=n)
    for i in range(n):
        count = int(rng.integers(2, 5))
        places = rng.permutation(length)
        tokens[i, places[:count]] = labels[i] + 1
        used = count
        for other in range(classes):
            if other != labels[i]:
                extra = int(rng.integers(0, count))
                tokens[i, places[used:used + extra]] = other + 1
                used += extra
    return tokens.astype(np.int32), labels.astype(np.int32)


def _dataset(config: dict, training: bool) -> tf.data.Dataset:
    return batched(*sequences(config, training), config, training)


def train_input_fn(params: dict) -> tf.data.Dataset:
    return _dataset(params["train_input"], training=True)


def eval_input_fn(params: dict) -> tf.data.Dataset:
    return _dataset(params["eval_input"], training=False)
