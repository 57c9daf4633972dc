"""What a task of a CS job does when the user's script calls train / evaluate / predict.

`CSEstimator` calls `run(model_fn, settings, kind, input_fn, **kwargs)` (`settings`: the
run's `common.run_settings.RunSettings`; `kind`: a `common.run_kinds.RunKind`) when a CS
is in use. The task's rank (`coordinator.roles`) decides: rank 0 runs the chief (`coordinator.chief`),
the others stream their shard of input_fn to the CS (`workers.feed`) once the chief has
published the phase's rendezvous (`workers.rendezvous`).
"""
from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Callable

from common.run_kinds import RunKind
from common.run_settings import RunSettings
from coordinator.roles import task_role
from coordinator.stop_request import linger_on_stop
from workers.feed import JobEnded, input_dataset, run_worker
from workers.rendezvous import rendezvous_path, wait_for

_calls = itertools.count(1)  # the n-th CS call of this script: the same n in every task


def run(model_fn: Callable, settings: RunSettings, kind: RunKind, input_fn: Callable,
        **kwargs: Any) -> Any:
    kind = RunKind(kind)  # ValueError for another kind
    role = task_role()
    # a requeued job's tasks run the script again in the same job folder: phases of their own
    phase = f"{next(_calls)}-{kind}" + (f"-requeue{role.restarts}" if role.restarts else "")
    path = rendezvous_path(phase, role.job_id, role.job_dir, Path(settings.model_dir))
    if role.is_chief:
        from coordinator.chief import Chief

        return Chief(model_fn, settings, role, path).run(kind, input_fn, **kwargs)
    linger_on_stop()  # a stopped chief's last piece still needs this worker's batches
    dataset = input_dataset(input_fn, settings.params)  # while the chief compiles and loads
    rendezvous = wait_for(path)
    if rendezvous.ended:
        print(f"input worker {role.worker_id}: nothing to stream: {rendezvous.ended}", flush=True)
        return None
    try:
        stats = run_worker(input_fn, settings.params, rendezvous, role.worker_id, dataset)
    except JobEnded as ended:
        print(f"{ended}; stopping", flush=True)
        return None
    print(f"input worker {role.worker_id}: sent {stats.batches} batches, "
          f"{stats.megabytes_per_sec:.1f} MB/s", flush=True)
    return None
