"""Everything that trains on the CS evaluates and predicts there (issue 20): models with
weight penalties, eval_metric_ops and dict labels (tests/eval_models.py) train on the
in-process CS like TensorFlow, then a checkpoint of the CS's weights evaluates and predicts
on the CS (the chief's host-side computation from the streamed outputs) with the CPU path's
metrics and predictions on that checkpoint; how much an evaluation takes and what its errors
say."""
from __future__ import annotations

import cs_inprocess
import eval_models as em
import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from common.errors import CSRunError
from common.run_kinds import RunKind
from launcher.estimator import CSEstimator
from tf_model.model_fn import run_batches
from workers.feed import shard_batches
from workers.rendezvous import Rendezvous


@pytest.mark.slow
@pytest.mark.parametrize("variant", [
    {"penalty": "keras"},  # kernel_regularizer + get_regularization_loss()
    {"penalty": "l2_loss", "dict_labels": True},  # tf.nn.l2_loss; labels={"clicked", "weight"}
    {"penalty": "none", "single_prediction": True},
], ids=["keras_regularizer", "l2_loss_dict_labels", "single_prediction"])
def test_a_model_trained_on_the_cs_evaluates_and_predicts_there_like_the_cpu_path(variant, tmp_path):
    params = em.params_for(**variant)
    trained = cs_inprocess.compare(em.model_fn, em.train_input_fn, params, str(tmp_path), steps=10)
    cs_inprocess.assert_same_training(trained)
    steps = em.SAMPLES // em.BATCH  # the whole eval input
    for mismatch in (cs_inprocess.evaluation_mismatch, cs_inprocess.prediction_mismatch):
        problem = mismatch(em.model_fn, em.eval_input_fn, params, str(tmp_path), trained, steps=steps)
        assert not problem, problem


@pytest.mark.slow
def test_the_eval_program_streams_what_the_metrics_read(tmp_path):
    """AUC's update reaches the logits through control dependencies only, the cross-entropy
    metric reads the loss's reduction over the batch: the logits, the per-sample cross
    entropy and the labels are streamed, nothing else (the host has the weights)."""
    params = em.params_for(penalty="keras", dict_labels=True)
    compiled = cs_inprocess.compile_checked(em.model_fn, em.eval_input_fn, params, str(tmp_path), mode="eval")
    kernels = {k.name: k for k in compiled.program.kernels}
    assert sorted(n for n in compiled.program.outputs if n not in kernels) == ["labels.clicked", "labels.weight"]
    streamed = [kernels[n] for n in compiled.program.outputs if n in kernels]
    assert sorted(k.type for k in streamed) == ["binary", "dense"]  # the logits, the per-sample cross entropy
    assert any(k.tf_tensor.startswith("sigmoid_cross_entropy_loss/xentropy") for k in streamed)


def test_dict_labels_train_evaluate_and_predict_on_the_cpu_path(tmp_path, capsys):
    est = CSEstimator(em.model_fn, str(tmp_path), params=em.params_for(penalty="none", dict_labels=True))
    est.train(em.train_input_fn, max_steps=3)
    results = est.evaluate(em.eval_input_fn)
    assert results["global_step"] == 3 and 0 <= results["weighted_accuracy"] <= 1
    # a metric of one value is a float, of several an array (as TF's Estimator returns them);
    # only the floats get a scalar summary
    assert isinstance(results["recall_at_0.3"], float) and results["precision_at"].shape == (3,)
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("Saving dict"))
    assert f"precision_at = [{results['precision_at'][0]:.6g} " in line.replace("[ ", "[")
    events = EventAccumulator(str(tmp_path / "eval"))
    events.Reload()
    assert "recall_at_0.3" in events.Tags()["scalars"] and "precision_at" not in events.Tags()["scalars"]
    samples = list(est.predict(em.eval_input_fn))
    assert len(samples) == em.SAMPLES and set(samples[0]) == {"probability", "clicked"}


@pytest.mark.slow
def test_predictions_of_one_tensor_are_an_array_per_sample(tmp_path):
    est = CSEstimator(em.model_fn, str(tmp_path), params=em.params_for(penalty="none", single_prediction=True))
    est.train(em.train_input_fn, max_steps=1)
    samples = list(est.predict(em.eval_input_fn, num_samples=20))
    assert len(samples) == 20 and all(isinstance(s, np.ndarray) and s.shape == (1,) for s in samples)
    assert [b.shape for b in est.predict(em.eval_input_fn, yield_single_examples=False)] == [(16, 1)] * 8
    with pytest.raises(CSRunError, match="predict_keys given, but model_fn's predictions are one tensor"):
        est.predict(em.eval_input_fn, predict_keys=["probability"])


def dataset(batches: int, repeat: bool = False, filtered: bool = False) -> tf.data.Dataset:
    data = tf.data.Dataset.range(batches * 4)
    if filtered:  # tf.data cannot tell its length
        data = data.filter(lambda x: x >= 0)
    return (data.repeat() if repeat else data).batch(4, drop_remainder=True)


def test_an_evaluation_takes_the_whole_finite_input_unless_told():
    assert run_batches(dataset(5), RunKind.EVALUATE, None, "--eval_steps") == 5
    assert run_batches(dataset(5, filtered=True), RunKind.EVALUATE, None, "--eval_steps") == 5
    assert run_batches(dataset(5, repeat=True), RunKind.EVALUATE, 7, "--eval_steps") == 7
    with pytest.raises(CSRunError, match=r"^the evaluation input repeats forever and no --eval_steps is given"):
        run_batches(dataset(5, repeat=True), RunKind.EVALUATE, None, "--eval_steps")
    with pytest.raises(CSRunError, match=r"^the evaluation input ran out after 5 of 20 batches") as error:
        run_batches(dataset(5), RunKind.EVALUATE, 20, "--eval_steps")
    assert error.value.hint == "lower --eval_steps or make the eval input repeat"


def test_an_input_worker_names_the_evaluation_input_when_it_runs_out():
    rendezvous = Rendezvous("h:1", "job", "token", 1, 0, 20, (), 4, kind=str(RunKind.EVALUATE))
    with pytest.raises(CSRunError, match=r"^input worker 0: the evaluation input ran out after batch 4, "
                                         r"the run needs batches up to 19") as error:
        list(shard_batches(lambda params: dataset(5), {}, rendezvous, 0))
    assert "eval_steps" in error.value.hint
