"""What the weights channel moves: named tensors as raw bytes, a complete version, and the chunking of a version
into messages of a bounded size (the publisher's, core.weights.publisher; read back by core.weights.assembly).

dtype is a string ("float32", "bfloat16", ...): the channel moves bytes and never interprets them, so core needs
no torch. `itemsize` is the one list of the dtypes it carries.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator

from core.trajectory import WireError


@dataclass
class TensorBytes:
    """One named tensor as raw bytes; `data` is C-contiguous and `len(data) == prod(shape) * itemsize`."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    data: memoryview | bytearray | bytes


@dataclass
class WeightSet:
    version: int
    tensors: dict[str, TensorBytes]
    shelf: tuple[str, list] | None = None  # (path, index) of a version read from the learner's shared memory

    @property
    def nbytes(self) -> int:
        return sum(len(t.data) for t in self.tensors.values())


def byte_view(data) -> memoryview:
    """A flat byte view of a C-contiguous buffer (an empty buffer of any shape gives an empty view)."""
    view = memoryview(data)
    return view.cast("B") if view.nbytes else memoryview(b"")


_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4, "int8": 1,
             "uint8": 1, "bool": 1, "int16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}


def itemsize(dtype: str) -> int:
    """Bytes per element of a dtype the channel carries; WireError for any other."""
    size = _ITEMSIZE.get(dtype) if isinstance(dtype, str) else None
    if size is None:
        raise WireError("dtype", f"unsupported dtype {dtype!r:.40}")
    return size


def chunk_tensors(tensors: Iterable[TensorBytes], chunk_bytes: int) -> Iterator[list[tuple[TensorBytes, int, memoryview]]]:
    """Group tensor byte ranges into chunks of at most `chunk_bytes` (a lone large tensor is split)."""
    chunk: list[tuple[TensorBytes, int, memoryview]] = []
    room = chunk_bytes
    for t in tensors:
        view = byte_view(t.data)
        offset = 0
        while True:  # an empty tensor still gets one (empty) part, so the receiver learns its shape
            take = min(room, len(view) - offset)
            chunk.append((t, offset, view[offset:offset + take]))
            offset += take
            room -= take
            if room == 0:
                yield chunk
                chunk, room = [], chunk_bytes
            if offset >= len(view):
                break
    if chunk:
        yield chunk
