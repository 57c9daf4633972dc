"""input_fn of the raw-ops regression: scikit-learn's diabetes data (442 patients, 10
features, a disease-progression target; shipped with scikit-learn, no download).

A fixed permutation gives 352 training and 90 evaluation samples; features and target are
standardised with the training split's mean and standard deviation (the target's is
`target_scale`, so a model's squared error reads as a fraction of the variance). Labels
come shaped (batch,), as tabular targets do.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_diabetes

from examples.digits import batched

TRAIN_SAMPLES = 352
SPLIT_SEED = 0


def diabetes_split(training: bool) -> tuple[np.ndarray, np.ndarray]:
    """(features (N, 10) float32, target (N,) float32), standardised by the training split."""
    x, y = load_diabetes(return_X_y=True)
    order = np.random.default_rng(SPLIT_SEED).permutation(len(y))
    train, test = order[:TRAIN_SAMPLES], order[TRAIN_SAMPLES:]
    mean, std = x[train].mean(0), x[train].std(0)
    y_mean, y_std = y[train].mean(), y[train].std()
    part = train if training else test
    return (((x[part] - mean) / std).astype(np.float32),
            ((y[part] - y_mean) / y_std).astype(np.float32))


def train_input_fn(params: dict) -> tf.data.Dataset:
    return batched(*diabetes_split(True), params["train_input"], training=True)


def eval_input_fn(params: dict) -> tf.data.Dataset:
    return batched(*diabetes_split(False), params["eval_input"], training=False)
