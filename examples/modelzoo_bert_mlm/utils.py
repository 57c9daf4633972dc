"""Params parsing for the BERT masked-LM (the original's transformers/tf/bert/utils.py)."""
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
    model.setdefault("dropout_rate", 0.0)
    model.setdefault("layer_norm_epsilon", 1.0e-5)
    model.setdefault("encoder_nonlinearity", "gelu")
    model.setdefault("vocab_size", params["train_input"]["vocab_size"])
    model.setdefault("max_position_embeddings", params["train_input"]["max_sequence_length"])
