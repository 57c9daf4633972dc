"""What an attached `csrun_wse` shows of its job's training besides the chief's log: on a
terminal, one line updated in place (step / end step, loss, samples/s, ETA) below the log
lines; in a log or a pipe nothing but those lines. And a summary when the job ends. Both
read the chief's `progress.json` (`slurm.jobs.Progress`)."""
from __future__ import annotations

import io
import math
import sys
import time
from pathlib import Path
from typing import TextIO

from slurm.jobs import Progress

_CLEAR = "\r\x1b[K"


def duration(seconds: float) -> str:
    """H:MM:SS, or M:SS under an hour."""
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def loss_text(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.6g}"


class ProgressLine(io.TextIOBase):
    """A stream for the chief's log lines (`write`) that keeps the progress line under them
    (`refresh`, called as the job is followed) when `terminal` is a terminal."""

    def __init__(self, folder: Path, out: TextIO, terminal: TextIO = sys.stderr):
        super().__init__()
        self.folder = folder
        self.out = out
        self.terminal = terminal
        self.live = terminal.isatty()
        self._shown = ""
        self._read = 0.0

    def write(self, text: str) -> int:
        shared = self.live and self.out.isatty()  # the log lines go to the same terminal
        if shared:
            self._clear()
        written = self.out.write(text)
        self.out.flush()
        if shared:
            self._draw()
        return written

    def flush(self) -> None:
        self.out.flush()

    def refresh(self) -> None:
        if not self.live or time.monotonic() - self._read < 0.5:
            return
        self._read = time.monotonic()
        progress = Progress.read(self.folder)
        if progress is None or progress.finished:
            self._clear()
            self._shown = ""
            return
        eta = progress.eta_s
        self._clear()
        self._shown = (f"step {progress.step}/{progress.end_step}  loss {loss_text(progress.loss)}  "
                       f"{progress.samples_per_sec:,.0f} samples/s"
                       + (f"  ETA {duration(eta)}" if eta is not None else ""))
        self._draw()

    def _clear(self) -> None:
        if self.live and self._shown:
            self.terminal.write(_CLEAR)
            self.terminal.flush()

    def _draw(self) -> None:
        if self.live and self._shown:
            self.terminal.write(self._shown)
            self.terminal.flush()

    def done(self) -> None:
        """Take the progress line off the terminal (the job ended)."""
        self._clear()
        self._shown = ""


def summary(folder: Path) -> str | None:
    """The training summary of the job in `folder`, None for a job that did not train."""
    progress = Progress.read(folder)
    if progress is None:
        return None
    seconds = progress.updated - progress.started
    return (f"steps {progress.start_step}->{progress.step} of {progress.end_step} in {duration(seconds)}, "
            f"{progress.samples_per_sec:,.0f} samples/s wall clock, {progress.sim_samples_per_sec:,.0f} "
            f"simulated CS system; final loss {loss_text(progress.loss)}; newest checkpoint "
            f"{progress.checkpoint or 'none'}; job folder {folder}"
            + (f"; input starvation: {progress.starvation}" if progress.starvation else ""))
