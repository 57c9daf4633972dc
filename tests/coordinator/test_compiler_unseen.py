"""Unseen user-style models validate, then train on the CS exactly as TensorFlow does."""
import cs_inprocess
import pytest
import unseen_models as u


@pytest.mark.slow
@pytest.mark.parametrize("model_fn, input_fn", [
    (u.conv1d, u.seq_input_fn), (u.bag_of_words, u.emb_input_fn), (u.cnn_bn, u.img_input_fn)],
    ids=["conv1d_rmsprop", "embedding_lookup_huber_momentum", "bn_inference_swish_clip"])
def test_unseen_model_trains_like_tensorflow(tmp_path, model_fn, input_fn):
    result = cs_inprocess.compare(model_fn, input_fn, {"runconfig": {"tf_random_seed": 3}},
                                  str(tmp_path), steps=6)
    assert not cs_inprocess.mismatches(result), cs_inprocess.mismatches(result)
