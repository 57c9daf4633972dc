"""input_fn for the CNN example: scikit-learn's 8x8 handwritten digits as 8x8x1 images
(`examples.digits`: the split and the shared pipeline)."""
from __future__ import annotations

import tensorflow as tf

from examples.digits import batched, digits_split


def _dataset(config: dict, training: bool) -> tf.data.Dataset:
    images, labels = digits_split(training)
    return batched(images[..., None], labels, config, training)


def train_input_fn(params: dict) -> tf.data.Dataset:
    return _dataset(params["train_input"], training=True)


def eval_input_fn(params: dict) -> tf.data.Dataset:
    return _dataset(params["eval_input"], training=False)
