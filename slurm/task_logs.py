"""A task's log, written by the task and read by the launcher: the line saying where the task
runs, the part of the chief's log the terminal shows, and the reason a task failed."""
from __future__ import annotations

import os
import re
import signal
import socket
from pathlib import Path
from typing import Mapping, TextIO

from common import task_env
from common.tf_startup import CHATTER
from slurm.submitit_api import ERROR_MARKER, LOCAL_NTASKS_ENV, LOCAL_RANK_ENV, LOG_PREFIX

# Every task's first line: where it runs. `where_task_runs` writes it, `task_hosts` reads it
# back (a failed node's tasks; the tests' placement checks).
_WHERE = re.compile(r"^csrun: task (\d+) of \d+ on (\S+) \((\S+) to the CS system at (\S+)\)$", re.M)

# The line after it, once the command started: its pid (`task_pid` reads it back).
_PID = re.compile(r"^csrun: task (\d+) runs as pid (\d+)$", re.M)

# A task's own one-line error (`run.py: error: …`): the launcher's line naming the failed task
# carries it (`last_error_line`), so the terminal shows it once.
_OWN_ERROR = re.compile(r"^\S+: error: ")


def where_task_runs(env: Mapping[str, str]) -> str:
    """`csrun: task R of N on NODE (ADDRESS to the CS system at CS_IP)`: the task's rank, its
    host (Slurm's node name, else the host name) and the address it reaches the CS from."""
    rank = env.get("SLURM_PROCID") or env.get(LOCAL_RANK_ENV) or "0"
    ntasks = env.get("SLURM_NTASKS") or env.get(LOCAL_NTASKS_ENV) or "1"
    node = env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    cs_ip = env.get(task_env.CS_IP) or "none"
    address = "-"
    host, _, port = cs_ip.rpartition(":")
    if host and port.isdigit():
        try:  # the source address the kernel picks for the CS: nothing is sent
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect((host, int(port)))
                address = probe.getsockname()[0]
        except OSError:
            address = "no-route"
    return f"csrun: task {rank} of {ntasks} on {node} ({address} to the CS system at {cs_ip})"


def task_hosts(log: Path) -> tuple[str, str] | None:
    """(node, address) from a task's log (its `where_task_runs` line), None before it ran."""
    try:
        with open(log, errors="replace") as f:
            head = f.read(4096)
    except OSError:
        return None
    match = _WHERE.search(head)
    return (match.group(2), match.group(3)) if match else None


def command_started(rank: str, pid: int) -> str:
    """`csrun: task R runs as pid P`: the task's command started (its process group's pid)."""
    return f"csrun: task {rank} runs as pid {pid}"


def task_pid(log: Path) -> int | None:
    """The pid of a task's command (its `command_started` line), None before it started."""
    try:
        with open(log, errors="replace") as f:
            head = f.read(8192)
    except OSError:
        return None
    match = _PID.search(head)
    return int(match.group(2)) if match else None


class LogCopy:
    """The terminal copy of a task's log as it grows: each `copy_new` writes the whole lines
    appended since the last call, submitit's own bookkeeping lines (and the traceback of its
    task wrapper that follows them), the task's placement line (`where_task_runs`), its own
    `error:` line and TensorFlow's start-up chatter left out (and its pid line). A line still being written, and
    whether a submitit line came before, carry over to the next call."""

    def __init__(self, path: Path, stream: TextIO):
        self.path = path
        self.stream = stream
        self.offset = 0
        self._partial = ""
        self._after = ""  # "submitit": after submitit's lines; "traceback": inside its traceback

    def copy_new(self, final: bool = False) -> None:
        """Copy what was appended since the last call; `final`: the log is complete, so a last
        line without its newline is copied too."""
        try:
            with open(self.path, "rb") as f:
                if os.fstat(f.fileno()).st_size < self.offset:  # rewritten (a requeued job's new run)
                    self.offset, self._partial = 0, ""
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return
        self.offset += len(data)
        text = self._partial + data.decode(errors="replace")
        lines = text.splitlines(keepends=True)
        self._partial = "" if final or not lines or lines[-1].endswith("\n") else lines.pop()
        for line in lines:
            self._copy(line)
        self.stream.flush()

    def _copy(self, line: str) -> None:
        if line.startswith(LOG_PREFIX):
            self._after = "submitit"
        elif self._after and line.startswith(("Traceback (most recent call last):", " ")):
            self._after = "traceback"
        elif self._after == "traceback":  # the exception line that ends it
            self._after = ""
        else:
            self._after = ""
            if not CHATTER.match(line) and not _WHERE.match(line) and not _PID.match(line) \
                    and not _OWN_ERROR.match(line):
                self.stream.write(line)


def last_error_line(log: Path, exit_code: int = 1) -> str:
    """The reason a task failed, from its own output in its log (submitit's lines and its
    wrapper's traceback left out): the signal that killed it, else its last `error:` line,
    else its last traceback's exception line (type and message), else its exit code."""
    if exit_code > 128:
        try:
            return f"killed by {signal.Signals(exit_code - 128).name} (exit code {exit_code})"
        except ValueError:
            pass
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return f"exit code {exit_code}; no log"
    own = text.split(ERROR_MARKER, 1)[0].splitlines()  # then submitit's own traceback
    lines = [ln.rstrip() for ln in own if ln.strip() and not ln.startswith(LOG_PREFIX)]
    for line in reversed(lines):
        if ": error: " in line:
            return line.strip()
    if any(ln.startswith("Traceback (most recent call last):") for ln in lines):
        for line in reversed(lines):
            if not line.startswith((" ", "\t", "Traceback", "During handling", "The above exception")):
                return line
    return f"exit code {exit_code}"
