"""tf.nn.nce_loss and tf.nn.sampled_softmax_loss on the CS (candidate_sampling.py): one
`sampled_logits` kernel draws the classes once a step for the whole batch. Proven here:
(1) with TF's draws replayed (tfs_draws: its sampled ids, its tries from its expected
counts) skip-grams with NCE (Adam; Momentum, whose sparse update moves only the looked-up
rows; a window of 3 with accidental hits removed; word2vec's fixed unigram table; one table
for the input embedding and NCE) and sampled-softmax classifiers (log-uniform and uniform
samplers; TF's function written by hand) train 4 steps to TF's losses and weights (1e-5),
at micro-batches of 2 and on two replicas too (one draw a step); (2) the classifier
evaluates and predicts with the full softmax as the CPU path, and the sampled loss
evaluates drawing every batch (TF's eval losses with TF's draws); (3) the CS's own samplers
draw TF's distributions (frequencies vs the log-uniform and unigram probabilities, TF's own
draws alike; the tries of unique draws) and compute TF's expected counts; (4) learned
unigram samplers, vocab files, sharded tables, draws the host reads and other logits of the
same ops (the probe's) are refused in one line naming the op."""
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
from wafer.kernels.candidate_sampling import Classes, expected_count

BASE = {"batch_size": 8, "runconfig": {"tf_random_seed": 1}}
CASES = {"skipgram_nce": (sm.skipgram_nce, sm.skipgram_input_fn, {}),
         "sampled_softmax": (sm.sampled_softmax_classifier, sm.classifier_input_fn, {}),
         "uniform_sampler": (sm.uniform_sampled_softmax, sm.classifier_input_fn, {}),
         # word2vec's unigram table: counts to the 3/4, two reserved ids
         "unigram_sampler": (sm.unigram_nce, sm.skipgram_input_fn, {"reserved": 2}),
         # three context words a sample, accidental hits removed (TF's -FLT_MAX)
         "window_of_three": (sm.skipgram_nce, sm.skipgram_input_fn, {"window": 3, "hits": True}),
         # TF's sparse momentum moves only the looked-up rows' slots: the IndexedSlices path
         "nce_momentum": (sm.skipgram_nce, sm.skipgram_input_fn, {"optimizer": "momentum"}),
         # one table for the input embedding and NCE (two sparse uses), int32 context ids
         "tied_table": (sm.tied_skipgram, sm.skipgram_input_fn,
                        {"optimizer": "momentum", "label_dtype": "int32"}),
         # draws that repeat, a repeated class among the labels (TF removes its last draw)
         "repeated_draws": (sm.repeated_draws_softmax, sm.skipgram_input_fn, {}),
         # TF's function written by hand (the probe takes it): tf.gather, slices, ones
         "hand_written": (sm.tempered_sampled_softmax, sm.classifier_input_fn,
                          {"temperature": 1.0}),
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
    if name == "repeated_draws":  # (the case happened)
        name_ = kernels[0].name
        data = tf_reference.batches(sm.skipgram_input_fn, BASE, 4)
        assert any(np.isin(ids[np.flatnonzero(np.bincount(ids) > 1)], labels).any()
                   for ids, (_, labels) in zip((s[f"{name_}:0"] for s in result.reference.fetched),
                                               data))
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


def test_the_sampled_loss_evaluates_drawing_every_batch_like_tensorflow(drawn, tmp_path):
    """Evaluating the sampled loss draws classes at every batch, as TF's EVAL graph does:
    handed TF's draws, the CS's evaluation losses are TF's batch by batch (1e-5); with its
    own, one batch evaluated twice gives two losses, the same for the same checkpoint; the
    chief's evaluation runs on the CS."""
    path = cs_inprocess.trained_checkpoint(str(tmp_path), drawn("sampled_softmax"))
    model_fn, input_fn = sm.sampled_softmax_eval, sm.classifier_input_fn
    cs_inprocess.assert_evaluation_draws_every_batch(model_fn, input_fn, BASE,
                                                     str(tmp_path / "eval"), path)
    chief = cs_inprocess.evaluate_like_the_chief(model_fn, input_fn, BASE,
                                                 str(tmp_path / "chief"), path, 2)
    assert set(chief) == {"loss"} and np.isfinite(chief["loss"])


TRUE_CLASSES = [[0], [3], [39]]
LOG_UNIFORM = Classes("log_uniform", sm.VOCAB)
UNIGRAM = Classes.of({"sampler": "fixed_unigram", "range_max": sm.VOCAB, "unigrams": sm.COUNTS,
                      "distortion": 0.75})


def _tf_sampler(classes: Classes, unique: bool, num_sampled: int,
                seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """TF's sampler of `classes`' distribution: (ids, true expected counts, expected counts)."""
    args = (tf.constant(TRUE_CLASSES, tf.int64), 1, num_sampled, unique, sm.VOCAB)
    if classes.sampler == "fixed_unigram":
        found = tf.random.fixed_unigram_candidate_sampler(*args, seed=seed, distortion=0.75,
                                                          unigrams=sm.COUNTS)
    else:
        found = tf.random.log_uniform_candidate_sampler(*args, seed=seed)
    return tuple(t.numpy() for t in found)  # type: ignore[return-value]


@pytest.mark.parametrize("classes", [LOG_UNIFORM, UNIGRAM], ids=lambda c: c.sampler)
def test_the_cs_sampler_draws_tfs_distribution(classes):
    """Class frequencies over 2^16 draws (the CS's and TF's) are TF's probabilities (the
    log-uniform law; the unigram counts to the 3/4) within 6 standard errors."""
    p = classes.probability(np.arange(sm.VOCAB)).astype(np.float64)
    assert abs(p.sum() - 1) < 1e-6
    ours, _ = classes.sample(np.random.default_rng(0), DRAWS, unique=False)
    theirs = _tf_sampler(classes, False, DRAWS, 1)[0]
    for drawn_ids in (ours, theirs):
        frequency = np.bincount(drawn_ids, minlength=sm.VOCAB) / DRAWS
        assert np.all(np.abs(frequency - p) < 6 * np.sqrt(p * (1 - p) / DRAWS))


@pytest.mark.parametrize("classes", [LOG_UNIFORM, UNIGRAM], ids=lambda c: c.sampler)
def test_unique_draws_take_tfs_tries_and_expected_counts(classes):
    """Unique draws: distinct ids; the mean number of tries is TF's (within 5 %); TF's
    expected counts, true and sampled, are the kernel's formula at TF's tries."""
    rng = np.random.default_rng(1)
    ours = [classes.sample(rng, sm.SAMPLED, unique=True) for _ in range(400)]
    assert all(len(set(ids.tolist())) == sm.SAMPLED for ids, _ in ours)
    tries_tf = []
    for seed in range(400):
        ids, true_counts, counts = _tf_sampler(classes, True, sm.SAMPLED, seed + 1)
        tries = cs_inprocess.sampler_tries(classes, ids, counts)
        tries_tf.append(tries)
        np.testing.assert_allclose(expected_count(classes.probability(ids), sm.SAMPLED, tries),
                                   counts, rtol=1e-6)
        np.testing.assert_allclose(
            expected_count(classes.probability(np.array(TRUE_CLASSES)), sm.SAMPLED, tries),
            true_counts, rtol=1e-6)
    ours_mean, tf_mean = np.mean([t for _, t in ours]), np.mean(tries_tf)
    assert abs(ours_mean - tf_mean) < 0.05 * tf_mean


REFUSED = {"learned_unigram": (sm.learned_unigram_softmax, {}, "LearnedUnigramCandidateSampler"),
           "vocab_file": (sm.unigram_nce, {"vocab_file": "counts.csv"},
                          "FixedUnigramCandidateSampler"),
           "sharded_table": (sm.sharded_nce, {}, "LogUniformCandidateSampler"),
           "draws_read_by_the_host": (sm.draws_in_a_metric, {}, "LogUniformCandidateSampler"),
           # _compute_sampled_logits' kinds of ops computing other logits: the probe's refusal
           "other_logits": (sm.tempered_sampled_softmax, {}, "LogUniformCandidateSampler")}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_other_samplers_and_sharded_tables_are_refused_in_one_line(name):
    model_fn, extra, op_type = REFUSED[name]
    input_fn = sm.skipgram_input_fn if "nce" in model_fn.__name__ else sm.classifier_input_fn
    with tempfile.TemporaryDirectory() as model_dir, pytest.raises(CSRunError) as refused:
        compile_model(model_fn, input_fn, {**BASE, **extra}, model_dir, validate_only=True,
                      mode="eval" if name == "draws_read_by_the_host" else "train")
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"validation failed: {op_type} ")
    assert "tests/sampled_loss_models.py:" in message and "log-uniform" in message
    if name == "other_logits":
        assert "on a probe" in message
