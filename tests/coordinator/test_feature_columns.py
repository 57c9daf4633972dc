"""tf.compat.v1.feature_column.input_layer's indicator and embedding columns of identity ids
train on the CS with TF's numbers and evaluate and predict as the CPU path does (issue 21); the
embedding_bag kernel is TF's safe_embedding_lookup_sparse bit for bit; the columns that stay
out are refused in one line naming the column and what to write instead."""
import inspect

import cs_inprocess
import numpy as np
import pytest
import tabular_feature_models as t
import tensorflow as tf

from common.errors import CSRunError
from coordinator.compiler import compile_model
from wafer.kernels import RunContext, build_kernel

PARAMS = {"runconfig": {"tf_random_seed": 5}}


@pytest.mark.parametrize("model_fn, kernels", [
    (t.indicator, {"cast", "one_hot"}),
    (t.embedding_sqrtn, {"embedding_bag"}),  # multi-hot, -1 pads, an empty sample; Adagrad
    (t.default_id, {"embedding_bag", "select"}),  # ids outside [0, n) to the default id
    pytest.param(t.sequence_mean_pool, {"embedding_bag"}, marks=pytest.mark.slow),  # momentum
    pytest.param(t.wide_and_deep, {"embedding_bag", "cast"}, marks=pytest.mark.slow),
], ids=["indicator", "embedding_sqrtn", "default_id", "sequence_mean_pool", "wide_and_deep"])
def test_feature_columns_train_like_tensorflow_and_evaluate_and_predict_like_the_cpu(tmp_path, model_fn, kernels):
    result = cs_inprocess.compare(model_fn, t.input_fn, PARAMS, str(tmp_path), steps=4)
    assert kernels <= {k.type for k in result.compiled.program.kernels}
    assert not cs_inprocess.mismatches(result), cs_inprocess.mismatches(result)
    assert not cs_inprocess.evaluation_mismatch(model_fn, t.input_fn, PARAMS, str(tmp_path), result)
    assert not cs_inprocess.prediction_mismatch(model_fn, t.input_fn, PARAMS, str(tmp_path), result)


def test_an_embedding_column_under_sgd_trains_like_tensorflow(tmp_path):
    result = cs_inprocess.compare(t.embedding_mean, t.input_fn, PARAMS, str(tmp_path), steps=4)
    assert not cs_inprocess.mismatches(result), cs_inprocess.mismatches(result)


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_embedding_bag_is_safe_embedding_lookup_sparse_forward_and_gradient(combiner):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 7, size=(6, 9)).astype(np.int64)
    ids[rng.random(ids.shape) < 0.3] = -1
    ids[2] = -1  # a sample without ids
    table = (rng.normal(size=(7, 5)) * 10).astype(np.float32)
    grad = rng.normal(size=(6, 5)).astype(np.float32)
    kernel = build_kernel("embedding_bag", "bag", {"operands": "pi", "p0": [7, 5],
                                                   "combiner": combiner, "ignore": -1}, [(9,)])
    ctx = RunContext(training=True, batch_size=6)
    out, cache = kernel.forward({"p0": table}, [ids], ctx)
    rows, values = kernel.table_slices(cache, grad)
    weights = tf.Variable(table)
    with tf.GradientTape() as tape:
        kept = np.argwhere(ids != -1)  # (tf.sparse.from_dense would drop id 0)
        sparse = tf.SparseTensor(kept, ids[ids != -1], ids.shape)
        want = tf.nn.safe_embedding_lookup_sparse(weights, sparse, combiner=combiner)
    slices = tape.gradient(want, weights, output_gradients=tf.constant(grad))
    np.testing.assert_array_equal(out, want.numpy())
    np.testing.assert_array_equal(rows, slices.indices.numpy())
    np.testing.assert_array_equal(values, slices.values.numpy())


IDENTITY = ("use categorical_column_with_identity, or tf.one_hot / tf.nn.embedding_lookup and "
            "tf.reduce_mean of the rows")


@pytest.mark.parametrize("model_fn, column, call, instead", [
    (t.hash_bucket, "device_embedding", "fc.input_layer(features, columns)))", IDENTITY),
    (t.crossed, "age_bucketized_X_city_indicator", "fc.input_layer(features, columns)))", IDENTITY),
    (t.linear_model, "age_bucketized", "fc.linear_model(", "write the linear part as "
     "input_layer(features, [indicator_column(c), numeric columns]) into a Dense(1)"),
], ids=["hash_bucket", "crossed", "linear_model"])
def test_other_columns_are_refused_naming_the_column_and_what_to_write(tmp_path, model_fn, column, call,
                                                                       instead):
    with pytest.raises(CSRunError) as info:
        compile_model(model_fn, t.input_fn, {}, str(tmp_path), validate_only=True)
    source, first = inspect.getsourcelines(model_fn)
    line = first + next(i for i, text in enumerate(source) if call in text)
    assert "\n" not in str(info.value)
    assert f"at tests/tabular_feature_models.py:{line}: tf.feature_column column '{column}' builds " \
           "a SparseTensor the CS cannot compute" in info.value.message
    assert f"{instead} (and " in info.value.message


@pytest.fixture(scope="module")
def at_micro_batch(tmp_path_factory):
    return cs_inprocess.micro_batch_comparisons(t.input_fn, tmp_path_factory, steps=4)


@pytest.mark.parametrize("model_fn", [t.embedding_sqrtn, t.embedding_mean], ids=["adagrad", "sgd"])
def test_an_embedding_column_trains_alike_in_micro_batches(at_micro_batch, model_fn):
    """Micro-batches of 2: the table's IndexedSlices are the micro-batches' in order (Adagrad
    sums them per id as TF's deduplication does; SGD adds them one by one: within rounding)."""
    result = at_micro_batch(model_fn, PARAMS, 2)
    assert not cs_inprocess.mismatches(result), cs_inprocess.mismatches(result)
