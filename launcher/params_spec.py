"""What a model's params.yaml must hold, checked before any work starts: each section and
key with its type and range, each mistake one line naming the key and the file.

    SPEC = {"train_input": {"batch_size": Key("int", minimum=1)},
            "model": {"hidden_sizes": Key("ints", minimum=1), "dropout": Key("number", 0, below=1)}}
    check_params(params, SPEC, "configs/params.yaml")

An example declares the keys its input_fn and model_fn read (`examples/*/params_spec.py`)
and passes them to `launcher.run_flow.run`; keys not in the spec are left to the model.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from common.errors import CSRunError

_KINDS = {"int": "a whole number", "number": "a number", "bool": "true or false",
          "str": "a string", "ints": "a list of whole numbers"}


@dataclass(frozen=True)
class Key:
    """One params key: its kind ("int", "number", "bool", "str", "ints"), its range
    (`minimum` <= value, `above` < value, value < `below`, value <= `maximum`), its allowed values, and
    whether it must be there."""

    kind: str
    minimum: float | None = None
    above: float | None = None
    maximum: float | None = None
    below: float | None = None
    choices: tuple[Any, ...] = ()
    required: bool = True

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
        if self.kind == "bool":
            return isinstance(value, bool)
        if self.kind == "str":
            return isinstance(value, str)
        if self.kind == "ints":
            return isinstance(value, list) and bool(value) and all(self._number_ok(v, True) for v in value)
        return self._number_ok(value, self.kind == "int")


Spec = Mapping[str, Mapping[str, Key]]


def check_params(params: dict, spec: Spec, path: str) -> None:
    """Raise one CSRunError for the first section or key of `spec` that `params` lacks or
    holds with a wrong type or out of range."""
    for section, keys in spec.items():
        values = params.get(section)
        if values is None:
            if any(k.required for k in keys.values()):
                needed = ", ".join(k for k, key in keys.items() if key.required)
                raise CSRunError(f"{path} has no {section} section",
                                 f"add `{section}:` with {needed}")
            continue
        if not isinstance(values, dict):
            raise CSRunError(f"{section} in {path} is {values!r}, not a mapping",
                             f"write `{section}:` with its keys indented below it")
        for name, key in keys.items():
            if values.get(name) is None:
                if key.required:
                    raise CSRunError(f"{section}.{name} is missing in {path}",
                                     f"set {name} to {key.describe()}")
                continue
            value = values[name]
            if not key.accepts(value):
                hint = f"fix {section}.{name} in {path}"
                if key.kind == "number" and isinstance(value, str) and _is_number(value):
                    hint = f"YAML reads {value} as text: write it with a dot, e.g. 1.0e-3"
                raise CSRunError(f"{section}.{name} in {path} is {value!r}, not "
                                 f"{key.describe()}", hint)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
