"""Which params keys the model's own code reads: a params dict (`ReadParams`) that records the
keys model_fn and input_fn read while they run (`recording`), for one note per key of a
section they read that they never read — a misspelt optional key (`model.dropuot: 0.5`, its
model reading `dropout` with a default) is otherwise ignored in silence. The note names the
nearest key they do read; it is not an error. Keys the caller names `quiet` (the original's
documented keys) and sections the code never opens (`eval_input` while training) get none.
"""
from __future__ import annotations

import contextlib
import copy
import difflib
from typing import Any, Iterable, Iterator, Mapping

_SKIPPED_SECTIONS = ("runconfig", "description")  # checked by the toolkit itself


class _Recording(dict):
    """A dict that calls `_read(key)` before a read of one key and `_read_all()` before it is
    read whole (iterated, its keys, values or items, a deep copy)."""

    def _read(self, *keys: Any) -> None:
        raise NotImplementedError

    def _read_all(self) -> None:
        raise NotImplementedError

    def __getitem__(self, key: Any) -> Any:
        self._read(key)
        return super().__getitem__(key)

    def get(self, key: Any, default: Any = None) -> Any:
        self._read(key)
        return super().get(key, default)

    def __iter__(self) -> Iterator:
        self._read_all()
        return super().__iter__()

    def keys(self):
        self._read_all()
        return super().keys()

    def values(self):
        self._read_all()
        return super().values()

    def items(self):
        self._read_all()
        return super().items()

    def __deepcopy__(self, memo: dict) -> dict:
        self._read_all()
        return copy.deepcopy(dict(dict.items(self)), memo)


class _Section(_Recording):
    """A section of a ReadParams: records the keys read while its owner records. Reading it
    whole (iterating it, copying it) counts as reading every key."""

    def __init__(self, values: Mapping, name: str, owner: "ReadParams"):
        super().__init__(values)
        self._name = name
        self._owner = owner

    def _read(self, *keys: Any) -> None:
        if self._owner.recording:
            self._owner.reads.update((self._name, key) for key in keys)

    def _read_all(self) -> None:
        self._read(*dict.keys(self))

    def __contains__(self, key: object) -> bool:
        self._read(key)
        return super().__contains__(key)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        self._read(key)
        return super().setdefault(key, default)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._read(key)  # a key the model's code sets is its own (the original fc_mnist's model.depth)
        super().__setitem__(key, value)

    def pop(self, key: Any, *default: Any) -> Any:
        self._read(key)
        return super().pop(key, *default)

    def copy(self) -> dict:
        self._read_all()
        return dict(dict.items(self))


class ReadParams(_Recording):
    """A model's params whose sections record the keys the model's code reads
    (`recording`); the toolkit reads it as any dict. Reading a section opens it; reading
    the params whole opens every section (no notes then)."""

    def __init__(self, params: Mapping, quiet: Mapping[str, Iterable[str]] | None = None):
        super().__init__({name: _Section(values, name, self) if isinstance(values, dict) else values
                          for name, values in params.items()})
        self.recording = False
        self.reads: set[tuple[str, Any]] = set()
        self.opened: set[str] = set()  # sections the model's code read
        self.everything = False  # the model's code read the params whole: no notes
        self.noted = False
        self.said: set[str] = set()  # the warnings said once for this model (`say_once`)
        self._quiet = {(section, key) for section, keys in (quiet or {}).items() for key in keys}

    def _read(self, *names: Any) -> None:
        if self.recording:
            self.opened.update(names)

    def _read_all(self) -> None:
        if self.recording:
            self.everything = True

    def unread(self) -> list[str]:
        """One note per key of an opened section the model's code never read, naming the
        nearest key it read."""
        if self.everything:
            return []
        read = {(s, k) for s, k in self.reads if isinstance(k, str)}
        notes = []
        for name in sorted(n for n in self.opened if isinstance(n, str) and n not in _SKIPPED_SECTIONS):
            section = dict.get(self, name)
            if not isinstance(section, dict):
                continue
            for key in dict.keys(section):
                if (name, key) in read or (name, key) in self._quiet or not isinstance(key, str):
                    continue
                near = difflib.get_close_matches(key, sorted(k for s, k in read if s == name), n=1, cutoff=0)
                nearest = f"; the nearest key they read is {name}.{near[0]}" if near else ""
                notes.append(f"params: {name}.{key} is never read by model_fn or input_fn{nearest} "
                             "(a misspelling?)")
        return notes


@contextlib.contextmanager
def recording(params: Any) -> Iterator[None]:
    """Record the reads of `params` (a ReadParams; any other dict: nothing) in the block:
    the model's own code runs in it."""
    if not isinstance(params, ReadParams) or params.recording:
        yield
        return
    params.recording = True
    try:
        yield
    finally:
        params.recording = False


def say_once(params: Any, line: str) -> None:
    """Print `line` unless it was said for these params (a ReadParams: one run's model;
    any other dict: every time): model_fn is built more than once in a run."""
    if isinstance(params, ReadParams):
        if line in params.said:
            return
        params.said.add(line)
    print(line, flush=True)


def say_unread(params: Any) -> None:
    """Print, once, the notes of the keys the model's code never read (`ReadParams.unread`)."""
    if isinstance(params, ReadParams) and not params.noted:
        params.noted = True
        for note in params.unread():
            print(note, flush=True)
