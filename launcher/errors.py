"""User-facing errors: one exception type, printed as one line by the entry points."""
from __future__ import annotations

import argparse
import functools
import os
import sys
from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable[..., int | None])


class CSRunError(Exception):
    """A user mistake or an environment problem: what is wrong, and what to do."""

    def __init__(self, message: str, hint: str | None = None, detail: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.detail = detail  # optional lines printed before the one-line error (a list)

    def __str__(self) -> str:
        return f"{self.message} (hint: {self.hint})" if self.hint else self.message


def debug_enabled(argv: list[str] | None = None) -> bool:
    argv = sys.argv if argv is None else argv
    return "--debug" in argv or os.environ.get("CSRUN_DEBUG") == "1"


def report(prog: str, error: CSRunError) -> None:
    """Print the one line a user sees for `error`, after its detail lines if it has any."""
    if error.detail:
        print(error.detail.rstrip("\n"), file=sys.stderr)
    print(f"{prog}: error: {error}", file=sys.stderr, flush=True)


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
            except KeyboardInterrupt:
                print(f"{prog}: interrupted", file=sys.stderr, flush=True)
                raise SystemExit(130) from None

        return run  # type: ignore[return-value]

    return wrap


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose mistakes (unknown flags, bad values) are a CSRunError: one line
    through `cli_entry`, not usage text and exit code 2."""

    def error(self, message: str):
        raise CSRunError(message, f"see {self.prog} --help")
