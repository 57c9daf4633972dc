"""The chief's stop request: SIGTERM / SIGUSR2 while it trains are recorded (the run ends
with a checkpoint after the piece in progress), the pieces stay about PIECE_S long, and an
input worker outlives a SIGTERM for the chief's last piece."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

from coordinator.stop_request import PIECE_S, WORKER_LINGER_S, StopRequest, next_piece


def test_a_stop_signal_is_recorded_and_the_handlers_come_back():
    before = signal.getsignal(signal.SIGTERM)
    with StopRequest() as stop:
        assert stop.signum is None
        os.kill(os.getpid(), signal.SIGUSR2)
        os.kill(os.getpid(), signal.SIGTERM)  # a second signal keeps the first
        assert stop.signum == signal.SIGUSR2
    assert signal.getsignal(signal.SIGTERM) is before


def test_pieces_last_about_piece_s_grow_at_most_fourfold_and_stop_at_the_end():
    assert next_piece(1, 0.001, 1000) == 4          # a fast first step: four times
    assert next_piece(100, 2 * PIECE_S, 1000) == 50  # slow: half
    assert next_piece(10, PIECE_S, 3) == 3           # never past the end
    assert next_piece(1, 10 * PIECE_S, 1000) == 1    # at least one step


def test_a_stopped_input_worker_lingers_then_ends_as_the_signal_would():
    worker = subprocess.run([sys.executable, "-c", (
        "import os, signal, time\n"
        "from coordinator.stop_request import linger_on_stop\n"
        "linger_on_stop()\n"
        "os.kill(os.getpid(), signal.SIGTERM); os.kill(os.getpid(), signal.SIGTERM)\n"
        "start = time.monotonic()\n"
        "while True:\n"
        "    print(round(time.monotonic() - start), flush=True); time.sleep(0.2)\n")],
        capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert worker.returncode == 128 + signal.SIGTERM
    assert int(worker.stdout.split()[-1]) >= WORKER_LINGER_S - 1  # alive through both SIGTERMs
