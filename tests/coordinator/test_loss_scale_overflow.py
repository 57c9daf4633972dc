"""Loss scales that overflow float16 on input_fn's first batch: with TF's dynamic scale the
CS skips the overflowing steps and halves S as TF does, and the validation's gradient check
runs at a scale where the gradients are finite (a wrong gradient still refused); a static
scale that overflows is refused in one line saying so."""
from __future__ import annotations

import cs_inprocess
import numpy as np
import pytest
import tensorflow as tf
import tf_reference
from sklearn.datasets import load_digits

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

v1 = tf.compat.v1
STEPS = 6


def input_fn(params):
    d = load_digits()
    x = (d.data[:128] / 16.0).astype(np.float32)
    y = d.target[:128].astype(np.float32)[:, None]
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(16, drop_remainder=True)


def model_fn(features, labels, mode, params):
    """Each pixel a token (Dense from 1 channel) and LayerNorm, as swin's stem: a blank
    pixel's token is the bias alone, whose LayerNorm gradient is large (1 / sqrt(eps))."""
    tf.keras.mixed_precision.set_global_policy(params.get("policy", "mixed_float16"))
    try:
        h = tf.keras.layers.Dense(16, name="patch_embed")(tf.reshape(features, [-1, 64, 1]))
        h = tf.keras.layers.LayerNormalization(epsilon=params.get("epsilon", 1e-5),
                                               name="embed_ln")(h)
        out = tf.keras.layers.Dense(1, dtype="float32", name="out")(tf.reduce_mean(h, 1))
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"y": out})
    loss = v1.losses.mean_squared_error(labels * params.get("target", 1.0), out)
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss)
    opt = v1.train.experimental.MixedPrecisionLossScaleOptimizer(
        v1.train.AdamOptimizer(1e-2), params["loss_scale"])
    step = v1.train.get_or_create_global_step()
    if not params.get("swap"):
        return CSEstimatorSpec(mode, loss=loss, train_op=opt.minimize(loss, global_step=step))
    grads = dict((v.op.name, (g, v)) for g, v in opt.compute_gradients(loss))
    gamma, beta = grads["embed_ln/gamma"], grads["embed_ln/beta"]
    grads["embed_ln/gamma"], grads["embed_ln/beta"] = (beta[0], gamma[1]), (gamma[0], beta[1])  # swap line
    return CSEstimatorSpec(mode, loss=loss, train_op=opt.apply_gradients(list(grads.values()), step))


def params(**extra):
    return {"runconfig": {"tf_random_seed": 1}, "loss_scale": "dynamic", **extra}


@pytest.mark.slow
def test_dynamic_scale_overflowing_the_first_batch_trains_evaluates_and_predicts_as_tensorflow(tmp_path):
    """S starts at 2 ** 15, where the float16 gradients overflow: TF skips those steps and
    halves S; the CS skips the same steps (TF's global step and Adam's beta1_power count the
    applied ones), ends with TF's S and good-step counter, trains with TF mixed's losses by
    the mixed rule, and evaluates and predicts the trained state as the CPU path does."""
    p = params()
    run = cs_inprocess.compare(model_fn, input_fn, p, str(tmp_path), steps=STEPS)
    read = "current_loss_scale/Read/ReadVariableOp:0"
    data = tf_reference.batches(input_fn, p, STEPS)
    ref = tf_reference.run(model_fn, input_fn, p, run.compiled.initial_weights, data, fetch=(read,))
    scales = [float(f[read]) for f in ref.fetched]
    skipped = sum(b < a for a, b in zip(scales, scales[1:] + [float(ref.state["current_loss_scale"])]))
    assert scales[0] == 2.0 ** 15 and skipped >= 2  # (the model overflows as the test means)
    assert int(ref.state["global_step"]) == STEPS - skipped
    state = run.cs.state
    assert float(state["current_loss_scale"]) == float(ref.state["current_loss_scale"])
    assert int(state["good_steps"]) == int(ref.state["good_steps"])
    assert float(state["beta1_power"]) == float(ref.state["beta1_power"])
    twin = cs_inprocess.float32_twin(model_fn, input_fn, p, run, STEPS)
    assert not cs_inprocess.mixed_precision_mismatches(run, twin)
    assert not cs_inprocess.evaluation_mismatch(model_fn, input_fn, p, str(tmp_path), run, rtol=1e-2)
    assert not cs_inprocess.prediction_mismatch(model_fn, input_fn, p, str(tmp_path), run, rtol=1e-2)


def test_a_wrong_gradient_under_an_overflowing_dynamic_scale_is_refused(tmp_path, monkeypatch):
    """LayerNorm's gamma and beta gradients swapped: the numeric check, run at the scale where
    the float16 gradients are finite, refuses it naming the user's line."""
    monkeypatch.setattr("coordinator.compiler.training.gradients._check_source", lambda *args: None)
    line = cs_inprocess.refusal(model_fn, input_fn, params(swap=True), str(tmp_path), __file__)
    assert line.startswith("the gradient applied to embed_ln/")
    assert "is not the gradient of the loss model_fn returns" in line
    assert "(hint: apply the loss's own gradients (minimize(loss), or compute_gradients" in line
    assert "csrun_" not in line and "<unknown source>" not in line


def test_a_static_scale_overflowing_the_first_batch_is_refused_in_one_line(tmp_path):
    """TF applies the infinite gradients of a fixed 2 ** 15 and trains NaN from its second
    step: refused, saying the scale overflows and what to do, at the user's minimize line."""
    line = cs_inprocess.refusal(model_fn, input_fn, params(loss_scale=2.0 ** 15), str(tmp_path), __file__)
    assert line.startswith("the loss scale 32768 overflows float16 in the gradient of ")
    assert 'lower the loss scale or use "dynamic"' in line
    assert "csrun_" not in line and "<unknown source>" not in line


def test_gradients_overflowing_at_every_dynamic_scale_are_refused_naming_where(tmp_path):
    """LayerNormalization(epsilon=1e-6) over blank pixels' tokens (unseen24's segformer): the
    float16 gradient overflows even at S = 1, so TF halves S down to 1 and never applies a
    step. The line says so, names the op where float16 first overflows and what to do."""
    line = cs_inprocess.refusal(model_fn, input_fn, params(epsilon=1e-6, target=1e4),
                                str(tmp_path), __file__)
    assert line.startswith("the gradient of the loss for patch_embed/kernel is not finite on "
                           "input_fn's first batch at every loss scale the dynamic scale "
                           "reaches (down to 1): TensorFlow would skip every step")
    assert "float16 first overflows in the gradient of LayerNormalization (Cast " \
           "'embed_ln_1/Cast') at " \
           "test_loss_scale_overflow.py:" in line.replace("tests/coordinator/", "")
    assert "(hint: keep that layer's float16 values finite: a larger epsilon" in line
    assert "optimizers the CS carries out" not in line
