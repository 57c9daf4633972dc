"""Ops that unseen tabular models needed (issue 21) train on the CS with TF's numbers and
evaluate as the CPU path does: hashed crosses (tf.math.floormod of ids), class weights
(tf.gather of a constant), ordinal cut-points (tf.cumsum on the weight program), tf.cumsum of
activations, tf.math.floormod of floats, tf.math.divide_no_nan, tf.floor, tf.math.ceil,
tf.round, tf.reduce_prod, Bucketize (Keras Discretization); each kernel computes TF's values (bit for bit, but reduce_prod's
order of products). What stays refused says so in one line with what to use instead."""
import inspect

import cs_inprocess
import numpy as np
import pytest
import tabular_models as t
import tensorflow as tf

from common.errors import CSRunError
from coordinator.compiler import compile_model
from wafer.kernels import RunContext, build_kernel


@pytest.mark.slow
@pytest.mark.parametrize("model_fn, input_fn, kernels", [
    (t.hashed_cross, t.categorical_input_fn, {"binary", "one_hot", "gather"}),  # a constant's too
    (t.ordinal, t.ordinal_input_fn, {"cumsum"}),
    (t.rounded_features, t.regression_input_fn, {"cumsum", "binary", "activation", "reduce"}),
    (t.bucketized, t.regression_input_fn, {"bucketize", "gather", "one_hot"}),
], ids=["hashed_cross", "ordinal_cutpoints", "cumsum_floor_round", "bucketized"])
def test_tabular_op_trains_like_tensorflow_and_evaluates_like_the_cpu(tmp_path, model_fn, input_fn,
                                                                     kernels):
    params = {"runconfig": {"tf_random_seed": 5}}
    result = cs_inprocess.compare(model_fn, input_fn, params, str(tmp_path), steps=4)
    program = result.compiled.program
    assert kernels <= {k.type for k in (*program.kernels, *program.weight_program.kernels)}
    assert not cs_inprocess.mismatches(result), cs_inprocess.mismatches(result)
    assert not cs_inprocess.evaluation_mismatch(model_fn, input_fn, params, str(tmp_path), result)


def _run(kind, attrs, x, y=None, grad=None):
    kernel = build_kernel(kind, "k", attrs, [x.shape[1:]] + ([y.shape[1:]] if y is not None else []))
    ctx = RunContext(training=True, batch_size=len(x))
    out, cache = kernel.forward({}, [x] if y is None else [x, y], ctx)
    if grad is None:
        return out, None
    return out, kernel.backward({}, cache, grad, ctx)[0]


@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
def test_cumsum_is_tensorflows_forward_and_gradient(exclusive, reverse):
    x = np.random.default_rng(0).normal(size=(3, 5, 7)).astype(np.float32) * 1e3
    g = np.random.default_rng(1).normal(size=x.shape).astype(np.float32)
    out, (dx,) = _run("cumsum", {"axis": 1, "exclusive": exclusive, "reverse": reverse}, x, grad=g)
    tx = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(tx)
        want = tf.cumsum(tx, axis=2, exclusive=exclusive, reverse=reverse)
    np.testing.assert_array_equal(out, want.numpy())
    np.testing.assert_array_equal(dx, tape.gradient(want, tx, output_gradients=tf.constant(g)).numpy())


def test_divnonan_floormod_floordiv_floor_ceil_round_are_tensorflows():
    rng = np.random.default_rng(2)
    x = np.concatenate([rng.normal(size=(2, 8)) * 10, np.full((1, 8), 2.5),
                        np.arange(-4, 4, dtype=np.float64)[None] * 0.5]).astype(np.float32)
    y = np.where(rng.random(x.shape) < 0.5, -1.7, 1.3).astype(np.float32)
    y[0, :3] = 0
    got, (dx, dy) = _run("binary", {"op": "div_no_nan", "operands": "ii"}, x, y, grad=np.ones_like(x))
    tx, ty = tf.constant(x), tf.constant(y)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([tx, ty])
        want = tf.math.divide_no_nan(tx, ty)
    np.testing.assert_array_equal(got, want.numpy())
    np.testing.assert_array_equal(dx, tape.gradient(want, tx).numpy())
    np.testing.assert_array_equal(dy, tape.gradient(want, ty).numpy())
    y[0, :3] = 1.3
    for op, fn in [("floor_mod", tf.math.floormod), ("floor_div", tf.math.floordiv)]:
        np.testing.assert_array_equal(_run("binary", {"op": op, "operands": "ii"}, x, y)[0], fn(x, y).numpy())
        ints = (x * 7).astype(np.int32), np.where(y < 0, -3, 4).astype(np.int32)
        np.testing.assert_array_equal(_run("binary", {"op": op, "operands": "ii"}, *ints)[0],
                                      fn(*ints).numpy())
    for name, fn in [("floor", tf.floor), ("ceil", tf.math.ceil), ("round", tf.round)]:
        np.testing.assert_array_equal(_run("activation", {"function": name}, x)[0], fn(x).numpy())


def test_bucketize_is_tensorflows_at_the_boundaries_and_beyond():
    boundaries = [-1.0, -0.25, 0.0, 0.5, 1.0]
    x = np.array([[-2.0, -1.0, -0.25, -0.0, 0.0, 0.25, 0.5, 1.0, 3.0],
                  [np.nan, np.inf, -np.inf, 1e-30, -1e-30, 0.49999997, 0.5000001, 0.9999999, 1.0000001]],
                 np.float32)
    got, _ = _run("bucketize", {"boundaries": boundaries}, x)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, tf.raw_ops.Bucketize(input=x, boundaries=boundaries).numpy())


def test_a_string_feature_is_refused_naming_input_fn_and_what_to_do(tmp_path):
    with pytest.raises(CSRunError) as info:
        compile_model(t.string_feature, t.string_input_fn, {}, str(tmp_path), validate_only=True)
    line = inspect.getsourcelines(t.string_input_fn)[1]
    assert "\n" not in str(info.value)
    assert f"Placeholder 'features.word' at tests/tabular_models.py:{line} (input_fn): input_fn " \
           "yields features.word as string: the CS streams float32, float16, int32, int64 or bool; map " \
           "strings to integer ids in input_fn (tf.strings.to_hash_bucket_fast" in info.value.message


def test_a_sort_across_the_batch_in_the_loss_validates(tmp_path):
    """A Cox partial likelihood sorts the batch by time: a loss of the whole batch
    (tests/coordinator/test_survival_losses.py trains it)."""
    compile_model(t.cox_partial_likelihood, t.survival_input_fn, {}, str(tmp_path),
                  validate_only=True)


def test_per_sample_weights_divided_by_their_count_validate(tmp_path):
    """SUM_BY_NONZERO_WEIGHTS (tests/coordinator/test_weighted_losses.py trains it)."""
    params = {"reduction": tf.compat.v1.losses.Reduction.SUM_BY_NONZERO_WEIGHTS}
    compile_model(t.hashed_cross, t.categorical_input_fn, params, str(tmp_path), validate_only=True)


def test_a_keras_optimizer_in_model_fn_is_refused_saying_which_optimizers_work(tmp_path):
    with pytest.raises(CSRunError) as info:
        compile_model(t.keras_optimizer, t.categorical_input_fn, {}, str(tmp_path), validate_only=True)
    assert "\n" not in str(info.value)
    assert info.value.message.startswith("model_fn raised AttributeError at tests/tabular_models.py:")
    assert "use a tf.compat.v1.train optimizer" in info.value.hint


@pytest.mark.parametrize("axes", [[1], [0, 2]])
def test_reduce_prod_is_tensorflows_forward_and_gradient_with_zeros(axes):
    x = np.random.default_rng(3).uniform(0.5, 1.5, size=(3, 4, 5, 2)).astype(np.float32)
    x[0, 1, 2, 0] = x[1, 2, 3, 1] = x[1, 0, 3, 1] = 0  # one zero, and two in one product
    kept = [d for a, d in enumerate(x.shape[1:]) if a not in axes]
    g = np.random.default_rng(4).normal(size=(3, *kept)).astype(np.float32)
    out, (dx,) = _run("reduce", {"op": "prod", "axes": axes, "keepdims": False}, x, grad=g)
    tx = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(tx)
        want = tf.reduce_prod(tx, axis=[a + 1 for a in axes])
    np.testing.assert_allclose(out, want.numpy(), rtol=1e-6)
    np.testing.assert_allclose(dx, tape.gradient(want, tx, output_gradients=tf.constant(g)).numpy(),
                               rtol=1e-6)
