"""C's libm for float32 scalars: what TensorFlow's scalar kernel paths call for one element
(std::exp, std::pow, ... on a float are glibc's expf, powf, ...). numpy's vectorised versions
differ in the last bit (np.power(x, 0.5) is sqrt, and glibc's powf(x, 0.5) is not always
the correctly rounded square root: 133 of 200,000 random floats differ)."""
from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any, Callable

import numpy as np

F32 = np.float32

try:
    _libm = ctypes.CDLL("libm.so.6")  # glibc's, which TensorFlow's kernels call
except OSError:
    _libm = ctypes.CDLL(ctypes.util.find_library("m"))
for _name, _argc in (("expf", 1), ("logf", 1), ("log1pf", 1), ("expm1f", 1), ("cosf", 1), ("sinf", 1), ("powf", 2)):
    getattr(_libm, _name).restype = ctypes.c_float
    getattr(_libm, _name).argtypes = [ctypes.c_float] * _argc


def scalar(name: str) -> Callable[..., Any]:
    """libm's `name` (expf, logf, log1pf, expm1f, cosf, sinf, powf) on float32 scalars."""
    fn = getattr(_libm, name)
    return lambda *xs: F32(fn(*(float(x) for x in xs)))


_powf = scalar("powf")


def powf(x: np.ndarray, y: float) -> np.ndarray:
    """glibc's powf(x, y) of every element of float32 x (a loop: for a few rows)."""
    flat = np.asarray(x, F32).ravel()
    return np.array([_powf(v, y) for v in flat], F32).reshape(np.shape(x))


def external(name: str, signature: Any) -> Any:
    """libm's `name` for compiled code (wafer/compiled.py: a numba ExternalFunction of
    `signature`), bound by its address under the name csrun_<name>: the very function TF
    calls, which LLVM does not know as a libm function and so calls as it is (no constant
    folding, no rewriting of a power)."""
    import llvmlite.binding
    from numba import types

    address = ctypes.cast(getattr(_libm, name), ctypes.c_void_p).value
    llvmlite.binding.add_symbol(f"csrun_{name}", address)
    return types.ExternalFunction(f"csrun_{name}", signature)
