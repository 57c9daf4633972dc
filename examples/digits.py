"""scikit-learn's 8x8 handwritten digits, the data the examples train on without a download.

The 1,797 samples ship with scikit-learn. They are scaled to [0, 1] and split
deterministically: the first 1,500 train, the remaining 297 evaluate. `batched` is the input
pipeline the examples share: the training input shuffles with a fixed seed, repeats forever
and drops the last partial batch, so batch k of a run is always the same batch, on the CPU
and on the CS; the evaluation input is one pass in order.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

TRAIN_SAMPLES = 1500


def digits_split(training: bool) -> tuple[np.ndarray, np.ndarray]:
    """(images (N, 8, 8) float32 in [0, 1], labels (N,) int32) of the train or eval split."""
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)
    labels = digits.target.astype(np.int32)
    part = slice(0, TRAIN_SAMPLES) if training else slice(TRAIN_SAMPLES, None)
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
