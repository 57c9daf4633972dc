"""Einsums, argmax, top_k, constant-index gathers and softmax cross-entropy on rows folded
into the batch: a PatchTST encoder (tf.signal.frame's patches and Keras MultiHeadAttention
over channels folded into the batch) and a Switch-style per-token router and classifier over
[batch * T, d] (argmax routing, sparse softmax cross-entropy over the B*T tokens) train on
the CS with TensorFlow's numbers and evaluate and predict with the CPU path's (the reshape
back to [batch, T, ...] a metric or prediction reads computed on the CS); the router's
capacity count (a cumulative sum over the folded tokens of every sample) is refused in one
line naming the op, as is a metric the host would recompute from folded rows."""
import cs_inprocess
import folded_ops_models as f
import pytest

SEED = {"runconfig": {"tf_random_seed": 3}}
RTOL = 1e-5


def test_patchtst_over_folded_channels_trains_evaluates_and_predicts_like_tensorflow(tmp_path):
    model_dir = str(tmp_path)
    result = cs_inprocess.compare(f.patchtst, f.series_input_fn, SEED, model_dir, steps=4)
    assert cs_inprocess.mismatches(result, RTOL) == []
    # each series' 3 channels' attention scores: (3 channels, 2 heads, 4 patches, 4 patches)
    einsums = [list(k.output_shape) for k in result.compiled.program.kernels if k.type == "einsum"]
    assert [3, 2, 4, 4] in einsums
    assert cs_inprocess.cpu_path_mismatches(f.patchtst, f.series_input_fn, SEED, model_dir,
                                            result) == []


@pytest.mark.parametrize("params", [{}, {"top_k": True}, {"losses": True}],
                         ids=["argmax", "argmax_top_k", "v1_losses_mean_over_folded_tokens"])
def test_a_per_token_router_and_classifier_trains_evaluates_and_predicts_like_tensorflow(
        tmp_path, params):
    model_dir, params = str(tmp_path), {**SEED, **params}
    result = cs_inprocess.compare(f.switch_router, f.tokens_input_fn, params, model_dir, steps=4)
    assert cs_inprocess.mismatches(result, RTOL) == []
    assert cs_inprocess.cpu_path_mismatches(f.switch_router, f.tokens_input_fn, params,
                                            model_dir, result) == []


def test_the_routers_capacity_count_over_folded_tokens_is_refused_in_one_line(tmp_path):
    line = cs_inprocess.refusal(f.switch_capacity, f.tokens_input_fn, SEED, str(tmp_path),
                                f.__file__)
    assert line.startswith("validation failed: Cumsum 'Cumsum'") and \
        "folded into the batch" in line and "\n" not in line, line


def test_a_metric_of_the_loss_over_folded_tokens_is_refused_in_one_line(tmp_path):
    """tf.compat.v1.metrics.mean of a loss over the B*T tokens: the host would recompute it
    from the per-token losses, which the CS holds as each sample's (T,) rows."""
    params = {**SEED, "losses": True, "loss_metric": True}
    line = cs_inprocess.refusal(f.switch_router, f.tokens_input_fn, params, str(tmp_path),
                                f.__file__, mode="eval")
    assert "the host reads this value" in line and "folded into its batch axis" in line, line
