"""Script to train FC MNIST model, in the original modelzoo's shape (its fc_mnist/tf/run.py
with the import lines changed to csrun's `launcher`).

    python run.py --mode train                  # CPU (plain TensorFlow)
    python run.py --mode eval                   # accuracy of the newest checkpoint
    python run.py --mode train --validate_only  # does the model map onto the CS?
    csrun_wse python run.py --mode train        # on the CS system
"""
import os
import sys

import tensorflow as tf

sys.path.append(os.path.join(os.path.dirname(__file__), "../.."))
from examples.modelzoo_fc_mnist.data import eval_input_fn, train_input_fn
from examples.modelzoo_fc_mnist.model import model_fn
from examples.modelzoo_fc_mnist.utils import get_params
from launcher.estimator import CSEstimator, CSRunConfig, ModeKeys
from launcher.run_flow import train_and_eval
from launcher.run_utils import (
    check_env,
    create_arg_parser,
    get_csrunconfig_dict,
    is_cs,
    save_params,
    update_params_from_args,
)


def run(args, params, model_fn, train_input_fn=None, eval_input_fn=None):
    """
    Set up estimator and run based on mode

    :params dict params: dict to handle all parameters
    :params model_fn: Model function to run with
    :params train_input_fn: Dataset to train with
    :params eval_input_fn: Dataset to validate against
    """
    # update and validate runtime params
    runconfig_params = params["runconfig"]
    update_params_from_args(args, runconfig_params)
    # save params for reproducibility
    save_params(params, model_dir=runconfig_params["model_dir"])

    # get runtime configurations
    use_cs = is_cs(runconfig_params)
    csrunconfig_dict = get_csrunconfig_dict(runconfig_params)

    # prep cs1 run environment, run config and estimator
    check_env(runconfig_params)
    est_config = CSRunConfig(cs_ip=runconfig_params["cs_ip"], **csrunconfig_dict)
    est = CSEstimator(
        model_fn=model_fn,
        model_dir=runconfig_params["model_dir"],
        config=est_config,
        params=params,
        warm_start_from=runconfig_params["checkpoint_path"],
    )

    # execute based on mode
    if runconfig_params["validate_only"] or runconfig_params["compile_only"]:
        if runconfig_params["mode"] == "train":
            input_fn = train_input_fn
            mode = ModeKeys.TRAIN
        else:
            input_fn = eval_input_fn
            mode = ModeKeys.EVAL
        est.compile(input_fn, validate_only=runconfig_params["validate_only"], mode=mode)
    elif runconfig_params["mode"] == "train":
        est.train(
            input_fn=train_input_fn,
            steps=runconfig_params["steps"],
            max_steps=runconfig_params["max_steps"],
            use_cs=use_cs,
        )
    elif runconfig_params["mode"] == "eval":
        est.evaluate(
            input_fn=eval_input_fn,
            checkpoint_path=runconfig_params["checkpoint_path"],
            steps=runconfig_params["eval_steps"],
            use_cs=use_cs,
        )
    elif runconfig_params["mode"] == "eval_all":
        ckpt_list = tf.train.get_checkpoint_state(runconfig_params["model_dir"]).all_model_checkpoint_paths
        for ckpt in ckpt_list:
            est.evaluate(
                input_fn=eval_input_fn,
                checkpoint_path=ckpt,
                steps=runconfig_params["eval_steps"],
                use_cs=use_cs,
            )
    elif runconfig_params["mode"] == "train_and_eval":
        # tf.estimator.train_and_evaluate's rule: an evaluation after checkpoints, throttle_secs apart
        train_and_eval(est, train_input_fn, eval_input_fn, runconfig_params)
    elif runconfig_params["mode"] == "predict":
        est.predict(
            input_fn=eval_input_fn,
            checkpoint_path=runconfig_params["checkpoint_path"],
            use_cs=use_cs,
        )


def main():
    """
    Main function
    """
    default_model_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "model_dir")
    parser = create_arg_parser(default_model_dir)
    args = parser.parse_args(sys.argv[1:])
    params = get_params(args.params)
    run(
        args=args,
        params=params,
        model_fn=model_fn,
        train_input_fn=train_input_fn,
        eval_input_fn=eval_input_fn,
    )


if __name__ == "__main__":
    main()
