"""A weight given to every sample (issue 21): a tiny ViT (class token tf.tile'd over the batch,
concatenated, a learned position embedding, Keras MultiHeadAttention), a Set Transformer's
pooling by multihead attention, Perceiver latents by tf.broadcast_to, DETR queries by
tf.repeat, tf.ones_like(x[:, :1]) * w, a tile by the static batch size, one repeating the
tokens within the sample too and a class token under mixed_float16 train on the CS as
TensorFlow trains them (the weight's gradient: the batch's sum of the per-sample gradients)
and evaluate there with the CPU path's metrics; a value the CS cannot compute, tiled, is
refused in one line."""
from __future__ import annotations

import inspect

import cs_inprocess
import numpy as np
import pytest
import tensorflow as tf
import tiled_weight_models as m

from common.errors import CSRunError
from wafer.kernels import build_kernel
from wafer.kernels.base import RunContext

BASE = {"batch_size": 8, "runconfig": {"tf_random_seed": 1}}
CASES = {
    "vit": (m.vit, m.image_input_fn, {}),
    "set_transformer_pma": (m.set_transformer_pma, m.set_input_fn, {}),
    "perceiver_latents": (m.perceiver_latents, m.set_input_fn, {}),
    "object_queries": (m.object_queries, m.set_input_fn, {}),
    "ones_like_token": (m.ones_like_token, m.set_input_fn, {}),
    "static_batch_tile": (m.static_batch_tile, m.set_input_fn, {}),
    "scaled_token": (m.scaled_token, m.set_input_fn, {}),
    "tiled_along_a_token_axis": (m.tiled_along_a_token_axis, m.set_input_fn, {}),
    "mixed_class_token": (m.mixed_class_token, m.set_input_fn, {}),
}
# float16 (the class token's float16 copy): the mixed precision tests' tolerance
RTOL = {"mixed_class_token": 1e-2}
# each model's tiled weight (the broadcast kernel's), and the shape it is read as
TILED = {"vit": ("class_token/cls_token", (1, 1, m.WIDTH)),
         "set_transformer_pma": ("pooling_by_attention/seed", (1, 2, m.WIDTH)),
         "perceiver_latents": ("latents", (3, m.WIDTH)),
         "object_queries": ("queries", (1, m.ELEMENTS, m.WIDTH)),
         "ones_like_token": ("token", (m.WIDTH,)),
         "static_batch_tile": ("token", (1, 1, m.WIDTH)),
         "scaled_token": ("mul", (1, 1, m.WIDTH)),
         "tiled_along_a_token_axis": ("tokens", (1, 2, m.WIDTH)),
         "mixed_class_token": ("class_token/cls_token", (1, 1, m.WIDTH))}


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    return cs_inprocess.cached_comparisons(CASES, BASE, tmp_path_factory)


@pytest.mark.slow
@pytest.mark.parametrize("name", CASES)
def test_a_weight_tiled_over_the_batch_trains_like_tensorflow(compared, name):
    result = compared(name)
    cs_inprocess.assert_same_training(result, rtol=RTOL.get(name, 1e-5))
    assert result.cs.losses[0] != result.cs.losses[-1]  # it trained
    variable, shape = TILED[name]
    [kernel] = [k for k in result.compiled.program.kernels if k.type == "broadcast"]
    [param] = kernel.params
    assert dict(kernel.attrs).get("precision") is None or name == "mixed_class_token"
    assert (param.variable.split(":")[0], tuple(param.shape)) == (variable, shape)
    source = variable if name != "scaled_token" else "token"
    if name in ("vit", "set_transformer_pma"):  # softmax ignores the key bias: exactly 0
        assert any(v.endswith("key/bias") for v in cs_inprocess.zero_gradient_variables(result.compiled))
    if name == "tiled_along_a_token_axis":  # the copies, then tiled within each sample
        [tile] = [k for k in result.compiled.program.kernels if k.type == "tile"]
        assert list(tile.inputs) == [kernel.name] and list(tile.output_shape) == [4, m.WIDTH]
    assert not np.array_equal(result.cs.state[source], result.compiled.initial_weights[source])


@pytest.mark.slow
def test_a_vit_evaluates_on_the_cs_with_the_cpu_paths_metrics(compared, tmp_path):
    assert cs_inprocess.evaluation_mismatch(m.vit, m.image_input_fn, BASE, str(tmp_path),
                                            compared("vit")) == ""


@pytest.mark.slow
def test_a_set_transformer_predicts_on_the_cs_what_the_cpu_path_predicts(compared, tmp_path):
    assert cs_inprocess.prediction_mismatch(m.set_transformer_pma, m.set_input_fn, BASE,
                                            str(tmp_path), compared("set_transformer_pma")) == ""


def test_a_token_tiled_by_tf_shape_is_a_broadcast_of_the_weight_programs_value(tmp_path):
    compiled = cs_inprocess.compile_checked(m.scaled_token, m.set_input_fn, BASE, str(tmp_path))
    program = compiled.program
    kernels = {k.type: k for k in program.kernels}
    broadcast = kernels["broadcast"]
    # it reads the features (for their number), and 2 * token as the weight program computes it
    assert list(broadcast.inputs) == ["features"] and list(broadcast.output_shape) == [1, m.WIDTH]
    assert [(p.variable, list(p.shape)) for p in broadcast.params] == [("mul", [1, 1, m.WIDTH])]
    assert [p.variable for p in program.weight_program.sources] == ["token"]
    assert kernels["concat"].inputs[0] == broadcast.name
    lines, start = inspect.getsourcelines(m.scaled_token)
    tile = start + next(i for i, line in enumerate(lines) if "tf.tile(" in line)
    assert broadcast.source.endswith(f"tiled_weight_models.py:{tile}")


def test_the_broadcast_gradient_is_the_batchs_sum_no_farther_from_float64_than_tfs():
    rng = np.random.default_rng(5)
    grads = rng.normal(size=(64, 3, 16)).astype(np.float32) * np.float32(1e3)
    kernel = build_kernel("broadcast", "cls", {"shape": [3, 16], "value": [1, 1, 16]}, [(5,)])
    value = rng.normal(size=(1, 1, 16)).astype(np.float32)
    out, _ = kernel.forward({"value": value}, [np.zeros((64, 5), np.float32)], RunContext(True, 64))
    np.testing.assert_array_equal(out, np.broadcast_to(value, (64, 3, 16)))
    accumulator = {"value": np.zeros((1, 1, 16), np.float32)}
    for start in range(0, 64, 16):  # four micro-batches
        kernel.backward({"value": value}, None, grads[start:start + 16],
                        RunContext(True, 64, accumulate=start > 0), accumulator)
    with tf.GradientTape() as tape:
        w = tf.constant(value)
        tape.watch(w)
        tiled = tf.tile(w, [64, 3, 1])
    tf_grad = tape.gradient(tiled, w, output_gradients=tf.constant(grads)).numpy()
    exact = grads.astype(np.float64).sum(axis=(0, 1), keepdims=True)
    cs_error = np.abs(accumulator["value"] - exact).max()
    assert cs_error <= max(np.abs(tf_grad - exact).max(), np.spacing(np.abs(exact).max()))


@pytest.mark.parametrize("model_fn, words", [
    (m.sorted_token, "computes on weights with TopKV2"),
])
def test_a_tiled_value_the_cs_cannot_compute_is_refused_in_one_line(tmp_path, model_fn, words):
    with pytest.raises(CSRunError) as refused:
        cs_inprocess.compile_checked(model_fn, m.set_input_fn, BASE, str(tmp_path))
    assert words in str(refused.value)
    assert cs_inprocess.refusal_problem(refused.value, m.__file__, cs_inprocess.model_op_words(
        model_fn, m.set_input_fn, BASE)) == ""
