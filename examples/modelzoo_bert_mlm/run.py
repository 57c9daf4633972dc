"""Script to train the BERT masked-LM, in the original modelzoo's shape (its
transformers/tf/bert/run.py on csrun's `launcher`; the estimator flow is the modelzoo
FC-MNIST's `run`).

    python run.py --mode train                  # CPU (plain TensorFlow)
    python run.py --mode eval                   # masked-LM accuracy of the newest checkpoint
    python run.py --mode train --validate_only  # does the model map onto the CS?
    csrun_wse python run.py --mode train        # on the CS system
"""
import os
import sys

sys.path.append(os.path.join(os.path.dirname(__file__), "../.."))
from examples.modelzoo_bert_mlm.data import eval_input_fn, train_input_fn
from examples.modelzoo_bert_mlm.model import model_fn
from examples.modelzoo_bert_mlm.utils import get_params
from examples.modelzoo_fc_mnist.run import run
from launcher.run_utils import create_arg_parser


def main():
    default_model_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "model_dir")
    parser = create_arg_parser(default_model_dir)
    args = parser.parse_args(sys.argv[1:])
    params = get_params(args.params)
    run(args=args, params=params, model_fn=model_fn, train_input_fn=train_input_fn,
        eval_input_fn=eval_input_fn)


if __name__ == "__main__":
    main()
