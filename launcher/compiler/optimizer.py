"""Read the optimizer and its hyper-parameters from a tf.compat.v1.train op."""
from __future__ import annotations

import tensorflow as tf

from launcher.compiler.extract import user_source
from launcher.compiler.ir import OptimizerSpec
from launcher.errors import CSRunError

# op type -> (optimizer, {hyper-parameter: input index})
APPLY_OPS = {
    "ApplyGradientDescent": ("sgd", {"learning_rate": 1}),
    "ApplyMomentum": ("momentum", {"learning_rate": 2, "momentum": 4}),
    "ApplyAdam": ("adam", {"learning_rate": 5, "beta1": 6, "beta2": 7, "epsilon": 8}),
}
APPLY_OPS.update({"Resource" + k: v for k, v in list(APPLY_OPS.items())})
SUPPORTED = "tf.compat.v1.train.GradientDescentOptimizer, MomentumOptimizer, AdamOptimizer"


def apply_ops(train_op: tf.Operation | tf.Tensor) -> list[tf.Operation]:
    """The variable-update ops the train_op runs (through inputs and control inputs)."""
    start = train_op.op if isinstance(train_op, tf.Tensor) else train_op
    seen, stack, found = set(), [start], []
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        if op.type in APPLY_OPS or (op.type.startswith(("Apply", "ResourceApply",
                                                         "ResourceSparseApply", "SparseApply"))):
            found.append(op)
            continue
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return sorted(found, key=lambda op: op.name)


def variable_name(handle: tf.Tensor) -> str:
    """The TF variable a resource handle or ref tensor belongs to."""
    op = handle.op
    while op.type in ("Identity", "ReadVariableOp") and op.inputs:
        op = op.inputs[0].op
    return op.name


def read_optimizer(train_op) -> tuple[OptimizerSpec, dict[str, str]]:
    """The optimizer of `train_op` and the variables it updates (name -> apply op source)."""
    ops = apply_ops(train_op)
    if not ops:
        raise CSRunError("train_op updates no variable with a supported optimizer",
                         f"minimize the loss with {SUPPORTED}")
    specs = set()
    updated = {}
    for op in ops:
        if op.type not in APPLY_OPS:
            raise CSRunError(f"optimizer op {op.type} '{op.name}' at {user_source(op)} is not "
                             "supported", f"use {SUPPORTED}")
        kind, inputs = APPLY_OPS[op.type]
        values = {}
        for key, index in inputs.items():
            value = tf.get_static_value(op.inputs[index])
            if value is None:
                raise CSRunError(
                    f"the optimizer's {key} at {user_source(op)} is not a constant",
                    "learning-rate schedules are not supported on the CS: use a constant")
            values[key] = float(value)
        nesterov = bool(op.get_attr("use_nesterov")) if "use_nesterov" in op.node_def.attr else False
        specs.add(OptimizerSpec(type=kind, use_nesterov=nesterov, **values))
        updated[variable_name(op.inputs[0])] = user_source(op)
    if len(specs) > 1:
        raise CSRunError(f"train_op mixes optimizers or hyper-parameters: {sorted(map(str, specs))}",
                         "train every variable with one optimizer")
    return specs.pop(), updated
