"""Training semantics of the CS beyond the optimizer rule: gradient transforms against
TensorFlow's (tf.clip_by_value, tf.clip_by_norm, tf.clip_by_global_norm, scaling)."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from wse_sim.api import cs_api_pb2 as pb
from wse_sim.grad_transforms import GradientTransform, apply_transforms

F32 = np.float32
SHAPES = {"dense/kernel": (784, 500), "dense/bias": (500,), "out/kernel": (500, 10),
          "out/bias": (10,), "emb": (1000, 17)}
# measured 2 (clip_by_norm) and 3 (clip_by_global_norm) ULP: the sums of squares in another order
MAX_CLIPPED_ULP = 4


def ulps(a: np.ndarray, b: np.ndarray) -> int:
    def ordered(x):
        i = np.asarray(x, F32).view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)
    return int(np.max(np.abs(ordered(a) - ordered(b))))


def tf_transform(kind: str, grads: list[np.ndarray], value: float, low: float, high: float):
    g = [tf.constant(x) for x in grads]
    if kind == "scale":
        return [x * F32(value) for x in g]
    if kind == "clip_by_value":
        return [tf.clip_by_value(x, F32(low), F32(high)) for x in g]
    if kind == "clip_by_norm":
        return [tf.clip_by_norm(x, F32(value)) for x in g]
    return tf.clip_by_global_norm(g, F32(value))[0]


@pytest.mark.parametrize("kind", ["scale", "clip_by_value", "clip_by_norm", "clip_by_global_norm"])
def test_transforms_equal_tf_on_random_gradients(kind):
    """Random gradients of FC-MNIST-like shapes over eight orders of magnitude, so that some
    are clipped and some not: unclipped gradients are bit-equal, clipped ones within a few
    ULP (the norm's float32 sum), elementwise transforms always bit-equal."""
    rng = np.random.default_rng(7)
    names = list(SHAPES)
    clipped = unclipped = 0
    for trial in range(12):
        magnitude = 10 ** rng.uniform(-5, 1)
        grads = [rng.normal(size=s).astype(F32) * F32(magnitude * 10 ** rng.uniform(-1, 1))
                 for s in SHAPES.values()]
        value = float(F32(10 ** rng.uniform(-1, 2)))
        low, high = -value / 3, value
        ref = [np.asarray(r) for r in tf_transform(kind, grads, value, low, high)]
        mine = {n: g.copy() for n, g in zip(names, grads)}
        apply_transforms([GradientTransform(kind, value, low, high, tuple(names))], mine)
        for name, g, r in zip(names, grads, ref):
            factor_applied = kind in ("clip_by_norm", "clip_by_global_norm") and not np.array_equal(
                r, (g * F32(value)) / F32(value) if kind == "clip_by_norm"
                else g * (F32(value) * (F32(1) / F32(value))))
            if factor_applied:
                clipped += 1
                assert ulps(mine[name], r) <= MAX_CLIPPED_ULP, (trial, name)
            else:
                unclipped += 1
                np.testing.assert_array_equal(mine[name], r, err_msg=f"{trial} {name}")
    if kind in ("clip_by_norm", "clip_by_global_norm"):
        assert clipped and unclipped  # both regimes were exercised


def test_transforms_apply_in_order_to_their_variables_only():
    grads = {"a": np.array([3.0, -4.0], F32), "b": np.array([10.0], F32), "c": np.array([1.0], F32)}
    apply_transforms([GradientTransform("scale", 2.0, variables=("a", "b")),
                      GradientTransform("clip_by_global_norm", 5.0, variables=("a",)),
                      GradientTransform("clip_by_value", low=-1.0, high=4.0, variables=("a", "b"))],
                     grads)
    np.testing.assert_array_equal(grads["a"], np.array([3.0, -1.0], F32))  # 6,-8 -> 3,-4 -> clip
    np.testing.assert_array_equal(grads["b"], np.array([4.0], F32))
    np.testing.assert_array_equal(grads["c"], np.array([1.0], F32))


def test_non_finite_global_norm_makes_every_gradient_nan_as_in_tf():
    grads = {"a": np.array([np.inf, 1.0], F32), "b": np.array([2.0], F32)}
    apply_transforms([GradientTransform("clip_by_global_norm", 1.0, variables=("a", "b"))], grads)
    assert np.isnan(grads["a"]).all() and np.isnan(grads["b"]).all()


def test_transform_message_round_trip_and_refusals():
    t = GradientTransform("clip_by_value", low=-1.5, high=2.0, variables=("w", "b"))
    assert GradientTransform.from_message(pb.GradientTransform.FromString(
        t.to_message().SerializeToString())) == t
    with pytest.raises(ValueError, match="unknown gradient transform 'clip_by_average_norm'; "
                                         "the CS system has scale, clip_by_value"):
        GradientTransform("clip_by_average_norm", 1.0, variables=("w",))
    with pytest.raises(ValueError, match="clip_by_norm needs a finite clip norm > 0, got 0.0"):
        GradientTransform("clip_by_norm", 0.0, variables=("w",))
    with pytest.raises(ValueError, match="gradient transform scale names no variables"):
        GradientTransform("scale", 2.0)
    with pytest.raises(KeyError, match="no gradient for 'x'"):
        apply_transforms([GradientTransform("scale", 2.0, variables=("x",))], {})
