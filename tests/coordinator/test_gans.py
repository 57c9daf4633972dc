"""GANs: two optimizers minimizing two losses in one step (`tf.group(d_opt.minimize(d_loss,
var_list=d_vars), g_opt.minimize(g_loss, var_list=g_vars, global_step=step))`, also with the
generator's under tf.control_dependencies([d_train])). TF's step is an update of each group
from its own loss's gradient at the weights before the step; the CS runs a backward pass of
each loss from the step's forward activations, then the updates: TF's numbers, slots and
step counters, over micro-batches, replicas and stage threads (a generator's feature
matching too: a loss of the whole batch; a WGAN's critic clipped after its update); a
checkpoint resumes; the trained model
evaluates on the CS. What the CS does not carry out with several losses is
refused in one line."""
from __future__ import annotations

import inspect
import json
import os

import numpy as np
import pytest
import tensorflow as tf
import tf_reference
from cs_inprocess import (
    Comparison,
    assert_resume_is_unbroken,
    assert_same_training,
    at_micro_batch,
    cached_comparisons,
    compare,
    compare_drawn,
    evaluation_mismatch,
    prediction_mismatch,
    run_on_cs,
)
from delayed_update_models import ring_input_fn as input_fn
from random_models import moments_batch_norm

from common.errors import CSRunError
from coordinator.compiler import compile_model
from tf_model.estimator_spec import CSEstimatorSpec
from tf_model.model_fn import named_inputs
from wafer import timing
from wafer.fabric import get_fabric
from wse_sim.pipeline import Pipeline
from wse_sim.program import check_program, check_state

v1 = tf.compat.v1


def _networks(features, params, training):
    """The discriminator's logits of the real and fake points, each network's variables and
    the generator's samples."""
    g_hidden = tf.keras.layers.Dense(8, activation="relu", name="g_hidden")
    g_out = tf.keras.layers.Dense(2, name="g_out")
    d_hidden = tf.keras.layers.Dense(16, activation=tf.nn.leaky_relu, name="d_hidden")
    d_logit = tf.keras.layers.Dense(1, name="d_logit")
    hidden = g_hidden(features["noise"])
    if params.get("batch_norm"):  # a DCGAN's generator: its moving statistics move once a step
        hidden = moments_batch_norm(hidden, 0, training)
    fake = g_out(hidden)
    d_real, d_fake = d_logit(d_hidden(features["real"])), d_logit(d_hidden(fake))
    d_vars = [v for v in v1.trainable_variables() if v.name.startswith("d_")]
    g_vars = [v for v in v1.trainable_variables() if v.name.startswith(("g_", "bn0/"))]
    return d_real, d_fake, d_vars, g_vars, fake


def gan_model_fn(features, labels, mode, params):
    """A GAN as the TF 1 tutorials write it: sigmoid cross-entropies, two
    AdamOptimizer(2e-4, 0.5); model_fn returns the sum of both losses."""
    d_real, d_fake, d_vars, g_vars, fake = _networks(features, params, mode == "train")
    d_loss = (v1.losses.sigmoid_cross_entropy(tf.ones_like(d_real), d_real)  # d_loss line
              + v1.losses.sigmoid_cross_entropy(tf.zeros_like(d_fake), d_fake))
    if params.get("weighted"):  # the real points weighted per sample (a mask): a divisor
        mask = tf.cast(features["real"][:, :1] > 0, tf.float32)
        d_loss = v1.losses.sigmoid_cross_entropy(  # weighted line
            tf.ones_like(d_real), d_real, weights=mask) + d_loss
    g_loss = v1.losses.sigmoid_cross_entropy(tf.ones_like(d_fake), d_fake)
    if mode == "infer":  # generated points and how real the discriminator finds them
        return CSEstimatorSpec(mode=mode, predictions={"fake": fake, "real": tf.sigmoid(d_fake)})
    if mode != "train":
        return CSEstimatorSpec(mode=mode, loss=d_loss + g_loss)
    d_opt, g_opt = v1.train.AdamOptimizer(2e-4, 0.5), v1.train.AdamOptimizer(2e-4, 0.5)
    if params.get("scaled"):
        d_opt = v1.mixed_precision.MixedPrecisionLossScaleOptimizer(d_opt, 64.0)
        g_opt = v1.mixed_precision.MixedPrecisionLossScaleOptimizer(g_opt, 64.0)
    step = v1.train.get_or_create_global_step()
    if params.get("one_loss"):  # one optimizer of the discriminator's loss: not model_fn's
        train_op = d_opt.minimize(d_loss, global_step=step)
        return CSEstimatorSpec(mode=mode, loss=d_loss + g_loss, train_op=train_op)
    if params.get("clip"):  # each loss's gradients by their own global norm, or both by one
        d_grads = [g for g, _ in d_opt.compute_gradients(d_loss, var_list=d_vars)]
        g_grads = [g for g, _ in g_opt.compute_gradients(g_loss, var_list=g_vars)]
        if params["clip"] == "together":
            clipped, _ = tf.clip_by_global_norm(d_grads + g_grads, 0.05)  # norm line
        else:
            clipped = tf.clip_by_global_norm(d_grads, 0.05)[0] + \
                tf.clip_by_global_norm(g_grads, 0.02)[0]
        d_train = d_opt.apply_gradients(zip(clipped[:len(d_vars)], d_vars))
        g_train = g_opt.apply_gradients(zip(clipped[len(d_vars):], g_vars), global_step=step)
        return CSEstimatorSpec(mode=mode, loss=d_loss + g_loss, train_op=tf.group(d_train, g_train))
    with tf.control_dependencies(v1.get_collection(v1.GraphKeys.UPDATE_OPS)):
        d_train = d_opt.minimize(d_loss, var_list=d_vars)  # d's minimize
    with tf.control_dependencies([d_train] if params.get("ordered") else []):
        g_train = g_opt.minimize(g_loss, var_list=g_vars, global_step=step)  # g's minimize
    return CSEstimatorSpec(mode=mode, loss=d_loss + g_loss, train_op=tf.group(d_train, g_train))


def drawn_noise_model_fn(features, labels, mode, params):
    """The GAN with its noise drawn in the graph (tf.random.normal), as users often write it:
    both losses' backward passes read the step's one draw."""
    noise = tf.random.normal(tf.shape(features["noise"]))
    return gan_model_fn({"real": features["real"], "noise": noise}, labels, mode, params)


def wgan_model_fn(features, labels, mode, params):
    """A WGAN: the critic by RMSProp(5e-5) on E[D(fake)] - E[D(real)], the generator by
    another on -E[D(fake)] (equal hyper-parameters: one optimizer of two losses); model_fn
    returns the critic's loss. `clip`: the critic's weights clipped after its update."""
    d_real, d_fake, d_vars, g_vars, _ = _networks(features, params, mode == "train")
    d_loss = tf.reduce_mean(d_fake) - tf.reduce_mean(d_real)
    if mode != "train":
        return CSEstimatorSpec(mode=mode, loss=d_loss)
    g_loss = -tf.reduce_mean(d_fake)
    d_train = v1.train.RMSPropOptimizer(5e-5).minimize(d_loss, var_list=d_vars)
    g_train = v1.train.RMSPropOptimizer(5e-5).minimize(
        g_loss, var_list=g_vars, global_step=v1.train.get_or_create_global_step())
    train_op = tf.group(d_train, g_train)
    if params.get("clip"):
        with tf.control_dependencies([d_train]):
            clips = [v.assign(tf.clip_by_value(v, -0.01, 0.01)) for v in d_vars]
        train_op = tf.group(train_op, *clips)
    return CSEstimatorSpec(mode=mode, loss=d_loss, train_op=train_op)


def regenerated_model_fn(features, labels, mode, params):
    """The generator's loss computed anew under the discriminator's update (a forward pass
    that reads the updated discriminator): not the step's forward activations."""
    d_real, d_fake, d_vars, g_vars, _ = _networks(features, params, mode == "train")
    d_loss = (v1.losses.sigmoid_cross_entropy(tf.ones_like(d_real), d_real)
              + v1.losses.sigmoid_cross_entropy(tf.zeros_like(d_fake), d_fake))
    d_train = v1.train.AdamOptimizer(2e-4, 0.5).minimize(d_loss, var_list=d_vars)
    with tf.control_dependencies([d_train]):
        again = tf.keras.layers.Dense(1, name="d_again")(features["real"])  # regenerated line
        g_loss = v1.losses.sigmoid_cross_entropy(tf.ones_like(d_fake), d_fake + again)
    g_train = v1.train.AdamOptimizer(2e-4, 0.5).minimize(
        g_loss, var_list=g_vars, global_step=v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode=mode, loss=d_loss + g_loss, train_op=tf.group(d_train, g_train))


def own_fakes_model_fn(features, labels, mode, params):
    """The generator's loss on fakes of its own: the discriminator's loss reads the
    generator's weights (its fakes) in a pass the generator's update does not wait for, so
    TF reads them before or after that update."""
    generate = tf.keras.Sequential([tf.keras.layers.Dense(8, activation="relu"),
                                    tf.keras.layers.Dense(2)])
    discriminate = tf.keras.Sequential([tf.keras.layers.Dense(16, activation="relu"),
                                        tf.keras.layers.Dense(1)])
    d_real = discriminate(features["real"])
    d_fake = discriminate(generate(features["noise"]))  # d's fakes line
    d_own = discriminate(generate(-features["noise"]))
    d_loss = (v1.losses.sigmoid_cross_entropy(tf.ones_like(d_real), d_real)
              + v1.losses.sigmoid_cross_entropy(tf.zeros_like(d_fake), d_fake))
    g_loss = v1.losses.sigmoid_cross_entropy(tf.ones_like(d_own), d_own)
    return _trained_apart(mode, d_loss, g_loss, "sequential_1/", "sequential/")


def _trained_apart(mode, d_loss, g_loss, d_scope: str, g_scope: str) -> CSEstimatorSpec:
    """Each network (its variables' scope) trained on its own loss by Adam(2e-4, 0.5);
    model_fn's loss the sum."""
    d_vars = [v for v in v1.trainable_variables() if v.name.startswith(d_scope)]
    g_vars = [v for v in v1.trainable_variables() if v.name.startswith(g_scope)]
    d_train = v1.train.AdamOptimizer(2e-4, 0.5).minimize(d_loss, var_list=d_vars)
    g_train = v1.train.AdamOptimizer(2e-4, 0.5).minimize(
        g_loss, var_list=g_vars, global_step=v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode=mode, loss=d_loss + g_loss, train_op=tf.group(d_train, g_train))


def feature_matching_model_fn(features, labels, mode, params):
    """Improved GAN training's feature matching (Salimans et al.): the generator matches the
    batch's mean discriminator features of the fake points to the real ones' (a loss of the
    whole batch), the discriminator its cross entropies."""
    g_hidden = tf.keras.layers.Dense(8, activation="relu", name="g_hidden")
    g_out = tf.keras.layers.Dense(2, name="g_out")
    d_hidden = tf.keras.layers.Dense(16, activation=tf.nn.leaky_relu, name="d_hidden")
    d_logit = tf.keras.layers.Dense(1, name="d_logit")
    h_real, h_fake = d_hidden(features["real"]), d_hidden(g_out(g_hidden(features["noise"])))
    d_real, d_fake = d_logit(h_real), d_logit(h_fake)
    d_loss = (v1.losses.sigmoid_cross_entropy(tf.ones_like(d_real), d_real)  # matched d_loss
              + v1.losses.sigmoid_cross_entropy(tf.zeros_like(d_fake), d_fake))
    g_loss = tf.reduce_mean(tf.square(tf.reduce_mean(h_real, 0) - tf.reduce_mean(h_fake, 0)))
    if mode != "train":
        return CSEstimatorSpec(mode=mode, loss=d_loss + g_loss)
    return _trained_apart(mode, d_loss, g_loss, "d_", "g_")


CASES = {"gan": (gan_model_fn, input_fn, {}),
         "gan_ordered": (gan_model_fn, input_fn, {"ordered": True}),
         "gan_two_replicas": (gan_model_fn, input_fn, {"runconfig": {
             "tf_random_seed": 1, "num_replicas": 2}}),
         "wgan": (wgan_model_fn, input_fn, {}),
         "wgan_clipped": (wgan_model_fn, input_fn, {"clip": True}),
         "gan_batch_norm": (gan_model_fn, input_fn, {"batch_norm": True}),
         "gan_clipped": (gan_model_fn, input_fn, {"clip": "apart"}),
         "feature_matching": (feature_matching_model_fn, input_fn, {})}
D_VARS = ["d_hidden/kernel", "d_hidden/bias", "d_logit/kernel", "d_logit/bias"]
G_VARS = ["g_hidden/kernel", "g_hidden/bias", "g_out/kernel", "g_out/bias"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return cached_comparisons(CASES, {}, tmp_path_factory)


@pytest.mark.parametrize("case, slots", [
    ("gan", {"d_hidden/kernel/Adam", "g_out/bias/Adam_1", "beta1_power", "beta2_power_1"}),
    ("gan_ordered", {"d_logit/kernel/Adam_1", "g_hidden/kernel/Adam", "beta1_power_1"}),
    ("gan_two_replicas", {"d_hidden/bias/Adam", "g_hidden/bias/Adam_1", "beta2_power"}),
    ("wgan", {"d_hidden/kernel/RMSProp", "g_out/kernel/RMSProp_1"}),
    # (its generator's moving statistics moved once a step, by the first pass)
    # (the critic's weights clipped to [-0.01, 0.01] after its update: weight writes)
    ("wgan_clipped", {"d_hidden/kernel/RMSProp", "g_out/kernel/RMSProp_1"}),
    ("gan_batch_norm", {"bn0/moving_mean", "bn0/gamma/Adam_1", "beta1_power_1"}),
    ("gan_clipped", {"d_logit/bias/Adam", "g_out/bias/Adam_1"}),  # (by their own norms)
    # (the generator's loss a batch_tail_loss barrier: it seeds its own pass alone)
    ("feature_matching", {"d_hidden/kernel/Adam", "g_out/kernel/Adam_1", "beta2_power_1"}),
])
def test_each_network_trains_on_its_own_loss_as_tensorflow(trained, case, slots):
    """4 steps on the CS and TF from the same weights: losses (model_fn's), weights, every
    slot, beta power and moving statistic within 1e-5; the global step counts 1 a step; the program and the
    compile report name each loss with its variables."""
    run = trained(case)
    assert_same_training(run, rtol=1e-5)
    assert slots <= set(run.cs.state)
    assert run.cs.global_steps == [1, 2, 3, 4]
    objectives = [(o.loss_kernel, list(o.variables)) for o in run.compiled.program.objectives]
    if case == "gan_batch_norm":  # (its bias before the normalization: floored in g's pass)
        assert [(t.kind, list(t.variables)) for t in run.compiled.program.gradient_transforms] \
            == [("noise_floor", ["g_hidden/bias"])]
    normalized = ["bn0/gamma", "bn0/beta"] if case == "gan_batch_norm" else []
    g_vars = [*G_VARS[:2], *normalized, *G_VARS[2:]]
    assert [variables for _, variables in objectives] == [D_VARS, g_vars]
    assert run.compiled.program.loss_kernel not in [kernel for kernel, _ in objectives] \
        or case.startswith("wgan")  # (the WGAN returns its critic's loss)
    assert "Objectives (several losses minimized in one step: a backward pass of each from " \
           "the step's forward activations, then the updates): " in run.compiled.report_text
    if case == "wgan_clipped":
        assert [w.variable for w in run.compiled.program.weight_writes] == D_VARS
        assert all(np.abs(run.cs.state[v]).max() <= 0.01 for v in D_VARS)
    marker = {"wgan": "d_loss = tf.", "wgan_clipped": "d_loss = tf.", "feature_matching": "# matched d_loss"}.get(case,
                                                                                "# d_loss line")
    assert f"test_gans.py:{_line(marker)}" \
           f" (kernel {objectives[0][0]}) for {', '.join(D_VARS)}" in run.compiled.report_text
    with open(os.path.join(run.compiled.directory, "compile_report.json")) as report_json:
        listed = json.load(report_json)["objectives"]
    assert [o["variables"] for o in listed] == [D_VARS, g_vars]


def test_noise_drawn_in_the_graph_is_the_step_s_one_draw_for_both_losses(tmp_path):
    """tf.random.normal noise, the CS's random kernel handed TF's draws (compare_drawn): 4
    steps within 1e-5 of TF."""
    assert_same_training(compare_drawn(drawn_noise_model_fn, input_fn, {}, str(tmp_path)),
                         rtol=1e-5)


def test_one_optimizer_of_the_discriminator_s_loss_reports_model_fn_s_sum(tmp_path):
    """d_opt.minimize(d_loss) alone, model_fn returning d_loss + g_loss: the CS trains on
    d_loss and reports the sum from the same forward pass (tests/coordinator/
    test_reported_loss.py), 4 steps within 1e-5 of TF."""
    result = compare(gan_model_fn, input_fn, {"one_loss": True}, str(tmp_path), steps=4)
    assert_same_training(result, rtol=1e-5)
    assert result.compiled.program.reported_loss_kernel and not result.compiled.program.objectives


def test_micro_batches_accumulate_each_loss_s_gradients(trained):
    """The batch of 16 streamed as 4 micro-batches of 4: each loss's gradients accumulated
    over them, TF's numbers still."""
    run = trained("gan")
    data = tf_reference.batches(input_fn, {}, 4)
    cs = run_on_cs(at_micro_batch(run.compiled.program, 4), run.compiled.initial_weights, data)
    assert_same_training(Comparison(run.compiled, cs, run.reference), rtol=1e-5)


def test_stage_threads_give_the_same_bits(trained):
    """The GAN's regions in 2 stage threads: losses and state bit for bit one thread's."""
    compiled = trained("gan").compiled
    batches = [named_inputs(x, y) for x, y in tf_reference.batches(input_fn, {}, 3)]
    results = []
    for threads in (1, 2):
        checked = check_program(compiled.program)
        pipeline = Pipeline.load(checked, check_state(checked, compiled.initial_weights),
                                 threads=threads, min_stage_flops=0)
        try:
            assert pipeline.stages == threads
            losses = [pipeline.run(b, training=True, step=s).loss for s, b in enumerate(batches)]
            results.append((losses, {k: np.array(v) for k, v in pipeline.state().items()}))
        finally:
            pipeline.close()
    assert results[0][0] == results[1][0]
    for name, value in results[0][1].items():
        np.testing.assert_array_equal(results[1][1][name], value, err_msg=name)


def test_the_timing_model_charges_each_loss_s_backward_pass(trained):
    """A kernel both losses' backward passes reach (the generator's, the discriminator's
    on the fake points) costs 1 + 2 x 2 forward passes; one only the discriminator's loss
    reaches (its real points) 3; the compile's estimate is the simulator's."""
    compiled = trained("gan").compiled
    checked = check_program(compiled.program)
    passes = {k.name: k.backward_passes for k in checked.kernels}
    generator = next(k for k in checked.kernels if k.name.startswith("g_hidden"))
    real = next(k for k in checked.kernels if k.name.startswith("d_hidden")
                and "features.real" in checked.sources[checked.kernels.index(k)])
    assert (passes[generator.name], passes[real.name]) == (2, 1)
    assert timing.flops_per_sample(generator, True) == 5 * generator.flops_per_sample()
    simulated = timing.program_timing(compiled.program, checked.kernels, get_fabric("cs1"),
                                      training=True)
    assert compiled.program.estimate.samples_per_sec == pytest.approx(simulated.samples_per_sec)
    assert "F_k = 3 x forward FLOPs ((1 + 2 n) x, n the losses whose backward pass reaches it)" \
        in compiled.report_text


def test_the_trained_gan_evaluates_and_generates_on_the_cs_as_on_the_cpu(trained, tmp_path):
    assert evaluation_mismatch(gan_model_fn, input_fn, {}, str(tmp_path), trained("gan")) == ""
    assert prediction_mismatch(gan_model_fn, input_fn, {}, str(tmp_path), trained("gan")) == ""


def test_a_run_resumed_from_a_checkpoint_continues_both_networks(tmp_path):
    """4 steps, a checkpoint (both Adams' slots and beta powers) read back as the chief
    resumes: the next 4 steps are an unbroken run's, and TF's from that state."""
    assert_resume_is_unbroken(gan_model_fn, input_fn, {}, str(tmp_path),
                              {"d_hidden/kernel/Adam", "g_out/kernel/Adam_1", "beta1_power",
                               "beta2_power_1"})


def _line(fragment: str) -> int:
    lines = inspect.getsource(inspect.getmodule(_line)).splitlines()
    return next(i for i, s in enumerate(lines) if fragment in s) + 1


@pytest.mark.parametrize("model_fn, params, start, line", [
    (gan_model_fn, {"scaled": True}, "loss scaling (or a float16 model) with several losses "
     "minimized in one step", "d's minimize"),
    (gan_model_fn, {"clip": "together"}, "clip_by_global_norm over the gradients of "
     "several losses minimized in one step", "norm line"),
    (gan_model_fn, {"weighted": True}, "a loss divided by a count or sum of the batch "
     "(per-sample weights) among several losses", "weighted line"),
    (own_fakes_model_fn, {}, "which another loss's optimizer updates in the step, with no "
     "order to that update", "d's fakes line"),
    (regenerated_model_fn, {}, "computes a loss of several minimized in one step after the "
     "train_op's update", "regenerated line"),
], ids=["loss_scaling", "global_norm", "divisor", "unordered_read", "regenerated_forward"])
def test_what_the_cs_does_not_carry_out_with_two_losses_is_refused_in_one_line(
        model_fn, params, start, line, tmp_path):
    with pytest.raises(CSRunError) as info:
        compile_model(model_fn, input_fn, params, str(tmp_path), validate_only=True)
    message = info.value.message
    assert start in message and "\n" not in message
    assert f"test_gans.py:{_line(f'# {line}')}" in message
