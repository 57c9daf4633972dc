"""Windows, patches and Monte Carlo samples folded into the batch and back
(tests/window_models.py): Swin's window partition, window attention with a relative position
bias, shifted windows by tf.roll and the reverse; a VIB decoding k samples per input; ViT
patches by reshape and transpose, tf.image.extract_patches and tf.nn.space_to_depth; a pixel
shuffle; tf.repeat and tf.tile of per-sample values along axis 0 — each trains 4 steps on the
CS with TensorFlow's numbers and evaluates and predicts as the CPU path does, also when the
window count or k equals the batch size; windows mixed across samples (a mean over every
window, windows before the batch, keys of another row's window) are refused in one line
naming the op, also at those sizes."""
from __future__ import annotations

import cs_inprocess
import pytest
import window_models as w

PARAMS = {"runconfig": {"tf_random_seed": 3}}
STEPS, RTOL = 4, 1e-4

COMPARED = {
    "swin_shifted": (w.swin, {}),
    "swin_at_batch_4": (w.swin, {"batch": 4}),  # 4 windows an image, 4 images a batch
    "vit_reshaped_patches": (w.vit_patches, {}),
    "vit_extract_patches": (w.vit_patches, {"patches": "extract"}),
    "vit_space_to_depth": (w.vit_patches, {"patches": "space_to_depth"}),
    "pixel_shuffle": (w.pixel_shuffle, {}),
    "repeat_views": (w.repeated_views, {}),
    "tile_views_at_batch_3": (w.repeated_views, {"how": "tile", "batch": 3}),
    # TF's draws handed to the CS (compare_drawn): the same training, so each sample's (k, d)
    # draws and decodings are TF's rows b*k .. b*k+k-1
    "vib_eps": (w.vib, {}),
    "vib_tiled": (w.vib, {"draw": "tile"}),
    "vib_k_equals_batch": (w.vib, {"samples": 4, "batch": 4}),
    "vib_repeated_rows": (w.vib, {"draw": "repeat"}),
    "vib_predictive_mean_k_equals_batch": (w.vib, {"draw": "repeat", "average": "probabilities",
                                                   "samples": 4, "batch": 4}),
}


@pytest.mark.parametrize("name", COMPARED)
def test_folded_windows_patches_and_samples_train_evaluate_and_predict_like_tensorflow(
        tmp_path, name):
    model_fn, extra = COMPARED[name]
    params = {**PARAMS, **extra}
    compare = cs_inprocess.compare_drawn if model_fn is w.vib else cs_inprocess.compare
    result = compare(model_fn, w.image_input_fn, params, str(tmp_path), STEPS)
    assert cs_inprocess.mismatches(result, RTOL) == []
    assert cs_inprocess.cpu_path_mismatches(model_fn, w.image_input_fn, params, str(tmp_path),
                                            result) == []
    if model_fn is w.swin:  # each image's 4 windows' scores, 2 heads of 16 pixels by 16
        scores = [list(k.output_shape) for k in result.compiled.program.kernels
                  if k.type == "matmul" and k.name.endswith("attn_1/MatMul")]
        assert scores == [[4, 2, 16, 16]] * 2


MIXED = [
    (w.windows_mixed, {"mix": "window_mean"}, "Mean 'Mean'"),
    (w.windows_mixed, {"mix": "transpose"}, "Transpose 'transpose_1'"),
    (w.windows_mixed, {"mix": "window_major"}, "Transpose 'transpose'"),
    (w.windows_mixed, {"mix": "rolled_keys"}, "Roll 'Roll'"),
    (w.windows_mixed, {"mix": "batch_second"}, "Transpose 'transpose_1'"),
    (w.views_of_other_samples, {}, "Tile 'Tile'"),
]


@pytest.mark.parametrize("batch", [8, 4, 3], ids=["batch_8", "windows_equal_batch", "k_equals_batch"])
@pytest.mark.parametrize("model_fn, extra, named", MIXED, ids=[
    "mean_over_every_window", "pixels_before_windows", "windows_before_the_batch", "rolled_keys",
    "batch_second_then_folded", "tiled_along_the_batch"])
def test_windows_mixed_across_samples_are_refused_in_one_line(tmp_path, model_fn, extra, named,
                                                              batch):
    """At batch 4 the 4 windows an image equal the batch, at batch 3 the 3 views: the same
    refusal, whichever axis the shapes would let the compiler take for another."""
    line = cs_inprocess.refusal(model_fn, w.image_input_fn, {**PARAMS, **extra, "batch": batch},
                                str(tmp_path), w.__file__)
    assert line.startswith(f"validation failed: {named} at "), line
