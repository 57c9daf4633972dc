"""A per-sample axis folded into the batch (tf.reshape(bags, [-1, d]), a Dense per instance,
the reshape back) trains on the CS with TensorFlow's numbers and evaluates and predicts with
the CPU path's; ops mixing the folded rows of different samples are refused in one line
naming the op; of several refusals the line leads with the first in graph order."""
import os

import cs_inprocess
import folded_batch_models as f
import pytest

from common.errors import CSRunError
from coordinator.compiler import compile_model

SEED = {"runconfig": {"tf_random_seed": 3}}
RTOL = 1e-5


@pytest.fixture(scope="module")
def mil(tmp_path_factory):
    model_dir = str(tmp_path_factory.mktemp("mil"))
    return model_dir, cs_inprocess.compare(f.mil_attention, f.bags_input_fn, SEED, model_dir,
                                           steps=4)


def test_attention_mil_over_folded_instances_trains_like_tensorflow(mil):
    _, result = mil
    assert cs_inprocess.mismatches(result, RTOL) == []
    # the instances' Dense computes each bag's 8 rows as its own (8, 16) value
    dense = next(k for k in result.compiled.program.kernels if k.type == "dense")
    assert list(dense.output_shape) == [8, 16]


def test_attention_mil_evaluates_and_predicts_like_the_cpu(mil):
    model_dir, result = mil
    assert cs_inprocess.cpu_path_mismatches(f.mil_attention, f.bags_input_fn, SEED, model_dir,
                                            result) == []


@pytest.mark.parametrize("model_fn, input_fn, params", [
    (f.mil_attention, f.bags_input_fn, {"fold": "shape", "layer_norm": True}),
    (f.time_distributed, f.seq_input_fn, {}),
], ids=["shape_times_k_layer_norm", "time_distributed_by_hand"])
def test_folded_rows_train_like_tensorflow(tmp_path, model_fn, input_fn, params):
    result = cs_inprocess.compare(model_fn, input_fn, {**SEED, **params}, str(tmp_path), steps=4)
    assert cs_inprocess.mismatches(result, RTOL) == []


def test_noise_drawn_on_folded_rows_is_one_number_an_element_in_tensorflows_order(tmp_path):
    """GaussianNoise on the [B*8, 16] rows, the CS handed the numbers TF drew: the same
    training, so each sample's (8, 16) numbers are TF's rows b*8 .. b*8+7."""
    result = cs_inprocess.compare_drawn(f.mil_attention, f.bags_input_fn, {**SEED, "noise": 0.5},
                                        str(tmp_path), steps=4)
    assert cs_inprocess.mismatches(result, RTOL) == []
    assert [list(k.output_shape) for k in result.compiled.program.kernels
            if k.type == "random"] == [[8, 16]]


def test_keras_dropout_on_folded_rows_trains_and_evaluates(tmp_path):
    params = {**SEED, "dropout": 0.25}
    model_dir = str(tmp_path)
    result = cs_inprocess.compare(f.mil_attention, f.bags_input_fn, params, model_dir, steps=4)
    dropout = next(k for k in result.compiled.program.kernels if k.type == "dropout")
    # its own mask, one keep decision per element of each bag's (8, 16) rows
    assert list(dropout.output_shape) == [8, 16] and "noise_shape" not in dropout.attrs
    assert all(0.0 < loss < 2.0 for loss in result.cs.losses)
    assert result.cs.state["dense/kernel"].tolist() != result.compiled.initial_weights["dense/kernel"].tolist()
    # evaluation draws no mask: the CPU path's metrics on the CS's checkpoint
    assert cs_inprocess.evaluation_mismatch(f.mil_attention, f.bags_input_fn, params, model_dir,
                                            result) == ""


@pytest.mark.parametrize("pool", [False, True], ids=["conv", "conv_and_max_pool"])
def test_conv2d_over_folded_frames_trains_evaluates_and_predicts_like_tensorflow(tmp_path, pool):
    model_dir, params = str(tmp_path), {**SEED, "pool": pool}
    result = cs_inprocess.compare(f.frame_conv, f.clips_input_fn, params, model_dir, steps=4)
    assert cs_inprocess.mismatches(result, RTOL) == []
    kernels = {k.type: k for k in result.compiled.program.kernels}
    assert list(kernels["conv2d"].output_shape) == [3, 6, 6, 4]  # each clip's 3 frames
    if pool:  # each frame pooled on its own
        assert list(kernels["max_pool"].output_shape) == [3, 3, 3, 4]
    assert cs_inprocess.cpu_path_mismatches(f.frame_conv, f.clips_input_fn, params, model_dir,
                                            result) == []


@pytest.mark.parametrize("model_fn, params, named", [
    (f.folded_batch_mean, {}, "Mean 'Mean'"),
    (f.folded_batch_norm, {}, "BatchNormalization at"),
    (f.folded_gram, {}, "MatMul 'MatMul'"),
    (f.folded_softmax, {}, "Softmax 'Softmax'"),
    (f.folded_rotate, {}, "StridedSlice 'strided_slice'"),
], ids=["mean_over_folded_batch", "batch_norm_over_folded_batch", "matmul_across_rows",
        "softmax_over_every_bags_rows", "rows_rotated_across_bags"])
def test_mixing_folded_rows_is_refused_naming_the_op(tmp_path, model_fn, params, named):
    line = cs_inprocess.refusal(model_fn, f.bags_input_fn, {**SEED, **params}, str(tmp_path), f.__file__)
    assert line.startswith(f"validation failed: {named}") and "folded into the batch" in line, line


def test_the_refusal_leads_with_the_reshape_the_dropout_follows(tmp_path):
    """A reshape whose rows straddle samples, then a Dropout drawn on those rows: the line
    names the Reshape (first in graph order), says how many more and where they are listed."""
    with pytest.raises(CSRunError) as info:
        compile_model(f.misfolded, f.seq_input_fn, SEED, str(tmp_path), validate_only=True)
    error, report = info.value, os.path.join(str(tmp_path), "cs_compile", "validation_report.txt")
    assert "\n" not in str(error)
    assert error.message.startswith("validation failed: Reshape 'Reshape' at "
                                    "tests/folded_batch_models.py:")
    assert "reshapes (8, 6, 5) to (15, 16)" in error.message
    assert "(and 1 more unsupported layer or operation)" in error.message
    assert "every one is listed" not in error.hint and f"{report} give all 2" in error.hint
    listed = open(report).read()
    assert "Reshape 'Reshape'" in listed and "Dropout at" in listed
    assert listed.index("Reshape 'Reshape'") < listed.index("Dropout at")
    assert "Dropout at" in error.detail


def test_a_metric_of_folded_rows_is_refused_naming_its_layer(tmp_path):
    with pytest.raises(CSRunError) as info:
        compile_model(f.folded_metric, f.bags_input_fn, SEED, str(tmp_path), mode="eval",
                      validate_only=True)
    line = str(info.value)
    assert line.startswith("validation failed: Dense at tests/folded_batch_models.py:") and \
        "the host reads this value" in line and "\n" not in line, line
