"""Ops that unseen user models needed (issue 21's kernels) train on the CS with TF's numbers
and evaluate as the CPU path does: tf.reduce_logsumexp (a mixture density network),
tf.math.top_k (k-max pooling, values and indices, ties), slices with tf.newaxis, `...` and
negative strides, dilated Keras Conv1D (causal, same, valid); what stays refused says so
in one line naming the user's line."""
import inspect

import cs_inprocess
import numpy as np
import op_models as o
import pytest
import tensorflow as tf

from common.errors import CSRunError
from coordinator.compiler import compile_model
from coordinator.compiler.lowering import slice_bounds
from coordinator.compiler.operands import static_shape
from cs_api.attrs import from_attr
from wafer.kernels import build_kernel


@pytest.mark.slow
@pytest.mark.parametrize("model_fn, input_fn, params, kernels, evaluate", [
    (o.mixture_density, o.regression_input_fn, {}, {"is_finite", "select", "stop_gradient", "reduce"},
     True),
    (o.k_max_pooling, o.sequence_input_fn, {"ties": True}, {"top_k"}, True),
    (o.k_max_pooling, o.sequence_input_fn, {"use_positions": True}, {"top_k", "cast"}, False),
    (o.new_axis_slices, o.sequence_input_fn, {}, {"slice", "reshape"}, False),
    (o.dilated_conv1d, o.sequence_input_fn, {}, {"conv2d", "pad", "reshape"}, False),
], ids=["logsumexp", "top_k_ties", "top_k_indices", "newaxis_ellipsis", "dilated_conv1d"])
def test_op_trains_like_tensorflow_and_evaluates_like_the_cpu(tmp_path, model_fn, input_fn, params,
                                                              kernels, evaluate):
    params = {"runconfig": {"tf_random_seed": 5}, **params}
    result = cs_inprocess.compare(model_fn, input_fn, params, str(tmp_path), steps=4)
    assert kernels <= {k.type for k in result.compiled.program.kernels}
    assert not cs_inprocess.mismatches(result), cs_inprocess.mismatches(result)
    if evaluate:
        assert not cs_inprocess.evaluation_mismatch(model_fn, input_fn, params, str(tmp_path), result)


@pytest.mark.slow
def test_dilated_conv1d_is_one_dilated_convolution_per_layer(tmp_path):
    compiled = compile_model(o.dilated_conv1d, o.sequence_input_fn, {}, str(tmp_path))
    convs = [k for k in compiled.program.kernels if k.type == "conv2d"]
    assert len(convs) == 3
    assert [from_attr(k.attrs["dilations"]) for k in convs] == [[1, 2], [1, 2], [1, 4]]


def test_newaxis_before_the_batch_axis_is_refused_naming_the_line(tmp_path):
    with pytest.raises(CSRunError) as info:
        compile_model(o.refused_slices, o.sequence_input_fn, {}, str(tmp_path), validate_only=True)
    lines = inspect.getsource(o).splitlines()
    line = next(i for i, text in enumerate(lines) if "features[tf.newaxis]" in text) + 1
    assert "\n" not in str(info.value)
    assert info.value.message.startswith(
        f"validation failed: StridedSlice 'strided_slice' at tests/op_models.py:{line}: views "
        "a per-sample value as a row of the whole batch (a leading axis of 1) that no "
        "element-wise op pairs with per-sample values")
    assert "as in sq[:, None] + sq[None, :] or tf.equal(labels[:, None], labels[None, :]); " \
        "reduce over the batch in the loss instead" in info.value.message


SLICES = [lambda t: t[:, ::-1], lambda t: t[:, -2:-9:-3], lambda t: t[:, -100:2, 1],
          lambda t: t[..., 0], lambda t: t[:, tf.newaxis, ..., ::2], lambda t: t[:, 3:1:-1, -1],
          lambda t: t[:, 7:], lambda t: t[:, -1:-6:-1, tf.newaxis], lambda t: t[..., tf.newaxis],
          lambda t: t[:, 1, ..., tf.newaxis, 1:3], lambda t: t[:, -7::-1], lambda t: t[:, 2:-1:2]]


@pytest.mark.parametrize("case", range(len(SLICES)))
def test_strided_slices_resolve_as_tensorflows_kernel(case):
    """The bounds the compiler gives the slice kernel (then a reshape) take TF's values."""
    x = np.arange(2 * 5 * 4, dtype=np.float32).reshape(2, 5, 4)
    with tf.Graph().as_default():
        op = SLICES[case](tf.compat.v1.placeholder(tf.float32, x.shape)).op
        spec = [tf.get_static_value(t) for t in op.inputs[1:4]]
        bounds = slice_bounds(op, *spec)
        out_shape = static_shape(op.outputs[0])
    attrs = {"begin": [b[0] for b in bounds[1:]], "end": [b[1] for b in bounds[1:]],
             "strides": [b[2] for b in bounds[1:]], "shrink": [a - 1 for a, b in enumerate(bounds) if b[3]]}
    sliced, _ = build_kernel("slice", "s", attrs, [x.shape[1:]]).forward({}, [x], None)
    np.testing.assert_array_equal(sliced.reshape(out_shape), SLICES[case](tf.constant(x)).numpy())
