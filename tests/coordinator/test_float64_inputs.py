"""Inputs input_fn yields as float64 (numpy's default: float32 features plus labels * 0.3)
that every reader casts to float32 first (Keras layers' autocast, tf.cast): the input worker
streams them as float32, cast as TF's Cast rounds, and the CS trains with TF's numbers; a
float64 input read as float64 (or cast to another dtype) is refused in one line naming the
reader and its line."""
from __future__ import annotations

import blind_finding_models as bm
import cs_inprocess
import numpy as np
import pytest
import tensorflow as tf

from common.errors import CSRunError
from cs_api import pb
from cs_api.input_spec import InputSpec, as_streamed


def test_a_gcn_on_float64_node_features_trains_like_tensorflow(tmp_path):
    """The GCN's features['x'] is float64, read by Keras' Dense (autocast): streamed as
    float32 (4 bytes a value), trained 4 steps with TF's numbers, then evaluated and
    predicting as the CPU path (the chief's way: batches through the input worker's cast)."""
    params = {**bm.GCN_PARAMS, "runconfig": {"tf_random_seed": 1}}
    run = cs_inprocess.compare(bm.gcn, bm.gcn_input_fn, params, str(tmp_path), steps=4)
    inputs = {spec.name: spec for spec in run.compiled.program.inputs}
    assert inputs["features.x"].dtype == pb.FLOAT32
    assert next(r.bytes_per_sample for r in run.compiled.program.routes
                if r.src == "features.x") == 12 * 8 * 4
    cs_inprocess.assert_same_training(run)
    assert cs_inprocess.evaluation_mismatch(bm.gcn, bm.gcn_input_fn, params, str(tmp_path / "eval"),
                                            run) == ""
    assert cs_inprocess.prediction_mismatch(bm.gcn, bm.gcn_input_fn, params, str(tmp_path / "predict"),
                                            run) == ""


def test_the_input_worker_rounds_float64_as_tensorflows_cast():
    """Ties to even, overflow to infinity, the smallest normal (and what rounds up to it),
    subnormal results flushed to zero of their sign, NaN: as TF's Cast; only a float32
    input's float64 array is cast."""
    tiny = 2.0 ** -126
    values = np.array([1 + 2.0 ** -24, 1 + 3 * 2.0 ** -24, 0.1, -1e300, 1e-40, tiny,
                       -2.0 ** -149, tiny * (1 - 2.0 ** -26), tiny * (1 - 2.0 ** -23),
                       3.4028235e38 * 1.0000001, np.nan, 12345.678901234])
    inputs = (InputSpec("features", "float32", (12,)), InputSpec("labels", "float64", (12,)))
    streamed = as_streamed({"features": values[None], "labels": values[None]}, inputs)
    assert streamed["features"].dtype == np.float32 and streamed["labels"].dtype == np.float64
    expected = tf.cast(values, tf.float32).numpy()
    np.testing.assert_array_equal(streamed["features"][0], expected)
    np.testing.assert_array_equal(np.signbit(streamed["features"][0]), np.signbit(expected))


def test_float64_images_flattened_before_the_dense_train_like_tensorflow(tmp_path):
    """Keras' Flatten (a Reshape of the float64 values) before the Dense's autocast: the
    view changes no value, so the stream is float32 and 4 steps are TF's."""
    params = {"batch_size": 16, "runconfig": {"tf_random_seed": 1}}
    run = cs_inprocess.compare(bm.flattened_float64, bm.float64_images_input_fn, params,
                               str(tmp_path), steps=4)
    assert run.compiled.program.inputs[0].dtype == pb.FLOAT32
    cs_inprocess.assert_same_training(run)


def test_a_float64_input_read_as_float64_is_refused_naming_the_reader(tmp_path):
    with pytest.raises(CSRunError) as refused:
        cs_inprocess.compile_checked(bm.scaled_before_the_cast, bm.float64_images_input_fn,
                                     {"batch_size": 16}, str(tmp_path))
    line = str(refused.value)
    assert "\n" not in line
    assert "input_fn yields features as float64 and Mul 'mul' at " \
        "tests/blind_finding_models.py:" in line
    assert "reads it as float64: the CS computes in float32" in line
