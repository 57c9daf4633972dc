"""Arrays in CS API messages, one home for both sides: whole `Tensor`s (sample batches,
streamed outputs) and ordered `TensorChunk` pieces (weights and slots of any size)."""
from __future__ import annotations

from typing import Iterable, Iterator

import numpy as np

from wse_sim.api import cs_api_pb2 as pb

CHUNK_BYTES = 1 << 20


def dtype_of(code: int) -> np.dtype:
    """The numpy dtype of a DType enum value (ValueError for DTYPE_UNSPECIFIED or unknown)."""
    if code == pb.DTYPE_UNSPECIFIED or code not in pb.DType.values():
        raise ValueError(f"unsupported dtype code {code}")
    return np.dtype(pb.DType.Name(code).lower())


def dtype_code(dtype: np.dtype) -> int:
    return pb.DType.Value(np.dtype(dtype).name.upper())


def _little_endian(array: np.ndarray) -> np.ndarray:
    array = np.asarray(array, order="C")  # (ascontiguousarray would make a scalar 1-d)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return array


def to_tensor(name: str, array: np.ndarray) -> pb.Tensor:
    """One array as a Tensor: C-order little-endian raw bytes."""
    array = _little_endian(array)
    return pb.Tensor(name=name, dtype=dtype_code(array.dtype), shape=array.shape,
                     data=array.tobytes())


def from_tensor(tensor: pb.Tensor) -> np.ndarray:
    """A Tensor's array (read-only, no copy). ValueError if its bytes do not fit its shape."""
    dtype = dtype_of(tensor.dtype)
    shape = tuple(int(d) for d in tensor.shape)
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(tensor.data) != expected:
        raise ValueError(f"tensor {tensor.name!r} has {len(tensor.data)} bytes, shape {shape} "
                         f"{dtype.name} needs {expected}")
    return np.frombuffer(tensor.data, dtype.newbyteorder("<")).reshape(shape)


def tensor_chunks(name: str, array: np.ndarray, chunk_bytes: int = CHUNK_BYTES) -> Iterator[pb.TensorChunk]:
    """`array` as ordered TensorChunk pieces (tensors above gRPC's message limit work)."""
    array = _little_endian(array)
    data = memoryview(array.reshape(-1).view(np.uint8))
    total = len(data)
    code = dtype_code(array.dtype)
    for offset in range(0, max(total, 1), chunk_bytes):
        yield pb.TensorChunk(name=name, dtype=code, shape=array.shape, offset=offset,
                             total_bytes=total, data=bytes(data[offset:offset + chunk_bytes]))


def assemble(chunks: Iterable[pb.TensorChunk]) -> dict[str, np.ndarray]:
    """Arrays from ordered TensorChunk pieces, by name. ValueError for pieces that do not
    add up to their tensor (gaps, overlaps, sizes that do not fit the shape)."""
    buffers: dict[str, tuple[pb.TensorChunk, bytearray, list[int]]] = {}
    for chunk in chunks:
        if chunk.name not in buffers:
            buffers[chunk.name] = (chunk, bytearray(chunk.total_bytes), [0])
        head, buf, filled = buffers[chunk.name]
        if chunk.offset != filled[0] or chunk.offset + len(chunk.data) > head.total_bytes:
            raise ValueError(f"tensor {chunk.name!r}: piece at byte {chunk.offset} "
                             f"({len(chunk.data)} bytes) does not continue at byte {filled[0]} "
                             f"of {head.total_bytes}")
        buf[chunk.offset:chunk.offset + len(chunk.data)] = chunk.data
        filled[0] += len(chunk.data)
    arrays = {}
    for name, (head, buf, filled) in buffers.items():
        if filled[0] != head.total_bytes:
            raise ValueError(f"tensor {name!r}: {filled[0]} of {head.total_bytes} bytes arrived")
        arrays[name] = from_tensor(pb.Tensor(name=name, dtype=head.dtype, shape=head.shape,
                                             data=bytes(buf))).copy()
    return arrays
