"""Monte Carlo dropout (issue 21): a regressor whose evaluation and prediction run its head
SAMPLES times through dropout or noise it asks for (tf.nn.dropout, Keras Dropout or
GaussianNoise with training=True) and report the samples' mean and standard deviation. The CS
draws its own masks and noise in every mode (docs/design.md, "Random numbers"), so it is
compared with the CPU path in distribution; with rate 0 the predictions are the CPU path's,
the samples stacked after the batch (axis 1) or in front of it (axis 0)."""
from __future__ import annotations

import cs_inprocess
import numpy as np
import pytest
import tensorflow as tf

from common.run_settings import RunSettings
from tf_model import cpu_session
from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

FEATURES, HIDDEN, SAMPLES = 4, 32, 32
PARAMS = {"batch_size": 16, "runconfig": {"tf_random_seed": 3}}
NOISE = {"nn_dropout": lambda h, rate: tf.nn.dropout(h, rate=rate),
         "keras_dropout": lambda h, rate: tf.keras.layers.Dropout(rate)(h, training=True),
         "gaussian_noise": lambda h, rate: tf.keras.layers.GaussianNoise(rate)(h, training=True)}


def input_fn(params):
    rng = np.random.default_rng(11)
    x = rng.normal(size=(8 * params["batch_size"], FEATURES)).astype(np.float32)
    y = np.sin(x.sum(1, keepdims=True)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(params["batch_size"], drop_remainder=True)


def mc_regressor(features, labels, mode, params):
    hidden = tf.keras.layers.Dense(HIDDEN, activation="relu")
    head = tf.keras.layers.Dense(1)
    h = hidden(features)
    mean = head(h)
    if mode == ModeKeys.TRAIN:
        loss = tf.compat.v1.losses.mean_squared_error(labels, mean)
        step = tf.compat.v1.train.get_or_create_global_step()
        return CSEstimatorSpec(mode, loss=loss, train_op=tf.compat.v1.train.AdamOptimizer(
            0.01).minimize(loss, global_step=step))
    noisy = NOISE[params["noise"]]
    axis = params.get("stack_axis", 1)
    samples = tf.stack([head(noisy(h, params["rate"])) for _ in range(SAMPLES)], axis=axis)
    mc_mean, mc_std = tf.reduce_mean(samples, axis), tf.math.reduce_std(samples, axis)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"mean": mean, "mc_mean": mc_mean, "mc_std": mc_std})
    return CSEstimatorSpec(mode, loss=tf.compat.v1.losses.mean_squared_error(labels, mc_mean),
                           eval_metric_ops={"mc_std": tf.compat.v1.metrics.mean(mc_std),
                                            "mse": tf.compat.v1.metrics.mean_squared_error(labels, mean)})


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The regressor trained 4 steps on the CS (its training graph holds no dropout)."""
    params = {**PARAMS, "noise": "nn_dropout", "rate": 0.5}
    return cs_inprocess.compare(mc_regressor, input_fn, params,
                                str(tmp_path_factory.mktemp("train")), steps=4)


def _predictions(trained, params, model_dir):
    path = cs_inprocess.trained_checkpoint(model_dir, trained)
    cs = cs_inprocess.predict_like_the_chief(mc_regressor, input_fn, params, model_dir, path, 4)
    settings = RunSettings(model_dir, params, None, None, None, None)
    cpu = cpu_session.predict(mc_regressor, input_fn, settings, checkpoint_path=path,
                                           num_samples=len(cs["mean"])).arrays
    return cs, cpu


def test_mc_dropout_predictions_have_the_cpu_paths_distribution(trained, tmp_path):
    cs, cpu = _predictions(trained, {**PARAMS, "noise": "nn_dropout", "rate": 0.5}, str(tmp_path))
    np.testing.assert_allclose(cs["mean"], cpu["mean"], rtol=1e-5, atol=1e-7)
    assert (cs["mc_std"] > 0).all() and not np.allclose(cs["mc_mean"], cs["mean"])
    # dropout before a linear head keeps its mean: both paths' MC means scatter around the
    # plain mean by mc_std / sqrt(SAMPLES); the spreads themselves agree within 10 %
    for path in (cs, cpu):
        z = (path["mc_mean"] - path["mean"]) / (path["mc_std"] / np.sqrt(SAMPLES))
        assert abs(z.mean()) < 0.5 and 0.6 < z.std() < 1.5, z
    assert cs["mc_std"].mean() == pytest.approx(cpu["mc_std"].mean(), rel=0.1)


@pytest.mark.parametrize("stack_axis", [1, 0])
def test_mc_dropout_with_rate_0_predicts_the_cpu_paths_numbers(trained, tmp_path, stack_axis):
    problem = cs_inprocess.prediction_mismatch(
        mc_regressor, input_fn, {**PARAMS, "noise": "nn_dropout", "rate": 0.0, "stack_axis": stack_axis},
        str(tmp_path), trained, steps=4, rtol=1e-5)
    assert problem == ""


@pytest.mark.parametrize("noise", ["keras_dropout", "gaussian_noise"])
def test_keras_layers_asked_to_draw_in_prediction_draw_on_the_cs(trained, noise, tmp_path):
    """(TF's CPU path repeats one Keras draw at every call in a tf.compat.v1 graph: the CS
    draws fresh numbers at each, as the layers intend.)"""
    model_dir = str(tmp_path)
    path = cs_inprocess.trained_checkpoint(model_dir, trained)
    cs = cs_inprocess.predict_like_the_chief(mc_regressor, input_fn, {**PARAMS, "noise": noise,
                                             "rate": 0.5}, model_dir, path, 2)
    assert (cs["mc_std"] > 0).all() and not np.allclose(cs["mc_mean"], cs["mean"])


def test_mc_dropout_in_evaluation_has_the_cpu_paths_spread(trained, tmp_path):
    """The loss is the MC mean's (its dropout on the CS, the CS's masks); the metrics are
    computed on the host from the CS's stacked samples."""
    params = {**PARAMS, "noise": "nn_dropout", "rate": 0.5}
    path = cs_inprocess.trained_checkpoint(str(tmp_path), trained)
    settings = RunSettings(str(tmp_path), params, None, None, None, None)
    cpu = cpu_session.evaluate(mc_regressor, input_fn, settings, steps=4, checkpoint_path=path)
    cs = cs_inprocess.evaluate_like_the_chief(mc_regressor, input_fn, params, str(tmp_path), path, 4)
    assert cs["mse"] == pytest.approx(cpu["mse"], rel=1e-5)  # no dropout
    # (the MC mean's loss exceeds the plain one by about mc_std ** 2 / SAMPLES, ~4e-3)
    assert abs(cs["loss"] - cs["mse"]) > 1e-4 and cs["loss"] == pytest.approx(cpu["loss"], rel=0.05)
    assert cs["mc_std"] == pytest.approx(cpu["mc_std"], rel=0.1)
