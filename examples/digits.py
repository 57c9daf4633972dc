"""scikit-learn's 8x8 handwritten digits, the data the examples train on without a download.

The 1,797 samples ship with scikit-learn. They are scaled to [0, 1] and split
deterministically: a permutation with a fixed seed (the file is ordered by writer, so a
plain cut would test on unseen writers only) gives 1,500 training and 297 evaluation
samples. `batched` is the input
pipeline the examples share: the training input shuffles with a fixed seed, repeats forever
and drops the last partial batch, so batch k of a run is always the same batch, on the CPU
and on the CS; the evaluation input is one pass in order.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

from launcher.params_spec import Key

# The keys `batched` reads, for each input section (checked before any work starts).
INPUT_KEYS = {"batch_size": Key("int", minimum=1), "shuffle": Key("bool", required=False),
              "shuffle_seed": Key("int", minimum=0, required=False),
              "data_dir": Key("str", required=False)}
INPUT_SPEC = {"train_input": INPUT_KEYS, "eval_input": INPUT_KEYS}

TRAIN_SAMPLES = 1500
SPLIT_SEED = 0


def digits_split(training: bool) -> tuple[np.ndarray, np.ndarray]:
    """(images (N, 8, 8) float32 in [0, 1], labels (N,) int32) of the train or eval split."""
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)
    labels = digits.target.astype(np.int32)
    order = np.random.default_rng(SPLIT_SEED).permutation(len(labels))
    part = order[:TRAIN_SAMPLES] if training else order[TRAIN_SAMPLES:]
    return images[part], labels[part]


def batched(features: np.ndarray, labels: np.ndarray, config: dict,
            training: bool) -> tf.data.Dataset:
    """(features, labels) batches of `config["batch_size"]`; see the module docstring."""
    dataset = tf.data.Dataset.from_tensor_slices((features, labels))
    if config.get("shuffle", training):
        dataset = dataset.shuffle(len(features), seed=config.get("shuffle_seed", 1),
                                  reshuffle_each_iteration=True)
    if training:
        dataset = dataset.repeat()
    return dataset.batch(config["batch_size"], drop_remainder=True)
