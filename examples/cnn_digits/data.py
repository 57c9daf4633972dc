"""input_fn for the CNN example: scikit-learn's 8x8 handwritten digits as 8x8x1 images.

The dataset ships with scikit-learn (no download). Samples are scaled to [0, 1]; the first
1,500 are the training split, the remaining 297 the evaluation split. Batch k of a run is
always batch k of this dataset (fixed shuffle seed), on the CPU and on the CS.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

TRAIN_SAMPLES = 1500


def _split(training: bool) -> tuple[np.ndarray, np.ndarray]:
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[..., np.newaxis]  # (N, 8, 8, 1)
    labels = digits.target.astype(np.int32)
    part = slice(0, TRAIN_SAMPLES) if training else slice(TRAIN_SAMPLES, None)
    return images[part], labels[part]


def _dataset(config: dict, training: bool) -> tf.data.Dataset:
    images, labels = _split(training)
    dataset = tf.data.Dataset.from_tensor_slices((images, labels))
    if config.get("shuffle", training):
        dataset = dataset.shuffle(len(images), seed=config.get("shuffle_seed", 1),
                                  reshuffle_each_iteration=True)
    return dataset.repeat().batch(config["batch_size"], drop_remainder=True)


def train_input_fn(params: dict) -> tf.data.Dataset:
    return _dataset(params["train_input"], training=True)


def eval_input_fn(params: dict) -> tf.data.Dataset:
    return _dataset(params["eval_input"], training=False)
