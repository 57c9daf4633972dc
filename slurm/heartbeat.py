"""An attached launcher's sign of life, so that no task outlives it: `csrun_wse` rewrites
`launcher.heartbeat` in the job folder every second (`Heartbeat`); every task of a Slurm job
it follows watches the file (`watch_heartbeat`, from `HEARTBEAT_ENV` in its environment) and
stops its command once the file stayed unchanged for `HEARTBEAT_TIMEOUT_S`: the launcher died,
however (SIGKILL, a lost login node), and the job ends within seconds instead of training on.
The watcher compares the file's content on its own clock, never the launcher's.
(Local tasks end with their launcher by parent-death signals, `slurm.fork_server`.)"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Callable

HEARTBEAT = "launcher.heartbeat"  # in the job folder
HEARTBEAT_ENV = "CSRUN_HEARTBEAT"  # a task's environment: the file it watches
HEARTBEAT_EVERY_S = 1.0
HEARTBEAT_TIMEOUT_S = 10.0  # unchanged this long: the launcher is dead


class Heartbeat:
    """The launcher's side: a daemon thread rewriting the file every second until `stop`."""

    def __init__(self, folder: Path):
        self.path = folder / HEARTBEAT
        self._stop = threading.Event()
        self._beat()
        self._thread = threading.Thread(target=self._run, name="csrun-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        try:
            self.path.write_text(f"{os.getpid()} {time.time():.3f}\n")
        except OSError:
            pass

    def _run(self) -> None:
        while not self._stop.wait(HEARTBEAT_EVERY_S):
            self._beat()

    def stop(self) -> None:
        self._stop.set()


def watch_heartbeat(path: Path, on_death: Callable[[], None],
                    timeout_s: float = HEARTBEAT_TIMEOUT_S) -> threading.Thread:
    """A task's side: a daemon thread calling `on_death()` once `path` stayed unchanged for
    `timeout_s` seconds of this host's clock."""

    def content() -> str:
        try:
            return path.read_text()
        except OSError:
            return ""

    def run() -> None:
        last, since = content(), time.monotonic()
        while True:
            time.sleep(HEARTBEAT_EVERY_S)
            now = content()
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since > timeout_s:
                on_death()
                return

    thread = threading.Thread(target=run, name="csrun-heartbeat-watch", daemon=True)
    thread.start()
    return thread
