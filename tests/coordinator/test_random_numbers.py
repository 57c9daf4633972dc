"""Random numbers in the samples' computation (issue 21: a VAE, Keras GaussianNoise and
GaussianDropout, Gumbel and truncated-normal noise; unseen15: integers per sample, a DDPM's
timesteps). The CS draws its own numbers (docs/
design.md, "Determinism"); what is proven here: (1) they have the distribution of what TF's
op with the same arguments draws; (2) with the draws made equal (compare_drawn hands the CS
TF's), the models train to TF's losses and weights; (3) a resumed run draws what an unbroken
one draws, and micro-batches or replicas draw what one batch draws; (4) Keras' layers are
the identity outside training, as in TF, and a hand-written tf.random.normal stays random in
evaluation and prediction; (5) what the CS does not draw is refused in one line naming the op.
"""
from __future__ import annotations

import tempfile

import blind_finding_models as bm
import cs_inprocess
import noise_models as nm
import numpy as np
import pytest
import tensorflow as tf
import tf_reference

from common.errors import CSRunError
from common.run_settings import RunSettings
from coordinator.compiler import compile_model
from tf_model import cpu_session
from wafer.kernels import KernelError, build_kernel
from wafer.kernels.draw_replay import DRAWING
from wafer.kernels.random_numbers import TRUNCATE, draw, integers

BASE = {"batch_size": 8, "runconfig": {"tf_random_seed": 1}}
CASES = {"vae": (nm.vae, nm.input_fn, {"autoencoder": True}),
         "gaussian_noise": (nm.gaussian_noise, nm.input_fn, {}),
         "gaussian_dropout": (nm.gaussian_dropout, nm.input_fn, {}),
         "gumbel_logits": (nm.gumbel_logits, nm.input_fn, {}),
         "noisy_labels": (nm.noisy_labels, nm.input_fn, {"autoencoder": True}),
         "sampled_labels": (nm.sampled_labels, nm.input_fn, {}),
         "conditional_generator": (nm.conditional_generator, nm.input_fn, {}),
         "random_feature": (nm.random_feature, nm.input_fn, {}),
         "ddpm": (nm.ddpm, nm.input_fn, {}),
         "ddpm_table": (nm.ddpm, nm.input_fn, {"table": True}),
         "ddpm_stateless": (nm.ddpm, nm.input_fn, {"stateless": True}),
         "infogan": (nm.infogan, nm.input_fn, {}),
         "infogan_zeros_like": (nm.infogan, nm.input_fn, {"logits": "zeros_like"}),
         "infogan_prior": (nm.infogan, nm.input_fn, {"logits": "prior"})}
INTEGER_CASES = ("random_feature", "ddpm", "ddpm_table", "ddpm_stateless")
# (what TF's op draws with the model's arguments) for the distribution tests
TF_DRAWS = {"normal": lambda shape: tf.random.normal(shape, mean=0.5, stddev=2.0),
            "truncated_normal": lambda shape: tf.random.truncated_normal(shape, stddev=1.5),
            "uniform": lambda shape: tf.random.uniform(shape, -1.0, 3.0)}
DRAW_SHAPE = (256, 1024)  # 2 ** 18 values


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    """compare_drawn() of each case, once."""
    return cs_inprocess.cached_comparisons(CASES, BASE, tmp_path_factory, drawn=True)


@pytest.mark.parametrize("name", sorted(CASES))
def test_with_tfs_draws_the_models_train_to_tfs_losses_and_weights(drawn, name):
    result = drawn(name)
    kernels = result.compiled.program.kernels
    assert any(k.type in DRAWING for k in kernels)
    if name in INTEGER_CASES:  # (each sample's integers drawn by the CS)
        assert any(k.type == "random" and k.attrs["distribution"].s == "uniform_int" for k in kernels)
    assert cs_inprocess.mismatches(result, rtol=1e-5) == []


def _cs_draws(kind: str, tmp_path, **params) -> np.ndarray:
    """What the CS predicts as `features + draws` on zeros: its draws, through the compiled
    scale and shift kernels."""
    params = {"batch_size": DRAW_SHAPE[0], "width": DRAW_SHAPE[1], **params}
    model_fn = nm.draws(kind)
    compiled = cs_inprocess.compile_checked(model_fn, nm.draw_input_fn, params, str(tmp_path),
                                            mode="infer")
    data = cs_inprocess.first_batches(nm.draw_input_fn, params, 1)
    run = cs_inprocess.run_on_cs(compiled.program, compiled.initial_weights, data, kind="predict")
    drawn = [v for v in run.outputs[0].values() if v.shape == DRAW_SHAPE]  # (not the logits)
    assert len(drawn) == 1
    return drawn[0].astype(np.float64).reshape(-1)


def _tf_draws(kind: str) -> np.ndarray:
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        return session.run(TF_DRAWS[kind](DRAW_SHAPE)).astype(np.float64).reshape(-1)


@pytest.mark.parametrize("kind", sorted(TF_DRAWS))
def test_the_cs_draws_what_tf_draws_in_distribution(kind, tmp_path):
    """Over 2^18 values: mean, standard deviation, range and the quantiles of the CS's draws
    and TF's agree within 6 standard errors (a two-sample bound: a false alarm about once
    in 10^8 runs), and both with the distribution itself."""
    cs, ref = _cs_draws(kind, tmp_path), _tf_draws(kind)
    n = cs.size
    assert n == 2 ** 18 and np.isfinite(cs).all()
    mean, std = {"normal": (0.5, 2.0),
                 "truncated_normal": (0.0, 1.5 * 0.87962566103423978),  # sd of N(0,1) | |z| < 2
                 "uniform": (1.0, 4.0 / np.sqrt(12.0))}[kind]
    for values in (cs, ref):
        assert abs(values.mean() - mean) < 6 * std / np.sqrt(n)
        assert abs(values.std() - std) < 6 * std / np.sqrt(2 * n) * 1.5
    if kind == "truncated_normal":
        assert np.abs(cs).max() < TRUNCATE * 1.5 and np.abs(cs).max() > TRUNCATE * 1.5 * 0.99
    if kind == "uniform":
        assert cs.min() >= -1.0 and cs.max() < 3.0
    # quantiles (the tails included): two samples of one distribution agree to a few
    # standard errors of a quantile, sqrt(2 q (1 - q) / n) / density
    qs = np.array([0.001, 0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99, 0.999])
    spread = np.sqrt(2 * qs * (1 - qs) / n)
    cs_q, ref_q = np.quantile(cs, qs), np.quantile(ref, qs)
    assert np.all(np.abs(np.mean(cs[:, None] <= ref_q, axis=0) - qs) < 6 * spread + 1e-4)
    assert np.all(np.abs(np.mean(ref[:, None] <= cs_q, axis=0) - qs) < 6 * spread + 1e-4)


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_the_cs_draws_integers_uniform_in_their_range_as_tf_does(dtype, tmp_path):
    """tf.random.uniform(shape, -3, 5, dtype) over 2^18 values: the CS's and TF's are the
    integers -3..4 only, each drawn 1/8 of the time within 6 standard errors."""
    cs = _cs_draws(dtype, tmp_path)
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        ref = session.run(tf.random.uniform(DRAW_SHAPE, -3, 5, getattr(tf, dtype))).reshape(-1)
    n, p = cs.size, 1 / 8
    for values in (cs, ref):
        assert set(np.unique(values)) == set(range(-3, 5))
        counts = np.array([np.sum(values == k) for k in range(-3, 5)])
        assert np.all(np.abs(counts - n * p) < 6 * np.sqrt(n * p * (1 - p)))


def test_float16_draws_of_a_mixed_precision_gaussian_noise_keep_their_distribution(tmp_path):
    """Keras' GaussianNoise under mixed_float16 draws float16: the CS's values are float16
    numbers with the layer's standard deviation."""
    def model_fn(features, labels, mode, params):
        tf.keras.mixed_precision.set_global_policy("mixed_float16")
        try:
            noisy = tf.keras.layers.GaussianNoise(0.5)(tf.cast(features, tf.float16), training=True)
            logits = tf.keras.layers.Dense(nm.CLASSES, dtype="float32")(noisy)
        finally:
            tf.keras.mixed_precision.set_global_policy("float32")
        return nm.CSEstimatorSpec(mode=mode, predictions={"noisy": tf.cast(noisy, tf.float32),
                                                          "logits": logits})
    params = {"batch_size": 256, "width": 256}
    compiled = cs_inprocess.compile_checked(model_fn, nm.draw_input_fn, params, str(tmp_path),
                                            mode="infer")
    random = [k for k in compiled.program.kernels if k.type == "random"]
    assert len(random) == 1 and random[0].attrs["precision"].s == "float16"
    data = cs_inprocess.first_batches(nm.draw_input_fn, params, 1)
    run = cs_inprocess.run_on_cs(compiled.program, compiled.initial_weights, data, kind="predict")
    noisy = [v for v in run.outputs[0].values() if v.shape == (256, 256)][0]
    assert np.array_equal(noisy, noisy.astype(np.float16).astype(np.float32))
    assert abs(noisy.std() - 0.5) < 6 * 0.5 / np.sqrt(2 * noisy.size) * 1.5
    assert abs(noisy.mean()) < 6 * 0.5 / np.sqrt(noisy.size)


@pytest.mark.parametrize("distribution", ["normal", "truncated_normal", "uniform", "uniform_int"])
def test_micro_batches_of_any_size_draw_what_the_whole_batch_draws(distribution):
    """The executor hands a region's micro-batches (and replicas' slices) its stream in
    batch order: split anywhere, the draws are the same numbers."""
    def stream():
        return np.random.Generator(np.random.PCG64(np.random.SeedSequence([7, 3, 11])))

    def of(rng, shape):
        if distribution == "uniform_int":
            return integers(rng, -3, 2 ** 40, shape)
        return draw(rng, distribution, shape)
    whole = of(stream(), (16, 5))
    rng = stream()
    parts = np.concatenate([of(rng, (m, 5)) for m in (3, 1, 7, 5)])
    np.testing.assert_array_equal(parts, whole)


@pytest.mark.slow
def test_replicas_draw_what_one_replica_draws(tmp_path):
    """Two replicas train a GaussianNoise classifier to one replica's weights (1e-5: the
    replicas' gradients are summed in another order)."""
    params = {**BASE, "batch_size": 16}
    runs = []
    for replicas in (1, 2):
        run_params = {**params, "runconfig": {**params["runconfig"], "multireplica": replicas > 1,
                                              "num_replicas": replicas}}
        compiled = cs_inprocess.compile_checked(nm.gaussian_noise, nm.input_fn, run_params,
                                                str(tmp_path / str(replicas)))
        assert compiled.program.num_replicas == replicas
        data = tf_reference.batches(nm.input_fn, run_params, 3)
        runs.append(cs_inprocess.run_on_cs(compiled.program, compiled.initial_weights, data))
    np.testing.assert_allclose(runs[0].losses, runs[1].losses, rtol=1e-5)
    for name, value in runs[0].state.items():
        np.testing.assert_allclose(runs[1].state[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.slow
def test_a_resumed_run_draws_what_an_unbroken_run_draws(tmp_path):
    compiled = cs_inprocess.compile_checked(nm.vae, nm.input_fn, {**BASE, "autoencoder": True},
                                            str(tmp_path))
    data = tf_reference.batches(nm.input_fn, {**BASE, "autoencoder": True}, 6)
    cs_inprocess.resume_is_unbroken(compiled, data, str(tmp_path), 3)
    # and the steps drew different numbers: the same batch twice gives two losses
    again = cs_inprocess.run_on_cs(compiled.program, compiled.initial_weights, [data[0]] * 2)
    assert again.losses[0] != again.losses[1]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gaussian_noise", "gaussian_dropout"])
def test_keras_noise_layers_are_the_identity_in_evaluation_and_prediction(drawn, name, tmp_path):
    model_fn, input_fn, extra = CASES[name]
    params = {**BASE, **extra}
    for mode in ("eval", "infer"):
        program = cs_inprocess.compile_checked(model_fn, input_fn, params, str(tmp_path / mode),
                                               mode=mode).program
        assert "random" not in [k.type for k in program.kernels]
    trained = drawn(name)
    assert cs_inprocess.evaluation_mismatch(model_fn, input_fn, params, str(tmp_path / "eval"),
                                            trained) == ""
    assert cs_inprocess.prediction_mismatch(model_fn, input_fn, params, str(tmp_path / "infer"),
                                            trained) == ""


def test_a_hand_written_draw_stays_random_in_prediction(drawn, tmp_path):
    """The VAE's z = mean + exp(0.5 log_var) * eps on the CS in prediction: eps recovered
    from the predictions is standard normal, fresh in every batch, as TF's is."""
    params = {**BASE, "autoencoder": True}
    path = cs_inprocess.trained_checkpoint(str(tmp_path), drawn("vae"))
    predicted = cs_inprocess.predict_like_the_chief(nm.vae, nm.input_fn, params, str(tmp_path),
                                                    path, steps=8)
    eps = (predicted["z"] - predicted["mean"]) / np.exp(0.5 * predicted["log_var"])
    assert eps.shape == (64, nm.LATENT)
    assert abs(eps.mean()) < 6 / np.sqrt(eps.size) and abs(eps.std() - 1) < 0.25
    again = cs_inprocess.predict_like_the_chief(nm.vae, nm.input_fn, params, str(tmp_path),
                                                path, steps=8)
    np.testing.assert_array_equal(again["z"], predicted["z"])  # a run's draws are its seed's
    first, second = eps[:8], eps[8:16]
    assert not np.allclose(first, second)  # a new draw for every batch


REFUSED = {
    "constant_seed": ("StatelessRandomNormalV2", "constant seed"),
    "value_shaped": ("RandomStandardNormal", "computed from values"),
    "integer_bounds_computed": ("RandomUniformInt", "constant minval and maxval"),
    "full_range_integers": ("StatelessRandomUniformFullIntV2", "full range"),
    "stateless_categorical": ("StatelessMultinomial", "use tf.random.categorical"),
    "infogan_rows_differ": ("Multinomial", "a constant whose rows differ"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_random_numbers_the_cs_does_not_draw_are_refused_in_one_line(name):
    op_type, reason = REFUSED[name]
    params = dict(BASE)
    with tempfile.TemporaryDirectory() as model_dir, pytest.raises(CSRunError) as refused:
        compile_model(getattr(nm, name), nm.input_fn, params, model_dir, validate_only=True)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"validation failed: {op_type} ")
    assert "tests/noise_models.py:" in message and reason in message


def test_mixups_gamma_draws_are_refused_saying_the_cs_has_no_gamma_sampler(tmp_path):
    """Mixup's lambda ~ Beta(alpha, alpha) as g1 / (g1 + g2) of two tf.random.gamma: one line
    naming RandomGamma and its line, what the CS lacks and what to write instead (not the
    shuffles' and full-range integers' words)."""
    line = cs_inprocess.refusal(bm.mixup, bm.mixup_input_fn, dict(bm.MIXUP_PARAMS), str(tmp_path),
                                "tests/blind_finding_models.py")
    assert line.startswith("validation failed: RandomGamma 'random_gamma/RandomGamma' at "
                           "tests/blind_finding_models.py:")
    assert ("draws from a gamma distribution (tf.random.gamma; a Beta as the ratio of two "
            "gammas, mixup's lambda): the CS has no gamma sampler; draw it in input_fn "
            "(np.random.gamma, or mixup's lambda as np.random.beta(alpha, alpha)) and yield it "
            "with the batch") in line
    assert "shuffle" not in line.split(" (and ")[0]


def test_the_draws_of_a_replay_are_the_kernels_values_not_a_stub(drawn):
    """compare_drawn's seam replaces the draws only: the CS's own draws train differently."""
    result = drawn("vae")
    own = cs_inprocess.run_on_cs(result.compiled.program, result.compiled.initial_weights,
                                 tf_reference.batches(nm.input_fn, {**BASE, "autoencoder": True}, 4))
    assert own.losses != result.cs.losses


def test_a_random_kernel_of_an_unknown_distribution_is_refused_at_load():
    with pytest.raises(KernelError, match="a distribution among normal, truncated_normal, uniform"):
        build_kernel("random", "r", {"distribution": "poisson", "shape": [3]}, [(4,)])
    for bounds in ({"minval": 5, "maxval": 5}, {"minval": 0, "maxval": 2 ** 31 + 1}):
        with pytest.raises(KernelError, match="minval"):
            build_kernel("random", "r", {"distribution": "uniform_int", "shape": [3],
                                         "output": "int32", **bounds}, [(4,)])


def test_a_ddpm_evaluates_on_the_cs(drawn, tmp_path):
    """The trained DDPM evaluated on the CS: its draw-free metric is the CPU path's (1e-6);
    its timesteps are the CS's own draws, integers whose mean over 32 samples lies within 6
    standard errors of (T - 1) / 2; its noise-prediction error is finite and positive."""
    path = cs_inprocess.trained_checkpoint(str(tmp_path), drawn("ddpm"))
    cs = cs_inprocess.evaluate_like_the_chief(nm.ddpm, nm.input_fn, BASE, str(tmp_path), path, 4)
    settings = RunSettings(str(tmp_path), BASE, None, None, None, None)
    cpu = cpu_session.evaluate(nm.ddpm, nm.input_fn, settings, steps=4, checkpoint_path=path)
    np.testing.assert_allclose(cs["pixel_mean"], cpu["pixel_mean"], rtol=1e-6)
    spread = np.sqrt((nm.T_STEPS ** 2 - 1) / 12 / 32)
    assert abs(cs["t_mean"] - (nm.T_STEPS - 1) / 2) < 6 * spread
    assert cs["t_mean"] != cpu["t_mean"]  # (its own draws)
    assert 0 < cs["eps_mse"] < 10 and cs["loss"] == pytest.approx(cs["eps_mse"], rel=1e-5)


@pytest.mark.parametrize("name", ["infogan", "infogan_zeros_like"])
def test_an_infogan_code_drawn_from_equal_rows_evaluates_on_the_cs(drawn, name, tmp_path):
    """unseen18: the InfoGAN trained on the CS (its code drawn from tf.zeros([batch, C]) or
    tf.zeros_like logits, each sample its own draw) evaluated on the CS: the draw-free critic
    metric is the CPU path's (1e-6); the codes are the CS's own draws, their mean over 32
    samples within 6 standard errors of the uniform (C - 1) / 2."""
    model_fn, input_fn, extra = CASES[name]
    params = {**BASE, **extra}
    path = cs_inprocess.trained_checkpoint(str(tmp_path), drawn(name))
    cs = cs_inprocess.evaluate_like_the_chief(model_fn, input_fn, params, str(tmp_path), path, 4)
    settings = RunSettings(str(tmp_path), params, None, None, None, None)
    cpu = cpu_session.evaluate(model_fn, input_fn, settings, steps=4, checkpoint_path=path)
    np.testing.assert_allclose(cs["real_loss"], cpu["real_loss"], rtol=1e-6)
    spread = np.sqrt((nm.CLASSES ** 2 - 1) / 12 / 32)
    assert abs(cs["code_mean"] - (nm.CLASSES - 1) / 2) < 6 * spread
