"""cs_input_analyzer's measuring half (`launcher.input_analyzer` is the command): compile the
user's script in this process and time its input_fn the way an input worker runs it. It
imports TensorFlow (through the user API), so the command imports it only after its flags."""
from __future__ import annotations

import json
import os
import runpy
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from common.errors import CSRunError
from cs_api import cs_api_pb2 as pb
from cs_api.input_spec import program_inputs
from launcher.estimator import recorded_compiles
from launcher.input_analyzer import MEASURED_WORKERS, PROG, REPEATS, InputCosts
from workers.feed import feed_requests, shard_batches
from workers.rendezvous import Rendezvous

# ---- compiling the user's script -------------------------------------------------------

@dataclass(frozen=True)
class CompiledScript:
    """What the script's --compile_only run handed the compiler, and what came out."""

    input_fn: Callable
    params: dict
    program: pb.Program
    directory: str           # the compile directory (holds compile_report.json)
    report: dict[str, Any]   # compile_report.json

    @property
    def samples_per_sec(self) -> float:
        return float(self.report["estimate"]["samples_per_sec"])


def script_argv(command: tuple[str, ...]) -> list[str]:
    """`python SCRIPT.py ARGS…` → [SCRIPT.py, ARGS…, --compile_only]."""
    if len(command) < 2 or not Path(command[0]).name.startswith("python") or not command[1].endswith(".py"):
        raise CSRunError(f"{PROG} runs a Python training script, not {' '.join(command)!r}",
                         f"e.g. {PROG} python run.py --mode train")
    if not Path(command[1]).is_file():
        raise CSRunError(f"script {command[1]} not found", "run from the script's directory or give its path")
    return [command[1], *command[2:], "--compile_only"]


def compile_script(command: tuple[str, ...]) -> CompiledScript:
    """Run the script's --compile_only path in this process; return what it compiled last."""
    argv = script_argv(command)
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = argv
    sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
    try:
        with recorded_compiles() as calls:
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as done:
        if done.code not in (None, 0):
            raise CSRunError(f"the compile ({' '.join(argv)}) failed with exit code {done.code}",
                             "see its error above; fix it with `python "
                             f"{' '.join(argv)}` first") from None
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    compiled = [(call, program) for call in calls if (program := call.result.program) is not None]
    if not compiled:
        raise CSRunError(f"{' '.join(argv)} compiled nothing",
                         "give a CSEstimator script whose --compile_only compiles "
                         "(e.g. python run.py --mode train)")
    call, program = compiled[-1]
    report_path = Path(call.result.directory) / "compile_report.json"
    try:
        report = json.loads(report_path.read_text())
    except (OSError, ValueError) as error:
        raise CSRunError(f"cannot read {report_path}: {error}",
                         "compile again with --compile_only") from None
    return CompiledScript(call.input_fn, call.params, program, call.result.directory, report)


# ---- measuring input_fn ----------------------------------------------------------------

def seconds_per_batch(input_fn: Callable, params: dict, inputs: tuple, batch_size: int,
                      batches: int, num_workers: int) -> float:
    """Seconds per batch worker 0 of `num_workers` sends (input_fn's call and its first
    batch excluded), through the workers' own sharding, checks and serialization."""
    rendezvous = Rendezvous(cs_ip="", cs_job_id="analyzer", token="", num_workers=num_workers,
                            start_batch=0, num_batches=(batches + 1) * num_workers, inputs=inputs,
                            batch_size=batch_size)
    requests = feed_requests(shard_batches(input_fn, params, rendezvous, 0), rendezvous, 0)
    next(requests)
    start = time.perf_counter()
    sent = sum(not request.end for request in requests)
    return (time.perf_counter() - start) / sent


def measure_costs(compiled: CompiledScript, batches: int, most_workers: int) -> InputCosts:
    """Time worker 0 of W for W = 1, 2, 4, 8, up to the first W >= `most_workers`; the
    fastest of REPEATS runs each (this node is shared: slower runs are other work)."""
    program = compiled.program
    inputs = program_inputs(program)
    reach = next((w for w in MEASURED_WORKERS if w >= max(most_workers, 2)), MEASURED_WORKERS[-1])
    counts = [w for w in MEASURED_WORKERS if w <= reach]
    seconds = tuple((w, min(seconds_per_batch(compiled.input_fn, compiled.params, inputs,
                                              program.batch_size, batches, w)
                            for _ in range(REPEATS)))
                    for w in counts)
    return InputCosts(int(compiled.report["batch_size"]), seconds, len(os.sched_getaffinity(0)))
