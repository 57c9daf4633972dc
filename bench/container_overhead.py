"""The Charliecloud image's costs: its build from containers/csrun.def (cold, and cached by
its stamp), a task's start in the container against on the host, and FC-MNIST's end-to-end
csrun_wse samples/s (chief + 2 input workers) with every task in the container against on
the host.

The cold build goes to a scratch directory (the `make image` one is left as it is). Start
overhead: the median of a few `python -c 'import tensorflow'` runs each way. Throughput:
steady state, the difference of a long and a short run, as bench/csrun_wse_throughput.py.
"""
from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from bench.csrun_wse_throughput import BATCH, ENV, EXAMPLE, write_params  # noqa: E402
from bench.table import Row, print_table  # noqa: E402
from containers.image import DEFAULT_IMAGE, build_image  # noqa: E402
from containers.runtime import find_runtime  # noqa: E402

SHORT, LONG = 20, 220
STARTS = 3
TASK = ["python", "-c", "import tensorflow"]


def timed(command: list[str], env: dict[str, str], cwd: Path = EXAMPLE) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{command} failed:\n{done.stdout}\n{done.stderr}")
    return seconds


def build_seconds(folder: Path) -> tuple[float, float]:
    image = folder / "image"
    start = time.perf_counter()
    build_image(image)
    cold = time.perf_counter() - start
    start = time.perf_counter()
    assert not build_image(image)
    return cold, time.perf_counter() - start


def measure() -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="csrun-bench-") as tmp:
        folder = Path(tmp)
        cold, cached = build_seconds(folder)
        build_image(DEFAULT_IMAGE)
        config = folder / "csrun.yaml"
        config.write_text(yaml.safe_dump({"container": {"image": str(DEFAULT_IMAGE), "runtime": "charliecloud"},
                                          "mount_dirs": [str(folder)]}))
        inside_env = {**ENV, "CSRUN_CONFIG": str(config)}
        runtime = find_runtime("charliecloud")
        inside_task = runtime.exec_command(str(DEFAULT_IMAGE), TASK, [], str(EXAMPLE))
        host_start = statistics.median(timed(TASK, ENV) for _ in range(STARTS))
        inside_start = statistics.median(timed(inside_task, ENV) for _ in range(STARTS))
        rates = {}
        for where, env in (("host", ENV), ("container", inside_env)):
            seconds = {}
            for steps in (SHORT, LONG):
                params = write_params(folder, steps)
                seconds[steps] = timed(["csrun_wse", "--tasks-per-node", "3", "--job-dir",
                                        str(folder / f"job-{where}-{steps}"), "--", "python", "run.py",
                                        "--mode", "train", "-p", str(params), "-o",
                                        str(folder / f"model-{where}-{steps}")], env)
            rates[where] = (LONG - SHORT) * BATCH / (seconds[LONG] - seconds[SHORT])
    return [
        ("image build, cold (mmdebstrap + %files + %post)", cold, "s", "a scratch image; pip reads the host's registries"),
        ("image build, cached (stamp matches)", cached, "s", "recipe, pins and sources unchanged"),
        ("task start on the host", host_start, "s", f"median of {STARTS}: {' '.join(TASK)}"),
        ("task start in the container", inside_start, "s", "ch-run, same command"),
        ("start overhead container - host", inside_start - host_start, "s", ""),
        ("FC-MNIST csrun_wse on the host", rates["host"], "samples/s", f"batch {BATCH}, steady state"),
        ("FC-MNIST csrun_wse in the container", rates["container"], "samples/s", "every task in ch-run"),
        ("container / host throughput", rates["container"] / rates["host"], "ratio", "aim: >= 0.95"),
    ]


def main() -> None:
    print_table(measure())


if __name__ == "__main__":
    main()
