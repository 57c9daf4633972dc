"""Models training several optimizers in one step the way users write them: DLRM's recipe
(Adagrad on the embedding tables, SGD with a linear warmup on the MLPs), two SGDs each on
its own decay, an Adam beside an AdamW on a decay, an adversarial autoencoder with one Adam on reconstruction + w * adversarial
beside its discriminator's Adam (a prior drawn in model_fn), and the AAE of three Adams whose
encoder two of them update (test_twice_updated_weights.py)."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from examples.modelzoo_adamw import AdamWOptimizer
from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

L, v1 = tf.keras.layers, tf.compat.v1
VOCABS = (30, 20)


def ctr_input_fn(params):
    rng = np.random.default_rng(4)
    n = 64
    dense = rng.normal(size=(n, 6)).astype(np.float32)
    sparse = np.stack([rng.integers(0, v, n) for v in VOCABS], 1).astype(np.int32)
    labels = (rng.random(n) < 0.3).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices(({"dense": dense, "sparse": sparse}, labels)) \
        .repeat().batch(16, drop_remainder=True)


def dlrm(features, labels, mode, params):
    """Bottom MLP, embedding tables, dot interactions, top MLP; Adagrad on the tables and an
    SGD whose learning rate warms up linearly on the MLPs (one train_op)."""
    bottom = L.Dense(8, activation="relu", name="bottom0")(features["dense"])
    bottom = L.Dense(4, activation="relu", name="bottom1")(bottom)
    embs = [L.Embedding(v, 4, name=f"embedding_{i}")(features["sparse"][:, i])
            for i, v in enumerate(VOCABS)]
    t = tf.stack([bottom, *embs], 1)
    z = tf.reshape(tf.matmul(t, t, transpose_b=True), [-1, 9])
    interactions = tf.gather(z, [3, 6, 7], axis=1)  # (the strictly lower triangle)
    hidden = L.Dense(8, activation="relu", name="top0")(tf.concat([bottom, interactions], 1))
    logit = tf.squeeze(L.Dense(1, name="top1")(hidden), 1)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"ctr": tf.sigmoid(logit)})
    loss = v1.losses.sigmoid_cross_entropy(labels, logit)
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss, eval_metric_ops={
            "accuracy": v1.metrics.accuracy(labels, tf.cast(logit > 0, tf.float32))})
    tables = [v for v in v1.trainable_variables() if "embedding_" in v.name]
    mlps = [v for v in v1.trainable_variables() if "embedding_" not in v.name]
    step = v1.train.get_or_create_global_step()
    warmup = params["mlp_lr"] * tf.minimum(1.0, (tf.cast(step, tf.float32) + 1.0) / 3.0)
    train_op = tf.group(
        v1.train.GradientDescentOptimizer(warmup).minimize(loss, var_list=mlps, global_step=step),
        v1.train.AdagradOptimizer(0.05, initial_accumulator_value=0.01).minimize(
            loss, var_list=tables))
    return CSEstimatorSpec(mode, loss=loss, train_op=train_op)


def digits_input_fn(params):
    rng = np.random.default_rng(6)
    x = rng.random(size=(64, 32)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((x, x)).repeat().batch(16, drop_remainder=True)


def _autoencoder(train_op_fn):
    """The model_fn of an autoencoder (a Dense encoder and decoder reconstructing the input)
    whose train_op train_op_fn(loss, the encoder's variables, the decoder's, params) builds
    (named and documented as train_op_fn; not functools.wraps, whose __wrapped__ signature
    model_fn's caller would read)."""
    def model_fn(features, labels, mode, params):
        z = L.Dense(8, activation="relu", name="encoder")(features)
        recon = L.Dense(32, name="decoder")(z)
        if mode == ModeKeys.PREDICT:
            return CSEstimatorSpec(mode, predictions={"recon": recon})
        loss = v1.losses.mean_squared_error(labels, recon)
        if mode == ModeKeys.EVAL:
            return CSEstimatorSpec(mode, loss=loss)
        encoder = [v for v in v1.trainable_variables() if v.name.startswith("encoder")]
        decoder = [v for v in v1.trainable_variables() if v.name.startswith("decoder")]
        return CSEstimatorSpec(mode, loss=loss,
                               train_op=train_op_fn(loss, encoder, decoder, params))
    model_fn.__name__, model_fn.__doc__ = train_op_fn.__name__, train_op_fn.__doc__
    return model_fn


@_autoencoder
def two_decays(loss, encoder, decoder, params):
    """An autoencoder whose encoder and decoder are trained by SGDs decayed apart."""
    step = v1.train.get_or_create_global_step()
    slow = v1.train.exponential_decay(0.5, step, 2, 0.5)
    fast = v1.train.polynomial_decay(1.0, step, 8, 0.1)  # fast line
    if params.get("racing"):  # (the decoder's SGD reads the step its encoder's increments)
        return tf.group(
            v1.train.GradientDescentOptimizer(slow).minimize(loss, var_list=encoder,
                                                             global_step=step),
            v1.train.GradientDescentOptimizer(fast).minimize(loss, var_list=decoder))
    updates = [v1.train.GradientDescentOptimizer(slow).minimize(loss, var_list=encoder),
               v1.train.GradientDescentOptimizer(fast).minimize(loss, var_list=decoder)]
    with tf.control_dependencies(updates):
        return step.assign_add(1)


@_autoencoder
def adamw_decoder(loss, encoder, decoder, params):
    """An autoencoder whose encoder an Adam trains and whose decoder an AdamW (its rate
    decayed, no decay of the bias); the step counted after both."""
    step = v1.train.get_or_create_global_step()
    adamw = AdamWOptimizer(v1.train.exponential_decay(0.01, step, 2, 0.5),
                           weight_decay_rate=0.1, exclude_from_weight_decay=["bias"])
    updates = [v1.train.AdamOptimizer(0.02).minimize(loss, var_list=encoder),
               adamw.minimize(loss, var_list=decoder)]
    with tf.control_dependencies(updates):
        return step.assign_add(1)


def _aae(features, params):
    """Encoder, decoder, and a latent discriminator of the codes against a Gaussian prior."""
    z = L.Dense(4, name="encoder")(L.Dense(16, activation="relu", name="enc_h")(features))
    recon = L.Dense(32, activation="sigmoid", name="decoder")(z)
    disc_h = L.Dense(8, activation="relu", name="disc_h")
    disc_o = L.Dense(1, name="disc_o")
    d_fake = disc_o(disc_h(z))
    d_real = disc_o(disc_h(tf.random.normal(tf.shape(z), stddev=1.0)))
    recon_loss = v1.losses.mean_squared_error(features, recon)
    adversarial = v1.losses.sigmoid_cross_entropy(tf.ones_like(d_fake), d_fake)
    critic = v1.losses.sigmoid_cross_entropy(tf.ones_like(d_real), d_real) + \
        v1.losses.sigmoid_cross_entropy(tf.zeros_like(d_fake), d_fake)
    return recon, recon_loss, adversarial, critic


def aae_weighted(features, labels, mode, params):
    """One Adam on recon + 0.1 * adversarial for the encoder and decoder, one for the
    discriminator; model_fn reports the reconstruction loss."""
    recon, recon_loss, adversarial, critic = _aae(features, params)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"recon": recon})
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=recon_loss)
    autoencoder = [v for v in v1.trainable_variables() if not v.name.startswith("disc")]
    discriminator = [v for v in v1.trainable_variables() if v.name.startswith("disc")]
    return CSEstimatorSpec(mode, loss=recon_loss, train_op=tf.group(
        v1.train.AdamOptimizer(1e-2).minimize(recon_loss + 0.1 * adversarial,
                                              var_list=autoencoder,
                                              global_step=v1.train.get_or_create_global_step()),
        v1.train.AdamOptimizer(1e-2, beta1=0.5).minimize(critic, var_list=discriminator)))


def aae_three_adams(features, labels, mode, params):
    """The reference AAE: reconstruction Adam (encoder, decoder), discriminator Adam, and the
    generator's Adam on the encoder again; all gradients from one forward pass."""
    recon, recon_loss, adversarial, critic = _aae(features, params)
    autoencoder = [v for v in v1.trainable_variables() if not v.name.startswith("disc")]
    encoder = [v for v in autoencoder if v.name.startswith("enc")]
    discriminator = [v for v in v1.trainable_variables() if v.name.startswith("disc")]
    return CSEstimatorSpec(mode, loss=recon_loss + critic, train_op=tf.group(
        v1.train.AdamOptimizer(1e-2).minimize(recon_loss, var_list=autoencoder,
                                              global_step=v1.train.get_or_create_global_step()),
        v1.train.AdamOptimizer(1e-2, beta1=0.5).minimize(critic, var_list=discriminator),
        v1.train.AdamOptimizer(1e-2, beta1=0.5).minimize(adversarial,
                                                         var_list=encoder)))
