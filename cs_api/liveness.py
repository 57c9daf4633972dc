"""Is the CS still there? A client's watch over a long call (Load, Train, Feed, Snapshot).

A CS that stops (SIGSTOP, a hung host, a cable pulled) keeps its TCP connections open and
a waiting call would wait forever. While the call runs, `Liveness` asks the CS for its
Status on a channel of its own every `every_s` seconds; when no answer has come for
`limit_s` seconds it cancels the call (the caller then raises `Liveness.dead`, one line).
A busy CS still answers Status (a thread of its own), so a slow step is not taken for a
dead CS.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

import grpc

from cs_api import pb, rpc

EVERY_S = 5.0
LIMIT_S = 30.0  # no Status answer for this long: the CS is gone (ends the job well within 60 s)


class Liveness:
    """Use as a context manager around a call; `cancel` stops the call when the CS is gone."""

    def __init__(self, cs_ip: str, cancel: Callable[[], object],
                 open_channel: Callable[[str], grpc.Channel] = grpc.insecure_channel,
                 every_s: float = EVERY_S, limit_s: float = LIMIT_S):
        self.cs_ip = cs_ip
        self._open_channel = open_channel  # the client's own (TLS when its CS speaks TLS)
        self.dead: str | None = None  # why the call was cancelled, if it was
        self._cancel = cancel
        self._every_s, self._limit_s = every_s, limit_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="cs-liveness", daemon=True)

    def _watch(self) -> None:
        last_answer = time.monotonic()
        with self._open_channel(self.cs_ip) as channel:
            stub = rpc.CSSystemStub(channel)
            while not self._stop.wait(self._every_s):
                try:
                    stub.Status(pb.StatusRequest(), timeout=self._every_s)
                    last_answer = time.monotonic()
                except grpc.RpcError:
                    silent = time.monotonic() - last_answer
                    if silent >= self._limit_s and not self._stop.is_set():
                        self.dead = (f"the CS system at {self.cs_ip} stopped answering "
                                     f"(no reply to Status for {silent:.0f} s)")
                        self._cancel()
                        return

    def __enter__(self) -> "Liveness":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=1.0)  # an answering CS replies at once; a dead one was cancelled
