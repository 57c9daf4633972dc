"""A weight several optimizers update in one step (an adversarial autoencoder's encoder,
trained by its reconstruction Adam and again by the generator's; a GAN's shared trunk; two
tasks' optimizers on one embedding). TF (2.21, measured) takes every optimizer's gradient
from the step's one forward pass, at the weights before the step, and applies the updates
in the order the train_op gives them: the second minimize under
tf.control_dependencies([the first]) applies after it (bit for bit a hand-written
compute_gradients of both, then the two apply_gradients chained); under one tf.group the
executor runs them in either order, by chance, step by step (w - a - b or w - b - a: the
same result up to the rounding of the two subtractions when no update reads the weight).
The CS applies a weight's updates in the order their apply ops were created (the graph's:
tf.control_dependencies orders an op after ops created before it, so a chain's order is
always it), TF's order in a chain and one of TF's orders in a group; refused in one line,
naming both updates: a group of updates one of which reads the weight (FTRL, the proximal
rules, AdamW's decay: TF's result is then undefined beyond rounding), and a write of the
weight besides its updates or a soft update reading it (a target network's)."""
from __future__ import annotations

from coordinator.compiler.extract import user_name, user_source
from coordinator.compiler.training.graph import fail
from coordinator.compiler.training.updates import Update
from coordinator.compiler.training.writes import Write, waits

READS_WEIGHT = ("ftrl", "proximal_adagrad", "proximal_sgd")  # (their update reads var)


def _reads_weight(u: Update) -> bool:
    """Whether the update's new value depends on the weight beyond var - delta."""
    config = u.optimizer
    return config.type in READS_WEIGHT or (config.type == "adamw" and
                                           config.weight_decay_rate != 0.0 and
                                           u.variable not in config.no_weight_decay)


def _named(u: Update) -> str:
    return f"'{user_name(u.op)}' at {user_source(u.op)}"


def check_reupdates(first: list[Update], again: list[Update], written: list[Write]) -> None:
    """Each of `again` (a weight's later updates, in graph order) applied by TF after the
    weight's earlier updates, or unordered with them and none reading the weight; else
    refused (see the module)."""
    by_var = {u.variable: [u] for u in first}
    writes = {w.variable for w in written}
    sources = {v for w in written for v in w.sources}
    for u in again:
        earlier = by_var[u.variable]
        if u.variable in writes or u.variable in sources:
            raise fail(u.op, f"{u.variable} is updated by two optimizers (also by "
                             f"{_named(earlier[0])}) and written besides, or read by a "
                             "soft update: the CS orders a write around one update")
        for e in earlier:
            if waits(u.op, e.op):
                continue
            if _reads_weight(e) or _reads_weight(u):
                reader = e if _reads_weight(e) else u
                raise fail(u.op, f"{u.variable} is updated by two optimizers with no order "
                                 f"between them (also by {_named(e)}), and the "
                                 f"{reader.optimizer.type} update reads the weight: TF "
                                 "applies them in either order, by chance, with results "
                                 "that differ",
                           hint="make the second minimize wait for the first: "
                                "tf.control_dependencies([first_train_op])")
        earlier.append(u)
