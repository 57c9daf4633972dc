"""A streamed program input, as the compiler declares it, the chief publishes it to the input
workers and the CS checks every batch against it (a Program's TensorSpec)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cs_api import pb
from cs_api.tensors import dtype_code, dtype_of

Shape = tuple[int, ...]


@dataclass(frozen=True)
class InputSpec:
    """"features", "features.<key>", "labels" or "labels.<key>": its numpy dtype name and per-sample shape."""

    name: str
    dtype: str  # numpy dtype name: float32, int32, ...
    shape: Shape  # per sample (the batch dimension left out)

    def batch_shape(self, batch_size: int) -> Shape:
        return (batch_size, *self.shape)

    def to_proto(self) -> pb.TensorSpec:
        return pb.TensorSpec(name=self.name, dtype=dtype_code(np.dtype(self.dtype)), shape=list(self.shape))

    @classmethod
    def from_proto(cls, spec: pb.TensorSpec) -> "InputSpec":
        """ValueError when the message names no dtype the CS API knows."""
        return cls(spec.name, dtype_of(spec.dtype).name, tuple(int(d) for d in spec.shape))


def program_inputs(program: pb.Program) -> tuple[InputSpec, ...]:
    return tuple(InputSpec.from_proto(spec) for spec in program.inputs)


def as_streamed(named: dict[str, np.ndarray], inputs: tuple[InputSpec, ...]) -> dict[str, np.ndarray]:
    """A batch as the program streams it: a float64 array of a float32 input (one the compiler
    proved every reader casts to float32 first) cast as TF's Cast rounds it; every other
    array as it is."""
    dtypes = {spec.name: spec.dtype for spec in inputs}
    return {name: cast_to_float32(array)
            if array.dtype == np.float64 and dtypes.get(name) == "float32" else array
            for name, array in named.items()}


def cast_to_float32(array: np.ndarray) -> np.ndarray:
    """TF's Cast of float64 to float32 on the CPU: to nearest, ties to even (numpy's astype),
    too large to infinity, then a subnormal result flushed to zero of its sign (TF's kernels
    run with denormals flushed)."""
    with np.errstate(over="ignore"):
        cast = array.astype(np.float32)
    return np.where(np.abs(cast) < np.finfo(np.float32).tiny, np.copysign(np.float32(0), cast), cast)
