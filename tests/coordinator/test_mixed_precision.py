"""Mixed precision: Keras mixed_float16 graphs (and casts written by hand) compile to float16
kernels that compute as TensorFlow's CPU float16 ops do (wafer.precision), train with the
losses of `python run.py` on the same graph (BatchNormalization in training too), evaluate
on the CS, take static and dynamic loss scales (TF's rule: skipped steps, the scale's
trajectory), and the CS refuses what it does not carry out (bfloat16, cbfloat16, dynamic
loss scaling of float32 models) in one line."""
from __future__ import annotations

import json
import os

import cs_inprocess
import numpy as np
import pytest
import tensorflow as tf
import tf_reference

from common.errors import CSRunError
from cs_api import pb
from cs_api.attrs import from_attr
from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys
from wafer.kernels import RunContext, build_kernel
from wafer.precision import round_half
from wse_sim.errors import CSError

BATCH = 64


def input_fn(params):
    """A learnable 10-class problem on 64 features (float32, or cast to params["features"]
    as the modelzoo's input functions cast images to float16)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8 * BATCH, 64)).astype(np.float32)
    y = np.argmax(x @ rng.normal(size=(64, 10)), axis=1).astype(np.int32)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(BATCH, drop_remainder=True)
    if "features" in params:
        ds = ds.map(lambda x, y: (tf.cast(x, params["features"]), y))
    return ds


def model_fn(features, labels, mode, params):
    """FC layers as users write them under a Keras policy; the loss by tf.compat.v1.losses
    (float32 inside, cast back to float16), or a float16 reduce_mean as the modelzoo's."""
    tf.keras.mixed_precision.set_global_policy(params.get("policy", "mixed_float16"))
    if params.get("cast_features"):  # a float16 stream into a float32 model
        features = tf.cast(features, tf.float32)
    first = tf.keras.layers.Dense(128, activation="relu")
    h = first(features)
    h = tf.keras.layers.Dropout(0.0)(h, training=mode == ModeKeys.TRAIN)
    if params.get("batch_norm"):  # in training: the batch's statistics, under the policy
        h = tf.keras.layers.BatchNormalization()(h, training=mode == ModeKeys.TRAIN)
    h = tf.keras.layers.Dense(64, activation="relu")(h)
    logits = tf.keras.layers.Dense(10)(h)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode=mode, predictions={"logits": tf.cast(logits, tf.float32)})
    if params.get("loss") == "reduce_mean":
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=logits))
    else:
        loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    if params.get("l2"):  # a float32 penalty on the float32 weight
        loss = tf.cast(loss, tf.float32) + params["l2"] * tf.nn.l2_loss(first.kernel)
    optimizer = tf.compat.v1.train.AdamOptimizer(1e-3)
    step = tf.compat.v1.train.get_or_create_global_step()
    scale = params.get("loss_scale")
    if scale == "by_hand":
        grads = optimizer.compute_gradients(loss * 1024.0)
        train_op = optimizer.apply_gradients([(g / 1024.0, v) for g, v in grads], step)
    elif isinstance(scale, dict):  # dynamic: DynamicLossScale's arguments
        optimizer = tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer(
            optimizer, tf.compat.v1.mixed_precision.DynamicLossScale(**scale))
        train_op = optimizer.minimize(loss, global_step=step)
    elif scale is not None:
        optimizer = tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer(optimizer, scale)
        train_op = optimizer.minimize(loss, global_step=step)
    else:
        train_op = optimizer.minimize(loss, global_step=step)
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op)


def params(**extra):
    return {"batch_size": BATCH, "runconfig": {"tf_random_seed": 1}, **extra}


def test_float16_dense_computes_as_tensorflow():
    """A float16 dense layer (x @ cast(w) + cast(b), relu) forward and backward, against
    TF's float16 MatMul/BiasAdd/Relu and their gradients: float32 sums, float16 results."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(32, 300)).astype(np.float16)
    w = (rng.normal(size=(300, 200)) * 0.1).astype(np.float32)
    b = rng.normal(size=200).astype(np.float32)
    dy = rng.normal(size=(32, 200)).astype(np.float16)
    graph = tf.Graph()
    with graph.as_default():
        xt, wt, bt = tf.constant(x), tf.constant(w), tf.constant(b)
        y = tf.nn.relu(tf.nn.bias_add(tf.matmul(xt, tf.cast(wt, tf.float16)),
                                      tf.cast(bt, tf.float16)))
        dx, dw, db = tf.gradients(y, [xt, wt, bt], grad_ys=tf.constant(dy))
        with tf.compat.v1.Session() as session:
            want = session.run({"y": y, "dx": dx, "dw": dw, "db": db})
    kernel = build_kernel("dense", "d", {"units": 200, "use_bias": True, "activation": "relu",
                                         "precision": "float16"}, [(300,)])
    ctx = RunContext(training=True, batch_size=32)
    half = {"kernel": round_half(w), "bias": round_half(b)}
    out, cache = kernel.forward(half, [x.astype(np.float32)], ctx)
    grads_in, grads = kernel.backward(half, cache, dy.astype(np.float32), ctx)
    got = {"y": out, "dx": round_half(grads_in[0]), "dw": round_half(grads["kernel"]),
           "db": round_half(grads["bias"])}
    for name, value in got.items():
        expected = np.asarray(want[name], np.float32)
        assert np.array_equal(value, round_half(value)), f"{name} is not float16-valued"
        ulp = np.spacing(np.abs(expected).astype(np.float16)).astype(np.float32)
        assert np.all(np.abs(value - expected) <= ulp), f"{name}: more than 1 float16 ULP from TF"
        assert np.mean(value == expected) > 0.98, f"{name}: TF rounds the same sums otherwise"


@pytest.mark.slow
def test_mixed_float16_model_trains_with_tensorflows_losses(tmp_path):
    """60 steps of a Keras mixed_float16 MLP with Adam: the CS's losses within 1e-2 of TF's
    mixed-precision run, and its losses and weights no farther from a float32 run than TF's
    float16 are. (Element by element, 60 steps of float16 noise leave the two runs' Adam
    slots apart by up to 6 % of the largest, depending on the CPU's float32 GEMM order:
    docs/design.md, "Mixed precision"; the 8-step tests below compare every element.)"""
    run = cs_inprocess.compare(model_fn, input_fn, params(), str(tmp_path), steps=60)
    kernels = run.compiled.program.kernels
    assert [k.type for k in kernels if "precision" in k.attrs and
            from_attr(k.attrs["precision"]) == "float16"] == \
        ["cast", "dense", "dense", "dense", "cast"]  # the cross-entropy stays float32
    cs, mixed = np.asarray(run.cs.losses), np.asarray(run.reference.losses)
    assert np.max(np.abs(cs - mixed) / mixed) < 1e-2
    data = tf_reference.batches(input_fn, params(), 60)
    float32 = tf_reference.run(model_fn, input_fn, params(policy="float32"), run.compiled.initial_weights, data)
    full = np.asarray(float32.losses)
    assert np.mean(np.abs(cs - full) / full) <= 1.25 * np.mean(np.abs(mixed - full) / full)
    assert cs[-1] < 0.7 * cs[0]  # it learns
    assert not cs_inprocess.farther_than_tensorflow(run, float32.state, factor=2.0)


@pytest.mark.parametrize("scale,l2", [("by_hand", 0.0), (1024.0, 0.0), (1024.0, 1e-2)])
def test_static_loss_scale_seeds_the_float16_backward(tmp_path, scale, l2):
    """loss * S with gradients / S by hand, and MixedPrecisionLossScaleOptimizer with a fixed
    scale (tf.compat.v1.mixed_precision): S seeds the float16 backward (a weight penalty's
    gradient scaled with it), 1/S is the optimizer's; training matches TF's, the float16
    reduce_mean loss tail included."""
    run = cs_inprocess.compare(model_fn, input_fn, params(loss_scale=scale, loss="reduce_mean",
                                                          l2=l2), str(tmp_path), steps=8)
    loss = next(k for k in run.compiled.program.kernels if k.type == "loss")
    assert from_attr(loss.attrs["loss_scale"]) == 1024.0
    assert [t.value for t in run.compiled.program.gradient_transforms] == [1 / 1024]
    assert any(p.regularizers for k in run.compiled.program.kernels for p in k.params) == bool(l2)
    assert not cs_inprocess.mismatches(run, rtol=1e-2)


@pytest.mark.slow
def test_mixed_float16_model_with_batch_norm_trains_and_evaluates_on_the_cs(tmp_path):
    """BatchNormalization in training under mixed_float16 trains with TF's numbers (its
    moving statistics too); and the CS evaluates the checkpoint with the CPU path's metrics:
    the mean-loss metric reads the loss through the policy's float32 -> float16 -> float32
    casts, which TensorFlow's graph optimizer folds to their float32 source, and the chief
    still evaluates from the streamed values alone (it used to ask for the samples)."""
    run = cs_inprocess.compare(model_fn, input_fn, params(batch_norm=True), str(tmp_path), steps=3)
    assert any(k.type == "batch_norm_training" for k in run.compiled.program.kernels)
    assert not cs_inprocess.mismatches(run, rtol=1e-2)
    assert not cs_inprocess.evaluation_mismatch(model_fn, input_fn, params(batch_norm=True),
                                                str(tmp_path), run, rtol=1e-2)


def test_compile_report_shows_float16_and_halves_its_bytes(tmp_path):
    """The report marks float16 kernels and the loss scale; their weights and activations
    take 2 B on the wafer (float32 gradients and slots stay 4 B)."""
    reports, texts = {}, {}
    for policy in ("mixed_float16", "float32"):
        compiled = cs_inprocess.compile_checked(model_fn, input_fn, params(policy=policy),
                                                str(tmp_path / policy))
        with open(os.path.join(compiled.directory, "compile_report.json")) as f:
            reports[policy] = json.load(f)
        texts[policy] = compiled.report_text
    assert "dense (float16)" in texts["mixed_float16"]
    assert "5 of 7 kernels in float16" in texts["mixed_float16"]
    assert "Precision:" not in texts["float32"]
    half = {k["name"]: k for k in reports["mixed_float16"]["kernels"]}
    full = {k["name"]: k for k in reports["float32"]["kernels"]}
    dense = [n for n in half if half[n]["type"] == "dense"]
    assert all(half[n]["precision"] == "float16" and full[n]["precision"] == "float32"
               for n in dense)
    assert reports["mixed_float16"]["estimate"]["memory_bytes"] < \
        reports["float32"]["estimate"]["memory_bytes"]


def test_float16_features_train_evaluate_and_predict_on_the_cs_at_half_the_bytes(tmp_path):
    """An input_fn yielding float16 images (the modelzoo FC-MNIST's under mixed precision):
    the stream's values travel at 2 B each (the estimate's input bound doubles), feed the
    first float16 dense directly (no rounding cast), and the model trains with TF's numbers
    (every element at 1e-2, as the float32-fed runs above), evaluates and predicts on the CS
    as the CPU path does. A float32 batch for the float16 stream is refused in one line."""
    run = cs_inprocess.compare(model_fn, input_fn, params(features="float16"), str(tmp_path), steps=4)
    program = run.compiled.program
    assert program.inputs[0].dtype == pb.FLOAT16 and program.kernels[0].type == "dense"
    route = {r.src: r.bytes_per_sample for r in program.routes}
    assert route["features"] == 64 * 2 and route["labels"] == 4
    float32 = cs_inprocess.compile_checked(model_fn, input_fn, params(), str(tmp_path / "float32"))
    assert run.compiled.program.estimate.transmission_samples_per_sec / \
        float32.program.estimate.transmission_samples_per_sec == pytest.approx((64 * 4 + 4) / (64 * 2 + 4))
    assert not cs_inprocess.mismatches(run, rtol=1e-2)
    p = params(features="float16")
    assert not cs_inprocess.evaluation_mismatch(model_fn, input_fn, p, str(tmp_path), run, rtol=1e-2)
    assert not cs_inprocess.prediction_mismatch(model_fn, input_fn, p, str(tmp_path), run, rtol=1e-2)
    float32_batches = tf_reference.batches(input_fn, params(), 1)
    with pytest.raises(CSError) as refused:
        cs_inprocess.run_on_cs(program, run.compiled.initial_weights, float32_batches)
    assert "worker 0 batch 0: features is (64, 64) float32, the program takes (64, 64) float16" \
        in refused.value.message and "\n" not in refused.value.message


def test_a_float16_stream_into_a_float32_model_trains_as_tensorflow(tmp_path):
    """float16 features cast to float32 in model_fn: the cast changes no value (an alias)."""
    p = params(features="float16", policy="float32", cast_features=True)
    run = cs_inprocess.compare(model_fn, input_fn, p, str(tmp_path), steps=4)
    kernels = run.compiled.program.kernels
    assert kernels[0].type == "dense" and not any(
        from_attr(k.attrs["precision"]) == "float16" for k in kernels if "precision" in k.attrs)
    cs_inprocess.assert_same_training(run)


@pytest.mark.parametrize("dtype,instead", [
    ("bfloat16", ": the CS streams float32, float16, int32, int64 or bool; cast it to float16 "
                 "in input_fn"),
    ("float64", " and Cast 'Cast' at tests/coordinator/test_mixed_precision.py:48 casts "
                "it to float16: the CS computes in float32 (it streams a float64 input every "
                "reader casts to float32 first) (hint: cast in input_fn: tf.cast(x, tf.float32)"),
], ids=["bfloat16", "float64"])
def test_features_the_cs_does_not_stream_are_refused_in_one_line(tmp_path, dtype, instead):
    line = _refusal(tmp_path, features=dtype)
    assert f"input_fn yields features as {dtype}{instead}" in line


def _refusal(tmp_path, **extra) -> str:
    with pytest.raises(CSRunError) as error:
        cs_inprocess.compile_checked(model_fn, input_fn, params(**extra), str(tmp_path))
    line = str(error.value)
    assert "\n" not in line
    return line


def test_bfloat16_is_refused_in_one_line(tmp_path):
    line = _refusal(tmp_path, policy="mixed_bfloat16")
    assert "bfloat16" in line and "test_mixed_precision.py:" in line


def test_cbfloat16_is_refused_in_one_line(tmp_path):
    line = _refusal(tmp_path, csconfig={"use_cbfloat16": True})
    assert "csconfig.use_cbfloat16" in line


DYNAMIC = {"initial_loss_scale": 2.0 ** 20, "increment_period": 3}


@pytest.mark.slow
def test_dynamic_loss_scaling_skips_steps_and_moves_the_scale_as_tensorflow(tmp_path):
    """TF's DynamicLossScale from a scale that overflows float16 (2 ** 20) with a growth
    period of 3: steps 1-5 (S = 2 ** 20 ... 2 ** 16) and 9 (S grown back to 2 ** 16) have
    non-finite gradients and are skipped, S halving each time; the CS trains with TF's
    losses, ends with its scale, good-step counter (checkpointed under TF's names) and
    weights, and skipped Adam's bookkeeping as TF did (beta1_power = 0.9 ** (1 + 6))."""
    p = params(loss_scale=DYNAMIC, loss="reduce_mean")
    run = cs_inprocess.compare(model_fn, input_fn, p, str(tmp_path), steps=12)
    data = tf_reference.batches(input_fn, p, 12)
    read = "current_loss_scale/Read/ReadVariableOp:0"
    ref = tf_reference.run(model_fn, input_fn, p, run.compiled.initial_weights, data, fetch=(read,))
    assert [float(f[read]) for f in ref.fetched] == [2.0 ** e for e in (
        20, 19, 18, 17, 16, 15, 15, 15, 16, 15, 15, 15)]
    assert int(ref.state["global_step"]) == 6  # TF counts the applied steps
    state = run.cs.state
    assert float(state["current_loss_scale"]) == 2.0 ** 16 and int(state["good_steps"]) == 0
    assert state["good_steps"].dtype == np.int64
    assert float(state["beta1_power"]) == pytest.approx(0.9 ** 7)
    assert not cs_inprocess.mismatches(run, rtol=1e-2)
    assert "dynamic" in run.compiled.report_text


def test_dynamic_loss_scaling_of_a_float32_model_is_refused_in_one_line(tmp_path):
    line = _refusal(tmp_path, loss_scale=DYNAMIC, policy="float32")
    assert "dynamic loss scaling of a float32 model" in line and "\n" not in line
