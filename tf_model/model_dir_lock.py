"""One writer per model_dir: the run that trains holds `model_dir/.csrun.lock`.

The lock is an flock on that file, held by the training process until it exits (the
kernel releases it when the process dies, even by SIGKILL, so a lock left by a dead run is
free and is taken over; the file only names who held it last). The file says which host
and pid hold it, so a second run is refused naming the first:

    run.py: error: model_dir m is in use by another run: pid 4242 on host node1 (since …)

Taking the lock also removes the temporary files a killed writer may have left
(`.model.ckpt-N.tmp-PID*`, `checkpoint.tmp-PID`): with the lock held, no one else writes.
"""
from __future__ import annotations

import atexit
import contextlib
import fcntl
import glob
import os
import socket
import time
from typing import Iterator

from common.errors import CSRunError

LOCK_FILE = ".csrun.lock"
_held: dict[str, int] = {}  # real model_dir → the open lock file's descriptor (this process)
_LEFTOVERS = (".model.ckpt-*.tmp-*", "checkpoint.tmp-*", "params.yaml.tmp-*")


def _holder(text: str) -> str:
    fields = dict(part.split("=", 1) for part in text.split() if "=" in part)
    if not fields.get("pid"):
        return "another process"
    since = f" (since {fields['since']})" if fields.get("since") else ""
    return f"pid {fields['pid']} on host {fields.get('host', '?')}{since}"


def lock_model_dir(model_dir: str) -> None:
    """Hold `model_dir`'s lock for the rest of this process, or refuse naming its holder.
    Calling it again for a model_dir this process holds does nothing."""
    real = os.path.realpath(model_dir)
    if real in _held:
        return
    try:
        os.makedirs(real, exist_ok=True)
        fd = os.open(os.path.join(real, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as error:
        raise CSRunError(f"cannot write to model_dir {model_dir}: {error.strerror}",
                         "choose a writable directory with -o/--model_dir") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(os.pread(fd, 4096, 0).decode(errors="replace"))
        os.close(fd)
        raise CSRunError(f"model_dir {model_dir} is in use by another run: {holder}",
                         "wait for that run to end or stop it, or use another model_dir "
                         "(-o/--model_dir)") from None
    previous = os.pread(fd, 4096, 0).decode(errors="replace").strip()
    if previous:
        print(f"Taking over the lock of model_dir {model_dir} from a run that ended without "
              f"releasing it ({_holder(previous)})", flush=True)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"host={socket.gethostname()} pid={os.getpid()} since={stamp}\n".encode(), 0)
    _held[real] = fd
    for pattern in _LEFTOVERS:
        for leftover in glob.glob(os.path.join(glob.escape(real), pattern)):
            try:
                os.remove(leftover)
            except OSError:
                pass


def check_model_dir_free(model_dir: str) -> None:
    """Refuse, naming its holder, a model_dir another run holds now (what `lock_model_dir`
    would refuse), without taking its lock or changing anything in it."""
    try:
        fd = os.open(os.path.join(os.path.realpath(model_dir), LOCK_FILE), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return  # no lock file: no run ever held it (or it cannot be read: the run says why)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise CSRunError(f"model_dir {model_dir} is in use by another run: "
                         f"{_holder(os.pread(fd, 4096, 0).decode(errors='replace'))}",
                         "wait for that run to end or stop it, or use another model_dir (-o/--model_dir)") from None
    finally:
        os.close(fd)


def release_model_dir(model_dir: str) -> None:
    """Give the lock back (the file is emptied: nothing stale is left to report)."""
    fd = _held.pop(os.path.realpath(model_dir), None)
    if fd is not None:
        os.ftruncate(fd, 0)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


@contextlib.contextmanager
def model_dir_locked(model_dir: str) -> Iterator[None]:
    """The lock for a block (a train call); kept if this process held it already."""
    held = os.path.realpath(model_dir) in _held
    lock_model_dir(model_dir)
    try:
        yield
    finally:
        if not held:
            release_model_dir(model_dir)


@atexit.register
def _release_all() -> None:
    for real in list(_held):
        release_model_dir(real)
