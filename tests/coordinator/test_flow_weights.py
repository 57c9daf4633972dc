"""Linear algebra and masks on weights (tests/flow_models.py): Glow's log|det W| by
tf.linalg.slogdet and its LU form by tf.linalg.diag, diag_part, set_diag and band_part, its
log-determinant accumulated from tf.zeros(tf.shape(z)[:1]), and SINDy's evaluation mask
tf.cast(tf.abs(xi) > t, tf.float32) train on the CS as TensorFlow trains them (4 steps,
1e-5) and evaluate and predict there as the CPU path does; zeros plus a weight is that
weight given to every sample only when every row is the same (log|det| of per-sample
matrices: test_linear_systems.py)."""
import cs_inprocess
import flow_models as m
import numpy as np
import pytest
import tensorflow as tf

from coordinator.compiler.batch_broadcast import broadcast_value

PARAMS = {"runconfig": {"tf_random_seed": 3}}


@pytest.mark.parametrize("model_fn, input_fn, params, kernels", [
    (m.glow, m.density_input_fn, {}, {"slogdet", "broadcast"}),
    (m.glow, m.density_input_fn, {"lu": True}, {"select", "take"}),
    (m.sindy, m.lorenz_input_fn, {}, set()),
], ids=["glow_slogdet", "glow_lu", "sindy"])
def test_a_model_computing_on_weights_trains_evaluates_and_predicts_like_tensorflow(
        tmp_path, model_fn, input_fn, params, kernels):
    params = {**PARAMS, **params}
    result = cs_inprocess.compare(model_fn, input_fn, params, str(tmp_path), steps=4)
    cs_inprocess.assert_same_training(result, rtol=1e-5)
    assert kernels <= cs_inprocess.kernel_types(result.compiled.program)
    for check in (cs_inprocess.evaluation_mismatch, cs_inprocess.prediction_mismatch):
        assert check(model_fn, input_fn, params, str(tmp_path), result) == ""


def test_sindys_mask_is_computed_in_the_weight_program_when_evaluating(tmp_path):
    compiled = cs_inprocess.compile_checked(m.sindy, m.lorenz_input_fn, PARAMS, str(tmp_path),
                                            mode="eval")
    assert {"binary", "cast"} <= {k.type for k in compiled.program.weight_program.kernels}


def _sum_is_given_to_every_sample(make_summands) -> bool:
    """Whether batch_broadcast takes `a + b` (the summands made of features [8, 3] and a
    weight w [8]) for a value of weights given to every sample of a batch of 8."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [8, 3])
        w = tf.compat.v1.get_variable("w", [8])
        total = tf.add(*make_summands(x, w))
        return broadcast_value(total.op, 8) is not None


def test_zeros_plus_a_weight_is_given_to_every_sample_only_when_every_row_is_the_same():
    assert _sum_is_given_to_every_sample(lambda x, w: (tf.zeros(tf.shape(x)[:1]),
                                                       tf.reduce_sum(w)))
    assert _sum_is_given_to_every_sample(lambda x, w: (tf.zeros_like(x[:, 0]), tf.reduce_max(w)))
    assert _sum_is_given_to_every_sample(lambda x, w: (tf.zeros([8, 8]), w))  # (rows alike)
    # a weight as long as the batch differs along that axis; a constant other than zeros
    # is not the identity: neither is the batch's
    assert not _sum_is_given_to_every_sample(lambda x, w: (tf.zeros(tf.shape(x)[:1]), w))
    assert not _sum_is_given_to_every_sample(lambda x, w: (tf.constant(np.arange(8.0), tf.float32),
                                                           tf.reduce_sum(w)))
