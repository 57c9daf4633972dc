"""Kernel attributes in the CS API: a plain Python value (int, float, str, bool, a list of
ints or floats, a numpy array) and its AttrValue message, both ways."""
from __future__ import annotations

from typing import Any

import numpy as np

from cs_api import pb
from cs_api.tensors import from_tensor, to_tensor


def to_attr(value: Any) -> pb.AttrValue:
    """The compiler's side: TypeError for a value the CS API has no form for."""
    if isinstance(value, np.ndarray):
        return pb.AttrValue(tensor=to_tensor("", value))
    if isinstance(value, bool):
        return pb.AttrValue(b=value)
    if isinstance(value, int):
        return pb.AttrValue(i=value)
    if isinstance(value, float):
        return pb.AttrValue(f=value)
    if isinstance(value, str):
        return pb.AttrValue(s=value)
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool)
                                                for v in value):
        return pb.AttrValue(ints=pb.IntList(values=list(value)))
    if isinstance(value, (list, tuple)):
        return pb.AttrValue(floats=pb.FloatList(values=[float(v) for v in value]))
    raise TypeError(f"attribute value {value!r} has no AttrValue form")


def from_attr(value: pb.AttrValue) -> Any:
    """The CS's side: a tensor attribute as a numpy array (ValueError: its bytes do not fit
    its shape)."""
    kind = value.WhichOneof("value")
    if kind == "ints":
        return [int(v) for v in value.ints.values]
    if kind == "floats":
        return [float(v) for v in value.floats.values]
    if kind == "tensor":
        return from_tensor(value.tensor)
    return getattr(value, kind) if kind else None
