"""Params parsing for the FC-MNIST model (the original's fc_mnist/tf/utils.py)."""
import os

from launcher.run_utils import get_params as read_params

_curdir = os.path.dirname(os.path.abspath(__file__))
DEFAULT_YAML_PATH = os.path.join(_curdir, "configs/params.yaml")


def get_params(params_file=DEFAULT_YAML_PATH):
    """The checked params of `params_file`, with the model's defaults set."""
    params = read_params(params_file)
    set_defaults(params)
    return params


def set_defaults(params):
    model = params["model"]
    model.setdefault("mixed_precision", False)
    model.setdefault("dropout", 0.0)
    model.setdefault("activation_fn", "relu")
    if "hidden_sizes" not in model:  # the same hidden size across `depth` dense layers
        model["hidden_sizes"] = [model["hidden_size"]] * model["depth"]
