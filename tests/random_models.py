"""Random small Estimator-style models, written the way users write them (Keras layers,
raw tf ops, tf.compat.v1 losses and optimizers), for the differential test.

A `ModelSpec` (drawn by `model_specs()`, a hypothesis strategy) names an input, an optional
BatchNormalization in training (Keras or tf.nn.moments), a few blocks, maybe a weight read
twice or through a view (a layer called twice, a strided slice of a weight, a tied
transposed weight) or computed on before it meets the samples (weight normalization, a
normalised weight read raw too with a learned temperature), a head with its loss, an optimizer
(tf.compat.v1.train's, the modelzoo's AdamW) with a learning-rate schedule (often constant),
a gradient transform between compute_gradients and apply_gradients (clipping an embedding
table's sparse gradient too, with tokens; gradient centralization, adaptive clipping), an optional var_list subset, an optional L2
term and the replicas the CS trains it on (multireplica); `model_fn` and `input_fn` build it
from `params["spec"]`. The ops are created on the lines of this file, so a refusal must name
one of them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import tensorflow as tf
from hypothesis import strategies as st

from examples.modelzoo_adamw import AdamWOptimizer
from tf_model.estimator_spec import CSEstimatorSpec

BATCH = 8
STEPS = 10
WIDTH = 8
CLASSES = 3
VOCAB = 11

INPUTS = ("vector", "int_vector", "image", "tokens")
BLOCKS = ("dense:relu", "dense:tanh", "dense:sigmoid", "dense:gelu", "dense:none", "matmul",
          "unary:tanh", "unary:square", "unary:abs", "unary:neg", "unary:softplus",
          "unary:log1p_abs", "unary:exp_neg_square", "unary:sqrt", "unary:rsqrt",
          "const_affine", "broadcast", "maximum", "minimum", "softsign_by_hand", "select",
          "residual", "concat", "layer_norm", "layer_norm_by_hand", "gelu_exact", "gelu_tanh",
          "dropout0", "softmax", "attention", "reduce", "transpose", "dense_rank3",
          "conv_transpose", "depthwise", "separable", "dilated", "upsample", "upsample_bilinear",
          "pool1d", "volume", "logsumexp", "top_k", "newaxis", "dilated1d", "tiled_token",
          "roll", "frame", "scan", "while_refine")
# A weight read in several places or through a view, after the blocks (issue 22), or
# computed on before it meets the samples (the weight program, issue 21).
WEIGHT_USES = ("none", "shared_dense", "sliced_weight", "tied_weight", "weight_norm",
               "cosine_and_raw")
# BatchNormalization in training after the first layer: Keras' layer, or tf.nn.moments with
# moving averages in UPDATE_OPS (half the models have one)
BATCH_NORMS = ("none", "none", "batch_norm", "batch_norm_moments")
LOSSES = {
    "classes": ("sparse_ce", "sparse_ce_weighted", "softmax_ce_smoothed", "nn_sparse_ce_mean"),
    "regression": ("mse_reshape", "mse_by_hand", "huber", "absolute_difference_weighted",
                   "masked_mse"),
    "binary": ("sigmoid_ce_smoothed", "nn_sigmoid_ce"),
}
OPTIMIZERS = ("sgd", "momentum", "nesterov", "adam", "rmsprop", "rmsprop_centered", "adagrad",
              "adadelta", "ftrl", "proximal_adagrad", "proximal_sgd", "adamw")
SCHEDULES = ("constant", "constant", "exponential_staircase", "piecewise", "warmup_polynomial",
             "cosine_restarts", "cond_warmup")
TRANSFORMS = ("none", "clip_by_value", "clip_by_norm", "clip_by_global_norm", "scale",
              "centralize", "unit_clip")
L2_TERMS = ("none", "l2_loss", "kernel_regularizer")
# Under a Keras mixed_float16 policy (a quarter of the models these fit, by seed): blocks and
# losses that mix no float32 tensor of their own with the layers' float16 ones.
MIXED_BLOCKS = tuple(b for b in BLOCKS if b not in ("matmul", "broadcast", "tiled_token"))
MIXED_LOSSES = tuple(loss for losses in LOSSES.values() for loss in losses
                     if loss not in ("mse_by_hand", "nn_sigmoid_ce", "masked_mse"))
MIXED_RTOL = 1e-2  # float16 rounding: the CS and TF agree to about a float16 ULP per op


@dataclass(frozen=True)
class ModelSpec:
    inputs: str
    blocks: tuple[str, ...]
    task: str
    loss: str
    optimizer: str
    schedule: str
    transform: str
    var_subset: bool  # minimize(var_list=...) leaves the first layer's variables out
    l2: str
    seed: int
    weights: str = "none"  # one of WEIGHT_USES
    replicas: int = 1  # runconfig.num_replicas: data-parallel copies on the CS
    batch_norm: str = "none"

    @property
    def mixed(self) -> bool:
        """Built under the mixed_float16 policy (float16 layers, float32 weights)."""
        return self.seed % 4 == 0 and self.l2 == "none" and self.weights == "none" and self.loss in MIXED_LOSSES and \
            all(b in MIXED_BLOCKS for b in self.blocks) and self.batch_norm == "none"

    @property
    def rtol(self) -> float:
        return MIXED_RTOL if self.mixed else 1e-4

    def describe(self) -> str:
        blocks = (((self.batch_norm,) if self.batch_norm != "none" else ()) + self.blocks
                  + ((self.weights,) if self.weights != "none" else ()))
        return (f"{self.inputs} -> {' -> '.join(blocks) or '(no block)'} -> {self.task} "
                f"head, loss {self.loss}, {self.optimizer} ({self.schedule} rate), "
                f"transform {self.transform}"
                f"{', var_list subset' if self.var_subset else ''}"
                f"{', ' + self.l2 if self.l2 != 'none' else ''}"
                f"{', mixed_float16' if self.mixed else ''}"
                f"{f', {self.replicas} replicas' if self.replicas > 1 else ''}")


@st.composite
def model_specs(draw) -> ModelSpec:
    task = draw(st.sampled_from(sorted(LOSSES)))
    return ModelSpec(
        inputs=draw(st.sampled_from(INPUTS)),
        blocks=tuple(draw(st.lists(st.sampled_from(BLOCKS), min_size=0, max_size=3))),
        task=task, loss=draw(st.sampled_from(LOSSES[task])),
        optimizer=draw(st.sampled_from(OPTIMIZERS)), schedule=draw(st.sampled_from(SCHEDULES)),
        transform=draw(st.sampled_from(TRANSFORMS)),
        var_subset=draw(st.booleans()), l2=draw(st.sampled_from(L2_TERMS)),
        seed=draw(st.integers(0, 2 ** 16)), replicas=draw(st.sampled_from((1, 1, 2, 4))),
        weights=draw(st.sampled_from(WEIGHT_USES)),
        batch_norm=draw(st.sampled_from(BATCH_NORMS)))


def params_for(spec: ModelSpec) -> dict:
    runconfig = {"tf_random_seed": spec.seed % 1000 + 1}
    if spec.replicas > 1:
        runconfig["num_replicas"] = spec.replicas
    return {"batch_size": BATCH, "spec": spec, "runconfig": runconfig}


# ---- input_fn ----
def input_fn(params):
    spec: ModelSpec = params["spec"]
    rng = np.random.default_rng(spec.seed)
    n = BATCH * STEPS
    if spec.inputs == "vector":
        x = rng.normal(size=(n, 6)).astype(np.float32)
    elif spec.inputs == "int_vector":
        x = rng.integers(0, 5, size=(n, 6)).astype(np.int32)
    elif spec.inputs == "image":
        x = rng.uniform(size=(n, 6, 6, 2)).astype(np.float32)
    else:
        x = rng.integers(0, VOCAB, size=(n, 5)).astype(np.int32)
    if spec.task == "classes":
        y = rng.integers(0, CLASSES, size=n).astype(np.int32)
    elif spec.task == "regression":
        y = rng.normal(size=n).astype(np.float32)
    else:
        y = rng.integers(0, 2, size=(n, 1)).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(params["batch_size"], drop_remainder=True)


# ---- model_fn ----
def first_layer(spec: ModelSpec, features):
    if spec.inputs == "vector":
        return tf.keras.layers.Dense(WIDTH, activation="relu")(features)
    if spec.inputs == "int_vector":
        x = tf.cast(features, tf.float32) / 4.0
        return tf.keras.layers.Dense(WIDTH, activation="tanh")(x)
    if spec.inputs == "image":
        x = tf.keras.layers.Conv2D(4, 3, activation="relu")(features)
        x = tf.keras.layers.Flatten()(x)
        return tf.keras.layers.Dense(WIDTH)(x)
    x = tf.keras.layers.Embedding(VOCAB, WIDTH)(features)
    return tf.reduce_mean(x, axis=1)


def moments_batch_norm(h, index: int, training: bool):
    """Batch normalisation the TF1 way: tf.nn.moments in training, the moving averages
    registered in UPDATE_OPS (train_op runs them), the moving statistics otherwise."""
    with tf.compat.v1.variable_scope(f"bn{index}"):
        gamma = tf.compat.v1.get_variable("gamma", [WIDTH], initializer=tf.ones_initializer())
        beta = tf.compat.v1.get_variable("beta", [WIDTH], initializer=tf.zeros_initializer())
        moving_mean = tf.compat.v1.get_variable("moving_mean", [WIDTH], trainable=False,
                                                initializer=tf.zeros_initializer())
        moving_variance = tf.compat.v1.get_variable("moving_variance", [WIDTH], trainable=False,
                                                    initializer=tf.ones_initializer())
    if not training:
        return tf.nn.batch_normalization(h, moving_mean, moving_variance, beta, gamma, 1e-3)
    mean, variance = tf.nn.moments(h, axes=[0])
    for moving, batch in ((moving_mean, mean), (moving_variance, variance)):
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.UPDATE_OPS,
                                       moving.assign(moving * 0.9 + batch * 0.1))
    return tf.nn.batch_normalization(h, mean, variance, beta, gamma, 1e-3)


def block(name: str, h, index: int, training: bool = True):
    kind, _, arg = name.partition(":")
    if kind == "batch_norm":  # the usual conv/dense block: no bias, batch norm, relu
        h = tf.keras.layers.Dense(WIDTH, use_bias=False)(h)
        return tf.nn.relu(tf.keras.layers.BatchNormalization()(h, training=True))
    if kind == "batch_norm_moments":
        h = tf.keras.layers.Dense(WIDTH, use_bias=False)(h)
        return tf.nn.relu(moments_batch_norm(h, index, training))
    if kind == "dense":
        return tf.keras.layers.Dense(WIDTH, activation=None if arg == "none" else arg)(h)
    if kind == "matmul":
        w = tf.compat.v1.get_variable(f"w{index}", [WIDTH, WIDTH])
        b = tf.compat.v1.get_variable(f"b{index}", [WIDTH], initializer=tf.zeros_initializer())
        return tf.matmul(h, w) + b
    if kind == "unary":
        if arg == "log1p_abs":
            return tf.math.log1p(tf.abs(h))
        if arg == "exp_neg_square":
            return tf.exp(-tf.square(h))
        if arg == "sqrt":
            return tf.sqrt(tf.square(h) + 1.0)
        if arg == "rsqrt":
            return tf.math.rsqrt(tf.square(h) + 1.0)
        return {"tanh": tf.tanh, "square": tf.square, "abs": tf.abs, "neg": tf.negative,
                "softplus": tf.nn.softplus}[arg](h)
    if kind == "const_affine":
        return h * 0.5 + 1.0
    if kind == "broadcast":
        scale = tf.constant(np.linspace(0.5, 1.5, WIDTH), tf.float32)
        return h * scale - tf.constant(np.linspace(-1.0, 1.0, WIDTH), tf.float32)
    if kind == "maximum":
        return tf.maximum(h, 0.1 * h)
    if kind == "minimum":
        return tf.minimum(h, 1.0)
    if kind == "softsign_by_hand":
        return h / (1.0 + tf.abs(h))
    if kind == "select":
        return tf.where(h > 0, h, 0.1 * h)
    if kind == "residual":
        return h + tf.keras.layers.Dense(WIDTH, activation="relu")(h)
    if kind == "concat":
        return tf.keras.layers.Dense(WIDTH)(tf.concat([h, tf.nn.relu(h)], axis=-1))
    if kind == "layer_norm":
        return tf.keras.layers.LayerNormalization()(h)
    if kind == "layer_norm_by_hand":
        mean = tf.reduce_mean(h, axis=-1, keepdims=True)
        variance = tf.reduce_mean(tf.square(h - mean), axis=-1, keepdims=True)
        return (h - mean) * tf.math.rsqrt(variance + 1e-5)
    if kind == "gelu_exact":
        return tf.nn.gelu(h, approximate=False)
    if kind == "gelu_tanh":
        return tf.nn.gelu(h, approximate=True)
    if kind == "dropout0":
        return tf.keras.layers.Dropout(0.0)(h, training=True)
    if kind == "softmax":
        return tf.nn.softmax(h) * float(WIDTH)
    if kind == "attention":
        x = tf.reshape(h, [-1, 2, WIDTH // 2])
        scores = tf.matmul(x, x, transpose_b=True) / math.sqrt(WIDTH // 2)
        return tf.reshape(tf.matmul(tf.nn.softmax(scores), x), [-1, WIDTH])
    if kind == "reduce":
        x = tf.reshape(h, [-1, 2, WIDTH // 2])
        return tf.concat([tf.reduce_mean(x, axis=1), tf.reduce_max(x, axis=1)], axis=-1)
    if kind == "transpose":
        return tf.reshape(tf.transpose(tf.reshape(h, [-1, 2, WIDTH // 2]), [0, 2, 1]), [-1, WIDTH])
    if kind == "dense_rank3":
        x = tf.keras.layers.Dense(WIDTH // 2, activation="relu")(tf.reshape(h, [-1, 2, WIDTH // 2]))
        return tf.reshape(x, [-1, WIDTH])
    if kind == "shared_dense":  # one layer called twice
        layer = tf.keras.layers.Dense(WIDTH, activation="tanh")
        return layer(layer(h)) + h
    if kind == "sliced_weight":  # every other row of a taller table, plus its first row
        w = tf.compat.v1.get_variable(f"w{index}", [2 * WIDTH + 1, WIDTH])
        return tf.matmul(h, w[1::2]) + w[0]
    if kind == "tied_weight":  # a tied autoencoder: the decoder is the encoder transposed
        w = tf.compat.v1.get_variable(f"w{index}", [WIDTH, WIDTH // 2])
        return tf.matmul(tf.tanh(tf.matmul(h, w)), tf.transpose(w))
    if kind == "weight_norm":  # weight normalization: w = g * v / ||v||
        v = tf.compat.v1.get_variable(f"v{index}", [WIDTH, WIDTH])
        g = tf.compat.v1.get_variable(f"g{index}", [WIDTH], initializer=tf.ones_initializer())
        return tf.nn.tanh(tf.matmul(h, g * v / tf.norm(v, axis=0)))
    if kind == "cosine_and_raw":  # a weight normalised (times a learned temperature) and raw
        w = tf.compat.v1.get_variable(f"w{index}", [WIDTH, WIDTH])
        t = tf.compat.v1.get_variable(f"t{index}", [], initializer=tf.zeros_initializer())
        return tf.matmul(h, tf.nn.l2_normalize(w, 0)) * tf.exp(t) + tf.matmul(h, w)
    if kind in SPATIAL:
        return tf.reshape(SPATIAL[kind](tf.reshape(h, [-1, 2, 2, WIDTH // 4])), [-1, WIDTH])
    if kind == "volume":
        x = tf.reshape(h, [-1, 2, 2, WIDTH // 4, 1])
        x = L.AveragePooling3D(2, strides=1, padding="same")(L.Conv3D(1, 2, padding="same")(x))
        return tf.reshape(L.MaxPooling3D((1, 1, 2), strides=1, padding="same")(x), [-1, WIDTH])
    if kind == "pool1d":
        x = tf.keras.layers.MaxPooling1D(2)(tf.reshape(h, [-1, 4, WIDTH // 4]))
        return tf.reshape(tf.keras.layers.UpSampling1D(2)(x), [-1, WIDTH])
    if kind == "logsumexp":  # a log-softmax by hand
        return h - tf.reduce_logsumexp(h, axis=-1, keepdims=True)
    if kind == "top_k":
        return tf.concat([tf.math.top_k(h, k=WIDTH // 2).values, tf.sort(h)[:, :WIDTH // 2]], -1)
    if kind == "newaxis":  # an outer product's first column, with tf.newaxis and ...
        return (h[:, :, tf.newaxis] * h[:, tf.newaxis, ::-1])[..., 0]
    if kind == "dilated1d":
        x = L.Conv1D(2, 2, dilation_rate=2, padding="causal")(tf.reshape(h, [-1, 4, WIDTH // 4]))
        return tf.reshape(x, [-1, WIDTH])
    if kind == "tiled_token":  # a learned token given to every sample (ViT's class token)
        token = tf.compat.v1.get_variable(f"token{index}", [1, 2, WIDTH // 2])
        x = tf.concat([tf.tile(token, [tf.shape(h)[0], 1, 1]), tf.reshape(h, [-1, 2, WIDTH // 2])], 1)
        return tf.reshape(L.Dense(WIDTH // 4)(x), [-1, WIDTH])
    if kind == "roll":
        return tf.roll(h, shift=3, axis=1) - 0.5 * h
    if kind == "frame":  # overlapping windows of the sample's values (tf.signal)
        return tf.reshape(tf.signal.frame(h, 4, 2)[:, :2], [-1, WIDTH])
    if kind == "scan":  # a recurrence over the sample's 4 steps of 2 values, by tf.scan
        w = tf.compat.v1.get_variable(f"w{index}", [2, 2])
        steps = tf.transpose(tf.reshape(h, [-1, 4, 2]), [1, 0, 2])
        states = tf.scan(lambda s, x: tf.tanh(tf.matmul(s, w) + x), steps)
        return tf.reshape(tf.transpose(states, [1, 0, 2]), [-1, WIDTH])
    if kind == "while_refine":  # three refinement steps of one layer, by tf.while_loop
        layer = L.Dense(WIDTH, activation="tanh")
        return tf.while_loop(lambda i, x: i < 3, lambda i, x: (i + 1, x + 0.5 * layer(x)),
                             (tf.constant(0), h))[1]
    raise ValueError(f"no block {name}")


L = tf.keras.layers
# Spatial blocks on the (2, 2, WIDTH / 4) image of a sample, back to that shape.
SPATIAL = {
    "conv_transpose": lambda x: L.AveragePooling2D(2)(
        L.Conv2DTranspose(WIDTH // 4, 3, strides=2, padding="same", activation="relu")(x)),
    "depthwise": lambda x: L.DepthwiseConv2D(2, padding="same", depth_multiplier=1)(x),
    "separable": lambda x: L.SeparableConv2D(WIDTH // 4, 2, padding="same", activation="tanh")(x),
    "dilated": lambda x: L.DepthwiseConv2D(2, dilation_rate=2, padding="same")(x),
    "upsample": lambda x: L.MaxPooling2D(2)(L.UpSampling2D(2)(x)),
    "upsample_bilinear": lambda x: L.AveragePooling2D(2)(L.UpSampling2D(2, interpolation="bilinear")(x)),
}


def head_and_loss(spec: ModelSpec, h, labels):
    regularizer = tf.keras.regularizers.l2(1e-3) if spec.l2 == "kernel_regularizer" else None
    head = tf.keras.layers.Dense(CLASSES if spec.task == "classes" else 1,
                                 kernel_regularizer=regularizer)
    out = head(h)
    losses = tf.compat.v1.losses
    if spec.loss == "sparse_ce":
        loss = losses.sparse_softmax_cross_entropy(labels, out)
    elif spec.loss == "sparse_ce_weighted":
        loss = losses.sparse_softmax_cross_entropy(labels, out, weights=0.5)
    elif spec.loss == "softmax_ce_smoothed":
        loss = losses.softmax_cross_entropy(tf.one_hot(labels, CLASSES), out, label_smoothing=0.1)
    elif spec.loss == "nn_sparse_ce_mean":
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=out))
    elif spec.loss == "mse_reshape":
        loss = losses.mean_squared_error(tf.reshape(labels, [-1, 1]), out)
    elif spec.loss == "mse_by_hand":
        loss = tf.reduce_mean(tf.square(out - tf.expand_dims(labels, -1)))
    elif spec.loss == "huber":
        loss = losses.huber_loss(tf.reshape(labels, [-1, 1]), out, delta=0.5)
    elif spec.loss == "absolute_difference_weighted":
        loss = losses.absolute_difference(tf.reshape(labels, [-1, 1]), out, weights=2.0)
    elif spec.loss == "masked_mse":  # samples with a small label left out of the mean
        mask = tf.cast(tf.abs(labels) > 0.3, tf.float32)
        per_sample = tf.square(out[:, 0] - labels) * mask
        loss = tf.reduce_sum(per_sample) / tf.maximum(tf.reduce_sum(mask), 1.0)
    elif spec.loss == "sigmoid_ce_smoothed":
        loss = losses.sigmoid_cross_entropy(labels, out, label_smoothing=0.1)
    else:
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
            labels=tf.cast(labels, tf.float32), logits=out))
    if spec.l2 == "kernel_regularizer":
        loss = loss + tf.add_n(head.losses)
    elif spec.l2 == "l2_loss":
        kernels = [v for v in tf.compat.v1.trainable_variables() if len(v.shape) >= 2]
        loss = loss + 1e-3 * tf.add_n([tf.nn.l2_loss(v) for v in kernels])
    return out, loss


def learning_rate(schedule: str, base: float, step):
    train = tf.compat.v1.train
    if schedule == "exponential_staircase":
        return train.exponential_decay(base, step, 3, 0.5, staircase=True)
    if schedule == "piecewise":
        return train.piecewise_constant(step, [3, 6], [base, base * 0.5, base * 0.1])
    if schedule == "warmup_polynomial":
        warm = base * tf.cast(step + 1, tf.float32) / 3.0
        return tf.where(step < 3, warm, train.polynomial_decay(base, step, 10, base * 0.1))
    if schedule == "cosine_restarts":
        return train.cosine_decay_restarts(base, step, 4, alpha=0.1)
    if schedule == "cond_warmup":
        return tf.cond(step < 2, lambda: base * 0.5,
                       lambda: train.exponential_decay(base, step, 5, 0.8))
    return base


def optimizer(name: str, schedule: str, step):
    train = tf.compat.v1.train
    rate = {"sgd": 0.05, "momentum": 0.05, "nesterov": 0.05, "adam": 0.01, "rmsprop": 0.01,
            "rmsprop_centered": 0.01, "adagrad": 0.1, "adadelta": 1.0, "ftrl": 0.1,
            "proximal_adagrad": 0.1, "proximal_sgd": 0.05, "adamw": 0.01}[name]
    lr = learning_rate(schedule, rate, step)
    return {"sgd": lambda: train.GradientDescentOptimizer(lr),
            "momentum": lambda: train.MomentumOptimizer(lr, 0.9),
            "nesterov": lambda: train.MomentumOptimizer(lr, 0.9, use_nesterov=True),
            "adam": lambda: train.AdamOptimizer(lr),
            "rmsprop": lambda: train.RMSPropOptimizer(lr),
            "rmsprop_centered": lambda: train.RMSPropOptimizer(lr, momentum=0.5, centered=True),
            "adagrad": lambda: train.AdagradOptimizer(lr),
            "adadelta": lambda: train.AdadeltaOptimizer(lr, rho=0.9),
            "ftrl": lambda: train.FtrlOptimizer(lr, l1_regularization_strength=1e-3,
                                                l2_regularization_strength=1e-3),
            "proximal_adagrad": lambda: train.ProximalAdagradOptimizer(
                lr, l1_regularization_strength=1e-3),
            "proximal_sgd": lambda: train.ProximalGradientDescentOptimizer(
                lr, l2_regularization_strength=1e-3),
            "adamw": lambda: AdamWOptimizer(lr, weight_decay_rate=0.01, epsilon=1e-6,
                                            exclude_from_weight_decay=["bias"])}[name]()


def _unit_norm(x):
    """The norm per output unit (over every axis but the last; a vector's whole)."""
    axes = list(range(len(x.shape) - 1)) if len(x.shape) > 1 else None
    return tf.sqrt(tf.reduce_sum(tf.square(x), axis=axes, keepdims=axes is not None))


def _unit_clip(g, v, clip=0.05):
    g_norm = _unit_norm(g)
    max_norm = clip * tf.maximum(_unit_norm(v), 1e-3)
    return tf.where(g_norm > max_norm, g * (max_norm / tf.maximum(g_norm, 1e-6)), g)


def train_op(spec: ModelSpec, loss, var_list):
    step = tf.compat.v1.train.get_or_create_global_step()
    opt = optimizer(spec.optimizer, spec.schedule, step)
    grads_and_vars = [(g, v) for g, v in opt.compute_gradients(loss, var_list=var_list)
                      if g is not None]
    if spec.transform == "clip_by_value":
        grads_and_vars = [(tf.clip_by_value(g, -0.05, 0.05), v) for g, v in grads_and_vars]
    elif spec.transform == "clip_by_norm":
        grads_and_vars = [(tf.clip_by_norm(g, 0.5), v) for g, v in grads_and_vars]
    elif spec.transform == "clip_by_global_norm":
        clipped, _ = tf.clip_by_global_norm([g for g, _ in grads_and_vars], 1.0)
        grads_and_vars = list(zip(clipped, [v for _, v in grads_and_vars]))
    elif spec.transform == "scale":
        grads_and_vars = [(tf.math.scalar_mul(0.5, g), v) for g, v in grads_and_vars]
    elif spec.transform == "centralize":  # gradient centralization
        grads_and_vars = [(g - tf.reduce_mean(g, list(range(len(g.shape) - 1)), keepdims=True)
                           if len(g.shape) > 1 else g, v) for g, v in grads_and_vars]
    elif spec.transform == "unit_clip":  # adaptive clipping: ||g|| / ||w|| per unit
        grads_and_vars = [(_unit_clip(g, v), v) for g, v in grads_and_vars]
    with tf.control_dependencies(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)):
        return opt.apply_gradients(grads_and_vars, global_step=step)


def model_fn(features, labels, mode, params):
    spec: ModelSpec = params["spec"]
    # params["policy"] "float32": a mixed model's float32 twin, the referee of its float16 noise
    tf.keras.mixed_precision.set_global_policy(params.get("policy", "mixed_float16" if spec.mixed else "float32"))
    h = first_layer(spec, features)
    first_variables = len(tf.compat.v1.trainable_variables())
    blocks = ((spec.batch_norm,) if spec.batch_norm != "none" else ()) + spec.blocks
    for index, name in enumerate(blocks):
        h = block(name, h, index, mode == "train")
    if spec.weights != "none":
        h = block(spec.weights, h, len(blocks), mode == "train")
    out, loss = head_and_loss(spec, h, labels)
    var_list = tf.compat.v1.trainable_variables()[first_variables if spec.var_subset else 0:]
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op(spec, loss, var_list))
