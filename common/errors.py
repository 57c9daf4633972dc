"""User-facing errors: one exception type, printed as one line by the entry points."""
from __future__ import annotations

import argparse
import functools
import os
import signal
import sys
from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable[..., int | None])


class CSRunError(Exception):
    """A user mistake or an environment problem: what is wrong, and what to do."""

    def __init__(self, message: str, hint: str | None = None, detail: str | None = None,
                 caused_by: str = ""):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.detail = detail  # optional lines printed before the one-line error (a list)
        # in a task of a job: whose failure this one follows (`common.task_failure`), "" its own
        self.caused_by = caused_by

    def __str__(self) -> str:
        return f"{self.message} (hint: {self.hint})" if self.hint else self.message


class Stopped(KeyboardInterrupt):
    """A stop signal (SIGTERM, SIGHUP) turned into an exception, as Ctrl-C is: the code
    running cleans up on its way out (`stop_on_signals`)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.done = ""  # what the clean-up stopped, for the one line the CLI prints

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def stop_on_signals() -> None:
    """SIGTERM and SIGHUP raise `Stopped` in the main thread (once: a second one during the
    clean-up is ignored, so the clean-up finishes); SIGINT raises KeyboardInterrupt even
    where the launcher started with it ignored (a background job of a non-interactive
    shell), so `kill -INT` stops it as Ctrl-C does."""

    def stop(signum, _frame):
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        raise Stopped(signum)

    for sig in STOP_SIGNALS:
        signal.signal(sig, stop)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def debug_enabled(argv: list[str] | None = None) -> bool:
    argv = sys.argv if argv is None else argv
    return "--debug" in argv or os.environ.get("CSRUN_DEBUG") == "1"


_on_report: list[Callable[[CSRunError], None]] = []


def on_report(hook: Callable[[CSRunError], None]) -> None:
    """Call `hook` with every error `report` prints (a task records its failure for its
    launcher: `coordinator.roles`)."""
    if hook not in _on_report:
        _on_report.append(hook)


def report(prog: str, error: CSRunError) -> None:
    """Print the one line a user sees for `error`, after its detail lines if it has any."""
    if error.detail:
        print(error.detail.rstrip("\n"), file=sys.stderr)
    print(f"{prog}: error: {error}", file=sys.stderr, flush=True)
    for hook in _on_report:
        hook(error)


def cli_entry(prog: str) -> Callable[[F], F]:
    """Decorate a CLI main: a CSRunError becomes one line on stderr and exit code 1.

    Internal bugs are not caught. `--debug` (or CSRUN_DEBUG=1) re-raises the error so the
    traceback shows.
    """

    def wrap(main: F) -> F:
        @functools.wraps(main)
        def run(*args, **kwargs):
            try:
                return main(*args, **kwargs)
            except CSRunError as error:
                if debug_enabled():
                    raise
                report(prog, error)
                raise SystemExit(1) from None
            except Stopped as stopped:
                done = f": {stopped.done}" if stopped.done else ""
                print(f"{prog}: stopped by {stopped.name}{done}", file=sys.stderr, flush=True)
                raise SystemExit(128 + stopped.signum) from None
            except KeyboardInterrupt:
                print(f"{prog}: interrupted", file=sys.stderr, flush=True)
                raise SystemExit(130) from None

        return run  # type: ignore[return-value]

    return wrap


def install_excepthook() -> None:
    """A CSRunError that escapes a user's own script (one that calls `get_params`,
    `CSEstimator.train`… without `launcher.run_flow`) prints as `run.py: error: …` with exit
    code 1, not a traceback; `--debug` (or CSRUN_DEBUG=1) keeps the traceback. Installed by
    importing the user API."""
    previous = sys.excepthook
    if getattr(previous, "csrun", False):
        return

    def hook(kind, error, trace):
        if issubclass(kind, CSRunError) and not debug_enabled():
            report(os.path.basename(sys.argv[0] or "") or "python", error)
            return  # the interpreter then exits with code 1
        previous(kind, error, trace)

    hook.csrun = True  # type: ignore[attr-defined]
    sys.excepthook = hook


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose mistakes (unknown flags, bad values) are a CSRunError: one line
    through `cli_entry`, not usage text and exit code 2."""

    def error(self, message: str):
        raise CSRunError(message, f"see {self.prog} --help")

    def add_command(self, help: str) -> None:
        """`--debug` (tracebacks, see `cli_entry`) and the command the CLI runs: every
        argument after its own flags, an optional `--` first (read back by `command`)."""
        self.add_argument("--debug", action="store_true", help="show tracebacks")
        self.add_argument("command", nargs=argparse.REMAINDER, help=help)

    def command(self, ns: argparse.Namespace, example: str, verb: str = "run") -> tuple[str, ...]:
        """The command `add_command` parsed into `ns`, without its `--`; none is an error."""
        command = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
        if not command:
            raise CSRunError(f"no command to {verb}", f"e.g. {self.prog} {example}")
        return tuple(command)
