"""Closing: a resource released by `close()`, which a `with` block closes at its end."""
from __future__ import annotations

from typing import Self


class Closing:
    """Subclasses define close(); `with Resource(...) as r:` closes r when the block ends."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
