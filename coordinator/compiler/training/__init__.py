"""Training analysis: what the train_op does to which variables, proven from the graph.

    analyze_training(extracted) -> TrainingSpec

1. Writes (writes.py). Every variable write the train_op runs is an optimizer update of one
   variable (Apply*/SparseApply*, v1 Adam's and SGD's sparse patterns), the optimizer's own
   bookkeeping (Adam's beta powers), the global step's increment, a Keras seed
   generator's state or a moving average (BatchNormalization's moving statistics, whose
   batch statistic the matcher must find); any other write is refused. Variables not
   updated are frozen.
2. Updates (updates.py). One optimizer type for all variables, its hyper-parameters
   constants or schedules (coordinator.compiler.schedules), float32 only, dense or sparse
   (an IndexedSlices gradient), its slots named as wafer.optimizers names them.
3. Gradients (gradients.py; transforms.py emits the list the CS applies). Each applied
   gradient is peeled back through recognised transforms (scale, clip_by_value,
   clip_by_norm, clip_by_global_norm; any other transform of one gradient, weights and
   constants: a program, gradient_program.py) to the output of tf.gradients; that call's seed must
   sit on model_fn's loss (or on S * loss: loss scaling, a scale S), or, when the calls
   minimize several losses (a GAN's), on its own loss: an objective (objective_losses); or,
   when they minimize one loss model_fn does not return, on that one (minimized_apart: the
   loss the CS trains on, model_fn's the one it reports; coordinator.compiler.reported_loss).
4. Numbers (numbers.py). One Session.run on input_fn's first batch compares those raw
   gradients with tf.gradients(loss) (same run, same dropout masks); random gradients fed
   into TF's transform subgraph are compared with wafer.grad_transforms.apply_transforms.

The pass (analysis.py) runs them in this order; graph.py holds what they read off the graph.
"""
from coordinator.compiler.training.analysis import analyze_training
from coordinator.compiler.training.gradients import TRANSFORMS, minimized_apart, objective_losses
from coordinator.compiler.training.graph import skip_identity, variable_op
from coordinator.compiler.training.numbers import HALF_GRADIENT_RTOL, NUMERIC_CHECK_VALUES
from coordinator.compiler.training.updates import APPLY_OPS, SUPPORTED

__all__ = ["APPLY_OPS", "HALF_GRADIENT_RTOL", "NUMERIC_CHECK_VALUES", "SUPPORTED", "TRANSFORMS",
           "analyze_training", "minimized_apart", "objective_losses", "skip_identity", "variable_op"]
