"""Vision and sequence constructs that unseen user models needed (issue 21) train on the CS
with TF's numbers and evaluate as the CPU path does: Keras Conv2D(groups=) (a grouped conv2d
kernel), tf.pad REFLECT/SYMMETRIC (the pad kernel's mirror modes, MirrorPadGrad),
Bidirectional(return_sequences=True) (ReverseV2) with a TimeDistributed head, Keras Masking
(reduce_any) and Embedding(mask_zero=True) (a tiled bool mask) before a recurrent layer,
a softmax cross-entropy of label-smoothed one-hot tags per token (logits of rank 3), tf.einsum
of one operand (a sum and a transpose)."""
import cs_inprocess
import numpy as np
import pytest
import tensorflow as tf
import vision_sequence_models as v

from wafer.kernels import build_kernel
from wafer.kernels.base import RunContext


@pytest.mark.slow
@pytest.mark.parametrize("model_fn, input_fn, kernels", [
    (v.grouped_conv, v.image_input_fn, {"conv2d"}),
    (v.mirror_padding, v.image_input_fn, {"pad"}),
    (v.bidirectional_tagger, v.sequence_input_fn, {"slice", "concat"}),
    (v.masked_rnn, v.sequence_input_fn, {"reduce", "tile", "select"}),
    (v.masked_embedding_rnn, v.token_input_fn, {"tile", "select"}),
    (v.smoothed_tagger, v.token_input_fn, {"softmax_cross_entropy_with_logits"}),
    (v.einsum_pooling, v.token_input_fn, {"reduce", "transpose"}),
], ids=["grouped_conv", "mirror_pad", "bidirectional_time_distributed", "masking", "mask_zero",
        "smoothed_tagger", "einsum_of_one_operand"])
def test_construct_trains_like_tensorflow_and_evaluates_like_the_cpu(tmp_path, model_fn, input_fn,
                                                                    kernels):
    params = {"runconfig": {"tf_random_seed": 4}}
    result = cs_inprocess.compare(model_fn, input_fn, params, str(tmp_path), steps=4)
    assert kernels <= {k.type for k in result.compiled.program.kernels}
    assert not cs_inprocess.mismatches(result), cs_inprocess.mismatches(result)
    assert not cs_inprocess.evaluation_mismatch(model_fn, input_fn, params, str(tmp_path), result)


@pytest.mark.parametrize("mode, pads", [
    ("REFLECT", [[2, 1], [0, 2], [1, 1]]), ("SYMMETRIC", [[2, 3], [4, 0], [1, 2]])])
def test_mirror_pad_and_its_gradient_are_tensorflows(mode, pads):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 3, 4, 3)).astype(np.float32)
    kernel = build_kernel("pad", "p", {"paddings": [p for pair in pads for p in pair], "mode": mode},
                          [x.shape[1:]])
    ctx = RunContext(training=True, batch_size=2)
    y, _ = kernel.forward({}, [x], ctx)
    upstream = rng.normal(size=y.shape).astype(np.float32)
    (dx,), _ = kernel.backward({}, None, upstream, ctx)
    tx = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(tx)
        ty = tf.pad(tx, [[0, 0], *pads], mode=mode)
    np.testing.assert_array_equal(y, ty.numpy())
    np.testing.assert_allclose(dx, tape.gradient(ty, tx, output_gradients=upstream).numpy(),
                               rtol=1e-6, atol=1e-6)


def test_grouped_conv2d_is_tensorflows_grouped_convolution():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 5, 5, 6)).astype(np.float32)
    kernel = build_kernel("conv2d", "c", {"filters": 4, "kernel_size": [3, 3], "strides": [2, 1],
                                          "padding": "SAME", "groups": 2, "use_bias": False}, [x.shape[1:]])
    w = rng.normal(size=(3, 3, 3, 4)).astype(np.float32)
    ctx = RunContext(training=True, batch_size=2)
    y, cache = kernel.forward({"kernel": w}, [x], ctx)
    upstream = rng.normal(size=y.shape).astype(np.float32)
    (dx,), grads = kernel.backward({"kernel": w}, cache, upstream, ctx)
    tx, tw = tf.constant(x), tf.constant(w)
    with tf.GradientTape() as tape:
        tape.watch([tx, tw])
        ty = tf.concat([tf.nn.conv2d(a, b, [1, 2, 1, 1], "SAME") for a, b in
                        zip(tf.split(tx, 2, axis=-1), tf.split(tw, 2, axis=-1))], axis=-1)
    want_dx, want_dw = tape.gradient(ty, [tx, tw], output_gradients=upstream)
    np.testing.assert_allclose(y, ty.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dx, want_dx.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grads["kernel"], want_dw.numpy(), rtol=1e-5, atol=1e-5)
