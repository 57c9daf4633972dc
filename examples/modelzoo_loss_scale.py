"""Loss scaling from the modelzoo's `optimizer` keys, as the original's Trainer reads them:

- `loss_scaling_factor` a number (not 1): a static scale;
- `loss_scaling_factor` 'dynamic' or 'tf_dynamic': TensorFlow's dynamic rule (a step with a
  non-finite gradient is skipped and the scale halves, not below 1; it doubles after
  `steps_per_increase` finite steps), starting at `initial_loss_scale` (defaults 2**15 and
  2000, the original's);
- `max_loss_scale`, `min_loss_scale` and `overflow_tolerance` belong to the CS-1's own rule
  (CSDynamicLossScale: the scale clipped to [min, max], halved only when more than
  `overflow_tolerance` of the steps since the last change overflowed); csrun carries out
  TensorFlow's rule, which has none of them, so a params file that sets one is refused.
"""
import tensorflow as tf

from common.errors import CSRunError

DYNAMIC = ("dynamic", "tf_dynamic")
INITIAL_LOSS_SCALE = 2.0 ** 15  # the original's defaults
STEPS_PER_INCREASE = 2000
CS1_ONLY_KEYS = ("max_loss_scale", "min_loss_scale", "overflow_tolerance")


def loss_scale(optimizer_params):
    """The loss scale of the params' `optimizer` section: None (no scaling), a number, or
    a tf.compat.v1.mixed_precision.DynamicLossScale."""
    factor = optimizer_params.get("loss_scaling_factor", 1.0)
    if isinstance(factor, str):
        if factor not in DYNAMIC:
            raise CSRunError(f"optimizer.loss_scaling_factor is {factor!r}",
                             "use a number, 'dynamic' or 'tf_dynamic'")
        for key in CS1_ONLY_KEYS:
            if optimizer_params.get(key) is not None:
                raise CSRunError(
                    f"optimizer.{key} is part of the CS-1's own dynamic loss scaling rule, which "
                    "csrun does not carry out (it runs TensorFlow's rule: the scale halves on a "
                    "non-finite step, not below 1, and doubles after steps_per_increase finite steps)",
                    f"remove {key}")
        return tf.compat.v1.mixed_precision.DynamicLossScale(
            initial_loss_scale=float(optimizer_params.get("initial_loss_scale", INITIAL_LOSS_SCALE)),
            increment_period=int(optimizer_params.get("steps_per_increase", STEPS_PER_INCREASE)),
            multiplier=2.0)
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 0:
        raise CSRunError(f"optimizer.loss_scaling_factor is {factor!r}",
                         "use a positive number, 'dynamic' or 'tf_dynamic'")
    return None if float(factor) == 1.0 else float(factor)


def wrap_optimizer(optimizer, optimizer_params):
    """`optimizer` in TensorFlow's MixedPrecisionLossScaleOptimizer when the params scale the loss."""
    scale = loss_scale(optimizer_params)
    if scale is None:
        return optimizer
    return tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer(optimizer, scale)
