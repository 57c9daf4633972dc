"""Models that transform their gradients between compute_gradients and apply_gradients,
written the way users write them: gradient centralization (g minus its mean over every axis
but the last, unseen20's eca_net; also before tf.clip_by_global_norm), adaptive gradient
clipping (NFNets' unit-wise ||g|| / ||w|| clipped by tf.where), signSGD with a learning
rate multiplier per layer (by variable name), a finite guard
tf.where(tf.math.is_finite(g), g, tf.zeros_like(g)) with pruning masks (a mask variable, a
mask of the weight's magnitude) and multipliers in a variable only the transform reads, and
transforms the CS refuses: one reading the loss, another variable's gradient, the global
step, or gradient noise."""
from __future__ import annotations

import tensorflow as tf
from weight_decay_models import CLASSES, FEATURES, HIDDEN, image_input_fn, input_fn

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

__all__ = ["input_fn", "image_input_fn", "centralized_cnn", "agc_mlp", "sign_sgd_layerwise",
           "finite_pruned_mlp", "scaled_by_loss", "normalized_by_other_gradient",
           "warmed_up_gradients", "noisy_gradients"]
v1 = tf.compat.v1


def _spec(mode, logits, labels, transform, optimizer):
    """The spec of a classifier whose gradients `transform((g, v), loss, gvs)` changes."""
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode=mode, predictions={"probs": tf.nn.softmax(logits)})
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode=mode, loss=loss, eval_metric_ops={
            "accuracy": v1.metrics.accuracy(labels, tf.argmax(logits, 1))})
    gvs = optimizer.compute_gradients(loss)
    gvs = transform(gvs, loss)
    train_op = optimizer.apply_gradients(gvs, global_step=v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op)


def _centralized(gvs, loss):
    out = []
    for g, v in gvs:
        if g is not None and len(g.shape) > 1:  # gradient centralization
            g = g - tf.reduce_mean(g, axis=list(range(len(g.shape) - 1)), keepdims=True)
        out.append((g, v))
    return out


def centralized_cnn(features, labels, mode, params):
    h = tf.keras.layers.Conv2D(4, 3, padding="same", use_bias=False, name="conv0")(features)
    h = tf.nn.relu(h)
    logits = tf.keras.layers.Dense(CLASSES, name="fc")(
        tf.keras.layers.GlobalAveragePooling2D()(h))

    def transform(gvs, loss):
        gvs = _centralized(gvs, loss)
        if params.get("clip"):
            grads, norm = tf.clip_by_global_norm([g for g, _ in gvs], params["clip"])
            gvs = list(zip(grads, [v for _, v in gvs]))
        return gvs
    return _spec(mode, logits, labels, transform, v1.train.MomentumOptimizer(0.1, 0.9,
                                                                             use_nesterov=True))


def _unitwise_norm(x):
    """NFNets' AGC: the norm per output unit (over every axis but the last)."""
    if len(x.shape) <= 1:
        return tf.sqrt(tf.reduce_sum(tf.square(x)))
    return tf.sqrt(tf.reduce_sum(tf.square(x), axis=list(range(len(x.shape) - 1)),
                                 keepdims=True))


def agc_mlp(features, labels, mode, params):
    h = tf.keras.layers.Dense(HIDDEN, activation="relu", name="hidden")(features)
    logits = tf.keras.layers.Dense(CLASSES, name="head")(h)

    clip, eps = params.get("agc", 0.01), 1e-3

    def transform(gvs, loss):
        out = []
        for g, v in gvs:
            max_norm = tf.maximum(_unitwise_norm(v), eps) * clip
            grad_norm = _unitwise_norm(g)
            clipped = g * (max_norm / tf.maximum(grad_norm, 1e-6))
            out.append((tf.where(grad_norm > max_norm, clipped, g), v))
        return out
    return _spec(mode, logits, labels, transform, v1.train.MomentumOptimizer(0.05, 0.9))


def sign_sgd_layerwise(features, labels, mode, params):
    h = tf.keras.layers.Dense(HIDDEN, activation="tanh", name="body")(features)
    logits = tf.keras.layers.Dense(CLASSES, name="head")(h)

    def transform(gvs, loss):
        return [(tf.sign(g) * (0.1 if v.name.startswith("head") else 1.0), v) for g, v in gvs]
    return _spec(mode, logits, labels, transform, v1.train.GradientDescentOptimizer(0.01))


def finite_pruned_mlp(features, labels, mode, params):
    kernel = v1.get_variable("hidden_kernel", [FEATURES, HIDDEN])
    mask = v1.get_variable("hidden_mask", [FEATURES, HIDDEN], trainable=False,
                           initializer=v1.initializers.random_uniform(0.0, 2.0))
    binary = tf.cast(mask > 0.5, tf.float32)
    h = tf.nn.relu(tf.matmul(features, kernel * binary))
    logits = tf.keras.layers.Dense(CLASSES, name="head")(h)
    multiplier = v1.get_variable("bias_multiplier", [CLASSES], trainable=False,  # (only the
                                 initializer=v1.initializers.random_uniform(0.0, 1.0))  # transform reads it)

    def transform(gvs, loss):
        out = []
        for g, v in gvs:
            g = tf.where(tf.math.is_finite(g), g, tf.zeros_like(g))
            if v is kernel:
                g = g * binary  # pruned weights stay pruned
            elif len(v.shape) > 1:  # magnitude pruning: the smallest weights do not move
                g = g * tf.cast(tf.abs(v) > 0.05, tf.float32)
            else:  # a learning rate per element
                g = g * multiplier
            out.append((g, v))
        return out
    return _spec(mode, logits, labels, transform, v1.train.AdamOptimizer(0.01))


def _mlp(features):
    h = tf.keras.layers.Dense(HIDDEN, activation="relu", name="hidden")(features)
    return tf.keras.layers.Dense(CLASSES, name="head")(h)


def scaled_by_loss(features, labels, mode, params):
    """A transform reading a value of the batch (the loss): refused."""
    return _spec(mode, _mlp(features), labels,
                 lambda gvs, loss: [(g / (loss + 1.0), v) for g, v in gvs],
                 v1.train.GradientDescentOptimizer(0.1))


def normalized_by_other_gradient(features, labels, mode, params):
    """A transform reading another variable's gradient: refused."""
    def transform(gvs, loss):
        first = gvs[0][0]
        return [(g / (tf.norm(first) + 1.0) if g is not first else g, v) for g, v in gvs]
    return _spec(mode, _mlp(features), labels, transform, v1.train.GradientDescentOptimizer(0.1))


def warmed_up_gradients(features, labels, mode, params):
    """A transform reading the global step (gradients scaled up over 10 steps): refused."""
    def transform(gvs, loss):
        step = tf.cast(v1.train.get_or_create_global_step(), tf.float32)
        return [(g * tf.minimum(1.0, (step + 1.0) / 10.0), v) for g, v in gvs]
    return _spec(mode, _mlp(features), labels, transform, v1.train.GradientDescentOptimizer(0.1))


def noisy_gradients(features, labels, mode, params):
    """Gradient noise (tf.random.normal added to each gradient): refused."""
    return _spec(mode, _mlp(features), labels,
                 lambda gvs, loss: [(g + tf.random.normal(g.shape, stddev=0.01), v)
                                    for g, v in gvs],
                 v1.train.GradientDescentOptimizer(0.1))
