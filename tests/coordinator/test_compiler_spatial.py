"""Keras' spatial layers compile onto the CS's kernels and train as TensorFlow does: a
UNet-like autoencoder, a MobileNet-style classifier, the 1-D forms with pooling of every
kind, resizing with transposed and dilated convolutions, 3-D convolution and pooling; what is refused is named in
the user's terms, a line per layer."""
import inspect
import os
import subprocess
import sys
import textwrap

import cs_inprocess
import pytest
import spatial_models as s

from common.errors import CSRunError
from coordinator.compiler import compile_model
from examples.mlp import mixed_float16

PARAMS = {"runconfig": {"tf_random_seed": 3}}


@pytest.mark.slow
@pytest.mark.parametrize("model_fn, input_fn, kernels", [
    (s.unet, s.image_input_fn, {"conv2d", "max_pool", "conv2d_transpose", "tile", "concat"}),
    (s.mobilenet, s.image_input_fn, {"conv2d", "depthwise_conv2d", "reduce", "dense"}),
    (s.sequence_layers, s.sequence_input_fn,
     {"conv2d_transpose", "depthwise_conv2d", "max_pool", "avg_pool", "tile", "reduce"}),
    (s.resize_layers, s.image_input_fn, {"resize", "conv2d", "avg_pool", "conv2d_transpose"}),
    (s.volume_layers, s.image_input_fn, {"conv3d", "max_pool3d", "avg_pool3d", "tile"}),
], ids=["unet", "mobilenet", "sequence_layers", "resize_layers", "volume_layers"])
def test_spatial_model_trains_like_tensorflow(tmp_path, model_fn, input_fn, kernels):
    result = cs_inprocess.compare(model_fn, input_fn, PARAMS, str(tmp_path), steps=4)
    assert kernels <= {k.type for k in result.compiled.program.kernels}
    assert not cs_inprocess.mismatches(result), cs_inprocess.mismatches(result)


def test_conv3d_then_max_pool3d_over_tied_windows_trains_like_tensorflow(tmp_path):
    """Dead ReLUs leave windows of the conv's bias alone, ties everywhere: the CS hands each
    window's gradient to the values TF's MaxPool3DGrad does (the suite's TF runs Eigen's
    kernels, TF_ENABLE_ONEDNN_OPTS=0: every value within 1e-5 of the maximum)."""
    result = cs_inprocess.compare(s.tied_volume, s.vector_input_fn, PARAMS, str(tmp_path), steps=4)
    assert {k.attrs["ties"].s for k in result.compiled.program.kernels if k.type == "max_pool3d"} == {"near"}
    assert not cs_inprocess.mismatches(result), cs_inprocess.mismatches(result)


@pytest.mark.slow
def test_with_onednn_max_pool3d_ties_train_like_its_kernel(tmp_path):
    """TF_ENABLE_ONEDNN_OPTS=1 (TF's default on AVX-512 CPUs): TF's graph MaxPool3DGrad gives
    a window's gradient to its first maximum only (where oneDNN runs it: Eigen's rule
    elsewhere); the compiler asks the host's TF, and the CS trains like it (with the old
    every-tie rule the conv's bias moved apart at step 3 on such a CPU)."""
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, "tests")
        import cs_inprocess, spatial_models as s
        result = cs_inprocess.compare(s.tied_volume, s.vector_input_fn, {PARAMS!r}, {str(tmp_path)!r}, steps=4)
        print(sorted({{k.attrs["ties"].s for k in result.compiled.program.kernels if k.type == "max_pool3d"}}))
        print(cs_inprocess.mismatches(result))
    """)
    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    ties, mismatches = proc.stdout.splitlines()[-2:]
    assert ties in ("['first']", "['near']") and mismatches == "[]", proc.stdout[-2000:]


def test_compile_report_and_wafer_picture_place_the_new_kernels(tmp_path):
    compiled = compile_model(s.mobilenet, s.image_input_fn, PARAMS, str(tmp_path))
    report = (tmp_path / "cs_compile").glob("*/compile_report.txt")
    text = next(report).read_text()
    assert "depthwise_conv2d" in text
    assert any(k.type == "depthwise_conv2d" and k.region.width * k.region.height >= 1
               for k in compiled.program.kernels)
    assert next((tmp_path / "cs_compile").glob("*/placement.png")).stat().st_size > 0


def line_of(fragment):
    lines = inspect.getsource(s).splitlines()
    return f"tests/spatial_models.py:{next(i for i, line in enumerate(lines) if fragment in line) + 1}"


def test_refusals_name_each_layer_the_user_wrote_once_and_what_to_use_instead(tmp_path):
    """The two hand-written batch norms (tf.nn.moments + tf.nn.batch_normalization) are
    BatchNormalization in training, which the CS carries out: the Conv3DTranspose alone is
    refused, once, naming the layer and what to use instead."""
    with pytest.raises(CSRunError) as info:
        compile_model(s.refused_layers, s.image_input_fn, PARAMS, str(tmp_path), validate_only=True)
    error, volume = info.value, line_of('name="volume"')
    assert "\n" not in str(error)
    assert error.message.startswith(f"validation failed: Conv3DTranspose at {volume} (layer 'volume")
    assert "upsample with UpSampling3D, then Conv3D" in error.message
    lines = error.detail.splitlines()
    assert lines[0] == "Unsupported layers and operations (1):"
    assert not any("moments" in line or "batchnorm" in line for line in lines)


def test_volume_pools_in_float16_are_refused_in_one_line_not_crashed(tmp_path):
    """Under mixed_float16, TF's CPU has no float16 MaxPool3D or AvgPool3D kernel (the
    compiler crashed evaluating UpSampling3D's multiples through one): refused in one line,
    the pools saying TF cannot run them either; the float16 Conv3Ds are carried out
    (tests/coordinator/test_mixed_conv3d.py)."""
    with pytest.raises(CSRunError) as info:
        compile_model(mixed_float16(s.volume_layers), s.image_input_fn, PARAMS, str(tmp_path), validate_only=True)
    assert "\n" not in info.value.message
    assert info.value.message.startswith("validation failed: MaxPooling3D")
    for pool in ("MaxPool3D", "AvgPool3D"):
        assert f"{pool} in float16 (mixed precision) has no TF CPU kernel" in info.value.detail
    assert "Conv3D '" not in info.value.detail  # (the float16 convs: none refused)


def test_the_spatial_kernels_in_float16_are_refused_naming_the_layer(tmp_path):
    """What is not proven against TF's float16 kernels (a dilated depthwise conv) is
    refused, not rounded otherwise than TF rounds; a depth multiplier is (test_half_parity)."""
    with pytest.raises(CSRunError) as info:
        compile_model(mixed_float16(s.mobilenet), s.image_input_fn, PARAMS, str(tmp_path), validate_only=True)
    assert info.value.message.startswith(
        f"validation failed: DepthwiseConv2D at {line_of('L.DepthwiseConv2D(2, dilation_rate=2')} ")
    assert "in float16 (mixed precision) is carried out without dilation" in info.value.message
    assert "dtype='float32'" in info.value.message and "more unsupported" not in info.value.message
