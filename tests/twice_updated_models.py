"""Models whose weights two optimizers update in one step, written the usual ways: an
adversarial autoencoder (reconstruction Adam on the encoder and decoder, the
discriminator's Adam, the generator's Adam on the encoder again) chained with
tf.control_dependencies; a GAN whose generator is the autoencoder's decoder (a shared
trunk), grouped; a two-task model whose tasks' optimizers both update the shared
embedding table and body; a sequential chain of two optimizers over overlapping var_lists;
and what the CS refuses: FTRL grouped beside an SGD on one weight (no order: TF's result
depends on the executor's), the GAN's three optimizers grouped (a read of the decoder no
update of it waits for)."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

L, v1 = tf.keras.layers, tf.compat.v1
VOCAB = 40


def digits_input_fn(params):
    rng = np.random.default_rng(11)
    x = rng.random(size=(64, 24)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((x, x)).repeat().batch(16, drop_remainder=True)


def _named(prefix: str) -> list:
    return [v for v in v1.trainable_variables() if v.name.startswith(prefix)]


def aae_chained(features, labels, mode, params):
    """The AAE's three phases in one step: reconstruction, then the discriminator, then the
    encoder as the generator, each minimize under tf.control_dependencies of the last."""
    h = L.Dense(16, activation="relu", name="enc_h")(features)
    z = L.Dense(4, name="enc_z")(h)
    recon = L.Dense(24, activation="sigmoid", name="dec")(z)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"code": z, "recon": recon})
    recon_loss = v1.losses.mean_squared_error(labels, recon)
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=recon_loss)
    disc_h = L.Dense(8, activation="relu", name="disc_h")
    disc_o = L.Dense(1, name="disc_o")
    d_fake = disc_o(disc_h(z))
    d_real = disc_o(disc_h(tf.random.normal(tf.shape(z))))
    critic = v1.losses.sigmoid_cross_entropy(tf.ones_like(d_real), d_real) + \
        v1.losses.sigmoid_cross_entropy(tf.zeros_like(d_fake), d_fake)
    generator = v1.losses.sigmoid_cross_entropy(tf.ones_like(d_fake), d_fake)
    step = v1.train.get_or_create_global_step()
    ae_train = v1.train.AdamOptimizer(1e-2).minimize(
        recon_loss, var_list=_named("enc") + _named("dec"), global_step=step)
    with tf.control_dependencies([ae_train]):
        d_train = v1.train.AdamOptimizer(1e-2, beta1=0.5).minimize(critic,
                                                                   var_list=_named("disc"))
    with tf.control_dependencies([d_train]):
        g_train = v1.train.AdamOptimizer(1e-2, beta1=0.5).minimize(  # generator line
            generator, var_list=_named("enc"))
    return CSEstimatorSpec(mode, loss=recon_loss, train_op=g_train)


def vaegan_trunk(features, labels, mode, params):
    """An autoencoder whose decoder is a GAN's generator (the noise drawn in model_fn): the
    discriminator's Adam steps first, then the reconstruction's Adam on the encoder and
    decoder, then the generator's Adam on the decoder again, chained by
    tf.control_dependencies (`grouped`: one tf.group, refused: the reconstruction's
    gradient reads the decoder with no order to the generator's update of it)."""
    decoder_h = L.Dense(16, activation="relu", name="dec_h")
    decoder_o = L.Dense(24, activation="sigmoid", name="dec_o")
    z = L.Dense(4, activation="tanh", name="enc")(features)
    recon = decoder_o(decoder_h(z))  # reconstruction line
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"recon": recon})
    recon_loss = v1.losses.mean_squared_error(labels, recon)
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=recon_loss)
    fake = decoder_o(decoder_h(tf.random.uniform(tf.shape(z), -1.0, 1.0)))
    critic_h = L.Dense(8, activation="relu", name="critic_h")
    critic_o = L.Dense(1, name="critic_o")
    d_real, d_fake = critic_o(critic_h(features)), critic_o(critic_h(fake))
    d_loss = tf.reduce_mean(tf.nn.softplus(-d_real)) + tf.reduce_mean(tf.nn.softplus(d_fake))
    g_loss = tf.reduce_mean(tf.nn.softplus(-d_fake))
    d_opt, ae_opt = v1.train.AdamOptimizer(5e-3, beta1=0.5), v1.train.AdamOptimizer(5e-3)
    g_opt, step = v1.train.AdamOptimizer(5e-3, beta1=0.5), v1.train.get_or_create_global_step()
    if params.get("grouped"):
        return CSEstimatorSpec(mode, loss=recon_loss, train_op=tf.group(
            ae_opt.minimize(recon_loss, var_list=_named("enc") + _named("dec"), global_step=step),
            d_opt.minimize(d_loss, var_list=_named("critic")),
            g_opt.minimize(g_loss, var_list=_named("dec"))))  # grouped generator line
    d_train = d_opt.minimize(d_loss, var_list=_named("critic"))
    with tf.control_dependencies([d_train]):
        ae_train = ae_opt.minimize(recon_loss, var_list=_named("enc") + _named("dec"),
                                   global_step=step)
    with tf.control_dependencies([ae_train]):
        g_train = g_opt.minimize(g_loss, var_list=_named("dec"))
    return CSEstimatorSpec(mode, loss=recon_loss, train_op=g_train)


def tasks_input_fn(params):
    rng = np.random.default_rng(12)
    n = 64
    ids = rng.integers(0, VOCAB, size=(n, 3)).astype(np.int32)
    click = (rng.random(n) < 0.4).astype(np.float32)
    rating = rng.normal(size=n).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((ids, {"click": click, "rating": rating})) \
        .repeat().batch(16, drop_remainder=True)


def two_tasks(features, labels, mode, params):
    """A shared embedding table and body, a click head and a rating head, each task trained
    by its own optimizer over the shared weights and its head (Adagrad-style sparse table
    updates from both); one tf.group, or the rating task's under the click task's
    control dependencies (`chained`)."""
    table = L.Embedding(VOCAB, 6, name="shared_embedding")
    body = L.Dense(8, activation="relu", name="shared_body")(
        tf.reshape(table(features), [-1, 18]))
    click = tf.squeeze(L.Dense(1, name="click_head")(body), 1)
    rating = tf.squeeze(L.Dense(1, name="rating_head")(body), 1)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"click": tf.sigmoid(click), "rating": rating})
    click_loss = v1.losses.sigmoid_cross_entropy(labels["click"], click)
    rating_loss = v1.losses.mean_squared_error(labels["rating"], rating)
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=click_loss + rating_loss)
    shared = _named("shared")
    click_train = v1.train.AdamOptimizer(1e-2).minimize(
        click_loss, var_list=shared + _named("click"),
        global_step=v1.train.get_or_create_global_step())
    rating_opt = v1.train.MomentumOptimizer(0.05, 0.9)
    if params.get("chained"):
        with tf.control_dependencies([click_train]):
            train_op = rating_opt.minimize(rating_loss, var_list=shared + _named("rating"))
    else:
        train_op = tf.group(click_train, rating_opt.minimize(
            rating_loss, var_list=shared + _named("rating")))
    return CSEstimatorSpec(mode, loss=click_loss + rating_loss, train_op=train_op)


def sequential_chain(features, labels, mode, params):
    """`opt.minimize(l1)`, then under tf.control_dependencies `opt2.minimize(l2)` over an
    overlapping var_list: a trunk two heads read, SGD on the first head's loss and RMSProp on
    the second's (`ftrl`: an FTRL grouped beside the first instead; `recomputed`: the second
    loss computed anew under the control dependencies, from the updated trunk; `penalized`:
    an L2 penalty on the trunk's kernel in the first loss)."""
    trunk_layer = L.Dense(12, activation="tanh", name="trunk", kernel_regularizer=(
        tf.keras.regularizers.L2(1e-3) if params.get("penalized") else None))
    head_b = L.Dense(24, name="head_b")
    trunk = trunk_layer(features)
    first = L.Dense(24, name="head_a")(trunk)
    second = head_b(trunk)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"a": first, "b": second})
    l1 = v1.losses.mean_squared_error(labels, first)
    if trunk_layer.losses:
        l1 += tf.add_n(trunk_layer.losses)
    l2 = v1.losses.absolute_difference(labels, second)
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=l1 + l2)
    step = v1.train.get_or_create_global_step()
    a_vars, b_vars = _named("trunk") + _named("head_a"), _named("trunk") + _named("head_b")
    if params.get("ftrl"):
        return CSEstimatorSpec(mode, loss=l1 + l2, train_op=tf.group(
            v1.train.GradientDescentOptimizer(0.1).minimize(l1, var_list=a_vars,
                                                            global_step=step),
            v1.train.FtrlOptimizer(0.1).minimize(l2, var_list=b_vars)))  # ftrl line
    first_train = v1.train.GradientDescentOptimizer(0.1).minimize(l1, var_list=a_vars,
                                                                  global_step=step)
    with tf.control_dependencies([first_train]):
        if params.get("recomputed"):  # (the second loss from the updated trunk)
            l2 = v1.losses.absolute_difference(labels, head_b(trunk_layer(features)))
        train_op = v1.train.RMSPropOptimizer(1e-2).minimize(l2, var_list=b_vars)
    return CSEstimatorSpec(mode, loss=l1 + l2, train_op=train_op)
