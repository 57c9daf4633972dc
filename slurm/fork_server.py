"""Local tasks forked from one Python that imported TensorFlow once.

Every task of a local job runs the same `python SCRIPT.py …`, and each used to spend most of
its start-up importing TensorFlow (about 6 CPU-seconds here): three tasks on a two-core host
queue behind one another's imports. The local backend starts one fork server per job, as
early as it can: the job's interpreter, in the job's environment, imports the preload modules
(`tensorflow`, `grpc`), then serves requests on an abstract Unix socket (Linux: a name, no
file, gone with the last process holding it, so a SIGKILLed launcher leaves nothing behind),
answering processes of this user only (the peer's credentials, checked before anything is
read). A task
(`slurm.local_backend.TaskCommand`) sends its argv, working directory and environment with its
stdin/stdout/stderr; the server forks a child that becomes `python SCRIPT.py …`: its own
session, the task's descriptors, environment, working directory, `sys.argv` and `sys.path[0]`,
Python's default signal handlers, the script run as `__main__`, uncaught exceptions and
`SystemExit` handled, threads joined, atexit handlers run and files flushed as for any script
(the module teardown skipped, see `exit_as_python_does`). The server sends the
child's pid, then its wait status; a task whose connection drops has its child killed.

The server serves the job's tasks and then ends, once their children have ended; it dies with
the launcher that started it (Linux's parent-death signal). A request is refused, and the task runs
as a plain process, when its interpreter or its environment (but for the per-task variables of
the launcher) differs from the server's, or the server is not there. Children share the
server's hash seed (PYTHONHASHSEED); the `random` module reseeds itself in every child.

This file uses the standard library only: it runs as a script under the job's interpreter.
"""
from __future__ import annotations

import atexit
import gc
import importlib
import importlib.machinery
import io
import json
import os
import secrets
import select
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, NoReturn, Sequence

# What every task imports: TensorFlow, gRPC and csrun's user API (CSEstimator; the compiler,
# chief and input worker behind it). A module the job's interpreter cannot import is left to
# the script.
PRELOAD = ("tensorflow", "grpc", "launcher.estimator")
# Per-task variables (the launcher's rank variables, the devices a task may use): they may
# differ from the server's environment, and nothing reads them at import.
TASK_VARIABLES = ("SUBMITIT_", "CUDA_VISIBLE_DEVICES")
_HEADER = struct.Struct("!I")
_PEER_CREDENTIALS = struct.Struct("3i")  # SO_PEERCRED: pid, uid, gid
_OPEN_FILES = (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom, io.BufferedRWPair)
_PR_SET_PDEATHSIG = 1


def script_of(command: Sequence[str]) -> str | None:
    """The script of a `python SCRIPT.py …` command (no interpreter flags), else None."""
    if len(command) >= 2 and Path(command[0]).name.startswith("python") and command[1].endswith(".py") \
            and not command[1].startswith("-"):
        return command[1]
    return None


def interpreter(command: Sequence[str], env: Mapping[str, str], cwd: str) -> str | None:
    """The interpreter `command[0]` names, as the task would find it (its PATH, its cwd)."""
    found = shutil.which(command[0], path=env.get("PATH", os.defpath)) if os.sep not in command[0] \
        else os.path.join(cwd, command[0])
    return os.path.abspath(found) if found else None


def _shared_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if not k.startswith(TASK_VARIABLES)}


# ---- messages: a length-prefixed JSON object, the first one carrying descriptors ----

def _send(sock: socket.socket, message: dict, fds: Sequence[int] = ()) -> None:
    data = json.dumps(message).encode()
    payload = _HEADER.pack(len(data)) + data
    if fds:
        socket.send_fds(sock, [payload], list(fds))
    else:
        sock.sendall(payload)


def _recv_exact(sock: socket.socket, size: int, first: bytes = b"") -> bytes:
    data = first
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the other side closed the connection")
        data += chunk
    return data


def _recv(sock: socket.socket, max_fds: int = 0) -> tuple[dict, list[int]]:
    fds: list[int] = []
    first = b""
    if max_fds:
        first, fds, _, _ = socket.recv_fds(sock, 65536, max_fds)
        if not first:
            raise ConnectionError("the other side closed the connection")
    head = _recv_exact(sock, _HEADER.size, first[:_HEADER.size])
    (size,) = _HEADER.unpack(head)
    body = _recv_exact(sock, size, first[_HEADER.size:])
    return json.loads(body), fds


# ---- the client side: what a task calls ----

@dataclass
class ForkedTask:
    """A task's child forked by the server: its pid (its process group too) and the
    connection that brings its wait status."""

    pid: int
    _sock: socket.socket

    def wait(self, timeout: float | None = None) -> int:
        """The child's exit code as `subprocess.Popen.returncode` gives it (-N: signal N);
        subprocess.TimeoutExpired when it has not ended within `timeout` seconds."""
        if timeout is not None and not select.select([self._sock], [], [], timeout)[0]:
            raise subprocess.TimeoutExpired(str(self.pid), timeout)
        try:
            message, _ = _recv(self._sock)
            return os.waitstatus_to_exitcode(message["status"])
        except (OSError, ValueError, KeyError):
            return 1  # the server is gone: the status with it
        finally:
            self._sock.close()


def request_fork(address: str, command: Sequence[str], cwd: str, env: Mapping[str, str]) -> ForkedTask | None:
    """Ask the server at `address` to start `command`; None when it cannot (no server, another
    interpreter or environment): the caller then starts a plain process."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(address)
        python = interpreter(command, env, cwd)
        _send(sock, {"argv": list(command), "python": python, "cwd": cwd, "env": dict(env)},
              (0, 1, 2))
        reply, _ = _recv(sock)
    except (OSError, ValueError):
        sock.close()
        return None
    if "pid" not in reply:
        sock.close()
        return None
    return ForkedTask(int(reply["pid"]), sock)


# ---- the server ----

@dataclass(frozen=True)
class Child:
    """What a forked child runs: the request, to become `python SCRIPT.py …`."""

    argv: list[str]
    cwd: str
    env: dict[str, str]
    fds: list[int]
    conn: socket.socket


class _Server:
    def __init__(self, listener: socket.socket, tasks: int):
        self.listener = listener
        self.tasks = tasks
        self.served = 0
        self.children: dict[int, socket.socket] = {}
        self.python = os.path.abspath(sys.executable)
        self.env = _shared_env(os.environ)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        signal.set_wakeup_fd(self._wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.listener, selectors.EVENT_READ, "accept")
        self._selector.register(self._wake_r, selectors.EVENT_READ, "reap")

    def _refusal(self, request: dict, fds: list[int]) -> str | None:
        if len(fds) != 3:
            return "no stdin, stdout and stderr"
        if script_of(request["argv"]) is None:
            return "not a `python SCRIPT.py` command"
        if request["python"] != self.python:
            return f"another interpreter ({request['python']})"
        if _shared_env(request["env"]) != self.env:
            return "another environment"
        return None

    def _accept(self) -> Child | None:
        conn, _ = self.listener.accept()
        if not _same_user(conn):  # an abstract socket has no file permissions: anyone may connect
            conn.close()
            return None
        try:
            request, fds = _recv(conn, max_fds=3)
        except (OSError, ValueError):
            conn.close()
            return None
        self.served += 1
        if self.served >= self.tasks:
            self._selector.unregister(self.listener)
        why = self._refusal(request, fds)
        if why is not None:
            for fd in fds:
                os.close(fd)
            _send(conn, {"refused": why})
            conn.close()
            return None
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            return Child(request["argv"], request["cwd"], request["env"], fds, conn)
        for fd in fds:
            os.close(fd)
        self.children[pid] = conn
        self._selector.register(conn, selectors.EVENT_READ, pid)
        try:
            _send(conn, {"pid": pid})
        except OSError:
            _kill(pid)
        return None

    def _reap(self) -> None:
        os.read(self._wake_r, 512)
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is not None:
                self._selector.unregister(conn)
                try:
                    _send(conn, {"status": status})
                except OSError:
                    pass
                conn.close()

    def serve(self) -> Child | None:
        """Serve until every task was served and its child ended (None), or return in a
        forked child what it is to run."""
        while self.children or self.served < self.tasks:
            for key, _ in self._selector.select():
                if key.data == "accept":
                    child = self._accept()
                    if child is not None:
                        return child
                elif key.data == "reap":
                    self._reap()
                elif key.data in self.children:  # the task's connection closed: it is gone
                    self._selector.unregister(key.fileobj)
                    _kill(key.data)
        return None

    def close_in_child(self, child: "Child") -> None:
        """Drop, in a forked child, what belongs to the server."""
        signal.set_wakeup_fd(-1)
        self._selector.close()
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)
        self.listener.close()
        for conn in (*self.children.values(), child.conn):
            conn.close()


def _same_user(conn: socket.socket) -> bool:
    """Whether the peer of `conn` runs as this process's user."""
    _, uid, _ = _PEER_CREDENTIALS.unpack(
        conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEER_CREDENTIALS.size))
    return uid == os.getuid()


def _kill(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def show_command(argv: Sequence[str]) -> None:
    """Make `ps`, `pgrep -f` and /proc/self/cmdline show `argv`: written over this process's
    argument block (the server's command line ends with the job's command: room enough);
    left as it is if it does not fit."""
    import ctypes

    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48, 49 of proc(5))
    data = b"".join(os.fsencode(a) + b"\0" for a in argv)
    if len(data) <= end - start:
        ctypes.memmove(start, data + b"\0" * (end - start - len(data)), end - start)


def become(child: Child) -> str:
    """Turn this forked process into `python SCRIPT.py …` of the request; the script's path."""
    os.setsid()
    show_command(child.argv)
    for target, fd in enumerate(child.fds):
        os.dup2(fd, target)
        os.close(fd)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(child.cwd)
    os.environ.clear()
    os.environ.update(child.env)
    script = child.argv[1]
    sys.argv = child.argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.realpath(script)))
    return os.path.join(os.getcwd(), script)  # as Python makes `__file__` absolute: not normalized


def compile_script(path: str, interpreter: str) -> types.CodeType:
    """The script's code; a script Python cannot open or compile ends the process as
    `python SCRIPT.py` does: its one message (`can't open file`, exit code 2; the syntax
    error's file, line and caret, exit code 1), no frames of this server."""
    try:
        with io.open_code(path) as f:
            return compile(f.read(), path, "exec")
    except OSError as error:
        print(f"{interpreter}: can't open file {path!r}: [Errno {error.errno}] {error.strerror}",
              file=sys.stderr, flush=True)
        os._exit(2)
    except (SyntaxError, ValueError) as error:  # ValueError: a NUL byte in the source
        sys.excepthook(type(error), error.with_traceback(None), None)
        sys.stderr.flush()
        os._exit(1)


def run_as_main(path: str, code: types.CodeType) -> None:
    """Run the script's `code` as `python SCRIPT.py` runs it: in a fresh `__main__`."""
    main = types.ModuleType("__main__")
    vars(main).update(__file__=path, __cached__=None,
                      __loader__=importlib.machinery.SourceFileLoader("__main__", path))
    sys.modules["__main__"] = main
    exec(code, main.__dict__)


def _exit_code(exit: SystemExit) -> int:
    """The exit status Python gives `raise SystemExit(code)`."""
    if exit.code is None:
        return 0
    if isinstance(exit.code, int):
        return exit.code & 0xFF
    print(exit.code, file=sys.stderr)
    return 1


def exit_as_python_does(path: str, interpreter: str) -> NoReturn:
    """Run the script, then end as Python ends one — uncaught exceptions through
    `sys.excepthook`, `SystemExit`'s code, non-daemon threads joined, atexit handlers run,
    open files and the standard streams flushed, an uncaught KeyboardInterrupt ending by
    SIGINT — and exit at once: the module teardown (1-3 s for a TensorFlow process; Python
    does not promise finalizers of objects alive at exit) is skipped."""
    interrupted = False
    script = compile_script(path, interpreter)
    try:
        run_as_main(path, script)
        code = 0
    except SystemExit as exit:
        code = _exit_code(exit)
    except BaseException as error:
        sys.excepthook(type(error), error, error.__traceback__)
        code, interrupted = 1, isinstance(error, KeyboardInterrupt)
    threading._shutdown()  # type: ignore[attr-defined]  # as Python's finalization, multiprocessing's children
    atexit._run_exitfuncs()
    # What open() returned, still open: the objects made since the fork (the server's are
    # frozen: 0.01 s instead of 0.1 s to look at), and the standard streams.
    for stream in (*gc.get_objects(), sys.stdout, sys.stderr):
        if type(stream) in _OPEN_FILES and not stream.closed:
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def _die_with(parent: int) -> None:
    """End this process when `parent` ends."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it ended before the line above
        os._exit(0)


def main(argv: list[str]) -> int:
    """fork_server.py PARENT LISTENER_FD TASKS [MODULE …] -- COMMAND…: preload the modules, serve
    TASKS requests on the listening socket inherited as LISTENER_FD (COMMAND: the tasks')."""
    _die_with(int(argv[0]))
    listener, tasks, preload = socket.socket(fileno=int(argv[1])), int(argv[2]), argv[3:argv.index("--")]
    sys.path.pop(0)  # this file's folder: not the script's
    server = _Server(listener, tasks)
    for name in preload:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    # What the imports made stays out of the children's garbage collections (and so shared
    # with them, not copied on write).
    gc.freeze()
    child = server.serve()
    if child is None:
        return 0
    server.close_in_child(child)
    exit_as_python_does(become(child), child.argv[0])


class ForkServer:
    """The server process of one job (the launcher's side)."""

    def __init__(self, python: str, command: Sequence[str], cwd: str, env: Mapping[str, str], tasks: int,
                 preload: Sequence[str] = PRELOAD, log: Path | None = None):
        self.address = f"\0csrun-fork-{os.getpid()}-{secrets.token_hex(8)}"  # abstract: no file
        # Listening before the server starts: tasks connect at once and wait for the imports.
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.address)
        listener.listen(max(tasks, 8))
        with listener, open(log if log is not None else os.devnull, "ab") as out:
            self._process = subprocess.Popen(
                [python, os.path.abspath(__file__), str(os.getpid()), str(listener.fileno()), str(tasks),
                 *preload, "--", *command],
                cwd=cwd, env=dict(env), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, pass_fds=(listener.fileno(),))

    def stop(self) -> None:
        """End the server (its children, if any, stay with their tasks); idempotent."""
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
