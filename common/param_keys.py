"""One params key's kind and range (`Key`): what params.yaml's sections, `CSRunConfig` and
train()'s step counts are checked against; `STEPS`, a number of steps, is the one rule of
"a whole number >= 0"."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_KINDS = {"int": "a whole number", "number": "a number", "bool": "true or false",
          "str": "a string", "ints": "a list of whole numbers", "any": "any value"}


@dataclass(frozen=True)
class Key:
    """One params key: its kind ("int", "number", "bool", "str", "ints", "any"), its range
    (`minimum` <= value, `above` < value, value < `below`, value <= `maximum`), its allowed
    values (`choices`), whether it must be there, and the one
    line (`note`) a run prints when the key is set although it means nothing here."""

    kind: str
    minimum: float | None = None
    above: float | None = None
    maximum: float | None = None
    below: float | None = None
    choices: tuple[Any, ...] = ()
    required: bool = True
    note: str = ""

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"Key kind {self.kind!r} is not one of {', '.join(_KINDS)}")

    def describe(self) -> str:
        if self.choices:
            return "one of " + ", ".join(str(c) for c in self.choices)
        bounds = [f">= {self.minimum:g}" if self.minimum is not None else "",
                  f"> {self.above:g}" if self.above is not None else "",
                  f"< {self.below:g}" if self.below is not None else "",
                  f"<= {self.maximum:g}" if self.maximum is not None else ""]
        return " ".join([_KINDS[self.kind], *[b for b in bounds if b]])

    def _number_ok(self, value: Any, whole: bool) -> bool:
        if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)):
            return False
        return ((self.minimum is None or value >= self.minimum)
                and (self.above is None or value > self.above)
                and (self.below is None or value < self.below)
                and (self.maximum is None or value <= self.maximum))

    def accepts(self, value: Any) -> bool:
        if self.choices:
            return value in self.choices
        if self.kind == "any":
            return True
        if self.kind == "bool":
            return isinstance(value, bool)
        if self.kind == "str":
            return isinstance(value, str)
        if self.kind == "ints":
            return isinstance(value, list) and bool(value) and all(self._number_ok(v, True) for v in value)
        return self._number_ok(value, self.kind == "int")


STEPS = Key("int", minimum=0, required=False)  # a number of steps: a whole number >= 0
