"""The CPU path through CSEstimator: checkpoints, events, log lines, resume, evaluate, predict."""
from __future__ import annotations

import copy
import os

import numpy as np
import pytest
import tabular_feature_models as tabular
import tensorflow as tf
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from common.errors import CSRunError
from examples.fc_mnist import data, model
from launcher.estimator import CSEstimator, CSEstimatorSpec, CSRunConfig
from tf_model.checkpoints import all_checkpoints, latest_checkpoint, read_checkpoint
from tf_model.metrics import EvalMetrics

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
with open(os.path.join(ROOT, "examples", "fc_mnist", "configs", "params.yaml")) as f:
    FC_MNIST_PARAMS = yaml.safe_load(f)
BATCH = 32


def small_params() -> dict:
    """FC-MNIST on the digits, shrunk: one hidden layer of 16, batch 32."""
    params = copy.deepcopy(FC_MNIST_PARAMS)
    params["train_input"].update(batch_size=BATCH, data_dir=None)
    params["eval_input"].update(data_dir=None)
    params["model"]["hidden_sizes"] = [16]
    return params


def estimator(model_dir, model_fn=model.model_fn, **config) -> CSEstimator:
    defaults = dict(save_summary_steps=5, save_checkpoints_steps=10, keep_checkpoint_max=2,
                    log_step_count_steps=5, tf_random_seed=1234)
    return CSEstimator(model_fn, model_dir=str(model_dir),
                       config=CSRunConfig(**{**defaults, **config}), params=small_params())


def with_summary(features, labels, mode, params):
    """FC-MNIST plus a user summary scalar."""
    spec = model.model_fn(features, labels, mode, params)
    tf.compat.v1.summary.scalar("mean_feature", tf.reduce_mean(features))
    return spec


def scalars(logdir: str, tag: str) -> dict[int, float]:
    acc = EventAccumulator(logdir)
    acc.Reload()
    return {e.step: e.value for e in acc.Scalars(tag)}


def test_training_writes_checkpoints_events_and_log_lines(tmp_path, capsys):
    est = estimator(tmp_path, with_summary)
    est.train(data.train_input_fn, max_steps=25)
    out = capsys.readouterr().out
    assert all_checkpoints(str(tmp_path)) == [str(tmp_path / "model.ckpt-20"),
                                              str(tmp_path / "model.ckpt-25")]
    tensors = read_checkpoint(str(tmp_path / "model.ckpt-25"))
    assert tensors["global_step"] == 25 and tensors["global_step"].dtype == np.int64
    assert {"dense/kernel", "dense/bias", "dense/kernel/Adam", "dense/kernel/Adam_1",
            "beta1_power", "beta2_power"} <= set(tensors)
    kernels = sorted(v.shape for n, v in tensors.items() if n.endswith("/kernel"))
    assert kernels == [(16, 10), (784, 16)]
    losses = scalars(str(tmp_path), "loss")
    assert sorted(losses) == [5, 10, 15, 20, 25]
    assert sorted(scalars(str(tmp_path), "mean_feature")) == [5, 10, 15, 20, 25]
    assert all(v > 0 for v in scalars(str(tmp_path), "global_step/sec").values())
    steps = [line for line in out.splitlines() if line.startswith("global step ")]
    assert [line.split(":")[0] for line in steps] == [f"global step {s}" for s in (5, 10, 15, 20, 25)]
    assert steps[-1].endswith("steps/sec)")
    logged = float(steps[-1].split("loss = ")[1].split(" ")[0])
    assert logged == pytest.approx(losses[25], rel=1e-5)
    assert f"Saving checkpoints for 10 into {tmp_path}/model.ckpt." in out
    assert f"Training finished with {25 * BATCH} samples in " in out and "samples/second." in out
    final = [line for line in out.splitlines() if line.startswith("Loss for final step: ")]
    assert float(final[0][len("Loss for final step: "):-1]) == pytest.approx(losses[25], rel=1e-6)


def test_a_resumed_run_ends_with_the_weights_of_an_unbroken_one(tmp_path, capsys):
    estimator(tmp_path / "a").train(data.train_input_fn, max_steps=12)
    resumed = estimator(tmp_path / "b")
    resumed.train(data.train_input_fn, steps=5)
    resumed.train(data.train_input_fn, steps=7)  # relative: from 5 to 12, batches 5..11
    assert "Restoring parameters from" in capsys.readouterr().out
    a = read_checkpoint(latest_checkpoint(str(tmp_path / "a")))
    b = read_checkpoint(latest_checkpoint(str(tmp_path / "b")))
    assert b["global_step"] == 12 and sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    resumed.train(data.train_input_fn, max_steps=12)  # absolute: nothing left to do
    assert "Skipping training since max_steps has already saved: 12" in capsys.readouterr().out


def test_evaluate_matches_predictions_and_writes_eval_events(tmp_path):
    est = estimator(tmp_path)
    est.train(data.train_input_fn, max_steps=30)
    results = est.evaluate(data.eval_input_fn)
    assert results["global_step"] == 30 and set(results) == {"accuracy", "loss", "global_step"}
    samples = list(est.predict(data.eval_input_fn))  # a dict per sample, as tf.estimator yields
    _, labels = data.digits_as_mnist(training=False)
    assert len(samples) == 297 and set(samples[0]) == {"classes", "probabilities"}
    assert samples[0]["classes"].shape == () and samples[0]["probabilities"].shape == (10,)
    classes = np.array([s["classes"] for s in samples])
    assert results["accuracy"] == pytest.approx(np.mean(classes == labels))
    stored = np.load(tmp_path / "predict" / "predictions-30.npz")
    np.testing.assert_array_equal(stored["classes"], classes)
    batches = list(est.predict(data.eval_input_fn, predict_keys=["classes"], yield_single_examples=False))
    assert [set(b) for b in batches] == [{"classes"}] * 3 and [len(b["classes"]) for b in batches] == [99] * 3
    with pytest.raises(CSRunError, match="predict_keys 'class' is not a key of model_fn's predictions"):
        est.predict(data.eval_input_fn, predict_keys=["class"])
    assert scalars(str(tmp_path / "eval"), "accuracy") == {30: pytest.approx(results["accuracy"])}
    older = est.evaluate(data.eval_input_fn, steps=1, checkpoint_path=str(tmp_path / "model.ckpt-20"))
    assert older["global_step"] == 20


def scored(features, labels, mode, params):
    """A model whose metric averages a value under a control dependency (metrics.mean does)."""
    logits = tf.identity(tf.keras.layers.Dense(10)(features), name="logits")
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits) + tf.add_n(
        [tf.nn.l2_loss(v) for v in tf.compat.v1.trainable_variables()])
    return CSEstimatorSpec(mode, loss=loss, eval_metric_ops={
        "accuracy": tf.compat.v1.metrics.accuracy(labels, tf.argmax(logits, axis=1)),
        "mean_logit": tf.compat.v1.metrics.mean(logits)})


def test_metrics_from_streamed_values_need_neither_the_samples_nor_the_weights():
    """The chief's way: values for the streamed tensors and the loss; control dependencies on
    their ops are dropped, so the model's ops (which read the samples) never run."""
    with EvalMetrics(scored, data.eval_input_fn, small_params(), streamed=["logits:0", "labels:0"]) as metrics:
        labels = np.arange(99, dtype=np.int32) % 10  # one eval batch
        right = np.eye(10, dtype=np.float32)[labels]
        wrong = np.roll(right, 1, axis=1)
        metrics.update({"logits:0": right, "labels:0": labels, metrics.loss_name: np.float32(0.5)})
        metrics.update({"logits:0": wrong, "labels:0": labels, metrics.loss_name: np.float32(1.5)})
        assert metrics.results() == {"accuracy": 0.5, "loss": 1.0, "mean_logit": pytest.approx(0.1)}


def test_a_metric_that_fails_on_the_host_is_one_line_naming_its_source():
    with EvalMetrics(scored, data.eval_input_fn, small_params(), streamed=["logits:0"]) as metrics:
        with pytest.raises(CSRunError) as error:  # labels are not fed: TF's error, in one line
            metrics.update({"logits:0": np.zeros((99, 10), np.float32), metrics.loss_name: np.float32(0)})
    line = error.value.message
    assert "\n" not in line and line.startswith("Placeholder 'labels' at ")
    assert line.endswith(" failed on a batch: You must feed a value for placeholder tensor 'labels' with dtype "
                         "int32 and shape [99]")


def test_evaluate_without_a_checkpoint_is_one_clear_error(tmp_path):
    with pytest.raises(CSRunError, match="no checkpoint in .* to evaluate"):
        estimator(tmp_path).evaluate(data.eval_input_fn)
    with pytest.raises(CSRunError, match="repeats forever and no eval_steps"):
        estimator(tmp_path).evaluate(data.train_input_fn)


def test_a_hook_can_stop_training_and_the_stop_step_is_saved(tmp_path):
    class StopAt(tf.compat.v1.train.SessionRunHook):
        def __init__(self):
            self.runs = 0

        def after_run(self, run_context, run_values):
            self.runs += 1
            if self.runs == 7:
                run_context.request_stop()

    estimator(tmp_path).train(data.train_input_fn, max_steps=50, hooks=[StopAt()])
    assert latest_checkpoint(str(tmp_path)) == str(tmp_path / "model.ckpt-7")


def test_a_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path):
    def nan_after_8(features, labels, mode, params):
        spec = model.model_fn(features, labels, mode, params)
        step = tf.compat.v1.train.get_global_step()
        bad = tf.where(step >= 8, tf.constant(np.nan, tf.float32), 0.0)
        return CSEstimatorSpec(mode=mode, loss=spec.loss + bad, train_op=spec.train_op)

    with pytest.raises(CSRunError, match=r"the loss became nan at step \d+ .*the newest checkpoint, "
                                         r"model.ckpt-5, is the last good one"):
        estimator(tmp_path, nan_after_8, save_checkpoints_steps=5).train(data.train_input_fn, max_steps=20)
    assert latest_checkpoint(str(tmp_path)) == str(tmp_path / "model.ckpt-5")
    with pytest.raises(CSRunError, match=r"the loss became nan at step 9 .*check the input for NaN.*"
                                         r"no checkpoint was written before it"):
        estimator(tmp_path / "fresh", nan_after_8).train(data.train_input_fn, max_steps=20)


def test_a_train_op_without_the_global_step_is_refused(tmp_path):
    def no_step(features, labels, mode, params):
        spec = model.model_fn(features, labels, mode, params)
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)
        return CSEstimatorSpec(mode=mode, loss=spec.loss, train_op=optimizer.minimize(spec.loss))

    with pytest.raises(CSRunError, match="global step"):
        estimator(tmp_path, no_step).train(data.train_input_fn, max_steps=3)


def test_labels_out_of_range_on_the_cpu_path_are_one_line_naming_the_op_and_the_users_line(tmp_path):
    def shifted_labels(params):
        return data.train_input_fn(params).map(lambda x, y: (x, y + 5))  # labels 5..14 of 10 classes

    with pytest.raises(CSRunError) as raised:
        estimator(tmp_path).train(shifted_labels, max_steps=3)
    line = str(raised.value)
    assert "SparseSoftmaxCrossEntropyWithLogits" in line and "examples/classifier.py:" in line, line
    assert "failed on a batch: Received a label value of " in line and "outside the valid range of [0, 10)" in line
    assert "\n" not in line and "--debug" in raised.value.hint


def test_a_changed_model_on_an_existing_checkpoint_says_it_was_trained_with_other_shapes(tmp_path):
    estimator(tmp_path).train(data.train_input_fn, max_steps=2)
    changed = estimator(tmp_path)
    changed.params["model"]["hidden_sizes"] = [8]
    with pytest.raises(CSRunError, match=r"the checkpoint .*model.ckpt-2 was trained with other shapes: "
                                         r"dense/kernel \(784, 16\) there, \(784, 8\) in the model"):
        changed.train(data.train_input_fn, max_steps=4)


def test_a_vocabulary_list_column_trains_evaluates_and_predicts_on_the_cpu(tmp_path):
    """The CPU path initializes lookup tables as Estimator's Scaffold does (the CS refuses
    the column in one line; `python run.py` must still run it)."""
    est = CSEstimator(tabular.vocabulary_list, model_dir=str(tmp_path), params={},
                      config=CSRunConfig(save_checkpoints_steps=4, tf_random_seed=3))
    est.train(tabular.input_fn, max_steps=4)
    results = est.evaluate(tabular.input_fn)
    assert results["global_step"] == 4 and np.isfinite(results["loss"])
    probabilities = np.concatenate([s["p_click"] for s in est.predict(tabular.input_fn)])
    assert probabilities.shape == (32,) and np.all((probabilities > 0) & (probabilities < 1))
