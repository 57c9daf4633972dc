"""Weight penalties in losses minimized in one step (advantage-weighted regression, unseen18):
a value loss and an advantage-weighted behaviour-cloning loss, two optimizers on their own
variable lists, each loss with an L2 penalty on its own network (a Keras kernel_regularizer,
tf.nn.l2_loss on the trunk both heads read). Each penalty belongs to the loss it is added
to: the CS adds it to its weight's gradient in the pass of the loss whose optimizer trains
the weight, and to the loss it reports, with TF's numbers in training and evaluation. A
penalty TF adds to a loss whose optimizer does not train its weight, or one model_fn's loss
leaves out, is refused in one line (one read by another loss in a step that updates the weight
with no order to the read is refused as a race: tests/coordinator/test_actor_critic.py)."""
import inspect

import cs_inprocess
import numpy as np
import pytest
import tensorflow as tf

from common.errors import CSRunError
from tf_model.estimator_spec import CSEstimatorSpec

v1 = tf.compat.v1
PARAMS = {"runconfig": {"tf_random_seed": 5}}


def input_fn(params):
    rng = np.random.default_rng(10)
    states = rng.normal(size=(64, 4)).astype(np.float32)
    actions = np.tanh(states[:, :2]) + rng.normal(scale=0.5, size=(64, 2)).astype(np.float32)
    returns = (1.0 - np.sum((actions - np.tanh(states[:, :2])) ** 2, 1)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices(
        ({"state": states, "action": actions}, returns)).batch(16, drop_remainder=True)


def awr_model_fn(features, labels, mode, params):
    """AWR: the value net (a trunk both heads read, its penalty in the value loss) on the
    returns, the Gaussian policy on exp(advantage)-weighted log-likelihoods with its
    layer's Keras L2; two Momentum optimizers; model_fn returns the sum of both losses."""
    s, a = features["state"], features["action"]
    trunk = tf.keras.layers.Dense(16, activation="relu", name="v_trunk")
    pi_h = tf.keras.layers.Dense(16, activation="tanh", name="pi_h",
                                 kernel_regularizer=tf.keras.regularizers.l2(1e-2))
    h = trunk(s)
    value = tf.squeeze(tf.keras.layers.Dense(1, name="v_out")(h), -1)
    mu = tf.keras.layers.Dense(2, name="pi_mu")(pi_h(tf.concat([s, h], 1)))
    v_loss = 0.5 * tf.reduce_mean(tf.square(labels - value)) \
        + 1e-2 * tf.nn.l2_loss(trunk.kernel)  # value penalty line
    weights = tf.minimum(tf.exp(tf.stop_gradient(labels - value)), 20.0)
    log_p = tf.reduce_sum(-0.5 * tf.square(a - mu), 1)
    pi_loss = -tf.reduce_mean(weights * log_p) + tf.add_n(pi_h.losses)  # policy loss line
    if params.get("elsewhere"):  # the value net's output weight penalized in the policy's loss
        pi_loss += 1e-2 * tf.nn.l2_loss(v1.trainable_variables("v_out")[0])  # elsewhere line
    loss = v_loss + pi_loss
    if mode == "eval":
        return CSEstimatorSpec(mode=mode, loss=loss, eval_metric_ops={
            "value_rmse": v1.metrics.root_mean_squared_error(labels, value),
            "log_p": v1.metrics.mean(log_p)})
    step = v1.train.get_or_create_global_step()
    v_opt = v1.train.MomentumOptimizer(0.05, 0.9)
    pi_opt = v1.train.MomentumOptimizer(0.03, 0.9, use_nesterov=True)
    returned = pi_loss if params.get("policy_loss_only") else loss
    if params.get("elsewhere"):  # every gradient before any update (else the read races)
        v_grads = v_opt.compute_gradients(v_loss, var_list=v1.trainable_variables("v_"))
        pi_grads = pi_opt.compute_gradients(pi_loss, var_list=v1.trainable_variables("pi_"))
        with tf.control_dependencies([g for g, _ in v_grads + pi_grads] + [loss]):
            train_op = tf.group(v_opt.apply_gradients(v_grads, global_step=step),
                                pi_opt.apply_gradients(pi_grads))
        return CSEstimatorSpec(mode=mode, loss=returned, train_op=train_op)
    train_op = tf.group(v_opt.minimize(v_loss, var_list=v1.trainable_variables("v_"),
                                       global_step=step),
                        pi_opt.minimize(pi_loss, var_list=v1.trainable_variables("pi_")))
    return CSEstimatorSpec(mode=mode, loss=returned, train_op=train_op)


def test_each_losss_penalty_trains_and_evaluates_like_tensorflow(tmp_path):
    result = cs_inprocess.compare(awr_model_fn, input_fn, PARAMS, str(tmp_path), steps=4)
    cs_inprocess.assert_same_training(result, rtol=1e-5)
    assert len(result.compiled.program.objectives) == 2
    regularized = {p.variable for k in result.compiled.program.kernels for p in k.params
                   if p.regularizers}
    assert regularized == {"v_trunk/kernel", "pi_h/kernel"}
    assert cs_inprocess.evaluation_mismatch(awr_model_fn, input_fn, PARAMS, str(tmp_path),
                                            result) == ""


def _line(fragment: str) -> int:
    lines = inspect.getsource(inspect.getmodule(_line)).splitlines()
    return next(i for i, s in enumerate(lines) if fragment in s) + 1


@pytest.mark.parametrize("params, start, line", [
    ({"elsewhere": True}, "a weight penalty on v_out/kernel in a loss of several minimized in "
     "one step whose optimizer does not train v_out/kernel", "elsewhere line"),
    ({"policy_loss_only": True}, "model_fn's loss holds other weight penalties than the losses "
     "minimized in one step", "policy loss line"),
], ids=["penalty_in_another_loss", "penalty_not_reported"])
def test_a_penalty_the_cs_cannot_carry_is_refused_in_one_line(params, start, line, tmp_path):
    with pytest.raises(CSRunError) as refused:
        cs_inprocess.compile_checked(awr_model_fn, input_fn, {**PARAMS, **params}, str(tmp_path))
    assert refused.value.message.count("\n") == 0 and start in refused.value.message
    assert f"test_objective_penalties.py:{_line(f'# {line}')}" in refused.value.message
