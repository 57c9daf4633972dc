"""TF's own float32 spread: how far the loss, its gradients or the predictions move when TF
runs the same graph on the same batch from its weights moved by 1 ULP. Values the compiler
computes from the same terms in another order (the FFT kernels of spectra.py, the unrolled
graph recurrences.py proves) may differ from TF's by SPREAD_FACTOR x that spread: a sum of
terms that nearly cancel rounds so in TF itself."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

# The farthest of SPREAD_RUNS TF runs from the weights moved by 1 ULP, times SPREAD_FACTOR.
SPREAD_RUNS = 3
SPREAD_FACTOR = 2.0


def distances(got: dict, want: dict, scale: dict[str, float]) -> dict[str, float]:
    """Each output's max |got - want| over its `scale` (the loss's magnitude, the model's
    largest gradient element)."""
    return {name: float(np.abs(np.asarray(got[name], np.float64) - want[name]).max())
            / max(scale[name], 1e-30) for name in want}


def spread(session: tf.compat.v1.Session, outputs: dict, feed: dict,
           weights: list[tf.Variable], want: dict, scale: dict[str, float]) -> dict[str, float]:
    """TF's own spread: each output's farthest distance from `want` over SPREAD_RUNS runs
    with a random half of every weight's elements moved by 1 float32 ULP (x(1 + 2^-23),
    seeds 0..SPREAD_RUNS-1). The session keeps the last run's weights."""
    initial = session.run(weights)
    farthest = dict.fromkeys(want, 0.0)
    for seed in range(SPREAD_RUNS):
        move_by_ulp(session, weights, initial, seed)
        moved = distances(session.run(outputs, feed), want, scale)
        farthest = {name: max(farthest[name], moved[name]) for name in want}
    return farthest


def move_by_ulp(session: tf.compat.v1.Session, weights: list[tf.Variable], initial: list,
                seed: int) -> None:
    """Load `weights` with their `initial` values, a random half of each weight's elements
    moved by 1 float32 ULP (x(1 + 2^-23), drawn from `seed`)."""
    rng = np.random.default_rng(seed)
    for weight, value in zip(weights, initial):
        weight.load(np.where(rng.random(value.shape) < 0.5, value * np.float32(1 + 2.0 ** -23),
                             value), session)
