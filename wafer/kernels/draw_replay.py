"""The test seam of the kernels drawing numbers of their own (`DRAWING`): within
`replayed_draws` each returns the values a test hands it (the numbers TensorFlow drew for
the same step) instead of its own draws. Tests only: a run never enters the block."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import numpy as np

# The kernels drawing numbers of their own: those the test seam hands TF's draws instead
# (dropout: the uniform numbers its mask compares with the rate).
DRAWING = ("random", "categorical", "sampled_logits", "dropout")

# (kernel name, micro-batch shape) -> the values a DRAWING kernel returns instead of its own
# draws (a test hands the CS the numbers TF drew); None: the kernel draws.
Replay = Callable[[str, tuple[int, ...]], "np.ndarray | None"]
_replay: Replay | None = None


@contextmanager
def replayed_draws(replay: Replay) -> Iterator[None]:
    """Within the block every DRAWING kernel returns `replay`'s values (tests only)."""
    global _replay
    _replay = replay
    try:
        yield
    finally:
        _replay = None


def replay_of(name: str, shape: tuple[int, ...]) -> np.ndarray | None:
    """The test seam's values for kernel `name` (None: the kernel draws its own)."""
    return None if _replay is None else _replay(name, shape)
