"""The optimizer the examples' params name: `optimizer.optimizer_type` sgd, momentum or adam."""
from __future__ import annotations

import tensorflow as tf

from common.errors import CSRunError
from launcher.params_spec import Key

OPTIMIZERS = ("sgd", "momentum", "adam")
# The keys `build_optimizer` reads (checked before any work starts).
OPTIMIZER_SPEC = {"optimizer": {
    "optimizer_type": Key("str", choices=OPTIMIZERS, required=False),
    "learning_rate": Key("number", above=0),
    "momentum": Key("number", minimum=0, required=False),
    "beta1": Key("number", minimum=0, below=1, required=False),
    "beta2": Key("number", minimum=0, below=1, required=False),
    "epsilon": Key("number", minimum=0, required=False)}}


def build_optimizer(config: dict) -> tf.compat.v1.train.Optimizer:
    """A tf.compat.v1.train optimizer from the params' `optimizer` section."""
    name, lr = str(config.get("optimizer_type", "sgd")).lower(), config["learning_rate"]
    if name == "sgd":
        return tf.compat.v1.train.GradientDescentOptimizer(lr)
    if name == "momentum":
        return tf.compat.v1.train.MomentumOptimizer(lr, config.get("momentum", 0.9))
    if name == "adam":
        return tf.compat.v1.train.AdamOptimizer(lr, beta1=config.get("beta1", 0.9),
                                                beta2=config.get("beta2", 0.999),
                                                epsilon=config.get("epsilon", 1e-8))
    raise CSRunError(f"optimizer.optimizer_type {name!r} is not supported",
                     f"use one of {', '.join(OPTIMIZERS)}")
