"""Train, evaluate, predict, validate or compile the CNN digits example.

    python run.py --mode train                 # CPU (plain TensorFlow)
    python run.py --mode eval                  # accuracy of the newest checkpoint
    python run.py --validate_only              # does the model map onto the CS?
    python run.py --compile_only               # place it on the wafer; see model_dir/cs_compile/
    csrun_wse python run.py --mode train       # on the CS system
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repository: `examples.*`

from examples.cnn_digits.data import eval_input_fn, train_input_fn  # noqa: E402
from examples.cnn_digits.model import PARAMS_SPEC, model_fn  # noqa: E402
from launcher.run_flow import run  # noqa: E402

if __name__ == "__main__":
    run(model_fn, train_input_fn, eval_input_fn, here=HERE, params_spec=PARAMS_SPEC)
