"""The local backend's fork server: a forked task is `python SCRIPT.py …` in every way a
script can see, signals reach it, and nothing outlives the job."""
from __future__ import annotations

import ast
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm.fork_server import ForkServer, request_fork

# What a script can see of how it was started, one line each (the pid and session aside).
PROBE = """\
import os, sys
print("argv", sys.argv)
print("cwd", os.getcwd())
print("path0", sys.path[0])
print("file", __file__, __name__)
print("env", os.environ.get("PROBE_VALUE"), "SUBMITIT_LOCAL_GLOBALID" in os.environ)
print("own session", os.getsid(0) == os.getpid())
print("stdin", sys.stdin.read())
import atexit, threading, time
atexit.register(print, "atexit ran")
threading.Thread(target=lambda: (time.sleep(0.3), print("thread joined"))).start()
left_open = open("left_open.txt", "w")
left_open.write("flushed at exit")
mode = sys.argv[1]
if mode == "exit":
    sys.exit(3)
if mode == "message":
    sys.exit("probe: error: bad")
if mode == "raise":
    raise ValueError("probe failed")
if mode == "interrupt":
    raise KeyboardInterrupt
if mode == "wait":
    print("waiting", flush=True)
    import time
    time.sleep(60)
"""


@pytest.fixture
def probe(tmp_path):
    folder = tmp_path / "scripts"
    folder.mkdir()
    (folder / "probe.py").write_text(PROBE)
    (tmp_path / "work").mkdir()
    return tmp_path


def server_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", "PROBE_VALUE": "42", **(extra or {})}


def start(tmp_path: Path, tasks: int, preload=("json",)) -> ForkServer:
    return ForkServer(sys.executable, [sys.executable, "../scripts/probe.py"], str(tmp_path / "work"),
                      server_env(), tasks, preload,
                      log=tmp_path / "server.log")


def outputs(tmp_path: Path, name: str):
    return (open(tmp_path / f"{name}.in", "w+b"), open(tmp_path / f"{name}.out", "w+b"))


def forked(server: ForkServer, tmp_path: Path, mode: str, name: str, env=None, script="../scripts/probe.py"):
    """Run the probe (or `script`) through the server with its own stdin/stdout/stderr files."""
    stdin, out = outputs(tmp_path, name)
    stdin.write(b"from stdin")
    stdin.seek(0)
    saved = [os.dup(fd) for fd in (0, 1, 2)]
    try:
        for fd, f in zip((0, 1, 2), (stdin, out, out)):
            os.dup2(f.fileno(), fd)
        task = request_fork(server.address, [sys.executable, script, mode],
                            str(tmp_path / "work"), env or {**server_env(), "SUBMITIT_LOCAL_GLOBALID": "1"})
    finally:
        for fd, copy in zip((0, 1, 2), saved):
            os.dup2(copy, fd)
            os.close(copy)
    return task, tmp_path / f"{name}.out"


def plain(tmp_path: Path, mode: str) -> tuple[int, str]:
    (tmp_path / "work" / "left_open.txt").unlink()
    done = subprocess.run([sys.executable, "../scripts/probe.py", mode], cwd=tmp_path / "work",
                          input="from stdin", stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**server_env(), "SUBMITIT_LOCAL_GLOBALID": "1"})
    return done.returncode, done.stdout


def last_lines(text: str) -> list[str]:
    """The output a user reads: the probe's lines and the last line of a traceback."""
    lines = text.strip().splitlines()
    return [ln for ln in lines if not ln.startswith((" ", "Traceback", "own session"))][:-1] + lines[-1:]


@pytest.mark.parametrize("mode", ["ok", "exit", "message", "raise", "interrupt"])
def test_a_forked_task_is_the_script_run_by_python(probe, mode):
    server = start(probe, 1, preload=("json", "no_such_module"))  # one it cannot import: left to the script
    try:
        task, out = forked(server, probe, mode, mode)
        assert task is not None, (probe / "server.log").read_text()
        code = task.wait()
    finally:
        server.stop()
    text = out.read_text()
    plain_code, plain_text = plain(probe, mode)
    assert code == plain_code == {"ok": 0, "exit": 3, "message": 1, "raise": 1, "interrupt": -2}[mode]
    assert last_lines(text) == last_lines(plain_text)
    assert "own session True" in text
    assert f"path0 {probe / 'scripts'}" in text and "env 42 True" in text
    assert "thread joined" in text and "atexit ran" in text
    assert (probe / "work" / "left_open.txt").read_text() == "flushed at exit"


@pytest.mark.parametrize("script", ["missing.py", "broken.py"])
def test_a_script_python_cannot_open_or_compile_ends_as_python_says_it(probe, script):
    (probe / "work" / "broken.py").write_text("import os\nx = (\n")
    server = start(probe, 1)
    try:
        task, out = forked(server, probe, "ok", script, script=script)
        assert task is not None, (probe / "server.log").read_text()
        code = task.wait()
    finally:
        server.stop()
    done = subprocess.run([sys.executable, script, "ok"], cwd=probe / "work", capture_output=True, text=True)
    assert (code, out.read_text()) == (done.returncode, done.stderr)
    assert code == {"missing.py": 2, "broken.py": 1}[script]
    assert "fork_server" not in done.stderr and "Traceback" not in done.stderr


def test_signals_reach_the_task_and_a_dropped_task_loses_its_child(probe):
    server = start(probe, 2)
    try:
        task, out = forked(server, probe, "wait", "signalled")
        assert task is not None
        while "waiting" not in out.read_text():
            time.sleep(0.05)
        shown = Path(f"/proc/{task.pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        assert shown == [os.fsencode(sys.executable), b"../scripts/probe.py", b"wait"]  # what ps shows
        os.killpg(task.pid, signal.SIGTERM)
        assert task.wait() == -signal.SIGTERM
        dropped, out = forked(server, probe, "wait", "dropped")
        while "waiting" not in out.read_text():
            time.sleep(0.05)
        dropped._sock.close()  # the task died: the server kills what it forked for it
        deadline = time.monotonic() + 10
        while pid_alive(dropped.pid):
            assert time.monotonic() < deadline, "the dropped task's child still runs"
            time.sleep(0.05)
        server._process.wait(10)  # both tasks served and gone: the server ends by itself
    finally:
        server.stop()


def test_another_interpreter_or_environment_is_refused(probe, tmp_path):
    server = start(probe, 3)
    try:
        other_env, _ = forked(server, probe, "ok", "other_env", env={**server_env(), "PROBE_VALUE": "7"})
        assert other_env is None
        stdin, out = outputs(probe, "other_python")
        other_python = request_fork(server.address, ["/usr/bin/python3", "../scripts/probe.py", "ok"],
                                    str(probe / "work"), server_env())
        assert other_python is None
        not_a_script = request_fork(server.address, [sys.executable, "-c", "print(1)"], str(probe / "work"),
                                    server_env())
        assert not_a_script is None
        server._process.wait(10)
    finally:
        server.stop()
    assert request_fork(server.address, [sys.executable, "x.py"], str(probe), server_env()) is None  # gone


def test_a_killed_launcher_leaves_no_server_and_no_file(tmp_path):
    """SIGKILL of the process that started the server: the server ends, and nothing is left
    in the temporary folder (the socket is abstract) nor listening at its address."""
    (tmp_path / "work").mkdir()
    (tmp_path / "tmp").mkdir()
    parent = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from slurm.fork_server import ForkServer; "
         f"s = ForkServer(sys.executable, ['python', 'x.py'], {str(tmp_path)!r}, {{}}, 1, ()); "
         "print(s._process.pid, repr(s.address), flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
        env={**os.environ, "TMPDIR": str(tmp_path / "tmp"),
             "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    pid, address = parent.stdout.readline().split(" ", 1)
    server_pid, address = int(pid), ast.literal_eval(address)
    assert address.startswith("\0csrun-fork-")
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while pid_alive(server_pid):
        assert time.monotonic() < deadline, "the fork server outlived its parent"
        time.sleep(0.05)
    assert os.listdir(tmp_path / "tmp") == []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock, pytest.raises(ConnectionRefusedError):
        sock.connect(address)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to act as another user")
def test_another_user_is_refused_before_anything_is_read(probe):
    server = start(probe, 1)
    try:
        child = os.fork()
        if child == 0:  # another user asks for the job's one task
            os.setuid(65534)
            refused = request_fork(server.address, [sys.executable, "../scripts/probe.py", "ok"],
                                   str(probe / "work"), server_env())
            os._exit(0 if refused is None else 1)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "another user's request was served"
        task, _ = forked(server, probe, "ok", "owner")  # the task slot is still the job's
        assert task is not None and task.wait() == 0
    finally:
        server.stop()


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
