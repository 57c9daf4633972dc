"""Classes drawn per folded row (unseen27): a blind tester's ELECTRA draws its replacement
tokens by tf.random.categorical of the generator's logits folded to [batch * T, V]
(tf.categorical takes 2-D logits only), each row from its own logits: the `categorical`
kernel draws each sample's T rows. Handed TF's draws (and dropout's masks) it trains 4 Adam
steps as TF does; evaluation draws every batch, TF's losses when handed TF's draws."""
import cs_inprocess
import replaced_token_models as electra

PARAMS = {**electra.params, "runconfig": {"tf_random_seed": 1}}
T = electra.params["seq_len"]


def test_electra_trains_with_tensorflows_draws_and_evaluates_drawing_every_batch(tmp_path):
    train = str(tmp_path / "train")
    result = cs_inprocess.compare_drawn(electra.model_fn, electra.input_fn, PARAMS, train)
    cs_inprocess.assert_same_training(result, 1e-5)
    drawn = [list(k.output_shape) for k in result.compiled.program.kernels
             if k.type == "categorical"]
    assert drawn == [[T, 1]]  # each sample's T tokens, one class a token
    checkpoint = cs_inprocess.trained_checkpoint(train, result)
    cs_inprocess.assert_evaluation_draws_every_batch(electra.model_fn, electra.input_fn, PARAMS,
                                                     str(tmp_path / "eval"), checkpoint)
