"""Each sample's own shuffle (a blind tester's MAE, unseen32): per-sample indices from
tf.argsort of drawn noise gather the sample's tokens (batch_dims=1) and restore a constant row
of the batch (the mask of dropped patches: a gather of constants at each sample's indices).
It was refused ("gathers from a weight with batch_dims"), and its predict graph took the noise
for noise on weights (the broadcast rule applied to a gather's indices)."""
import cs_inprocess
import masked_autoencoder_models as mae
import numpy as np

PARAMS = {**mae.params, "runconfig": {"tf_random_seed": 3}}
N, KEEP = 16, 4


def test_mae_trains_with_tensorflows_draws_and_evaluates_drawing_every_batch(tmp_path):
    train = str(tmp_path / "train")
    result = cs_inprocess.compare_drawn(mae.model_fn, mae.input_fn, PARAMS, train)
    cs_inprocess.assert_same_training(result, 1e-5)
    checkpoint = cs_inprocess.trained_checkpoint(train, result)
    cs_inprocess.assert_evaluation_draws_every_batch(mae.model_fn, mae.input_fn, PARAMS,
                                                     str(tmp_path / "eval"), checkpoint)
    predicted = cs_inprocess.predict_like_the_chief(mae.model_fn, mae.input_fn, PARAMS,
                                                    str(tmp_path / "predict"), checkpoint, 2)
    mask = predicted["mask"]
    assert mask.shape == (2 * PARAMS["batch_size"], N)
    assert (mask.sum(1) == N - KEEP).all() and set(np.unique(mask)) == {0.0, 1.0}
    assert len({tuple(row) for row in mask}) > 1  # each image its own draw
