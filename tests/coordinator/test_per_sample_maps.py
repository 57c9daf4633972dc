"""Functions applied to each sample of a batch: CondConv (each sample convolved with its own
kernel routing(x) @ experts by tf.split and tf.concat, or tf.unstack and tf.stack), a
dynamic filter network (tf.map_fn of a depthwise convolution of each sample by its
generated filter), a per-sample map_fn feature (each sample's values sorted, gathered at its
own top_k indices) and a hypernetwork (tf.vectorized_map of a Dense layer of generated
weights) train on the CS as TensorFlow trains them (4 steps, 1e-4) and evaluate and predict
as the CPU path does; pieces of the batch that mix samples (put back in another order, a
sample convolved with another's kernel) are refused in one line naming the op and the
line."""
import batch_slice_models
import cs_inprocess
import per_sample_models as m
import pytest

PARAMS = {"runconfig": {"tf_random_seed": 2}}


@pytest.mark.parametrize("model_fn", [m.condconv_split, m.condconv_unstack, m.condconv_map_fn,
                                      m.dynamic_filter, m.dynamic_filter_vectorized,
                                      m.sorted_features, m.hypernetwork],
                         ids=lambda f: f.__name__)
def test_a_function_mapped_over_the_samples_trains_like_tensorflow(tmp_path, model_fn):
    result = cs_inprocess.compare(model_fn, m.images_input_fn, PARAMS, str(tmp_path), steps=4)
    assert cs_inprocess.mismatches(result, rtol=1e-4) == []
    for variable, start in result.compiled.initial_weights.items():
        if variable != "global_step":
            assert (result.cs.state[variable] != start).any(), f"{variable} was not trained"
    assert cs_inprocess.cpu_path_mismatches(model_fn, m.images_input_fn, PARAMS, str(tmp_path),
                                            result) == []


def test_unseen24s_per_example_kernels_train_like_tensorflow(tmp_path):
    """unseen24's condconv_experts (each example's kernel its routing's mix of experts,
    tf.split of the batch, tf.matmul per example, tf.concat), once refused as splits of the
    batch (it predicts nothing)."""
    model_fn, params = batch_slice_models.per_example_kernels_model_fn, {
        "batch_size": batch_slice_models.BATCH, "runconfig": {"tf_random_seed": 7}}
    result = cs_inprocess.compare(model_fn, batch_slice_models.input_fn, params, str(tmp_path),
                                  steps=4)
    assert cs_inprocess.mismatches(result, rtol=1e-4) == []
    assert cs_inprocess.evaluation_mismatch(model_fn, batch_slice_models.input_fn, params,
                                            str(tmp_path), result) == ""


@pytest.mark.parametrize("model_fn", [m.condconv_reversed, m.condconv_shifted],
                         ids=lambda f: f.__name__)
def test_per_sample_pieces_that_mix_samples_are_refused_naming_the_op_and_line(tmp_path,
                                                                               model_fn):
    cs_inprocess.refusal(model_fn, m.images_input_fn, PARAMS, str(tmp_path),
                         "tests/per_sample_models.py")
