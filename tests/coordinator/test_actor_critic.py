"""An actor-critic trained in one step (DDPG's shape, unseen14): the critic on its TD-style
loss, the actor on -Q(s, actor(s)), every gradient computed before any update. The actor's
loss reads the critic's output bias in a forward pass its update does not wait for, but
nothing the step runs needs that read (the actor's gradient does not, and model_fn's loss is
the critic's): it trains as TensorFlow trains it. With both minimize calls in one tf.group
the actor's gradient reads the critic's kernel before or after its update, by chance:
refused naming the read."""
import cs_inprocess
import numpy as np
import pytest
import tensorflow as tf

from common.errors import CSRunError
from tf_model.estimator_spec import CSEstimatorSpec

v1 = tf.compat.v1
PARAMS = {"runconfig": {"tf_random_seed": 3}}


def input_fn(params):
    rng = np.random.default_rng(0)
    states = rng.normal(size=(64, 4)).astype(np.float32)
    returns = states[:, :1] * 2 + rng.normal(scale=0.1, size=(64, 1)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((states, returns)).batch(16, drop_remainder=True)


def model_fn(features, labels, mode, params):
    actor = tf.keras.Sequential([tf.keras.layers.Dense(8, activation="relu"),
                                 tf.keras.layers.Dense(2, activation="tanh")], name="actor")
    critic = tf.keras.Sequential([tf.keras.layers.Dense(8, activation="relu"),
                                  tf.keras.layers.Dense(1)], name="critic")
    q_taken = critic(tf.concat([features, tf.zeros([tf.shape(features)[0], 2])], 1))
    critic_loss = v1.losses.mean_squared_error(labels, q_taken)
    actor_loss = -tf.reduce_mean(critic(tf.concat([features, actor(features)], 1)))
    critic_vars = [v for v in v1.trainable_variables() if v.name.startswith("critic/")]
    actor_vars = [v for v in v1.trainable_variables() if v.name.startswith("actor/")]
    critic_opt, actor_opt = v1.train.AdamOptimizer(1e-3), v1.train.AdamOptimizer(1e-3)
    step = v1.train.get_or_create_global_step()
    if params.get("race"):
        train_op = tf.group(critic_opt.minimize(critic_loss, var_list=critic_vars,
                                                global_step=step),
                            actor_opt.minimize(actor_loss, var_list=actor_vars))
    else:
        critic_grads = critic_opt.compute_gradients(critic_loss, var_list=critic_vars)
        actor_grads = actor_opt.compute_gradients(actor_loss, var_list=actor_vars)
        with tf.control_dependencies([g for g, _ in critic_grads + actor_grads]):
            train_op = tf.group(critic_opt.apply_gradients(critic_grads, global_step=step),
                                actor_opt.apply_gradients(actor_grads))
    return CSEstimatorSpec(mode=mode, loss=critic_loss, train_op=train_op)


def test_gradients_before_updates_train_both_networks_like_tensorflow(tmp_path):
    result = cs_inprocess.compare(model_fn, input_fn, PARAMS, str(tmp_path), steps=4)
    cs_inprocess.assert_same_training(result, rtol=1e-5)
    assert len(result.compiled.program.objectives) == 2


def test_both_minimize_calls_in_one_group_race_and_are_refused(tmp_path):
    with pytest.raises(CSRunError) as refused:
        cs_inprocess.compile_checked(model_fn, input_fn, {**PARAMS, "race": True}, str(tmp_path))
    assert "which another loss's optimizer updates in the step, with no order to that update" \
        in refused.value.message
    assert refused.value.hint.startswith("compute every loss's gradients first")


def soft_actor_critic(features, labels, mode, params):
    """SAC's three losses in one step (unseen17): the critic on a target that reads the
    temperature alpha = exp(log_alpha), the actor on alpha-weighted log-probabilities (of a
    Gaussian policy at the returns), the temperature on -log_alpha * stop_gradient(log p +
    target entropy); three Adams, every gradient before any update."""
    actor = tf.keras.Sequential([tf.keras.layers.Dense(8, activation="relu"),
                                 tf.keras.layers.Dense(2)], name="actor")
    critic = tf.keras.Sequential([tf.keras.layers.Dense(8, activation="relu"),
                                  tf.keras.layers.Dense(1)], name="critic")
    log_alpha = v1.get_variable("log_alpha", [], initializer=v1.constant_initializer(np.log(0.2)))
    alpha = tf.exp(log_alpha)
    out = actor(features)
    mean, log_std = out[:, :1], tf.clip_by_value(out[:, 1:], -5.0, 2.0)
    log_p = tf.reduce_sum(-0.5 * tf.square((labels - mean) / tf.exp(log_std)) - log_std, 1)
    q = critic(tf.concat([features, mean], 1))[:, 0]
    target = tf.stop_gradient(labels[:, 0] - alpha * log_p)
    critic_loss = tf.reduce_mean(tf.square(critic(tf.concat([features, labels], 1))[:, 0] - target))
    actor_loss = tf.reduce_mean(tf.stop_gradient(alpha) * log_p - q)
    alpha_loss = -tf.reduce_mean(log_alpha * tf.stop_gradient(log_p - 1.0))
    optimizers = [v1.train.AdamOptimizer(3e-3) for _ in range(3)]
    grads = [optimizers[0].compute_gradients(critic_loss, var_list=v1.trainable_variables("critic")),
             optimizers[1].compute_gradients(actor_loss, var_list=v1.trainable_variables("actor")),
             optimizers[2].compute_gradients(alpha_loss, var_list=[log_alpha])]
    with tf.control_dependencies([g for pairs in grads for g, _ in pairs] + [critic_loss]):
        applies = [o.apply_gradients(pairs) for o, pairs in zip(optimizers, grads)]
    with tf.control_dependencies(applies):
        train_op = v1.assign_add(v1.train.get_or_create_global_step(), 1)
    return CSEstimatorSpec(mode=mode, loss=critic_loss, train_op=train_op)


def test_a_soft_actor_critics_temperature_trains_with_its_own_optimizer_like_tensorflow(tmp_path):
    result = cs_inprocess.compare(soft_actor_critic, input_fn, PARAMS, str(tmp_path), steps=4)
    cs_inprocess.assert_same_training(result, rtol=1e-5)
    assert len(result.compiled.program.objectives) == 3
    assert abs(float(result.cs.state["log_alpha"]) - np.log(0.2)) > 1e-3
