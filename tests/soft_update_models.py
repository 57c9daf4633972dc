"""Target networks updated by Polyak averaging (soft updates), written the way users write
them: a DDPG-like actor-critic of Keras layers whose TD target reads target networks moved
toward the trained ones after both optimizers' updates (`v1.assign(t, 0.99 * t + 0.01 * o)`,
`t.assign(tau * o + (1 - tau) * t)`, `t.assign_sub((1 - decay) * (t - o))`,
`t.assign_add(tau * (o - t))`, tau a constant or a schedule of the global step, or before
the updates), a BYOL-style momentum encoder with a cosine-similarity loss, and what cannot
be ordered (a soft update with no order to the optimizer's update or to the forward pass's
reads of the target), and a DQN's hard copy every 2 steps under tf.cond."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

v1 = tf.compat.v1
STATE, ACTION = 6, 2


def transitions_input_fn(params):
    """(s, a, r, s') transitions of a small linear system."""
    batch = params.get("batch_size", 8)
    rng = np.random.default_rng(21)
    n = 8 * batch
    s = rng.normal(size=(n, STATE))
    a = np.tanh(rng.normal(size=(n, ACTION)))
    s2 = 0.9 * s + 0.1 * np.concatenate([a, a, a], 1)
    r = -(s[:, :2] ** 2).sum(1, keepdims=True)
    x = np.concatenate([s, a, r, s2], 1).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((x, r.astype(np.float32))).batch(
        batch, drop_remainder=True)


def dense_stack(prefix, sizes, last=None):
    """Keras Dense layers named prefix_<i>, applied in turn."""
    layers = [tf.keras.layers.Dense(n, activation="relu" if i < len(sizes) - 1 else last,
                                    name=f"{prefix}_{i}") for i, n in enumerate(sizes)]

    def apply(x):
        for layer in layers:
            x = layer(x)
        return x
    return apply


def trainable(prefix):
    """The v1 trainable variables of the layers named prefix_<i> (Keras 3's variables are
    no var_list of a v1 optimizer)."""
    return [v for v in v1.trainable_variables() if v.name.startswith(prefix + "_")]


def soft_updates(online, target, params, step):
    """The soft updates of `target` toward `online`, in the form params['form'] names."""
    tau = (v1.train.exponential_decay(0.05, step, 2, 0.5, staircase=True)
           if params.get("schedule") else params.get("tau", 0.01))
    return [soft_write(o, t, params.get("form", "mix"), tau)
            for o, t in zip(trainable(online), trainable(target))]


def soft_write(o, t, form, tau):
    """t's soft update toward o, written in `form`."""
    if form == "tau":
        return t.assign(tau * o + (1 - tau) * t)
    if form == "sub":
        decay = 1 - tau
        return t.assign_sub((1 - decay) * (t - o))
    if form == "add":
        return t.assign_add(tau * (o - t))
    return v1.assign(t, (1 - tau) * t + tau * o)


def ddpg(features, labels, mode, params):
    s, a = features[:, :STATE], features[:, STATE:STATE + ACTION]
    r, s2 = features[:, STATE + ACTION:STATE + ACTION + 1], features[:, -STATE:]
    actor, critic = dense_stack("actor", [16, ACTION], "tanh"), dense_stack("critic", [16, 1])
    target_actor, target_critic = dense_stack("tactor", [16, ACTION], "tanh"), dense_stack("tcritic", [16, 1])
    mu, q = actor(s), critic(tf.concat([s, a], 1))
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"action": mu, "q": q})
    q_targ = target_critic(tf.concat([s2, target_actor(s2)], 1))
    y = tf.stop_gradient(r + 0.9 * q_targ)
    critic_loss = tf.reduce_mean(tf.square(q - y))
    actor_loss = -tf.reduce_mean(critic(tf.concat([s, mu], 1)))
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=critic_loss, eval_metric_ops={
            "q_mean": v1.metrics.mean(q), "target_q": v1.metrics.mean(q_targ)})
    step = v1.train.get_or_create_global_step()
    c_opt, a_opt = v1.train.AdamOptimizer(1e-2), v1.train.AdamOptimizer(1e-2)
    c_gv = c_opt.compute_gradients(critic_loss, var_list=trainable("critic"))
    a_gv = a_opt.compute_gradients(actor_loss, var_list=trainable("actor"))
    grads = [g for g, _ in c_gv + a_gv]
    if params.get("soft_first"):  # after the forward pass, before the updates
        with tf.control_dependencies([] if params["soft_first"] == "unwaited" else grads):
            soft = tf.group(*soft_updates("actor", "tactor", params, step),
                            *soft_updates("critic", "tcritic", params, step))
        with tf.control_dependencies([soft]):
            train_op = tf.group(c_opt.apply_gradients(c_gv, global_step=step),
                                a_opt.apply_gradients(a_gv))
        return CSEstimatorSpec(mode, loss=critic_loss, train_op=train_op)
    with tf.control_dependencies(grads):
        c_step = c_opt.apply_gradients(c_gv, global_step=step)
        a_step = a_opt.apply_gradients(a_gv)
    if params.get("unordered"):  # no order to the updates: TF reads o before or after
        soft = soft_updates("actor", "tactor", params, step) + soft_updates("critic", "tcritic", params, step)
        return CSEstimatorSpec(mode, loss=critic_loss, train_op=tf.group(c_step, a_step, *soft))
    if params.get("decay"):  # decoupled weight decay by hand of the actor, then the soft update
        with tf.control_dependencies([c_step, a_step]):
            decay = tf.group(*[v.assign(v * 0.999) for v in trainable("actor")])
        c_step = a_step = decay
    with tf.control_dependencies([c_step, a_step]):
        soft = soft_updates("actor", "tactor", params, step) + soft_updates("critic", "tcritic", params, step)
    return CSEstimatorSpec(mode, loss=critic_loss, train_op=tf.group(*soft))


def features_input_fn(params):
    """Vectors of 8 values (no labels)."""
    batch = params.get("batch_size", 8)
    x = np.random.default_rng(22).normal(size=(8 * batch, 8)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((x, np.zeros((8 * batch, 1), np.float32))).batch(
        batch, drop_remainder=True)


def _cosine(p, z):
    return tf.reduce_sum(tf.nn.l2_normalize(p, axis=1) * tf.nn.l2_normalize(z, axis=1), 1)


def byol(features, labels, mode, params):
    """BYOL's momentum encoder: an online encoder and predictor trained to predict a target
    encoder's projection of the other view; the target (applied to both views) is the
    online encoder's moving average."""
    online, predictor = dense_stack("online", [16, 8]), dense_stack("predictor", [8])
    target = dense_stack("target", [16, 8])
    view1, view2 = features * 0.8 + 0.1, features + 0.1 * tf.sin(3.0 * features)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"embedding": online(features)})
    p1, p2 = predictor(online(view1)), predictor(online(view2))
    z1, z2 = tf.stop_gradient(target(view1)), tf.stop_gradient(target(view2))
    loss = tf.reduce_mean(4.0 - 2.0 * _cosine(p1, z2) - 2.0 * _cosine(p2, z1))
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss, eval_metric_ops={
            "similarity": v1.metrics.mean(_cosine(p1, z2))})
    step = v1.train.get_or_create_global_step()
    train = v1.train.MomentumOptimizer(0.05, 0.9).minimize(
        loss, global_step=step, var_list=trainable("online") + trainable("predictor"))
    with tf.control_dependencies([train]):
        momentum = [t.assign(0.9 * t + 0.1 * o)
                    for o, t in zip(trainable("online"), trainable("target"))]
    return CSEstimatorSpec(mode, loss=loss, train_op=tf.group(*momentum))


def dqn_hard_copy(features, labels, mode, params):
    """A DQN whose target network is a hard copy of the Q network every 2 steps;
    params["mixed"]: its layers under mixed_float16."""
    s, a = features[:, :STATE], features[:, STATE:STATE + ACTION]
    r, s2 = features[:, STATE + ACTION:STATE + ACTION + 1], features[:, -STATE:]
    if params.get("mixed"):
        tf.keras.mixed_precision.set_global_policy("mixed_float16")
    layers = dense_stack("q", [16, ACTION]), dense_stack("qtarget", [16, ACTION])
    tf.keras.mixed_precision.set_global_policy("float32")  # (the layers keep theirs)
    qnet, target = ((lambda x, net=net: tf.cast(net(x), tf.float32)) for net in layers)
    values = qnet(s)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"q": values})
    q = tf.reduce_sum(values * tf.one_hot(tf.argmax(a, 1), ACTION), 1, keepdims=True)
    y = tf.stop_gradient(r + 0.9 * tf.reduce_max(
        (qnet if params.get("target_unread") else target)(s2), 1, keepdims=True))
    if params.get("target_unread"):  # (the target network built, read by nothing)
        target(s2)
    loss = tf.reduce_mean(tf.square(q - y))
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss, eval_metric_ops={"q_mean": v1.metrics.mean(q)})
    step = v1.train.get_or_create_global_step()
    train = v1.train.GradientDescentOptimizer(0.1).minimize(
        loss, global_step=step, var_list=trainable("q"))

    def copy():
        copies = [t.assign(o) for o, t in zip(trainable("q"), trainable("qtarget"))]
        if params.get("both_branches"):  # a write in the other branch too
            return tf.group(*copies[1:]), tf.group(copies[0])
        return tf.group(*copies)
    if params.get("unordered"):  # no order to the update: TF reads q before or after
        return CSEstimatorSpec(mode, loss=loss, train_op=tf.group(
            train, tf.cond(tf.equal(step % 2, 0), copy, tf.no_op)))
    with tf.control_dependencies([train]):
        if params.get("both_branches"):
            copied = tf.cond(tf.equal(step % 2, 0), lambda: copy()[0], lambda: copy()[1])
        else:
            copied = tf.cond(tf.equal(step % 2, 0), copy, tf.no_op)
    return CSEstimatorSpec(mode, loss=loss, train_op=copied)
