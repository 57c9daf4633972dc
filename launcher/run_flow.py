"""The mode flow every example's run.py calls: parse the flags, load params, then train /
eval / eval_all / train_and_eval / predict, or validate_only / compile_only.

    from launcher.run_flow import run
    run(model_fn, train_input_fn, eval_input_fn, here=os.path.dirname(__file__))

`python run.py` runs on the CPU; with `--cs_ip` (or under `csrun_wse`, which names the job's
CS to every task: `coordinator.roles`) train, eval, eval_all (a CS phase per checkpoint) and
predict go to the CS system; train_and_eval stays on the CPU (`run_config.CPU_ONLY_MODES`).
"""
from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Callable

from common.errors import CSRunError, cli_entry
from common.run_settings import end_step
from coordinator.roles import task_role
from launcher.estimator import CSEstimator, ModeKeys
from launcher.params_spec import Spec, check_params
from launcher.run_config import CSRunConfig, run_config
from launcher.run_utils import apply_args, check_env, create_arg_parser, get_params, save_params
from tf_model import checkpoints
from tf_model.model_dir_lock import model_dir_locked

TRAINING_MODES = ("train", "train_and_eval")  # the modes that write checkpoints: one writer


def estimator_for(model_fn: Callable, params: dict, config: CSRunConfig) -> CSEstimator:
    return CSEstimator(model_fn, model_dir=config.model_dir, config=config, params=params,
                       warm_start_from=config.checkpoint_path)


def train_and_eval(estimator: CSEstimator, train_input_fn: Callable, eval_input_fn: Callable,
                   runconfig: dict | CSRunConfig) -> None:
    """Train to each checkpoint step up to max_steps (or steps more), evaluating after the
    first, the last, and each other one that comes `throttle_secs` or more after the start
    of the evaluation before it (tf.estimator.train_and_evaluate's rule)."""
    config = run_config(runconfig)
    start = checkpoints.latest_checkpoint(estimator.model_dir)
    step = checkpoints.checkpoint_step(start) if start else 0
    end = end_step(step, config.steps or 0, config.max_steps)  # neither: no training
    every = config.save_checkpoints_steps or max(end - step, 1)
    last_eval: float | None = None
    while step < end:
        step = min((step // every + 1) * every, end)
        estimator.train(train_input_fn, max_steps=step)
        if last_eval is None or step == end or time.monotonic() - last_eval >= (config.throttle_secs or 0):
            last_eval = time.monotonic()
            estimator.evaluate(eval_input_fn, steps=config.eval_steps)


def run_mode(estimator: CSEstimator, train_input_fn: Callable, eval_input_fn: Callable,
             config: CSRunConfig) -> None:
    mode, on_cs = config.mode, config.cs_ip is not None
    if config.validate_only or config.compile_only:  # the graph the mode runs on the CS
        graph = ModeKeys.TRAIN if mode in TRAINING_MODES else \
            ModeKeys.PREDICT if mode == "predict" else ModeKeys.EVAL
        estimator.compile(train_input_fn if graph == ModeKeys.TRAIN else eval_input_fn,
                          validate_only=config.validate_only, mode=graph)
    elif mode == "train":
        estimator.train(train_input_fn, steps=config.steps, max_steps=config.max_steps)
    elif mode == "eval":
        estimator.evaluate(eval_input_fn, steps=config.eval_steps, checkpoint_path=config.checkpoint_path,
                           use_cs=on_cs)
    elif mode == "eval_all":
        paths = checkpoints.all_checkpoints(estimator.model_dir)
        if not paths:
            raise CSRunError(f"no checkpoint in {estimator.model_dir} to evaluate",
                             "train first (--mode train)")
        for path in paths:
            estimator.evaluate(eval_input_fn, steps=config.eval_steps, checkpoint_path=path, use_cs=on_cs)
    elif mode == "train_and_eval":
        train_and_eval(estimator, train_input_fn, eval_input_fn, config)
    else:  # predict
        estimator.predict(eval_input_fn, checkpoint_path=config.checkpoint_path, use_cs=on_cs)


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
        config = apply_args(args, params["runconfig"])
        check_env(config)
        chief = task_role().is_chief
        runs = not (config.validate_only or config.compile_only)
        if chief and runs and config.cs_ip is None and config.replicas != 1:
            print("multireplica: copies of the network run on the CS system only; on the CPU "
                  "the model runs as one copy (the same updates)", flush=True)
        writes = config.mode in TRAINING_MODES and chief and runs
        model_dir = str(config.model_dir)  # apply_args gives the script's default
        # one writer per model_dir, from before params.yaml is written to the run's end; input
        # workers (on other nodes, maybe before the chief made the folder) write nothing there
        with model_dir_locked(model_dir) if writes else contextlib.nullcontext():
            save_params(params, model_dir)  # the chief's only
            run_mode(estimator_for(model_fn, params, config), train_input_fn, eval_input_fn, config)

    main()
