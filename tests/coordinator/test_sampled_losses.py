"""tf.nn.nce_loss and tf.nn.sampled_softmax_loss on the CS (candidate_sampling.py): one
`sampled_logits` kernel draws the classes once a step for the whole batch. Proven here: (1)
with TF's draws replayed (tfs_draws: its sampled ids, its tries from its expected counts) a
skip-gram with NCE (Adam; Momentum, whose sparse update moves only the looked-up rows) and
sampled-softmax classifiers (log-uniform and uniform samplers) train 4 steps to TF's losses
and weights (1e-5), at micro-batches of 2 and on two replicas too (one draw a step);
(2) the classifier evaluates and predicts with the full softmax as the CPU path, and the
sampled loss evaluates on the CS with its own draws; (3) the CS's own sampler draws TF's
distribution (frequencies vs the log-uniform probabilities, TF's own draws alike; the tries
of unique draws) and computes TF's expected counts; (4) other samplers and sharded tables
are refused in one line naming the op."""
from __future__ import annotations

import tempfile

import cs_inprocess
import numpy as np
import pytest
import sampled_loss_models as sm
import tensorflow as tf
import tf_reference

from common.errors import CSRunError
from coordinator.compiler import compile_model
from wafer.kernels.candidate_sampling import expected_count, probability, sample

BASE = {"batch_size": 8, "runconfig": {"tf_random_seed": 1}}
CASES = {"skipgram_nce": (sm.skipgram_nce, sm.skipgram_input_fn, {}),
         "sampled_softmax": (sm.sampled_softmax_classifier, sm.classifier_input_fn, {}),
         "uniform_sampler": (sm.uniform_sampled_softmax, sm.classifier_input_fn, {}),
         # three context words a sample, accidental hits removed (TF's -FLT_MAX)
         "window_of_three": (sm.skipgram_nce, sm.skipgram_input_fn, {"window": 3, "hits": True}),
         # TF's sparse momentum moves only the looked-up rows' slots: the IndexedSlices path
         "nce_momentum": (sm.skipgram_nce, sm.skipgram_input_fn, {"optimizer": "momentum"}),
         # two replicas of 4 samples read the step's one draw
         "two_replicas": (sm.sampled_softmax_classifier, sm.classifier_input_fn,
                          {"runconfig": {"tf_random_seed": 1, "num_replicas": 2}})}
DRAWS = 2 ** 16


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    return cs_inprocess.cached_comparisons(CASES, BASE, tmp_path_factory, drawn=True)


@pytest.mark.parametrize("name", sorted(CASES))
def test_with_tfs_draws_sampled_losses_train_like_tensorflow(drawn, name):
    result = drawn(name)
    kernels = [k for k in result.compiled.program.kernels if k.type == "sampled_logits"]
    assert len(kernels) == 1
    if name == "two_replicas":
        assert result.compiled.program.num_replicas == 2
    assert cs_inprocess.mismatches(result, rtol=1e-5) == []


def test_micro_batches_read_the_steps_one_draw(drawn):
    result = drawn("sampled_softmax")
    program = result.compiled.program
    data = tf_reference.batches(sm.classifier_input_fn, BASE, 4)
    with cs_inprocess.tfs_draws(program, result.reference.fetched):
        split = cs_inprocess.run_on_cs(cs_inprocess.at_micro_batch(program, 2),
                                       result.compiled.initial_weights, data)
    np.testing.assert_allclose(split.losses, result.reference.losses, rtol=1e-5)


def test_the_cs_own_draws_train_otherwise(drawn):
    """The replay seam replaces the draws only: the CS's own draws give other losses."""
    result = drawn("skipgram_nce")
    own = cs_inprocess.run_on_cs(result.compiled.program, result.compiled.initial_weights,
                                 tf_reference.batches(sm.skipgram_input_fn, BASE, 4))
    assert not np.allclose(own.losses, result.reference.losses, rtol=1e-3)
    assert np.isfinite(own.losses).all()


def test_the_classifier_evaluates_and_predicts_with_the_full_softmax_like_the_cpu(drawn, tmp_path):
    model_fn, input_fn, _ = CASES["sampled_softmax"]
    trained = drawn("sampled_softmax")
    assert cs_inprocess.evaluation_mismatch(model_fn, input_fn, BASE, str(tmp_path / "eval"),
                                            trained) == ""
    assert cs_inprocess.prediction_mismatch(model_fn, input_fn, BASE, str(tmp_path / "predict"),
                                            trained) == ""


def test_the_sampled_loss_evaluates_on_the_cs_with_its_own_draws(drawn, tmp_path):
    """Evaluating the sampled loss draws classes on the CS every batch, as TF's EVAL graph
    does: near the CPU path's loss, differing by the draws."""
    path = cs_inprocess.trained_checkpoint(str(tmp_path), drawn("sampled_softmax"))
    cs = cs_inprocess.evaluate_like_the_chief(sm.sampled_softmax_eval, sm.classifier_input_fn,
                                              BASE, str(tmp_path / "eval"), path, 4)
    assert set(cs) == {"loss"} and 0.1 < cs["loss"] < 4.0


def _tf_sampler(unique: bool, num_sampled: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    true_classes = tf.constant([[0], [3], [39]], tf.int64)
    ids, true_counts, counts = tf.random.log_uniform_candidate_sampler(
        true_classes, 1, num_sampled, unique, sm.VOCAB, seed=seed)
    return ids.numpy(), true_counts.numpy(), counts.numpy()


def test_the_cs_sampler_draws_tfs_log_uniform_distribution():
    """Class frequencies over 2^16 draws (the CS's and TF's) are the log-uniform
    probabilities within 6 standard errors."""
    p = probability("log_uniform", np.arange(sm.VOCAB), sm.VOCAB).astype(np.float64)
    assert abs(p.sum() - 1) < 1e-6
    ours, _ = sample(np.random.default_rng(0), "log_uniform", sm.VOCAB, DRAWS, unique=False)
    theirs = _tf_sampler(False, DRAWS, 1)[0]
    for drawn_ids in (ours, theirs):
        frequency = np.bincount(drawn_ids, minlength=sm.VOCAB) / DRAWS
        assert np.all(np.abs(frequency - p) < 6 * np.sqrt(p * (1 - p) / DRAWS))


def test_unique_draws_take_tfs_tries_and_expected_counts():
    """Unique draws: distinct ids; the mean number of tries is TF's (within 5 %); TF's
    expected counts, true and sampled, are the kernel's formula at TF's tries."""
    rng = np.random.default_rng(1)
    ours = [sample(rng, "log_uniform", sm.VOCAB, sm.SAMPLED, unique=True) for _ in range(400)]
    assert all(len(set(ids.tolist())) == sm.SAMPLED for ids, _ in ours)
    tries_tf = []
    for seed in range(400):
        ids, true_counts, counts = _tf_sampler(True, sm.SAMPLED, seed + 1)
        tries = cs_inprocess.sampler_tries("log_uniform", sm.VOCAB, ids, counts)
        tries_tf.append(tries)
        np.testing.assert_allclose(expected_count(probability("log_uniform", ids, sm.VOCAB),
                                                  sm.SAMPLED, tries), counts, rtol=1e-6)
        true_p = probability("log_uniform", np.array([[0], [3], [39]]), sm.VOCAB)
        np.testing.assert_allclose(expected_count(true_p, sm.SAMPLED, tries), true_counts,
                                   rtol=1e-6)
    ours_mean, tf_mean = np.mean([t for _, t in ours]), np.mean(tries_tf)
    assert abs(ours_mean - tf_mean) < 0.05 * tf_mean


@pytest.mark.parametrize("name, op_type", [("unigram_sampled_softmax", "FixedUnigramCandidateSampler"),
                                           ("sharded_nce", "LogUniformCandidateSampler")])
def test_other_samplers_and_sharded_tables_are_refused_in_one_line(name, op_type):
    input_fn = sm.skipgram_input_fn if "nce" in name else sm.classifier_input_fn
    with tempfile.TemporaryDirectory() as model_dir, pytest.raises(CSRunError) as refused:
        compile_model(getattr(sm, name), input_fn, dict(BASE), model_dir, validate_only=True)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"validation failed: {op_type} ")
    assert "tests/sampled_loss_models.py:" in message and "log-uniform" in message
