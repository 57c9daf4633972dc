"""`make test`'s lanes share a queue of test files (tests/lane_queue.py): each file runs once,
whole, in one lane; a failure fails the lane that ran it."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

FILE = """import pytest
RUNS = []

@pytest.fixture(scope="module")
def once():
    RUNS.append(1)
    return len(RUNS)

@pytest.mark.parametrize("n", range(3))
def test_{name}(once, n):
    print("ran {name}", n, "fixture set up", once, "time(s)")
    assert {ok}
"""


def lanes(tmp_path: Path, failing: str) -> list[subprocess.CompletedProcess]:
    """Two lanes started at once on the same queue over four files (`failing` fails)."""
    (tmp_path / "tests").mkdir()
    for name in "abcd":
        (tmp_path / "tests" / f"test_{name}.py").write_text(FILE.format(name=name, ok=name != failing))
    argv = [sys.executable, "-m", "pytest", "-q", "-s", "-p", "lane_queue", "--lane-queue",
            str(tmp_path / "queue"), "-p", "no:cacheprovider", "tests"]
    procs = [subprocess.Popen(argv, cwd=tmp_path, env={"PYTHONPATH": str(TESTS)}, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for _ in range(2)]
    return [subprocess.CompletedProcess(argv, p.wait(timeout=120), p.communicate()[0], "")
            for p in procs]


def ran(run: subprocess.CompletedProcess) -> list[tuple[str, str, str]]:
    """(file, test, how many times its module fixture was set up) per test the lane ran."""
    return re.findall(r"ran (\w) (\d) fixture set up (\d+) time", run.stdout)


def test_each_file_runs_once_whole_in_one_lane_and_a_failure_fails_that_lane(tmp_path):
    runs = lanes(tmp_path, failing="c")
    files = [{f for f, _, _ in ran(r)} for r in runs]
    assert files[0] | files[1] == set("abcd") and not files[0] & files[1], [r.stdout for r in runs]
    assert sorted(t for r in runs for t in ran(r)) == [(f, n, "1") for f in "abcd" for n in "012"]
    assert [r.returncode for r in runs] == [1 if "c" in f else 0 for f in files]
