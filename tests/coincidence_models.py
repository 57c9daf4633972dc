"""Models whose dimensions coincide with the batch size or with each other, written the way
users write them, to attack the layouts the compiler decides (stack-first: [S, B, ...];
folded rows: [B*k, ...]): Dense widths, time steps, heads, Monte Carlo samples and patches
equal to the batch, a [B, B] similarity matrix beside a stack, a stack of values whose
sample shape starts with B, transposes of [B, T, T], reshape(-1, B), tiles and repeats along
the batch and along an inner axis of B, shared noise whose shape starts with B, and the
batch sizes 1 and 2. `params["batch"]` is the batch size (8 unless given)."""
import numpy as np
import tensorflow as tf

from tf_model.estimator_spec import CSEstimatorSpec, ModeKeys

L, v1 = tf.keras.layers, tf.compat.v1
FEATURES, CLASSES = 8, 3


def input_fn(params):
    """[batch * 4, 8, 8] sequences (8 steps of 8 features) and 3 classes."""
    batch = params.get("batch", 8)
    rng = np.random.default_rng(3)
    x = rng.normal(size=(batch * 4, 8, FEATURES)).astype(np.float32)
    y = (np.sign(x[:, :, 0].sum(1)) + 1).astype(np.int32) % CLASSES
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)


def spec(mode, labels, logits, loss=None):
    """Predictions (logits, class), accuracy, or Momentum on the loss (the mean cross-entropy
    unless given)."""
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits) if loss is None else loss
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={"logits": logits, "class": tf.argmax(logits, 1)})
    if mode == ModeKeys.EVAL:
        return CSEstimatorSpec(mode, loss=loss, eval_metric_ops={
            "accuracy": v1.metrics.accuracy(labels, tf.argmax(logits, 1))})
    step = v1.train.get_or_create_global_step()
    return CSEstimatorSpec(mode, loss=loss, train_op=v1.train.MomentumOptimizer(
        0.05, 0.9).minimize(loss, global_step=step))  # (Adam would blow up a key bias's noise)


def _batch(features):
    return features.shape[0]


def two_heads_width_b(features, labels, mode, params):
    """Two Dense(B) heads stacked on axis 0 ([2, B, B]) and averaged."""
    h = L.Flatten()(features)
    heads = tf.stack([L.Dense(_batch(features))(h), L.Dense(_batch(features))(h)], 0)
    return spec(mode, labels, L.Dense(CLASSES)(tf.reduce_mean(heads, 0)))


def stack_of_steps(features, labels, mode, params):
    """A stack of two per-sample values whose sample shape starts with B (T == B steps):
    [2, B, T, F], averaged over the stack and pooled over time."""
    a, b = L.Dense(FEATURES)(features), L.Dense(FEATURES, activation="tanh")(features)
    stacked = tf.stack([a, b], 0)
    return spec(mode, labels, L.Dense(CLASSES)(tf.reduce_mean(tf.reduce_max(stacked, 0), 1)))


def stack_then_step_first(features, labels, mode, params):
    """tf.stack(axis=0) of [B, T, F] values, T == B, then its time axis moved first:
    tf.transpose(stacked, [2, 1, 0, 3]) ([T, B, 2, F]: the batch second again)."""
    stacked = tf.stack([L.Dense(4)(features), L.Dense(4)(features)], 0)
    moved = tf.transpose(stacked, [2, 1, 0, 3])
    return spec(mode, labels, L.Dense(CLASSES)(L.Flatten()(tf.reduce_mean(moved, 0))))


def heads_equal_batch(features, labels, mode, params):
    """timm's attention with as many heads as the batch (8 heads of 2), qkv permuted
    tf.transpose(qkv, [2, 0, 3, 1, 4])."""
    n, heads, dh = features.shape[1], _batch(features), 2
    dim = heads * dh
    qkv = tf.reshape(L.Dense(3 * dim)(features), [-1, n, 3, heads, dh])
    q, k, v = tf.unstack(tf.transpose(qkv, [2, 0, 3, 1, 4]))
    attn = tf.nn.softmax(tf.matmul(q, k, transpose_b=True) * dh ** -0.5)
    out = tf.reshape(tf.transpose(tf.matmul(attn, v), [0, 2, 1, 3]), [-1, n, dim])
    return spec(mode, labels, L.Dense(CLASSES)(tf.reduce_mean(L.Dense(dim)(out), 1)))


def mha_time_equal_batch(features, labels, mode, params):
    """Keras MultiHeadAttention over T == B steps (its [B, heads, T, T] scores)."""
    h = L.MultiHeadAttention(2, 4)(features, features)
    return spec(mode, labels, L.Dense(CLASSES)(tf.reduce_mean(h, 1)))


def scores_transposed(features, labels, mode, params):
    """Self-attention scores [B, T, T] (T == B) and their transpose [0, 2, 1] (keys first)."""
    q, k = L.Dense(4)(features), L.Dense(4)(features)
    scores = tf.nn.softmax(tf.matmul(q, k, transpose_b=True))
    both = scores + tf.transpose(scores, [0, 2, 1])
    return spec(mode, labels, L.Dense(CLASSES)(tf.reduce_sum(tf.matmul(both, features), 1)))


def scores_batch_second(features, labels, mode, params):
    """[B, T, T] scores with T == B transposed [1, 0, 2] (a query axis first, the batch
    second), then averaged over it."""
    q, k = L.Dense(4)(features), L.Dense(4)(features)
    scores = tf.nn.softmax(tf.matmul(q, k, transpose_b=True))
    pooled = tf.reduce_mean(tf.transpose(scores, [1, 0, 2]), 0)
    return spec(mode, labels, L.Dense(CLASSES)(pooled))


def vib(features, labels, mode, params):
    """A VIB with K Monte Carlo samples drawn [K, tf.shape(mu)[0], Z] (K == B in the
    corpus's case), mu[None] + std[None] * eps, each decoded."""
    samples, code = params.get("samples", 3), 4
    stats = L.Dense(2 * code)(L.Flatten()(features))
    mu, std = stats[:, :code], tf.nn.softplus(stats[:, code:] - 1.0)
    decoder = L.Dense(CLASSES)
    if mode == ModeKeys.PREDICT:
        return spec(mode, labels, decoder(mu))
    eps = tf.random.normal([samples, tf.shape(mu)[0], code])
    z = mu[None] + std[None] * eps
    log_p = tf.nn.log_softmax(decoder(z))
    loss = -tf.reduce_mean(tf.reduce_sum(tf.one_hot(labels, CLASSES) * log_p, -1))
    return spec(mode, labels, decoder(mu), loss)


def noise_pattern_per_row(features, labels, mode, params):
    """Four noise patterns of a sample's [T, F] shared by the batch (T == B), the first added
    to every sample: tf.random.normal([4, T, F])[0]."""
    noise = tf.random.normal([4, features.shape[1], FEATURES])
    noisy = features + 0.1 * noise[0]
    return spec(mode, labels, L.Dense(CLASSES)(L.Flatten()(noisy)))


def noise_pattern_shared(features, labels, mode, params):
    """One noise pattern of a sample's [T, F] shared by the batch (T == B), added to each."""
    noisy = features + 0.1 * tf.random.normal([features.shape[1], FEATURES])
    return spec(mode, labels, L.Dense(CLASSES)(L.Flatten()(noisy)))


def patches_equal_batch(features, labels, mode, params):
    """T == B steps folded into the batch ([B*T, F]), a Dense per step, unfolded, pooled."""
    n = features.shape[1]
    steps = L.Dense(6, activation="relu")(tf.reshape(features, [-1, FEATURES]))
    pooled = tf.reduce_mean(tf.reshape(steps, [-1, n, 6]), 1)
    return spec(mode, labels, L.Dense(CLASSES)(pooled))


def reshape_minus_one_b(features, labels, mode, params):
    """tf.reshape(h, [-1, B]) of a per-sample [B, 2*B] value: two rows of B a sample."""
    width = _batch(features)
    h = L.Dense(2 * width)(L.Flatten()(features))
    rows = L.Dense(4, activation="relu")(tf.reshape(h, [-1, width]))
    return spec(mode, labels, L.Dense(CLASSES)(tf.reshape(rows, [-1, 8])))


def folded_then_batch_norm(features, labels, mode, params):
    """Steps folded into the batch, then a statistic over all B*T rows (BatchNormalization
    by hand): reduces over the folded axis."""
    rows = L.Dense(4)(tf.reshape(features, [-1, FEATURES]))
    mean, var = tf.nn.moments(rows, [0])
    rows = (rows - mean) * tf.math.rsqrt(var + 1e-3)
    return spec(mode, labels, L.Dense(CLASSES)(tf.reshape(rows, [-1, 8 * 4])))


def contrastive_beside_stack(features, labels, mode, params):
    """A [B, B] similarity matrix of two projections (an InfoNCE term over the batch)
    beside a stack of the projections averaged as the classifier's input."""
    h = L.Flatten()(features)
    z1, z2 = tf.math.l2_normalize(L.Dense(8)(h), 1), tf.math.l2_normalize(L.Dense(8)(h), 1)
    sim = tf.matmul(z1, z2, transpose_b=True) / 0.5
    nce = v1.losses.sparse_softmax_cross_entropy(tf.range(tf.shape(z1)[0]), sim)
    logits = L.Dense(CLASSES)(tf.reduce_mean(tf.stack([z1, z2], 0), 0))
    return spec(mode, labels, logits, v1.losses.sparse_softmax_cross_entropy(labels, logits) + nce)


def pairwise_distance_and_stack(features, labels, mode, params):
    """sq[:, None] + sq[None, :] (pairwise distances over the batch) and mu[None] beside it."""
    h = L.Dense(8)(L.Flatten()(features))
    sq = tf.reduce_sum(tf.square(h), 1)
    dist = sq[:, None] + sq[None, :] - 2 * tf.matmul(h, h, transpose_b=True)
    spread = tf.reduce_mean(dist)
    logits = L.Dense(CLASSES)(h)
    return spec(mode, labels, logits,
                 v1.losses.sparse_softmax_cross_entropy(labels, logits) - 1e-3 * spread)


def simclr_concat(features, labels, mode, params):
    """SimCLR's NT-Xent: two views concatenated along the batch ([2B, d]) and their
    [2B, 2B] similarities."""
    h = L.Flatten()(features)
    project = L.Dense(8)
    z = tf.math.l2_normalize(tf.concat([project(h), project(h * 0.9)], 0), 1)
    n = tf.shape(h)[0]
    sim = tf.matmul(z, z, transpose_b=True) / 0.5 - 1e9 * tf.eye(2 * n)
    targets = tf.concat([tf.range(n, 2 * n), tf.range(n)], 0)
    nce = v1.losses.sparse_softmax_cross_entropy(targets, sim)
    logits = L.Dense(CLASSES)(h)
    return spec(mode, labels, logits, v1.losses.sparse_softmax_cross_entropy(labels, logits) + nce)


def tile_along_batch(features, labels, mode, params):
    """tf.tile(h, [2, 1]) ([2B, d]: the batch twice, not each sample's two rows), reshaped to
    [B, 2, d] and differenced."""
    h = L.Dense(4)(L.Flatten()(features))
    pairs = tf.reshape(tf.tile(h, [2, 1]), [-1, 2, 4])
    return spec(mode, labels, L.Dense(CLASSES)(pairs[:, 0] - pairs[:, 1] + h))


def concat_along_batch(features, labels, mode, params):
    """tf.concat([a, b], 0) ([2B, d]) reshaped to [B, 2, d]: rows of two samples."""
    h = L.Flatten()(features)
    both = tf.reshape(tf.concat([L.Dense(4)(h), L.Dense(4)(h)], 0), [-1, 2, 4])
    return spec(mode, labels, L.Dense(CLASSES)(tf.reduce_sum(both, 1)))


def tile_inner_axis_b(features, labels, mode, params):
    """tf.tile(h[:, None], [1, B, 1]) ([B, B, d]: an inner axis of the batch's size) and a
    per-step product with the sequence."""
    h = L.Dense(FEATURES)(tf.reduce_mean(features, 1))
    tiled = tf.tile(h[:, None], [1, features.shape[1], 1])
    return spec(mode, labels, L.Dense(CLASSES)(tf.reduce_sum(tiled * features, 1)))


def repeat_inner_axis_b(features, labels, mode, params):
    """tf.repeat along a sample's axis of B (the steps) and along its features."""
    h = tf.repeat(L.Dense(4)(features), 2, axis=1)  # [B, 2T, 4]
    return spec(mode, labels, L.Dense(CLASSES)(L.Flatten()(tf.repeat(h, 2, axis=2))))


def expand_first_read_by_add(features, labels, mode, params):
    """h[None] (rank 3: [1, B, T... ]) added to a [B, T, F] value's first row view: a per-sample
    value with a unit axis in front read by an element-wise op."""
    h = L.Dense(FEATURES)(features)  # [B, T, F], T == B
    mixed = tf.reduce_mean(h[None] + h[:, :1][None], 0)
    return spec(mode, labels, L.Dense(CLASSES)(tf.reduce_mean(mixed, 1)))


def expand_first_pairs_steps(features, labels, mode, params):
    """m[None] + m[:, None] of a per-sample mean over time m [B, F] (F == B): the in-batch
    pairing [B, B, F], averaged over the first axis."""
    m = tf.reduce_mean(L.Dense(FEATURES)(features), 1)
    paired = tf.reduce_mean(tf.abs(m[None] - m[:, None]), 0)
    return spec(mode, labels, L.Dense(CLASSES)(paired + m))


def ensemble_weights_noise(features, labels, mode, params):
    """An ensemble of 3 [F, F] weights (F == B) perturbed by noise of shape [3, F, F] (no
    batch axis: noise on weights), applied to each sample by einsum."""
    w = v1.get_variable("ensemble", [3, FEATURES, FEATURES])
    noisy = w + 0.01 * tf.random.normal([3, FEATURES, FEATURES])
    h = tf.einsum("bi,kio->bko", tf.reduce_mean(features, 1), noisy)
    return spec(mode, labels, L.Dense(CLASSES)(tf.reduce_mean(h, 1)))


def mc_dropout_stack(features, labels, mode, params):
    """K == B Monte Carlo forward passes (dropout rate 0 to compare) stacked on axis 0."""
    h = L.Flatten()(features)
    dense, drop = L.Dense(CLASSES), L.Dropout(0.0)
    passes = tf.stack([dense(drop(h, training=True)) for _ in range(params.get("samples", 8))], 0)
    return spec(mode, labels, tf.reduce_mean(passes, 0))


def conv_width_b(features, labels, mode, params):
    """A Conv1D(B) over T == B steps: [B, T, B] per-sample maps, and a stack of two pools."""
    h = L.Conv1D(_batch(features), 3, padding="same")(features)
    pooled = tf.stack([tf.reduce_mean(h, 1), tf.reduce_max(h, 1)], 0)
    return spec(mode, labels, L.Dense(CLASSES)(tf.reduce_sum(pooled, 0)))


def unstack_time_major(features, labels, mode, params):
    """tf.unstack(tf.transpose(x, [1, 0, 2])) (T == B time-major steps) summed by hand."""
    steps = tf.unstack(tf.transpose(L.Dense(4)(features), [1, 0, 2]))
    h = tf.zeros_like(steps[0])
    for s in steps:
        h = tf.tanh(s + h)
    return spec(mode, labels, L.Dense(CLASSES)(h))


def regression_labels_broadcast(features, labels, mode, params):
    """The classic mistake: labels [B] minus predictions [B, 1] ([B, B] in TF: every sample's
    label against every prediction), squared and averaged."""
    prediction = L.Dense(1)(L.Flatten()(features))
    loss = tf.reduce_mean(tf.square(tf.cast(labels, tf.float32) - prediction))
    return spec(mode, labels, tf.concat([prediction] * CLASSES, 1), loss)


def step_weights_times_batch(features, labels, mode, params):
    """Per-sample step weights [B, T] (T == B) times a per-sample [B] scale: TF pairs the
    scale's batch with the steps."""
    weights = tf.nn.softmax(tf.squeeze(L.Dense(1)(features), -1))  # [B, T]
    scale = tf.reduce_mean(features, [1, 2])  # [B]
    pooled = tf.reduce_sum((weights * scale)[:, :, None] * features, 1)
    return spec(mode, labels, L.Dense(CLASSES)(pooled))


def pairs_of_samples(features, labels, mode, params):
    """tf.reshape(h, [-1, 8]) of h [B, 4]: two samples' rows a row ([B/2, 8]), a Dense, and
    back to [B, 3]: the first axis is the batch's size again, its rows of two samples."""
    h = L.Dense(4)(L.Flatten()(features))
    return spec(mode, labels, tf.reshape(L.Dense(6)(tf.reshape(h, [-1, 8])), [-1, CLASSES]))


def square_transposed(features, labels, mode, params):
    """tf.transpose of a Dense(B)'s [B, B] output: its rows are the batch's columns."""
    h = L.Dense(_batch(features))(L.Flatten()(features))
    return spec(mode, labels, L.Dense(CLASSES)(tf.transpose(h)))


def time_major_flattened(features, labels, mode, params):
    """tf.transpose(x, [1, 0, 2]) ([T, B, F], T == B) reshaped to [T, B*F] and read as if
    its rows were the samples."""
    steps = tf.transpose(L.Dense(4)(features), [1, 0, 2])
    return spec(mode, labels, L.Dense(CLASSES)(tf.reshape(steps, [features.shape[1], -1])))


def folded_then_reshaped_across(features, labels, mode, params):
    """Steps folded into the batch ([B*T, F]), then reshaped to [T, B*F] (T == B): rows that
    are not a sample's."""
    rows = L.Dense(4)(tf.reshape(features, [-1, FEATURES]))
    return spec(mode, labels, L.Dense(CLASSES)(tf.reshape(rows, [features.shape[1], -1])))
