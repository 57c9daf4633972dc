"""Functions applied to each sample of a batch: CondConv (each sample convolved with its own
kernel routing(x) @ experts by tf.split and tf.concat, tf.unstack and tf.stack, or
tf.map_fn), a dynamic filter network (a depthwise convolution of each sample by its
generated filter, by tf.map_fn and by tf.vectorized_map), a per-sample map_fn feature (each
sample's values sorted, gathered at its own top_k indices), hypernetworks (tf.vectorized_map
of a Dense layer of generated weights, of a strided convolution by a generated filter) and a
Keras layer called by tf.map_fn train on the CS as TensorFlow trains them (4 steps, 1e-4),
evaluate and predict as the CPU path does, at micro-batches of 1 and on 2 replicas too;
pieces of the batch that mix samples (put back in another order, a sample convolved with
another's kernel, a map convolving every sample by the first one's) and a map drawing its
own random numbers are refused in one line naming the op and the line."""
import batch_slice_models
import cs_inprocess
import per_sample_models as m
import pytest

PARAMS = {"runconfig": {"tf_random_seed": 2}}


@pytest.mark.parametrize("model_fn", [m.condconv_split, m.condconv_unstack, m.condconv_map_fn,
                                      m.dynamic_filter, m.dynamic_filter_vectorized,
                                      m.sorted_features, m.mapped_keras_layer, m.hypernetwork,
                                      m.hyper_conv],
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


def test_a_map_without_a_random_seed_trains_like_tensorflow(tmp_path):
    """Without runconfig.tf_random_seed each build of model_fn draws its own initial weights:
    the rebuilt graph is proven at the user's graph's weights, not refused for other ones."""
    result = cs_inprocess.compare(m.condconv_map_fn, m.images_input_fn, {}, str(tmp_path),
                                  steps=4)
    assert cs_inprocess.mismatches(result, rtol=1e-4) == []


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return cs_inprocess.micro_batch_comparisons(m.images_input_fn, tmp_path_factory, 4)


@pytest.mark.parametrize("model_fn", [m.condconv_split, m.dynamic_filter],
                         ids=lambda f: f.__name__)
@pytest.mark.parametrize("micro, replicas", [(1, 1), (2, 2)])
def test_per_sample_kernels_train_alike_at_any_micro_batch_and_on_two_replicas(
        prepared, model_fn, micro, replicas):
    result = prepared(model_fn, {"runconfig": {"tf_random_seed": 2, "num_replicas": replicas}},
                      micro)
    assert cs_inprocess.mismatches(result, rtol=1e-4) == []


@pytest.mark.parametrize("model_fn", [m.condconv_reversed, m.condconv_shifted,
                                      m.condconv_first_kernel, m.noisy_map],
                         ids=lambda f: f.__name__)
def test_per_sample_pieces_that_mix_samples_are_refused_naming_the_op_and_line(tmp_path,
                                                                               model_fn):
    cs_inprocess.refusal(model_fn, m.images_input_fn, PARAMS, str(tmp_path),
                         "tests/per_sample_models.py")
