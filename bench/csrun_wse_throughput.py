"""csrun_wse end to end vs python run.py: start-up and steady state, 1/2/4 input workers.

`csrun_wse` (a chief, 1/2/4 input workers and the embedded simulator) against `python run.py`
on the CPU path, FC-MNIST (784-500-300-10, batch 256), same params and batches: start-up of a
short run, steady-state samples/s, the ratios; and the rate one input worker streams at
against the rate the simulator consumes.

Start-up: the wall time of a 20-step run, command to exit (imports, compile, simulator, the
20 steps, the final checkpoint, exit); its overhead is csrun_wse's time minus the CPU path's.
Steady state per path: a long run's log lines after the first (`global step N: … (R
steps/sec)`, the same log on both paths; for csrun_wse the chief's, which gets a step's result
as the CS finishes it): the steps between them over the time the process's own clock gave
them, so neither start-up nor the end weighs in. Runs interleaved in rounds (the machine is
shared); each ratio and overhead is the median over the rounds of that round's (its paths
ran side by side), with the load average before and after. The worker's
rate is `input_fn` → its shard → checked, serialized FeedRequests, as `workers.feed` makes
them (no CS needed); the simulator's consumption is its own wall clock rate from the long
runs' summary lines.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import yaml  # noqa: E402

from bench.table import Row, print_table  # noqa: E402

EXAMPLE = ROOT / "examples" / "fc_mnist"
BATCH = 256
SHORT = 20
LONG = int(os.environ.get("BENCH_LONG_STEPS", 820))
WORKERS = tuple(int(w) for w in os.environ.get("BENCH_WORKERS", "1,2,4").split(","))
REPEATS = int(os.environ.get("BENCH_ROUNDS", 5))  # rounds: BENCH_ROUNDS=5 BENCH_WORKERS=1,2 ...
LOG_EVERY = 100
WORKER_BATCHES = 200
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
       "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(ROOT)}
SIM_RATE = re.compile(r"wall clock here: ([\d,]+) samples/second")
STEP_LINE = re.compile(r"^global step (\d+): loss = \S+ \(([\d.e+]+) steps/sec\)$", re.M)


def steady_rate(output: str) -> float:
    """Samples/s over the log lines after the first (its interval holds the start-up)."""
    lines = [(int(step), float(rate)) for step, rate in STEP_LINE.findall(output)]
    if len(lines) < 3:
        raise RuntimeError(f"too few step lines to measure a steady state:\n{output}")
    steps = [step - previous for (step, _), (previous, _) in zip(lines[1:], lines)]
    seconds = sum(count / rate for count, (_, rate) in zip(steps, lines[1:]))
    return sum(steps) * BATCH / seconds


def write_params(folder: Path, steps: int) -> Path:
    params = yaml.safe_load((EXAMPLE / "configs" / "params.yaml").read_text())
    params["train_input"]["batch_size"] = BATCH
    params["runconfig"].update(max_steps=steps, save_checkpoints_steps=None, save_summary_steps=LOG_EVERY,
                               log_step_count_steps=LOG_EVERY)
    path = folder / f"params-{steps}.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def timed(command: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    result = subprocess.run(command, cwd=EXAMPLE, env=ENV, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"{command} failed:\n{result.stdout}\n{result.stderr}")
    return seconds, result.stdout


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def _role(pid: int) -> str:
    """simulator, chief, worker (a task's stdout is its rank's log), or launcher (the rest)."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
        log = os.readlink(f"/proc/{pid}/fd/1")
    except OSError:
        return "launcher"
    if b"wse_sim.cli" in command:
        return "simulator"
    rank = re.search(r"_(\d+)_log\.out$", log) if command.startswith(b"python\0run.py") else None
    return "launcher" if rank is None else "chief" if rank.group(1) == "0" else "worker"


def _cpu_by_role(root: int, roles: dict[int, str]) -> dict[str, float]:
    """CPU seconds of `root`'s processes by role (`roles`: each pid's, kept from its first look)."""
    ticks = os.sysconf("SC_CLK_TCK")
    by_role: dict[str, float] = {}
    for pid in _descendants(root):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        role = roles.setdefault(pid, _role(pid))
        by_role[role] = by_role.get(role, 0.0) + (int(fields[11]) + int(fields[12])) / ticks
    return by_role


def steady_cpu(command: list[str]) -> tuple[str, dict[str, float]]:
    """Run `command`; its output, and the CPU milliseconds per step each role spent between
    its second and its last step line (the window `steady_rate` measures)."""
    first, last = f"global step {2 * LOG_EVERY}:", f"global step {LONG // LOG_EVERY * LOG_EVERY}:"
    process = subprocess.Popen(command, cwd=EXAMPLE, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    lines, marks, roles = [], [], {}
    assert process.stdout is not None
    for line in process.stdout:
        lines.append(line)
        if line.startswith((first, last)):
            marks.append(_cpu_by_role(process.pid, roles))
    error = process.stderr.read() if process.stderr else ""
    if process.wait() != 0 or len(marks) != 2:
        raise RuntimeError(f"{command} failed:\n{''.join(lines)}\n{error}")
    steps = LONG // LOG_EVERY * LOG_EVERY - 2 * LOG_EVERY
    return "".join(lines), {role: 1000 * (spent - marks[0].get(role, 0.0)) / steps
                            for role, spent in marks[1].items()}


def path_commands(folder: Path, steps: int, run: int) -> dict[str, list[str]]:
    """"cpu" and "csrun_wse W" (W input workers: W + 1 tasks) for a run of `steps` steps."""
    params = write_params(folder, steps)
    train = ["python", "run.py", "--mode", "train", "-p", str(params)]
    commands = {"cpu": [*train, "-o", str(folder / f"cpu-{steps}-{run}")]}
    for workers in WORKERS:
        name = f"{steps}-{run}-{workers}"
        commands[f"csrun_wse {workers}"] = ["csrun_wse", "--tasks-per-node", str(workers + 1), "--job-dir",
                                            str(folder / f"job-{name}"), "--", *train, "-o",
                                            str(folder / f"cs-{name}")]
    return commands


def worker_rate() -> tuple[float, float]:
    """One input worker's samples/s and MB/s: input_fn, its shard, checked and serialized."""
    from cs_api.input_spec import InputSpec
    from cs_api.tensors import tensor_bytes
    from examples.fc_mnist.data import train_input_fn
    from workers.feed import feed_requests, shard_batches
    from workers.rendezvous import Rendezvous

    params = yaml.safe_load((EXAMPLE / "configs" / "params.yaml").read_text())
    params["train_input"]["batch_size"] = BATCH
    inputs = (InputSpec("features", "float32", (784,)), InputSpec("labels", "int32", ()))
    rendezvous = Rendezvous("unused", "bench", "token", 1, 0, WORKER_BATCHES, inputs, BATCH)
    batches = shard_batches(train_input_fn, params, rendezvous, 0)
    next(batches)  # the dataset's start-up is not streaming
    start, size = time.perf_counter(), 0
    for request in feed_requests(batches, rendezvous, 0):
        size += sum(tensor_bytes(t) for t in request.tensors)
    seconds = time.perf_counter() - start
    count = WORKER_BATCHES - 1
    return count * BATCH / seconds, size / 1e6 / seconds


def measure() -> list[Row]:
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench_csrun_wse_") as tmp:
        folder = Path(tmp)
        start_up: dict[str, list[float]] = {}
        rates: dict[str, list[float]] = {}
        cpu: dict[str, dict[str, float]] = {}  # CPU ms per step by role, of the best run
        sim_rates = []
        for run in range(REPEATS):  # interleaved rounds (the machine is shared)
            for steps in (SHORT, LONG):
                for path, command in path_commands(folder, steps, run).items():
                    if steps == SHORT:
                        seconds, _ = timed(command)
                        start_up.setdefault(path, []).append(seconds)
                        continue
                    output, spent = steady_cpu(command)
                    if steady_rate(output) > max(rates.get(path, [0.0])):
                        cpu[path] = spent
                    rates.setdefault(path, []).append(steady_rate(output))
                    if path != "cpu":
                        sim_rates += [float(m.replace(",", "")) for m in SIM_RATE.findall(output)]
    load_after = os.getloadavg()

    def median(values) -> float:
        return float(np.median(list(values)))

    rows: list[Row] = [
        ("python run.py (CPU, TensorFlow): start-up", median(start_up["cpu"]), "s",
         f"a {SHORT}-step run, command to exit; median of {REPEATS}"),
        ("python run.py: steady state", median(rates["cpu"]), "samples/s",
         f"steps {2 * LOG_EVERY}-{LONG // LOG_EVERY * LOG_EVERY} of a {LONG}-step run"),
        ("  CPU per step", sum(cpu["cpu"].values()), "ms", "all its threads, same steps"),
    ]
    for workers in WORKERS:
        path = f"csrun_wse {workers}"
        tasks = f"chief + {workers} worker{'s' if workers > 1 else ''} + sim"
        rows += [
            (f"csrun_wse ({tasks}): start-up", median(start_up[path]), "s",
             f"a {SHORT}-step run, command to exit"),
            (f"  start-up overhead, {workers} worker(s)",
             median(a - b for a, b in zip(start_up[path], start_up["cpu"])), "s",
             "minus python run.py's in the same round; aim: <= 2"),
            (f"  steady state, {workers} worker(s)", median(rates[path]), "samples/s", "same method"),
            (f"  csrun_wse / CPU path, {workers} worker(s)",
             median(a / b for a, b in zip(rates[path], rates["cpu"])), "ratio",
             "median of the rounds' ratios; aim: >= 1"),
            *((f"  CPU per step: {role}", cpu[path].get(role, 0.0), "ms",
               "all workers" if role == "worker" else "the rest: csrun_wse, submitit, fork server" if
               role == "launcher" else "same steps") for role in ("simulator", "chief", "worker", "launcher")),
        ]
    rows.append(("load average (1/5/15 min)", load_before[0], "before",
                 f"before {'/'.join(f'{x:.1f}' for x in load_before)}, "
                 f"after {'/'.join(f'{x:.1f}' for x in load_after)}"))
    worker_samples, worker_mb = worker_rate()
    sim = max(sim_rates) if sim_rates else float("nan")
    return rows + [
        ("one input worker streams", worker_samples, "samples/s", "input_fn + shard + check + serialize"),
        ("one input worker streams", worker_mb, "MB/s", ""),
        ("simulator consumes (its wall clock)", sim, "samples/s", "the long runs' summary lines, best"),
        ("one worker / simulator", worker_samples / sim, "ratio", "> 1: workers are not the bottleneck"),
    ]


def main() -> None:
    print_table(measure(), "csrun_wse end to end vs python run.py (FC-MNIST, batch 256)")


if __name__ == "__main__":
    main()
