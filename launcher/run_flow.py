"""The mode flow every example's run.py calls: parse the flags, load params, then train /
eval / eval_all / train_and_eval / predict, or validate_only / compile_only.

    from launcher.run_flow import run
    run(model_fn, train_input_fn, eval_input_fn, here=os.path.dirname(__file__))

`python run.py` runs on the CPU; with `--cs_ip` (or under `csrun_wse`, which names the job's
CS to every task: `coordinator.roles`) train, eval, eval_all (a CS phase per checkpoint) and
predict go to the CS system; train_and_eval stays on the CPU (`run_utils.CPU_ONLY_MODES`).
"""
from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Callable

from common.errors import CSRunError, cli_entry
from common.run_settings import end_step
from coordinator.replicas import requested_replicas
from coordinator.roles import task_role
from launcher.estimator import CSEstimator, CSRunConfig, ModeKeys
from launcher.params_spec import Spec, check_params
from launcher.run_utils import (
    check_env,
    create_arg_parser,
    get_csrunconfig_dict,
    get_params,
    is_cs,
    save_params,
    update_params_from_args,
)
from tf_model import checkpoints
from tf_model.model_dir_lock import model_dir_locked

TRAINING_MODES = ("train", "train_and_eval")  # the modes that write checkpoints: one writer


def estimator_for(model_fn: Callable, params: dict) -> CSEstimator:
    runconfig = params["runconfig"]
    config = CSRunConfig(cs_ip=runconfig["cs_ip"], **get_csrunconfig_dict(runconfig))
    return CSEstimator(model_fn, model_dir=runconfig["model_dir"], config=config, params=params,
                       warm_start_from=runconfig["checkpoint_path"])


def train_and_eval(estimator: CSEstimator, train_input_fn: Callable, eval_input_fn: Callable,
                   runconfig: dict) -> None:
    """Train to each checkpoint step up to max_steps (or steps more), evaluating after the
    first, the last, and each other one that comes `throttle_secs` or more after the start
    of the evaluation before it (tf.estimator.train_and_evaluate's rule)."""
    start = checkpoints.latest_checkpoint(estimator.model_dir)
    step = checkpoints.checkpoint_step(start) if start else 0
    end = end_step(step, runconfig["steps"] or 0, runconfig["max_steps"])  # neither: no training
    every = runconfig["save_checkpoints_steps"] or max(end - step, 1)
    last_eval: float | None = None
    while step < end:
        step = min((step // every + 1) * every, end)
        estimator.train(train_input_fn, max_steps=step)
        if last_eval is None or step == end or time.monotonic() - last_eval >= (runconfig["throttle_secs"] or 0):
            last_eval = time.monotonic()
            estimator.evaluate(eval_input_fn, steps=runconfig["eval_steps"])


def run_mode(estimator: CSEstimator, train_input_fn: Callable, eval_input_fn: Callable,
             runconfig: dict) -> None:
    mode = runconfig["mode"]
    if runconfig["validate_only"] or runconfig["compile_only"]:
        train = mode == "train"
        estimator.compile(train_input_fn if train else eval_input_fn,
                          validate_only=runconfig["validate_only"],
                          mode=ModeKeys.TRAIN if train else ModeKeys.EVAL)
    elif mode == "train":
        estimator.train(train_input_fn, steps=runconfig["steps"], max_steps=runconfig["max_steps"])
    elif mode == "eval":
        estimator.evaluate(eval_input_fn, steps=runconfig["eval_steps"],
                           checkpoint_path=runconfig["checkpoint_path"], use_cs=is_cs(runconfig))
    elif mode == "eval_all":
        paths = checkpoints.all_checkpoints(estimator.model_dir)
        if not paths:
            raise CSRunError(f"no checkpoint in {estimator.model_dir} to evaluate",
                             "train first (--mode train)")
        for path in paths:
            estimator.evaluate(eval_input_fn, steps=runconfig["eval_steps"], checkpoint_path=path,
                               use_cs=is_cs(runconfig))
    elif mode == "train_and_eval":
        train_and_eval(estimator, train_input_fn, eval_input_fn, runconfig)
    else:  # predict
        estimator.predict(eval_input_fn, checkpoint_path=runconfig["checkpoint_path"],
                          use_cs=is_cs(runconfig))


def run(model_fn: Callable, train_input_fn: Callable, eval_input_fn: Callable, here: str,
        argv: list[str] | None = None, params_spec: Spec | None = None) -> None:
    """main() of an example's run.py; `here` is the example's folder (configs/params.yaml and
    the default model_dir are found there); `params_spec` the sections and keys its
    input_fn and model_fn read, checked before any work. Errors end as one line and exit
    code 1."""

    @cli_entry(os.path.basename(sys.argv[0]) or "run.py")
    def main() -> None:
        parser = create_arg_parser(os.path.join(here, "model_dir"))
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
        path = args.params
        params = get_params(path)
        check_params(params, params_spec or {}, path)
        runconfig = params["runconfig"]
        update_params_from_args(args, runconfig)
        check_env(runconfig)
        chief = task_role().is_chief
        if chief and requested_replicas(runconfig) != 1 and not is_cs(runconfig) \
                and not (runconfig["validate_only"] or runconfig["compile_only"]):
            print("multireplica: copies of the network run on the CS system only; on the CPU "
                  "the model runs as one copy (the same updates)", flush=True)
        writes = runconfig["mode"] in TRAINING_MODES and chief \
            and not (runconfig["validate_only"] or runconfig["compile_only"])
        # one writer per model_dir, from before params.yaml is written to the run's end; input
        # workers (on other nodes, maybe before the chief made the folder) write nothing there
        with model_dir_locked(runconfig["model_dir"]) if writes else contextlib.nullcontext():
            save_params(params, runconfig["model_dir"])  # the chief's only
            run_mode(estimator_for(model_fn, params), train_input_fn, eval_input_fn, runconfig)

    main()
