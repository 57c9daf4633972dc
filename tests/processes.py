"""Real processes in tests: start one with the test environment, read its stdout up to a
line, run several at once, and find the processes a job left behind; and a `python run.py`
run in this process where the run is a reference, not what the test is about."""
from __future__ import annotations

import contextlib
import io
import os
import re
import runpy
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from tests.fc_mnist_runs import ENV

T = TypeVar("T")


def start(argv: list[str], cwd: Path, **popen) -> subprocess.Popen:
    """`python argv…` in `cwd` with the tests' environment, its stdout and stderr piped."""
    return subprocess.Popen([sys.executable, *argv], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **{"env": ENV, **popen})


def run_py_in_process(script: Path, argv: list[str], cwd: Path) -> str:
    """`python SCRIPT ARGV…` in `cwd`, run in this process (no interpreter or TensorFlow
    start-up): its standard output. Its exit must be a success."""
    out = io.StringIO()
    saved = sys.argv
    sys.argv = [str(script), *map(str, argv)]
    try:
        with contextlib.chdir(cwd), contextlib.redirect_stdout(out):
            runpy.run_path(str(script), run_name="__main__")
    except SystemExit as ended:
        assert ended.code in (None, 0), out.getvalue()
    finally:
        sys.argv = saved
    return out.getvalue()


def together(*calls: Callable[[], T]) -> list[T]:
    """Each call at once, in a thread of its own (independent runs, e.g. the CPU path's beside
    the CS's, share the machine's cores); their results in order, or the first call's error."""
    with ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(call) for call in calls]
        return [future.result() for future in futures]


def wait_for_line(process: subprocess.Popen, pattern: str, timeout: float = 240) -> list[str]:
    """stdout lines up to the first matching `pattern` (the process must still run)."""
    seen, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            raise AssertionError(f"ended before {pattern!r}: {process.stderr.read()[-2000:]}")
        seen.append(line)
        if re.search(pattern, line):
            return seen
    raise AssertionError(f"no {pattern!r} within {timeout} s")


def processes_mentioning(text: str) -> list[int]:
    """Pids whose command line or environment mentions `text` (e.g. a job folder)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            blob = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
        except OSError:
            continue
        if text.encode() in blob:
            found.append(int(entry.name))
    return found


def left_running(text: str, within_s: float, poll_s: float = 0.5) -> list[int]:
    """The processes mentioning `text` still there after up to `within_s` seconds (none: at once)."""
    deadline = time.monotonic() + within_s
    while (found := processes_mentioning(text)) and time.monotonic() < deadline:
        time.sleep(poll_s)
    return found
