"""Models that fold windows, patches or Monte Carlo samples into the batch and back, as users
write them: Swin's window partition (reshape [B, H/w, w, W/w, w, C], transpose [0, 1, 3, 2, 4,
5], reshape [-1, w*w, C]) with window attention and a relative position bias, its reverse, and
shifted windows by tf.roll; a variational information bottleneck decoding k samples per input
(z [B, k, d] reshaped [-1, d], decoded, reshaped [-1, k, classes], averaged over k); ViT
patches by reshape and transpose, tf.image.extract_patches, tf.nn.space_to_depth and
depth_to_space (a pixel shuffle); tf.repeat / tf.tile of per-sample values along axis 0 then
reshaped [B, k, ...]. `params["batch"]` is the batch size (8 unless given): at batch 4 Swin's
4 windows a sample and the VIB's k equal the batch."""
import numpy as np
import tensorflow as tf
from coincidence_models import spec  # Momentum: Adam would blow up a key bias's noise

from tf_model.estimator_spec import ModeKeys

L = tf.keras.layers
v1 = tf.compat.v1
SIDE, CHANNELS, WINDOW, DIM, HEADS, CLASSES = 8, 3, 4, 8, 2, 3


def image_input_fn(params):
    """[batch * 4, 8, 8, 3] images, 3 classes from the quadrants' mean of channel 0."""
    batch = params.get("batch", 8)
    rng = np.random.default_rng(31)
    x = rng.normal(size=(batch * 4, SIDE, SIDE, CHANNELS)).astype(np.float32)
    y = (x[:, :4, :4, 0].mean((1, 2)) > x[:, 4:, 4:, 0].mean((1, 2))).astype(np.int32) + \
        (x[:, :, :, 1].mean((1, 2)) > 0.1).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)


def window_partition(x, window):
    """Swin's: [B, H, W, C] -> [B * H/w * W/w, w*w, C]."""
    _, height, width, channels = x.shape
    x = tf.reshape(x, [tf.shape(x)[0], height // window, window, width // window, window, channels])
    x = tf.transpose(x, [0, 1, 3, 2, 4, 5])
    return tf.reshape(x, [-1, window * window, channels])


def window_reverse(windows, window, height, width):
    """Swin's: [B * H/w * W/w, w*w, C] -> [B, H, W, C]."""
    channels = windows.shape[-1]
    x = tf.reshape(windows, [-1, height // window, width // window, window, window, channels])
    x = tf.transpose(x, [0, 1, 3, 2, 4, 5])
    return tf.reshape(x, [-1, height, width, channels])


def _relative_index(window):
    """Swin's relative_position_index: [w*w, w*w] indices into a (2w-1)^2 table."""
    coords = np.stack(np.meshgrid(np.arange(window), np.arange(window), indexing="ij")).reshape(2, -1)
    rel = (coords[:, :, None] - coords[:, None, :]).transpose(1, 2, 0) + window - 1
    return (rel[:, :, 0] * (2 * window - 1) + rel[:, :, 1]).astype(np.int32)


class WindowAttention(L.Layer):
    """Swin's window multi-head self-attention with a learned relative position bias table."""

    def __init__(self, dim, window, heads, **kwargs):
        super().__init__(**kwargs)
        self.dim, self.window, self.heads = dim, window, heads
        self.qkv, self.proj = L.Dense(3 * dim), L.Dense(dim)

    def build(self, input_shape):
        self.table = self.add_weight(
            name="relative_position_bias_table", shape=[(2 * self.window - 1) ** 2, self.heads],
            initializer=tf.keras.initializers.TruncatedNormal(stddev=0.02))
        self.index = tf.constant(_relative_index(self.window).reshape(-1))

    def call(self, x, shift_mask=None):
        n, hd = self.window * self.window, self.dim // self.heads
        qkv = tf.reshape(self.qkv(x), [-1, n, 3, self.heads, hd])
        q, k, v = tf.unstack(tf.transpose(qkv, [2, 0, 3, 1, 4]))
        attn = tf.matmul(q * hd ** -0.5, k, transpose_b=True)      # [B_, heads, n, n]
        bias = tf.reshape(tf.gather(self.table, self.index), [n, n, self.heads])
        attn = attn + tf.transpose(bias, [2, 0, 1])[None]
        if shift_mask is not None:  # [nW, n, n], the windows of one image
            windows = shift_mask.shape[0]
            attn = tf.reshape(attn, [-1, windows, self.heads, n, n]) + shift_mask[None, :, None]
            attn = tf.reshape(attn, [-1, self.heads, n, n])
        attn = tf.nn.softmax(attn, -1)
        out = tf.transpose(tf.matmul(attn, v), [0, 2, 1, 3])
        return self.proj(tf.reshape(out, [-1, n, self.dim]))


def _shift_mask(side, window, shift):
    """Swin's attention mask of the shifted windows: -100 between pixels of different regions."""
    regions = np.zeros((side, side))
    cuts = (slice(0, -window), slice(-window, -shift), slice(-shift, None))
    for i, (hs, ws) in enumerate((hs, ws) for hs in cuts for ws in cuts):
        regions[hs, ws] = i
    r = regions.reshape(side // window, window, side // window, window).transpose(0, 2, 1, 3)
    r = r.reshape(-1, window * window)
    return tf.constant(np.where(r[:, None, :] != r[:, :, None], -100.0, 0.0).astype(np.float32))


def swin_block(x, shift, name):
    """A Swin block: LayerNorm, (shifted) window attention, reverse, MLP, residuals."""
    side = x.shape[1]
    h = L.LayerNormalization(epsilon=1e-5, name=f"{name}_norm1")(x)
    if shift:
        h = tf.roll(h, shift=[-shift, -shift], axis=[1, 2])
    windows = window_partition(h, WINDOW)
    mask = _shift_mask(side, WINDOW, shift) if shift else None
    attended = WindowAttention(DIM, WINDOW, HEADS, name=f"{name}_attn")(windows, shift_mask=mask)
    h = window_reverse(attended, WINDOW, side, side)
    if shift:
        h = tf.roll(h, shift=[shift, shift], axis=[1, 2])
    x = x + h
    mlp = L.Dense(DIM)(L.Dense(2 * DIM, activation="gelu", name=f"{name}_fc1")(
        L.LayerNormalization(epsilon=1e-5, name=f"{name}_norm2")(x)))
    return x + mlp


def patch_merging(x):
    """Swin's downsampling: the 2x2 neighbours' channels concatenated, LayerNorm, a Dense
    halving them ([B, H, W, C] -> [B, H/2, W/2, 2C])."""
    x = tf.concat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], -1)
    return L.Dense(2 * x.shape[-1] // 4, use_bias=False)(L.LayerNormalization(epsilon=1e-5)(x))


def swin(features, labels, mode, params):
    """A patch embedding (1x1 Dense), a window block and a shifted-window block (params
    shift: 0 keeps both unshifted), patch merging, global average pooling, a Dense head."""
    x = L.Dense(DIM, name="embed")(features)
    x = swin_block(x, 0, "block0")
    x = swin_block(x, params.get("shift", 2), "block1")
    x = patch_merging(x)
    logits = L.Dense(CLASSES)(tf.reduce_mean(L.LayerNormalization()(x), [1, 2]))
    return spec(mode, labels, logits)


def vib(features, labels, mode, params):
    """A variational information bottleneck (Alemi et al.) decoding k samples per input in
    training: params draw "eps" draws eps [B, k, d] (z = mu[:, None] + sigma[:, None] * eps),
    "tile" tiles mu and sigma k times ([B, k, d]) and draws as many, "repeat" repeats them k
    times along the batch ([B*k, d]) and draws a row each; z as [-1, d] rows decoded,
    reshaped [-1, k, classes]; the loss the mean cross-entropy over the k samples (params
    average "probabilities": of the k samples' mean softmax) plus beta * KL. Evaluation and
    prediction decode mu."""
    k, code, beta = params.get("samples", 6), 4, 1e-3
    h = L.Dense(16, activation="relu")(L.Flatten()(features))
    stats = L.Dense(2 * code)(h)
    mu, sigma = stats[:, :code], tf.nn.softplus(stats[:, code:] - 5.0)
    decoder = tf.keras.Sequential([L.Dense(8, activation="relu"), L.Dense(CLASSES)], name="decoder")
    if mode != ModeKeys.TRAIN:
        return spec(mode, labels, decoder(mu))
    draw = params.get("draw", "eps")
    if draw == "eps":
        eps = tf.random.normal([tf.shape(mu)[0], k, code])
        z = tf.reshape(mu[:, None] + sigma[:, None] * eps, [-1, code])
    elif draw == "tile":
        mus, sigmas = tf.tile(mu[:, None], [1, k, 1]), tf.tile(sigma[:, None], [1, k, 1])
        z = tf.reshape(mus + sigmas * tf.random.normal(tf.shape(mus)), [-1, code])
    else:  # each input's k rows in a row: tf.repeat along the batch, a draw per row
        mus, sigmas = tf.repeat(mu, k, axis=0), tf.repeat(sigma, k, axis=0)
        z = mus + sigmas * tf.random.normal(tf.shape(mus))
    logits = tf.reshape(decoder(z), [-1, k, CLASSES])
    if params.get("average") == "probabilities":  # the k samples' predictive distribution
        probs = tf.reduce_mean(tf.nn.softmax(logits), 1)
        per_sample = -tf.math.log(tf.reduce_sum(tf.one_hot(labels, CLASSES) * probs, -1))
    else:
        per_sample = tf.nn.sparse_softmax_cross_entropy_with_logits(
            tf.tile(labels[:, None], [1, k]), logits)
    kl = 0.5 * tf.reduce_sum(tf.square(mu) + tf.square(sigma) - 2 * tf.math.log(sigma) - 1, -1)
    loss = tf.reduce_mean(per_sample) + beta * tf.reduce_mean(kl)
    return spec(mode, labels, tf.reduce_mean(logits, 1), loss)


def vit_patches(features, labels, mode, params):
    """ViT with patches cut by reshape and transpose (no conv; params patches "extract":
    tf.image.extract_patches, "space_to_depth": tf.nn.space_to_depth), a linear embedding and
    learned positions, one Keras MultiHeadAttention block, mean pooling, a Dense head."""
    p, side = 4, features.shape[1]
    n = (side // p) ** 2
    how = params.get("patches", "reshape")
    if how == "reshape":
        x = tf.reshape(features, [-1, side // p, p, side // p, p, CHANNELS])
        x = tf.transpose(x, [0, 1, 3, 2, 4, 5])
        patches = tf.reshape(x, [-1, n, p * p * CHANNELS])
    elif how == "extract":
        patches = tf.image.extract_patches(features, [1, p, p, 1], [1, p, p, 1], [1, 1, 1, 1],
                                           "VALID")
        patches = tf.reshape(patches, [-1, n, p * p * CHANNELS])
    else:
        patches = tf.reshape(tf.nn.space_to_depth(features, p), [-1, n, p * p * CHANNELS])
    h = L.Dense(DIM)(patches)
    position = v1.get_variable("position", [n, DIM],
                               initializer=v1.random_normal_initializer(0, 0.1))
    h = h + position
    norm = L.LayerNormalization()(h)
    h = h + L.MultiHeadAttention(HEADS, DIM // HEADS)(norm, norm)
    h = h + L.Dense(DIM)(L.Dense(16, activation="gelu")(L.LayerNormalization()(h)))
    return spec(mode, labels, L.Dense(CLASSES)(tf.reduce_mean(h, 1)))


def pixel_shuffle(features, labels, mode, params):
    """An ESPCN-style upsampler head: Conv2D to 4 * C channels, tf.nn.depth_to_space(2) (a
    pixel shuffle: [B, 8, 8, 12] -> [B, 16, 16, 3]), space_to_depth back, a conv and pooling."""
    h = L.Conv2D(4 * CHANNELS, 3, padding="same", activation="relu")(features)
    up = tf.nn.depth_to_space(h, 2)
    down = tf.nn.space_to_depth(L.Conv2D(2, 3, padding="same", activation="tanh")(up), 2)
    logits = L.Dense(CLASSES)(L.GlobalAveragePooling2D()(down))
    return spec(mode, labels, logits)


def repeated_views(features, labels, mode, params):
    """Each image's k = 3 views by tf.repeat(x, 3, axis=0) (params how "tile": tf.tile of x[:,
    None] to [B, 3, ...] reshaped [-1, ...]), each scaled by its own constant, a shared Dense
    encoder on the [B*3, ...] rows, reshaped [B, 3, d] and averaged over the views."""
    k, flat = 3, L.Flatten()(features)
    if params.get("how", "repeat") == "repeat":
        rows = tf.repeat(flat, k, axis=0)
    else:
        rows = tf.reshape(tf.tile(flat[:, None], [1, k, 1]), [-1, flat.shape[-1]])
    scale = tf.constant([1.0, 0.5, -1.0])
    views = tf.reshape(rows, [-1, k, flat.shape[-1]]) * scale[None, :, None]
    h = L.Dense(16, activation="relu")(tf.reshape(views, [-1, flat.shape[-1]]))
    pooled = tf.reduce_mean(tf.reshape(h, [-1, k, 16]), 1)
    return spec(mode, labels, L.Dense(CLASSES)(pooled))


def windows_mixed(features, labels, mode, params):
    """Swin's windows folded into the batch, then mixed across samples (refused): params mix
    "window_mean" subtracts the mean over every window of the batch, "transpose" takes the
    windows' rows with transpose [1, 0, 2] (pixels first, every window of every sample),
    "window_major" partitions with the windows before the batch (transpose [1, 3, 0, 2, 4,
    5]: row r the window r // B of sample r % B), "rolled_keys" attends from each window to
    the keys of the row before it (tf.roll along the folded rows), "batch_second" reshapes the windows back to
    [B, nW, n, C], moves the batch second (transpose [1, 0, 2, 3]) and folds that."""
    x = L.Dense(DIM)(features)
    mix = params.get("mix", "window_mean")
    if mix == "window_major":
        x = tf.reshape(x, [-1, SIDE // WINDOW, WINDOW, SIDE // WINDOW, WINDOW, DIM])
        windows = tf.reshape(tf.transpose(x, [1, 3, 0, 2, 4, 5]), [-1, WINDOW * WINDOW, DIM])
    else:
        windows = window_partition(x, WINDOW)                             # [B*4, 16, DIM]
    if mix == "window_mean":
        windows = windows - tf.reduce_mean(windows, 0)
    elif mix == "transpose":
        windows = tf.transpose(L.Dense(DIM)(tf.transpose(windows, [1, 0, 2])), [1, 0, 2])
    elif mix == "rolled_keys":  # each window's queries by the previous row's keys
        scores = tf.matmul(windows, tf.roll(windows, 1, 0), transpose_b=True)
        windows = tf.matmul(tf.nn.softmax(scores), windows)
    elif mix == "batch_second":
        per_image = tf.reshape(windows, [-1, 4, WINDOW * WINDOW, DIM])
        windows = tf.reshape(tf.transpose(per_image, [1, 0, 2, 3]), [-1, WINDOW * WINDOW, DIM])
    h = L.Dense(DIM, activation="relu")(windows)
    h = tf.reduce_mean(tf.reshape(h, [-1, 4, WINDOW * WINDOW, DIM]), [1, 2])
    return spec(mode, labels, L.Dense(CLASSES)(h))


def views_of_other_samples(features, labels, mode, params):
    """tf.tile(x, [3, 1]) along the batch (row r is sample r % B, not a sample's 3 views),
    reshaped [-1, 3, d] as if each sample's own (refused: it pairs rows of different
    samples)."""
    flat = L.Flatten()(features)
    h = L.Dense(16, activation="relu")(tf.tile(flat, [3, 1]))
    return spec(mode, labels, L.Dense(CLASSES)(tf.reduce_mean(tf.reshape(h, [-1, 3, 16]), 1)))
