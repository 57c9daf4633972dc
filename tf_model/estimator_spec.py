"""What a user's model_fn returns, and the modes it is called in."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from common.errors import CSRunError


class ModeKeys:
    TRAIN = "train"
    EVAL = "eval"
    PREDICT = "infer"


@dataclass
class CSEstimatorSpec:
    """The Estimator-style result of model_fn.

    host_call = (fn, [tensors]); fn(*tensors) returns {name: (value, update_op)} metrics,
    computed on the host. eval_metric_ops is the same dict built inside model_fn. Giving
    both is an error.
    """

    mode: str
    loss: Any = None
    train_op: Any = None
    host_call: tuple[Callable[..., Mapping[str, tuple[Any, Any]]], Sequence[Any]] | None = None
    predictions: Any = None
    eval_metric_ops: Mapping[str, tuple[Any, Any]] | None = None

    def __post_init__(self) -> None:
        if self.host_call is not None and self.eval_metric_ops is not None:
            raise CSRunError("CSEstimatorSpec got both host_call and eval_metric_ops",
                             "give the metrics once: host_call=(fn, tensors) or eval_metric_ops")
        if self.host_call is not None:
            if not (isinstance(self.host_call, (tuple, list)) and len(self.host_call) == 2
                    and callable(self.host_call[0])):
                raise CSRunError("CSEstimatorSpec host_call must be (fn, [tensors])",
                                 "fn takes the tensors and returns {name: (value, update_op)}")
        if self.mode == ModeKeys.TRAIN and (self.loss is None or self.train_op is None):
            raise CSRunError("model_fn in train mode must return a loss and a train_op")
        if self.mode == ModeKeys.EVAL and self.loss is None:
            raise CSRunError("model_fn in eval mode must return a loss")
