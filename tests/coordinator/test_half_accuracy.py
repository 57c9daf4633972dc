"""Issue 21's accuracy criterion for mixed precision, on a Keras encoder (Embedding,
MultiHeadAttention, LayerNormalization, a gelu Dense) under mixed_float16 with a static loss
scale: the CS's losses are TF mixed's within 1e-2, and every weight is no farther from a
float64 run of the same model (its layers built in float64) than TF mixed is (factor 2)."""
from __future__ import annotations

import cs_inprocess
import numpy as np
import pytest
import tensorflow as tf
import tf_reference

from tf_model.estimator_spec import CSEstimatorSpec

L, v1 = tf.keras.layers, tf.compat.v1
FACTOR = 2.0
FLOOR = 1e-5  # relative to the weight's largest value: rounding noise below it


def model_fn(features, labels, mode, params):
    policy = params.get("policy", "mixed_float16")
    head = "float64" if policy == "float64" else "float32"
    x = L.Embedding(30, 16, dtype=policy)(features)
    x = L.LayerNormalization(dtype=policy)(x + L.MultiHeadAttention(2, 8, dtype=policy)(x, x))
    x = x + L.Dense(16, dtype=policy)(L.Dense(32, activation="gelu", dtype=policy)(x))
    pooled = L.GlobalAveragePooling1D(dtype=policy)(L.LayerNormalization(dtype=policy)(x))
    logits = L.Dense(3, dtype=head)(pooled)
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    optimizer = v1.train.MomentumOptimizer(0.05, 0.9)
    if policy != "float64":  # (scaling by 128 and back is exact in float64)
        optimizer = v1.mixed_precision.MixedPrecisionLossScaleOptimizer(optimizer, 128.0)
    return CSEstimatorSpec(mode=mode, loss=loss,
                           train_op=optimizer.minimize(loss, v1.train.get_or_create_global_step()))


def input_fn(params):
    rng = np.random.default_rng(9)
    tokens = rng.integers(1, 30, (96, 10)).astype(np.int32)
    labels = np.stack([(tokens == k).sum(1) for k in (1, 2, 3)], 1).argmax(1).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((tokens, labels)).batch(16, drop_remainder=True)


@pytest.mark.slow
def test_mixed_float16_encoder_is_no_farther_from_float64_than_tensorflow(tmp_path):
    params = {"batch_size": 16, "runconfig": {"tf_random_seed": 7}}
    steps = 4
    result = cs_inprocess.compare(model_fn, input_fn, params, str(tmp_path), steps)
    weights = result.compiled.initial_weights
    exact = tf_reference.run(model_fn, input_fn, {**params, "policy": "float64"}, weights,
                             tf_reference.batches(input_fn, params, steps))
    np.testing.assert_allclose(result.cs.losses, result.reference.losses, rtol=1e-2)
    farther = cs_inprocess.farther_than_tensorflow(
        result, {n: v for n, v in exact.state.items() if np.asarray(v).dtype == np.float64}, FACTOR, FLOOR)
    assert not farther, farther
