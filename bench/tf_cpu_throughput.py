"""TensorFlow's CPU training throughput on FC-MNIST (784-500-300-10, batch 256): the CPU path vs a bare Session loop.

The CPU path (`CSEstimator.train` without a CS) is timed per step as the difference of a
long and a short run, so graph building, session start and the final checkpoint cancel
out; what is left is its per-step cost: tf.data batches fed through feed_dict, the log and
summary bookkeeping. The bare loop runs the same graph's train_op on one preloaded batch.
Both are measured twice, interleaved, best kept; the ratio is the path's overhead.
"""
from __future__ import annotations

import copy
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import tensorflow as tf  # noqa: E402
import yaml  # noqa: E402

from bench.table import Row, print_table  # noqa: E402
from examples.fc_mnist import data, model  # noqa: E402
from launcher.estimator import CSEstimator, CSRunConfig  # noqa: E402
from tf_model.model_fn import batch_signature, call_model_fn, make_dataset, model_graph  # noqa: E402

BATCH = 256
SHORT, LONG = 50, 350


def params() -> dict:
    with open(os.path.join(ROOT, "examples", "fc_mnist", "configs", "params.yaml")) as f:
        p = yaml.safe_load(f)
    p["train_input"].update(batch_size=BATCH, data_dir=None)
    return p


def _timed_train(steps: int) -> float:
    with tempfile.TemporaryDirectory() as model_dir:
        est = CSEstimator(model.model_fn, model_dir=model_dir, params=copy.deepcopy(params()),
                          config=CSRunConfig(save_summary_steps=100, log_step_count_steps=None,
                                             tf_random_seed=1))
        start = time.perf_counter()
        est.train(data.train_input_fn, max_steps=steps)
        return time.perf_counter() - start


def path_steps_per_sec() -> float:
    return (LONG - SHORT) / (_timed_train(LONG) - _timed_train(SHORT))


def bare_steps_per_sec() -> float:
    p = params()
    dataset = make_dataset(data.train_input_fn, p)
    batch = next(dataset.as_numpy_iterator())
    with model_graph(p) as graph:
        features, labels = batch_signature(dataset).placeholders()
        spec = call_model_fn(model.model_fn, features, labels, "train", p)
        init = tf.compat.v1.global_variables_initializer()
    with tf.compat.v1.Session(graph=graph) as session:
        session.run(init)
        feed = {features: batch[0], labels: batch[1]}
        for _ in range(SHORT):  # warm up
            session.run(spec.train_op, feed)
        start = time.perf_counter()
        for _ in range(LONG - SHORT):
            session.run(spec.train_op, feed)
        return (LONG - SHORT) / (time.perf_counter() - start)


def measure() -> list[Row]:
    bare, path = 0.0, 0.0
    for _ in range(2):
        bare = max(bare, bare_steps_per_sec())
        path = max(path, path_steps_per_sec())
    return [
        ("bare Session loop", bare, "steps/s", f"train_op on one preloaded batch of {BATCH}"),
        ("CPU path (CSEstimator.train)", path, "steps/s", "tf.data + feed_dict + logs/summaries"),
        ("CPU path samples/s", path * BATCH, "samples/s", f"batch {BATCH}"),
        ("CPU path / bare loop", path / bare, "ratio", "1.0 = no overhead"),
    ]


def main() -> None:
    print_table(measure())


if __name__ == "__main__":
    main()
