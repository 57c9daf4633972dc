"""Keras' spatial layers compile onto the CS's kernels and train as TensorFlow does: a
UNet-like autoencoder, a MobileNet-style classifier, the 1-D forms with pooling of every
kind, and resizing with transposed and dilated convolutions."""
import cs_inprocess
import pytest
import spatial_models as s

from coordinator.compiler import compile_model

PARAMS = {"runconfig": {"tf_random_seed": 3}}


@pytest.mark.slow
@pytest.mark.parametrize("model_fn, input_fn, kernels", [
    (s.unet, s.image_input_fn, {"conv2d", "max_pool", "conv2d_transpose", "tile", "concat"}),
    (s.mobilenet, s.image_input_fn, {"conv2d", "depthwise_conv2d", "reduce", "dense"}),
    (s.sequence_layers, s.sequence_input_fn,
     {"conv2d_transpose", "depthwise_conv2d", "max_pool", "avg_pool", "tile", "reduce"}),
    (s.resize_layers, s.image_input_fn, {"resize", "conv2d", "avg_pool", "conv2d_transpose"}),
], ids=["unet", "mobilenet", "sequence_layers", "resize_layers"])
def test_spatial_model_trains_like_tensorflow(tmp_path, model_fn, input_fn, kernels):
    result = cs_inprocess.compare(model_fn, input_fn, PARAMS, str(tmp_path), steps=4)
    assert kernels <= {k.type for k in result.compiled.program.kernels}
    assert not cs_inprocess.mismatches(result), cs_inprocess.mismatches(result)


def test_compile_report_and_wafer_picture_place_the_new_kernels(tmp_path):
    compiled = compile_model(s.mobilenet, s.image_input_fn, PARAMS, str(tmp_path))
    report = (tmp_path / "cs_compile").glob("*/compile_report.txt")
    text = next(report).read_text()
    assert "depthwise_conv2d" in text
    assert any(k.type == "depthwise_conv2d" and k.region.width * k.region.height >= 1
               for k in compiled.program.kernels)
    assert next((tmp_path / "cs_compile").glob("*/placement.png")).stat().st_size > 0
