"""Placement quality: the compiler's achieved compute rate against the balanced-pipeline
bound (fractional cores, same parallelism and memory limits) and against equal-area
placements, for FC-MNIST, a 24-layer MLP and the CNN example.

    python bench/placement_quality.py
"""
from __future__ import annotations

import os
import sys

import numpy as np
import tensorflow as tf
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "examples", "cnn_digits")]

import data as cnn_data  # noqa: E402  (examples/cnn_digits)
import model as cnn_model  # noqa: E402

from coordinator.compiler.extract import extract  # noqa: E402
from coordinator.compiler.match import check_supported, match  # noqa: E402
from coordinator.compiler.placement import equal_area_samples_per_sec, place_model  # noqa: E402
from tf_model.estimator_spec import CSEstimatorSpec  # noqa: E402
from wafer.fabric import get_fabric  # noqa: E402


def mlp_input_fn(params):
    x = np.zeros((params["batch_size"], 784), np.float32)
    y = np.zeros((params["batch_size"],), np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(params["batch_size"],
                                                            drop_remainder=True)


def mlp_model_fn(features, labels, mode, params):
    h = features
    for units in params["hidden"]:
        h = tf.keras.layers.Dense(units, activation="relu")(h)
    logits = tf.keras.layers.Dense(10)(h)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op)


def cases():
    with open(os.path.join(ROOT, "examples", "cnn_digits", "configs", "params.yaml")) as f:
        cnn_params = yaml.safe_load(f)
    yield "fc_mnist", mlp_model_fn, mlp_input_fn, {"hidden": [500, 300], "batch_size": 256}, "cs2"
    yield "mlp24", mlp_model_fn, mlp_input_fn, {"hidden": [4096] * 23, "batch_size": 256}, "cs1"
    yield "cnn_digits", cnn_model.model_fn, cnn_data.train_input_fn, cnn_params, "cs1"


def measure() -> list[tuple[str, float, str, str]]:
    rows = []
    for name, model_fn, input_fn, params, fabric_name in cases():
        fabric = get_fabric(fabric_name)
        model = match(extract(model_fn, input_fn, params, "train"))
        check_supported(model)
        placed = place_model(model, fabric, "train")
        placement, kernels = placed.placement, placed.kernels
        achieved = placement.timing.compute_samples_per_sec
        wafer = equal_area_samples_per_sec(kernels, fabric, training=True)
        same = equal_area_samples_per_sec(kernels, fabric, training=True,
                                          cores=placement.timing.active_cores)
        note = f"{fabric_name}, {len(kernels)} kernels, {placement.timing.active_cores:,} cores"
        rows += [
            (f"{name} compute rate", achieved, "samples/s", note),
            (f"{name} achieved / balanced bound", achieved / placement.balanced_bound, "ratio",
             f"bound {placement.balanced_bound:,.0f} samples/s"),
            (f"{name} achieved / fabric bound", achieved / placement.fabric_bound, "ratio",
             "cores x FLOP rate / FLOPs per sample"),
            (f"{name} achieved / equal-area (wafer)", achieved / wafer, "ratio",
             "each kernel gets cores / n of the wafer"),
            (f"{name} achieved / equal-area (same cores)", achieved / same, "ratio",
             "the placement's cores split equally"),
        ]
    return rows


def main() -> None:
    rows = measure()
    try:
        from bench.table import print_table
    except ImportError:
        for name, value, unit, note in rows:
            print(f"{name} | {value:,.4g} | {unit} | {note}")
    else:
        print_table(rows)


if __name__ == "__main__":
    main()
