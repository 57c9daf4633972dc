"""Delayed updates under a tf.cond of the global step beside updates every step, written the
way users write them: TD3 (its critic every step; its actor and the Polyak updates of both
target networks every 2 steps, the cond after the critic's step, which increments the
global step, or before the increment), a WGAN whose generator trains every n_critic-th step
(RMSProp and the critic's weight clipping, or Adam), and a GAN alternating its
discriminator's and generator's Adam steps in the two branches; and what TF does not order
(the predicate's read of the step beside its increment)."""
from __future__ import annotations

import numpy as np
import soft_update_models as m
import tensorflow as tf
from random_models import moments_batch_norm

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

v1 = tf.compat.v1


def td3(features, labels, mode, params):
    """TD3's updates: the critic every step, the actor and the target networks every
    params['delay'] steps. params['form']: "after" (the cond under the critic's step,
    which increments the global step: the predicate reads the incremented step), "before"
    (the step incremented after the cond), "unordered" (the cond beside the critic's step:
    TF reads the step before or after its increment by chance), "probe" (the actor's
    gradients computed in the cond, after the critic's update: its loss reads the critic
    before or after that update by chance), "counted" (the actor's update increments the
    step), "uncounted" (nothing increments the step), "nested" (the target networks in a
    tf.cond of their own inside); params['one_adam']: one AdamOptimizer for both (its step
    counters twice a delayed step); params['smoothing']: TD3's target policy smoothing;
    "targets_after" (the cond holds the actor's update alone, the target networks move
    every step under tf.control_dependencies([the cond])), "targets_unordered" (the same
    with the target networks' updates beside the cond: TF reads the actor before or after
    its update by chance)."""
    s, a = features[:, :m.STATE], features[:, m.STATE:m.STATE + m.ACTION]
    r, s2 = features[:, m.STATE + m.ACTION:m.STATE + m.ACTION + 1], features[:, -m.STATE:]
    actor, critic = m.dense_stack("actor", [16, m.ACTION], "tanh"), m.dense_stack("critic", [16, 1])
    target_actor = m.dense_stack("tactor", [16, m.ACTION], "tanh")
    target_critic = m.dense_stack("tcritic", [16, 1])
    mu, q = actor(s), critic(tf.concat([s, a], 1))
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"action": mu, "q": q})
    a2 = target_actor(s2)
    if params.get("smoothing"):  # TD3's target policy smoothing: clipped noise on a2
        noise = tf.clip_by_value(0.2 * tf.random.normal(tf.shape(a2)), -0.5, 0.5)
        a2 = tf.clip_by_value(a2 + noise, -1.0, 1.0)
    q_targ = target_critic(tf.concat([s2, a2], 1))
    y = tf.stop_gradient(r + 0.9 * q_targ)
    critic_loss = tf.reduce_mean(tf.square(q - y))
    actor_loss = -tf.reduce_mean(critic(tf.concat([s, mu], 1)))
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=critic_loss, eval_metric_ops={
            "q_mean": v1.metrics.mean(q), "target_q": v1.metrics.mean(q_targ)})
    step = v1.train.get_or_create_global_step()
    c_opt = v1.train.AdamOptimizer(1e-2)
    a_opt = c_opt if params.get("one_adam") else v1.train.AdamOptimizer(1e-2)
    c_gv = c_opt.compute_gradients(critic_loss, var_list=m.trainable("critic"))
    form = params.get("form", "after")
    a_gv = [] if form == "probe" else a_opt.compute_gradients(actor_loss,
                                                              var_list=m.trainable("actor"))

    def delayed():
        if form == "probe":  # the actor's gradients in the cond, after the critic's update
            a_step = a_opt.minimize(actor_loss, var_list=m.trainable("actor"))
        else:
            a_step = a_opt.apply_gradients(a_gv, global_step=step if form == "counted" else None)
        if form.startswith("targets"):
            return a_step
        with tf.control_dependencies([a_step]):
            if form == "nested":  # the targets every 4 steps, in a tf.cond of their own
                return tf.cond(tf.equal(step % 4, 0), lambda: tf.group(
                    *m.soft_updates("actor", "tactor", params, step),
                    *m.soft_updates("critic", "tcritic", params, step)), tf.no_op)
            return tf.group(*m.soft_updates("actor", "tactor", params, step),
                            *m.soft_updates("critic", "tcritic", params, step))

    first = c_gv if form == "probe" else c_gv + a_gv
    with tf.control_dependencies([g for g, _ in first]):  # every gradient first
        c_step = c_opt.apply_gradients(c_gv, global_step=None if form in (
            "before", "counted", "uncounted") else step)
    if form == "unordered":  # the predicate's read and the increment in no order
        cond = tf.cond(tf.equal(step % params.get("delay", 2), 0), delayed, tf.no_op)
        return CSEstimatorSpec(mode, loss=critic_loss, train_op=tf.group(c_step, cond))
    with tf.control_dependencies([c_step]):
        cond = tf.cond(tf.equal(step % params.get("delay", 2), 0), delayed, tf.no_op)
    if form.startswith("targets"):  # the target networks every step, after the cond (or not)
        with tf.control_dependencies([cond] if form == "targets_after" else []):
            soft = (m.soft_updates("actor", "tactor", params, step)
                    + m.soft_updates("critic", "tcritic", params, step))
        return CSEstimatorSpec(mode, loss=critic_loss, train_op=tf.group(cond, *soft))
    if form == "before":
        with tf.control_dependencies([cond]):
            return CSEstimatorSpec(mode, loss=critic_loss, train_op=v1.assign_add(step, 1))
    return CSEstimatorSpec(mode, loss=critic_loss, train_op=cond)


def ring_input_fn(params):
    """Points on a noisy ring (the real data) and the generator's noise, both as features."""
    rng = np.random.default_rng(5)
    angle = rng.uniform(0, 2 * np.pi, 64)
    ring = 2 * np.stack([np.cos(angle), np.sin(angle)], 1) + rng.normal(scale=0.1, size=(64, 2))
    features = {"real": ring.astype(np.float32),
                "noise": rng.normal(size=(64, 4)).astype(np.float32)}
    return tf.data.Dataset.from_tensor_slices((features, np.zeros(64, np.int32))).repeat().batch(
        16, drop_remainder=True)


def _gan(features, batch_norm: bool = False):
    """The critic's (discriminator's) outputs of the real and fake points, the generated
    points, each network's variables and the critic."""
    g_hidden = tf.keras.layers.Dense(8, activation="relu", name="g_hidden")
    g_out = tf.keras.layers.Dense(2, name="g_out")
    d_hidden = tf.keras.layers.Dense(16, activation=tf.nn.leaky_relu, name="d_hidden")
    d_out = tf.keras.layers.Dense(1, name="d_out")

    def critic(x):
        return d_out(d_hidden(x))
    hidden = g_hidden(features["noise"])
    if batch_norm:  # a DCGAN's generator: its moving statistics in UPDATE_OPS
        hidden = moments_batch_norm(hidden, 0, True)
    fake = g_out(hidden)
    d_real, d_fake = critic(features["real"]), critic(fake)
    d_vars = [v for v in v1.trainable_variables() if v.name.startswith("d_")]
    g_vars = [v for v in v1.trainable_variables() if v.name.startswith(("g_", "bn0/"))]
    return d_real, d_fake, fake, d_vars, g_vars, critic


def wgan_n_critic(features, labels, mode, params):
    """A WGAN training its critic every step and its generator every params['n_critic']-th
    step: RMSProp with the critic's weights clipped after its update, or (params['adam'])
    Adam(1e-2, 0.5, 0.9) as WGAN-GP trains (params['gp']: with its gradient penalty)."""
    d_real, d_fake, fake, d_vars, g_vars, critic = _gan(features)
    d_loss = tf.reduce_mean(d_fake) - tf.reduce_mean(d_real)
    if params.get("gp"):  # WGAN-GP: 10 x (||grad critic(x_hat)|| - 1)^2 at random interpolates
        eps = tf.random.uniform([tf.shape(fake)[0], 1])
        x_hat = eps * features["real"] + (1.0 - eps) * fake
        grad = tf.gradients(critic(x_hat), x_hat)[0]
        norm = tf.sqrt(tf.reduce_sum(tf.square(grad), axis=1) + 1e-12)
        d_loss += 10.0 * tf.reduce_mean(tf.square(norm - 1.0))
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"fake": fake})
    if mode != ModeKeys.TRAIN:
        return CSEstimatorSpec(mode, loss=d_loss)
    g_loss = -tf.reduce_mean(d_fake)
    if params.get("adam"):
        d_opt, g_opt = (v1.train.AdamOptimizer(1e-2, 0.5, 0.9) for _ in "dg")
    else:
        d_opt, g_opt = (v1.train.RMSPropOptimizer(1e-2) for _ in "dg")
    step = v1.train.get_or_create_global_step()
    d_train = d_opt.minimize(d_loss, var_list=d_vars, global_step=step)
    writes = [d_train]
    if not params.get("adam"):
        with tf.control_dependencies([d_train]):
            writes = [v.assign(tf.clip_by_value(v, -0.1, 0.1)) for v in d_vars]
    with tf.control_dependencies([d_train]):
        g_train = tf.cond(tf.equal(step % params.get("n_critic", 3), 0),
                          lambda: g_opt.minimize(g_loss, var_list=g_vars), tf.no_op)
    return CSEstimatorSpec(mode, loss=d_loss, train_op=tf.group(*writes, g_train))


def alternating_gan(features, labels, mode, params):
    """A GAN alternating its updates, `tf.cond(step % 2 == 0, d_step, g_step)`, each an
    AdamOptimizer(1e-2, 0.5) of its own loss; the global step incremented after the cond.
    params['clip']: the discriminator's weights clipped after its step, in its branch."""
    d_real, d_fake, fake, d_vars, g_vars, _ = _gan(features, params.get("batch_norm", False))
    d_loss = (v1.losses.sigmoid_cross_entropy(tf.ones_like(d_real), d_real)
              + v1.losses.sigmoid_cross_entropy(tf.zeros_like(d_fake), d_fake))
    g_loss = v1.losses.sigmoid_cross_entropy(tf.ones_like(d_fake), d_fake)
    loss = d_loss + g_loss
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"fake": fake})
    if mode != ModeKeys.TRAIN:
        return CSEstimatorSpec(mode, loss=loss)
    d_opt, g_opt = v1.train.AdamOptimizer(1e-2, 0.5), v1.train.AdamOptimizer(1e-2, 0.5)
    step = v1.train.get_or_create_global_step()

    def g_step():
        with tf.control_dependencies(v1.get_collection(v1.GraphKeys.UPDATE_OPS)):
            return g_opt.minimize(g_loss, var_list=g_vars)

    def d_step():
        d_train = d_opt.minimize(d_loss, var_list=d_vars)
        if not params.get("clip"):
            return d_train
        with tf.control_dependencies([d_train]):  # the discriminator clipped after its step
            return tf.group(*[v.assign(tf.clip_by_value(v, -0.1, 0.1)) for v in d_vars])
    alternate = tf.cond(tf.equal(step % 2, 0), d_step, g_step)
    with tf.control_dependencies([alternate]):
        return CSEstimatorSpec(mode, loss=loss, train_op=v1.assign_add(step, 1))


def dqn_polyak_every_2(features, labels, mode, params):
    """A DQN whose target network moves toward the Q network every 2 steps by
    `t.assign_sub(0.1 * (t - o))` under a tf.cond on the step its optimizer incremented."""
    s, a = features[:, :m.STATE], features[:, m.STATE:m.STATE + m.ACTION]
    r, s2 = features[:, m.STATE + m.ACTION:m.STATE + m.ACTION + 1], features[:, -m.STATE:]
    qnet, target = m.dense_stack("q", [16, m.ACTION]), m.dense_stack("qtarget", [16, m.ACTION])
    values = qnet(s)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"q": values})
    q = tf.reduce_sum(values * a, 1, keepdims=True)
    y = tf.stop_gradient(r + 0.9 * tf.reduce_max(target(s2), 1, keepdims=True))
    loss = tf.reduce_mean(tf.square(q - y))
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss)
    step = v1.train.get_or_create_global_step()
    train = v1.train.AdamOptimizer(1e-2).minimize(loss, global_step=step,
                                                  var_list=m.trainable("q"))
    with tf.control_dependencies([train]):
        return CSEstimatorSpec(mode, loss=loss, train_op=tf.cond(
            tf.equal(step % 2, 0), lambda: tf.group(*[
                t.assign_sub(0.1 * (t - o)) for o, t in zip(m.trainable("q"),
                                                            m.trainable("qtarget"))]),
            tf.no_op))
