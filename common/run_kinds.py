"""The kinds of run on the CS system: what a user's script calls on the estimator, the
phase a task takes part in, the CS API call that runs it. Str-valued, so messages, phase
file names (`1-train.json`) and logs keep their spelling."""
from __future__ import annotations

import enum


class RunKind(enum.StrEnum):
    TRAIN = "train"
    EVALUATE = "evaluate"
    PREDICT = "predict"
