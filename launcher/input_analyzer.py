"""cs_input_analyzer: can the input workers keep up with the compiled program?

    cs_input_analyzer [--available-nodes N] [--cpus-per-node C] [--batches B] [--mount-dirs A,B]
                      [--debug] [--] python run.py --mode train

When csrun.yaml names a container image the analyzer runs inside it, as the original's ran
its steps through csrun_cpu: csrun.yaml's mount dirs, `--mount-dirs` and the current
directory bound (`containers.runtime`), on this host.

1. Compile: the script runs in this process with `--compile_only` appended, inside
   `launcher.estimator.recorded_compiles()`: its CSEstimator's compile hands over the
   user's input_fn and params and the compiled program; the program's estimated samples/s
   is read from its `compile_report.json`.
2. Measure input_fn the way an input worker runs it (`workers.feed.shard_batches`, then
   `feed_requests`: flatten, check, serialize with `to_tensor`), B batches as worker 0 of
   W for W = 1, 2, 4, 8, wall and CPU seconds. Every worker runs input_fn's whole
   pipeline and keeps one batch in W (`dataset.shard` after batching), so a worker's
   batches get slower as W grows, while prefetching overlaps the pipeline with the
   serialization: measuring, not a formula, says by how much. Between and beyond the
   measurements the time per batch is piecewise linear.
3. Measure the rest of a batch's way (`input_measurement.measure_stream`): gRPC's
   serialization and parsing of a Feed message, and the CS system — a `wse_sim serve`
   started for it, loaded with the program, fed worker 0's batches over gRPC and read as
   the chief reads it — wall and CPU seconds per batch.
4. Predict the samples/s of a job of W workers (`JobModel`): the least of what the workers
   send, what the CS consumes (and the compiled estimate), and what each node's CPUs hold
   of the processes it runs (the first node: the chief, the CS as csrun_wse's embedded
   simulator, its share of the workers), naming the limit.
5. Recommend `--total-nodes / --tasks-per-node / --cpus-per-task` for csrun_wse: the
   fewest workers whose predicted rate is within 5 % of the best the available nodes
   allow; one task more for the chief.

A worker is measured with the CPUs this process may use; the recommendation gives each
worker that many (at most a node's). The prediction is within 2x of what csrun_wse streams
on this host at 1 and 2 workers (tests/launcher/test_input_analyzer.py).
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from common.errors import ArgumentParser, CSRunError, cli_entry
from containers.runtime import add_mount_dirs_flag, container_exec, mount_dirs_of
from launcher.site_config import load_site_config

if TYPE_CHECKING:  # the measuring module imports TensorFlow: --help answers without it
    from launcher.input_measurement import CompiledScript

PROG = "cs_input_analyzer"
_IN_CONTAINER = "CSRUN_INPUT_ANALYZER_IN_CONTAINER"  # set for the analyzer run inside the image
NEAR_BEST = 0.95  # input-bound: the fewest workers within 5 % of the best rate
MEASURED_WORKERS = (1, 2, 4, 8)
REPEATS = 2


@dataclass(frozen=True)
class InputCosts:
    """Seconds per batch one input worker sends, measured on this node for a few numbers
    of workers (worker 0 of W runs input_fn's whole pipeline and keeps 1 batch in W)."""

    batch_size: int
    seconds: tuple[tuple[int, float], ...]  # (W, seconds per batch worker 0 of W sends), W from 1 up
    cpus: int                               # CPUs the measuring worker could use
    cpu_per_second: float = 1.0             # CPU seconds a worker spends per second (TF's threads)

    def __post_init__(self) -> None:
        workers = [w for w, _ in self.seconds]
        if not workers or workers[0] != 1 or workers != sorted(set(workers)):
            raise ValueError(f"measurements must start at 1 worker and ascend: {workers}")
        if any(t <= 0 for _, t in self.seconds):
            raise ValueError("measured times must be positive")

    def _points(self) -> list[tuple[int, float]]:
        """The measurements made non-decreasing: more workers cannot make one faster."""
        points, longest = [], 0.0
        for w, t in self.seconds:
            longest = max(longest, t)
            points.append((w, longest))
        return points

    def seconds_per_batch(self, num_workers: int) -> float:
        """Piecewise-linear through the measurements, extended beyond the last one with
        the last segment's slope."""
        points = self._points()
        for (w0, t0), (w1, t1) in zip(points, points[1:]):
            if num_workers <= w1:
                return t0 + (t1 - t0) * (num_workers - w0) / (w1 - w0)
        return points[-1][1] + self.slope * (num_workers - points[-1][0])

    @property
    def slope(self) -> float:
        """Seconds one more worker adds to each worker's batch (the last segment's)."""
        points = self._points()
        if len(points) < 2:
            return 0.0
        (w0, t0), (w1, t1) = points[-2:]
        return (t1 - t0) / (w1 - w0)

    def worker_rate(self, num_workers: int) -> float:
        """Samples/s one worker sends when there are `num_workers` of them."""
        return self.batch_size / self.seconds_per_batch(num_workers)

    def total_rate(self, num_workers: int) -> float:
        return num_workers * self.worker_rate(num_workers)

    @property
    def pipeline_limit(self) -> float:
        """Samples/s no number of workers passes: input_fn's pipeline rate."""
        return self.batch_size / self.slope if self.slope > 0 else math.inf


@dataclass(frozen=True)
class StreamCosts:
    """Seconds per batch of the rest of its way, measured on this host: gRPC's serialization
    of a Feed message and its parsing (`wire`, CPU, half on each side), and the CS system
    consuming it — here the simulator: its wall and CPU seconds per batch (the chief's
    reading of each step's result included)."""

    wire: float
    cs_wall: float
    cs_cpu: float


def _rate(samples: float, seconds: float) -> float:
    return samples / seconds if seconds > 0 else math.inf


@dataclass(frozen=True)
class JobModel:
    """The samples/s a job of W input workers streams: the least of what the workers send,
    what the CS consumes (the simulator's rate here; the compiled program's estimate on a
    CS), and what each node's CPUs hold of the processes it runs (the first: the chief, the
    CS (csrun_wse's embedded simulator) and its share of the workers)."""

    costs: InputCosts
    stream: StreamCosts
    cs_estimate: float  # the compiled program's samples/s (compile_report.json)
    available_nodes: int
    cpus_per_node: int

    def layout(self, workers: int) -> tuple[int, int]:
        """(nodes, workers on the first node) of a job of `workers` input workers and the
        chief, spread as csrun_wse spreads them over the nodes its slots need."""
        _, per_node, _ = job_slots(self.costs.cpus, self.available_nodes, self.cpus_per_node)
        nodes = min(self.available_nodes, math.ceil((workers + 1) / per_node))
        return nodes, min(workers, math.ceil((workers + 1) / nodes) - 1)

    def limits(self, workers: int) -> dict[str, float]:
        """Samples/s each part of the job allows, by what it is."""
        batch, stream = self.costs.batch_size, self.stream
        sent = self.costs.seconds_per_batch(workers) + stream.wire / 2
        worker_cpu = self.costs.seconds_per_batch(workers) * self.costs.cpu_per_second + stream.wire / 2
        nodes, first = self.layout(workers)
        first_cpu = stream.cs_cpu + stream.wire / 2 + first / workers * worker_cpu
        limits = {
            "the input workers": workers * batch / sent,
            f"the CS system (the simulator: {1e3 * stream.cs_wall:.1f} ms per batch here)": _rate(batch, stream.cs_wall),
            "the compiled program's rate": self.cs_estimate,
            f"the first node's {self.cpus_per_node} CPU(s) (the chief, the CS, {first} worker(s))":
                _rate(self.cpus_per_node * batch, first_cpu),
        }
        if nodes > 1:
            most = math.ceil((workers - first) / (nodes - 1))
            limits[f"another node's {self.cpus_per_node} CPU(s) ({most} worker(s))"] = \
                _rate(self.cpus_per_node * batch, most / workers * worker_cpu)
        return limits

    def rate(self, workers: int) -> float:
        return min(self.limits(workers).values())

    def limited_by(self, workers: int) -> str:
        limits = self.limits(workers)
        return min(limits, key=lambda name: limits[name])


@dataclass(frozen=True)
class Recommendation:
    total_nodes: int
    tasks_per_node: int
    cpus_per_task: int
    workers: int            # input workers (the tasks besides the chief; 1 in a lone chief)
    samples_per_sec: float  # what the job is expected to stream (`JobModel.rate`)
    limited_by: str         # what limits it (`JobModel.limited_by`)

    @property
    def input_bound(self) -> bool:
        return self.limited_by == "the input workers"

    def flags(self) -> str:
        return (f"--total-nodes {self.total_nodes} --tasks-per-node {self.tasks_per_node} "
                f"--cpus-per-task {self.cpus_per_task}")


def job_slots(cpus: int, available_nodes: int, cpus_per_node: int) -> tuple[int, int, int]:
    """(CPUs per task, tasks per node, most input workers) when a worker gets the `cpus`
    it was measured with (at most a node's) and the chief takes one task."""
    if available_nodes < 1 or cpus_per_node < 1:
        raise ValueError("need at least one node and one CPU")
    cpus_per_task = max(1, min(cpus, cpus_per_node))
    per_node = cpus_per_node // cpus_per_task
    return cpus_per_task, per_node, max(available_nodes * per_node - 1, 1)  # a lone chief runs one


def recommend(model: JobModel) -> Recommendation:
    """The smallest job that streams within NEAR_BEST of the best rate the available nodes
    allow: rank 0 is the chief, the rest workers."""
    cpus_per_task, slots_per_node, most = job_slots(model.costs.cpus, model.available_nodes, model.cpus_per_node)
    best = max(model.rate(w) for w in range(1, most + 1))
    workers = next(w for w in range(1, most + 1) if model.rate(w) >= NEAR_BEST * best)
    tasks = 1 if model.available_nodes * slots_per_node == 1 else workers + 1
    nodes = math.ceil(tasks / slots_per_node)
    per_node = math.ceil(tasks / nodes)
    workers = max(nodes * per_node - 1, 1)  # csrun_wse runs nodes x tasks-per-node tasks
    return Recommendation(nodes, per_node, cpus_per_task, workers, model.rate(workers), model.limited_by(workers))


# ---- the command line ------------------------------------------------------------------

@dataclass(frozen=True)
class AnalyzerArgs:
    available_nodes: int
    cpus_per_node: int
    batches: int
    command: tuple[str, ...]
    mount_dirs: tuple[str, ...] = ()


def parse_args(argv: list[str]) -> AnalyzerArgs:
    p = ArgumentParser(prog=PROG, allow_abbrev=False,
                description="Measure input_fn against the compiled program; recommend csrun_wse's layout.")
    p.add_argument("--available-nodes", type=int, default=1, help="nodes the job may use (default: 1)")
    p.add_argument("--cpus-per-node", type=int, default=os.cpu_count() or 1,
                   help="CPUs of a node (default: this node's)")
    p.add_argument("--batches", type=int, default=20, help="batches to time per run (default: 20)")
    add_mount_dirs_flag(p)
    p.add_command("python run.py --mode train")
    ns = p.parse_args(argv)
    command = p.command(ns, "python run.py --mode train", verb="analyze")
    for flag in ("available_nodes", "cpus_per_node", "batches"):
        if getattr(ns, flag) < 1:
            raise CSRunError(f"--{flag.replace('_', '-')} {getattr(ns, flag)}: must be at least 1")
    return AnalyzerArgs(ns.available_nodes, ns.cpus_per_node, ns.batches, command, mount_dirs_of(ns.mount_dirs))


def render(compiled: CompiledScript, model: JobModel, rec: Recommendation, batches: int,
           command: tuple[str, ...]) -> str:
    report, costs, stream = compiled.report, model.costs, model.stream
    lines = [
        f"Compiled program ({report['fabric']}, batch {report['batch_size']}): the CS consumes "
        f"up to {compiled.samples_per_sec:,.0f} samples/s ({compiled.directory})",
        f"On this host a batch costs the CS system (the simulator) {1e3 * stream.cs_wall:.1f} ms "
        f"({1e3 * stream.cs_cpu:.1f} ms of CPU) and gRPC {1e3 * stream.wire:.1f} ms of CPU",
        f"input_fn as input worker 0 of W with {costs.cpus} CPU(s), {batches} batches of "
        f"{costs.batch_size} samples (every worker runs the whole pipeline, keeps 1 batch in W); "
        f"the job on {model.available_nodes} node(s) of {model.cpus_per_node} CPU(s):",
        "  workers   ms per batch sent   samples/s sent   job samples/s   limited by",
    ]
    measured = {w for w, _ in costs.seconds}
    for w in sorted(measured | {rec.workers}):
        note = "" if w in measured else " (interpolated)" if w < max(measured) else " (extrapolated)"
        lines.append(f"  {w:7d}   {1e3 * costs.seconds_per_batch(w):17.3f}   {costs.total_rate(w):14,.0f}   "
                     f"{model.rate(w):13,.0f}   {model.limited_by(w)}{note}")
    lines += [
        f"Recommended: {rec.flags()}",
        f"  the chief and {rec.workers} input worker(s); expected {rec.samples_per_sec:,.0f} "
        f"samples/s (limited by {rec.limited_by})",
        f"  csrun_wse {rec.flags()} {' '.join(command)}",
    ]
    if rec.input_bound:
        limit = ("" if math.isinf(costs.pipeline_limit) else
                 f"more workers approach input_fn's pipeline rate, {costs.pipeline_limit:,.0f} samples/s; ")
        lines.append(f"  {limit}to go faster, make input_fn cheaper (cache decoded data, "
                     "vectorize map, prefetch) or give the job more nodes")
    return "\n".join(lines) + "\n"


@cli_entry(PROG)
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    site = load_site_config()
    image = site.container.image
    if image is not None and not os.environ.get(_IN_CONTAINER):
        runtime, inner = container_exec(image, (PROG, *argv), (*site.mount_dirs, *args.mount_dirs),
                                        os.getcwd(), site.container.runtime)
        print(f"{PROG}: running in the {runtime.name} container {image}", file=sys.stderr, flush=True)
        return subprocess.run(inner, env={**os.environ, _IN_CONTAINER: "1"}).returncode
    if image is None and args.mount_dirs:
        print(f"{PROG}: --mount-dirs unused: no container.image in "
              f"{site.path or 'csrun.yaml (none found)'}", file=sys.stderr, flush=True)
    from launcher.input_measurement import compile_script, measure_costs, measure_stream  # TensorFlow: after the flags

    compiled = compile_script(args.command)
    print(file=sys.stdout)
    model = JobModel(measure_costs(compiled, args.batches), measure_stream(compiled, args.batches),
                     compiled.samples_per_sec, args.available_nodes, args.cpus_per_node)
    sys.stdout.write(render(compiled, model, recommend(model), args.batches, args.command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
