"""cs_input_analyzer's measuring half (`launcher.input_analyzer` is the command): compile the
user's script in this process and time its input_fn the way an input worker runs it. It
imports TensorFlow (through the user API), so the command imports it only after its flags."""
from __future__ import annotations

import json
import os
import runpy
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from common.errors import CSRunError
from common.run_kinds import RunKind
from cs_api import cs_api_pb2 as pb
from cs_api.client import CSClient
from cs_api.input_spec import program_inputs
from launcher.csrun_wse import EmbeddedSimulator
from launcher.estimator import recorded_compiles
from launcher.input_analyzer import MEASURED_WORKERS, PROG, REPEATS, InputCosts, StreamCosts
from wafer.fabric import DEFAULT_FABRIC
from workers.feed import feed_requests, shard_batches, stream
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
    initial_weights: dict[str, np.ndarray]

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
    return CompiledScript(call.input_fn, call.params, program, call.result.directory, report,
                          call.result.initial_weights)


# ---- measuring input_fn ----------------------------------------------------------------

def _worker_requests(compiled: CompiledScript, batches: int, num_workers: int, token: str = "") -> Any:
    """The Feed messages worker 0 of `num_workers` sends: `batches` + 1 batches, then `end`."""
    program = compiled.program
    rendezvous = Rendezvous(cs_ip="", cs_job_id="analyzer", token=token, num_workers=num_workers,
                            start_batch=0, num_batches=(batches + 1) * num_workers,
                            inputs=program_inputs(program), batch_size=program.batch_size)
    return feed_requests(shard_batches(compiled.input_fn, compiled.params, rendezvous, 0), rendezvous, 0)


def seconds_per_batch(compiled: CompiledScript, batches: int, num_workers: int) -> tuple[float, float]:
    """(wall, CPU) seconds per batch worker 0 of `num_workers` sends (input_fn's call and its
    first batch excluded), through the workers' own sharding, checks and serialization."""
    requests = _worker_requests(compiled, batches, num_workers)
    next(requests)
    start, cpu = time.perf_counter(), time.process_time()
    sent = sum(not request.end for request in requests)
    return (time.perf_counter() - start) / sent, (time.process_time() - cpu) / sent


def measure_costs(compiled: CompiledScript, batches: int) -> InputCosts:
    """Time worker 0 of W for W = 1, 2, 4, 8; the fastest of REPEATS runs each (this node is
    shared: slower runs are other work)."""
    seconds, cpu, wall = [], 0.0, 0.0
    for w in MEASURED_WORKERS:
        runs = [seconds_per_batch(compiled, batches, w) for _ in range(REPEATS)]
        seconds.append((w, min(t for t, _ in runs)))
        wall, cpu = wall + sum(t for t, _ in runs), cpu + sum(c for _, c in runs)
    return InputCosts(int(compiled.report["batch_size"]), tuple(seconds), len(os.sched_getaffinity(0)),
                      cpu_per_second=cpu / wall)


def measure_stream(compiled: CompiledScript, batches: int) -> StreamCosts:
    """`stream_costs`, the mean of REPEATS runs: the simulator shares this node's CPUs with
    whatever else runs, as a job's will (the workers' fastest run is theirs alone)."""
    runs = [stream_costs(compiled, batches) for _ in range(REPEATS)]
    return StreamCosts(*(sum(getattr(run, field) for run in runs) / len(runs) for field in ("wire", "cs_wall", "cs_cpu")))


def stream_costs(compiled: CompiledScript, batches: int) -> StreamCosts:
    """What the rest of a batch's way costs on this host, as a job's batches go: worker 0's
    Feed messages streamed over gRPC to a `wse_sim serve` started for it (csrun_wse's
    embedded simulator), which trains on them while this process reads each step's result
    as the chief does: the CPU seconds gRPC takes to serialize and parse a message, and the
    simulator's wall and CPU seconds per batch from its second step."""
    steps = max(batches, 30)
    requests = [r for r in _worker_requests(compiled, steps, 1) if not r.end]
    start = time.process_time()
    for request in requests:
        pb.FeedRequest.FromString(request.SerializeToString())
    wire = (time.process_time() - start) / len(requests)
    with tempfile.TemporaryDirectory(prefix="cs_input_analyzer_") as folder:
        simulator = EmbeddedSimulator(compiled.program.fabric or DEFAULT_FABRIC, Path(folder) / "wse_sim.log")
        simulator.start()
        client = CSClient(simulator.address)
        try:
            client.load("analyzer", compiled.program, compiled.initial_weights, num_workers=1,
                        global_step=0, first_batch=0)
            for request in requests:
                request.token = client.token
            ended = pb.FeedRequest(token=client.token, worker_id=0, end=True)
            feeder = threading.Thread(target=stream, args=([*requests, ended], simulator.address, 0),
                                      daemon=True)
            feeder.start()
            times = [(time.perf_counter(), simulator.cpu_seconds())
                     for result in client.run(RunKind.TRAIN, len(requests)) if result.HasField("step")]
            feeder.join(30)
            client.unload()
        finally:
            client.close()
            simulator.stop()
    (wall0, cpu0), (wall1, cpu1) = times[0], times[-1]
    return StreamCosts(wire, (wall1 - wall0) / (len(times) - 1), (cpu1 - cpu0) / (len(times) - 1))
