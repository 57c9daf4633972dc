"""A run.py, utils.py and params.yaml written the way the original installation's modelzoo
writes them (its own argparse flags and YAML loading; `update_params_from_args`, `is_cs`,
`get_csrunconfig_dict`, `check_env`, `save_params`, `get_csconfig`,
`create_warm_start_settings`, `save_predictions` from `launcher.run_utils`;
`CerebrasEstimator` and `CSRunConfig(cs_ip=…, cs_config=…, stack_params=…)`;
`cs_enable_summaries`; `est_config.task_id`), with only its import lines naming csrun. In
process against a CS serving on a local port: `--cs_ip` trains it on the CS with the CPU
path's losses and honours the script's own `--save_checkpoints_steps` flag (the GPT-2's:
it used to be dropped, the CS run checkpointing only at its end); inside a job (the job's
CS in the environment, no flag) the CS evaluates and predicts as the CPU path does."""
from __future__ import annotations

import numpy as np
import pytest
import yaml
from fc_mnist_runs import eval_results, losses
from processes import run_py_in_process

from tf_model import checkpoints

STEPS = 4
PARAMS = {
    "train_input": {"batch_size": 8, "seed": 3},
    "model": {"hidden_size": 16},
    "optimizer": {"learning_rate": 0.05},
    "csconfig": {},
    "runconfig": {"max_steps": STEPS, "save_summary_steps": STEPS, "log_step_count_steps": 1,
                  "tf_random_seed": 7, "model_dir": "model_dir", "cs_ip": None, "multireplica": False,
                  "mode": "train"},
}
MODEL_PY = '''\
import numpy as np
import tensorflow as tf

from launcher.estimator import CSEstimatorSpec, ModeKeys


def input_fn(params):
    rng = np.random.default_rng(params["train_input"]["seed"])
    x = rng.normal(size=(64, 6)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int32)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(params["train_input"]["batch_size"], drop_remainder=True)
    return ds.repeat() if params["runconfig"]["mode"] == "train" else ds


def model_fn(features, labels, mode, params):
    hidden = tf.keras.layers.Dense(params["model"]["hidden_size"], activation="relu")(features)
    logits = tf.keras.layers.Dense(2)(hidden)
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode=mode, predictions={"classes": tf.argmax(logits, axis=1)})
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    train_op, host_call = None, None
    if mode == ModeKeys.TRAIN:
        opt = tf.compat.v1.train.GradientDescentOptimizer(params["optimizer"]["learning_rate"])
        train_op = opt.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    else:
        host_call = (lambda l, y: {"accuracy": tf.compat.v1.metrics.accuracy(y, tf.argmax(l, axis=1))},
                     [logits, labels])
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op, host_call=host_call)
'''
RUN_PY = '''\
import argparse
import os
import sys

import yaml

sys.path.append(os.path.dirname(os.path.abspath(__file__)))
from launcher.estimator import CSEstimator as CerebrasEstimator
from launcher.estimator import CSRunConfig, ModeKeys, cs_disable_summaries, cs_enable_summaries
from launcher.run_utils import (check_env, create_warm_start_settings, get_csconfig, get_csrunconfig_dict,
                                is_cs, save_params, save_predictions, update_params_from_args)
from model import input_fn, model_fn


def parser_of(default_model_dir):
    parser = argparse.ArgumentParser()
    parser.add_argument("-p", "--params", required=True)
    parser.add_argument("-o", "--model_dir", default=default_model_dir)
    parser.add_argument("--cs_ip", default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--max_steps", type=int, default=None)
    parser.add_argument("--eval_steps", type=int, default=None)
    parser.add_argument("--save_checkpoints_steps", type=int, default=None)
    parser.add_argument("-m", "--mode", required=True, choices=["train", "eval", "predict"])
    parser.add_argument("--validate_only", action="store_true")
    parser.add_argument("--compile_only", action="store_true")
    parser.add_argument("--multireplica", action="store_true")
    parser.add_argument("--checkpoint_path", default=None)
    return parser


def run(args, params):
    runconfig = params["runconfig"]
    update_params_from_args(args, runconfig)
    if not is_cs(runconfig):
        assert not runconfig["multireplica"], "multireplica runs on the CS only"
    save_params(params, model_dir=runconfig["model_dir"])
    use_cs = is_cs(runconfig)
    check_env(runconfig)
    est_config = CSRunConfig(cs_ip=runconfig["cs_ip"], cs_config=get_csconfig(params.get("csconfig")),
                             stack_params={}, **get_csrunconfig_dict(runconfig))
    est = CerebrasEstimator(model_fn=model_fn, model_dir=runconfig["model_dir"], config=est_config,
                            params=params, warm_start_from=create_warm_start_settings(runconfig))
    if runconfig["validate_only"] or runconfig["compile_only"]:
        est.compile(input_fn, validate_only=runconfig["validate_only"], mode=ModeKeys.TRAIN)
    elif runconfig["mode"] == "train":
        est.train(input_fn=input_fn, steps=runconfig["steps"], max_steps=runconfig["max_steps"], use_cs=use_cs)
    elif runconfig["mode"] == "eval":
        est.evaluate(input_fn=input_fn, steps=runconfig["eval_steps"], use_cs=use_cs)
    else:
        name = f"predictions_{'cs' if use_cs else 'tf'}_{est_config.task_id}.npz"
        save_predictions(runconfig["model_dir"], est.predict(input_fn=input_fn, use_cs=use_cs), name=name)


if __name__ == "__main__":
    args = parser_of(os.path.join(os.path.dirname(os.path.abspath(__file__)), "model_dir")).parse_args()
    with open(args.params) as stream:
        params = yaml.safe_load(stream)
    with (cs_disable_summaries if args.multireplica else cs_enable_summaries)():
        run(args, params)
'''


@pytest.mark.slow
def test_a_run_py_on_the_originals_helpers_runs_on_the_cs_as_on_the_cpu(tmp_path, server, monkeypatch):
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(PARAMS))
    (tmp_path / "model.py").write_text(MODEL_PY)
    (tmp_path / "run.py").write_text(RUN_PY)
    monkeypatch.delenv("CSRUN_CS_IP", raising=False)

    def run_py(*argv: str) -> str:
        return run_py_in_process(tmp_path / "run.py", ["-p", "params.yaml", *argv], tmp_path)

    cpu = run_py("--mode", "train", "-o", "cpu")
    out = run_py("--mode", "train", "--cs_ip", server.address, "--save_checkpoints_steps", "2", "-o", "cs")
    assert "Simulated CS system:" in out, out  # the chief trained on the CS
    assert sorted(losses(out)) == sorted(losses(cpu)) == list(range(1, STEPS + 1))
    for step, loss in losses(cpu).items():
        assert losses(out)[step] == pytest.approx(loss, rel=1e-5), step
    written = checkpoints.all_checkpoints(str(tmp_path / "cs"))
    assert [checkpoints.checkpoint_step(path) for path in written] == [2, 4]  # the script's own flag
    assert yaml.safe_load((tmp_path / "cs" / "params.yaml").read_text())["runconfig"]["save_checkpoints_steps"] == 2

    on_cpu = eval_results(run_py("--mode", "eval", "--eval_steps", "2", "-o", "cs"))
    run_py("--mode", "predict", "-o", "cs")
    cpu_classes = np.load(tmp_path / "cs" / "predict" / "predictions_tf_0.npz", allow_pickle=True)
    monkeypatch.setenv("CSRUN_CS_IP", server.address)  # a csrun_wse task: the job's CS, no flag
    on_cs = eval_results(run_py("--mode", "eval", "--eval_steps", "2", "-o", "cs"))
    assert set(on_cs) == set(on_cpu) == {"accuracy", "loss", "global_step"}
    for key in on_cpu:
        assert on_cs[key] == pytest.approx(on_cpu[key], rel=1e-5), key
    run_py("--mode", "predict", "-o", "cs")
    cs_classes = np.load(tmp_path / "cs" / "predict" / "predictions_cs_0.npz", allow_pickle=True)
    assert [p["classes"] for p in cs_classes["arr_0"]] == [p["classes"] for p in cpu_classes["arr_0"]]
    assert len(cs_classes["arr_0"]) == 64
