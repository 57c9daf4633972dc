"""Shared by the end-to-end tests: FC-MNIST runs as real subprocesses, their params and the
numbers read back from their logs."""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "fc_mnist"
# `python` in a task is the venv's, as for a user whose environment is activated.
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
       "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(REPO)}
STEP_LINE = re.compile(r"^global step (\d+): loss = (\S+)", re.M)
EVAL_LINE = re.compile(r"^Saving dict for global step (\d+): (.*)$", re.M)


def fc_mnist_params(folder: Path, *, steps: int, every: int, model: dict | None = None, **runconfig) -> Path:
    """FC-MNIST's params with a short run that logs every step's loss, in `folder` (`model`:
    keys of its model section replaced)."""
    params = yaml.safe_load((EXAMPLE / "configs" / "params.yaml").read_text())
    params["model"].update(model or {})
    params["runconfig"].update(max_steps=steps, save_checkpoints_steps=every, save_summary_steps=every,
                               log_step_count_steps=1, keep_checkpoint_max=5, **runconfig)
    path = folder / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def losses(output: str) -> dict[int, float]:
    """step → loss of a run's `global step N: loss = X` lines."""
    return {int(step): float(loss) for step, loss in STEP_LINE.findall(output)}


def eval_results(output: str) -> dict[str, float | list[float]]:
    """The metrics of a run's `Saving dict` line (a metric of several values: a list)."""
    (_, items), = EVAL_LINE.findall(output)
    return {k: [float(x) for x in v.strip("[]").split()] if v.startswith("[") else float(v)
            for k, v in (item.split(" = ") for item in items.split(", "))}
