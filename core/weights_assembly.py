"""One weights version being put together from its chunks (core.weights_subscriber receives them; the protocol
is in core.weights_channel).

What must hold: every header number is an integer in range before it is used; shapes, dtypes and byte counts
agree; a version's buffers are checked against what the subscriber expects (tensor name -> shape, the model's
own parameters) and against a byte budget *before* anything is allocated; chunks are taken in order, each
continuing exactly where the last one ended. A chunk is taken whole or not at all: nothing counts as filled
until every part of it is written, so a sealed part that does not authenticate (core.weights_seal) leaves the
assembly as it was.
"""
from __future__ import annotations

import math

import msgpack
import numpy as np

from core.trajectory import WireError
from core.weights_channel import TensorBytes, WeightSet, itemsize
from core.weights_seal import OpenChunk

MAX_VERSION = (1 << 62) - 1
MAX_CHUNKS = 1 << 24
MAX_DIMS = 8
_HEADER_KEYS = {"version", "seq", "n_chunks", "parts"}


def _int(value, name: str, lo: int, hi: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise WireError(name, f"expected an int in [{lo}, {hi}], got {value!r:.40}")
    return value


def parse_chunk_header(buf, n_frames: int) -> tuple[int, int, int, list[tuple[str, str, tuple[int, ...], int, int]]]:
    """(version, seq, n_chunks, parts) of a chunk header, every number checked; WireError otherwise."""
    try:
        header = msgpack.unpackb(buf, raw=False, max_array_len=1 << 16, max_map_len=8, max_bin_len=0,
                                 max_ext_len=0, max_str_len=1 << 12)
    except Exception as exc:
        raise WireError("header", f"not valid msgpack ({type(exc).__name__})") from None
    if not isinstance(header, dict) or set(header) != _HEADER_KEYS:
        raise WireError("header", f"expected a map with keys {sorted(_HEADER_KEYS)}")
    version = _int(header["version"], "version", 0, MAX_VERSION)
    n_chunks = _int(header["n_chunks"], "n_chunks", 1, MAX_CHUNKS)
    seq = _int(header["seq"], "seq", 0, n_chunks - 1)
    raw_parts = header["parts"]
    if not isinstance(raw_parts, list) or len(raw_parts) != n_frames:
        raise WireError("parts", f"expected {n_frames} part descriptors")
    parts = []
    for p in raw_parts:
        if not (isinstance(p, list) and len(p) == 5 and isinstance(p[0], str) and 0 < len(p[0]) <= 256
                and isinstance(p[1], str) and isinstance(p[2], list) and len(p[2]) <= MAX_DIMS):
            raise WireError("parts", f"bad part descriptor {p!r:.80}")
        name, dtype = p[0], p[1]
        shape = tuple(_int(d, "shape", 0, 1 << 40) for d in p[2])
        offset, total = _int(p[3], "offset", 0, 1 << 50), _int(p[4], "total", 0, 1 << 50)
        if math.prod(shape) * itemsize(dtype) != total:  # Python ints: no overflow
            raise WireError("parts", f"{name}: shape {list(shape)} of {dtype} is not {total} bytes")
        parts.append((name, dtype, shape, offset, total))
    return version, seq, n_chunks, parts


class Assembly:
    """Buffers for one version while its chunks arrive, in order."""

    def __init__(self, version: int, n_chunks: int, spare: dict[str, np.ndarray],
                 expected: dict[str, tuple[int, ...]] | None, max_total_bytes: int):
        self.version, self.n_chunks = version, n_chunks
        self.next_seq = 0
        self.buffers: dict[str, tuple[str, tuple[int, ...], np.ndarray]] = {}
        self.filled: dict[str, int] = {}
        self.allocated = 0
        self.spare = spare  # byte buffers of an older version, reused when the sizes match
        self.expected, self.max_total_bytes = expected, max_total_bytes

    def add(self, seq: int, parts: list, frames: list, sealed: OpenChunk | None = None) -> None:
        """Write one chunk's parts (`sealed`: opened straight into the buffers). Nothing counts as filled until
        every part is written: a sealed part that does not authenticate (SealError) leaves the assembly as it was."""
        if seq != self.next_seq:
            raise WireError("seq", f"chunk {seq} of version {self.version} arrived, expected {self.next_seq}")
        filled, writes = dict(self.filled), []
        for (name, dtype, shape, offset, total), frame in zip(parts, frames):
            if name not in self.buffers:
                self._allocate(name, dtype, shape, total)
                filled[name] = 0
            elif self.buffers[name][:2] != (dtype, shape):
                raise WireError("parts", f"{name}: dtype/shape differ between chunks of version {self.version}")
            buf = self.buffers[name][2]
            n = sealed.part_size(frame) if sealed is not None else len(frame)
            if sealed is not None and not 0 <= n <= len(buf) - offset:  # the header is genuine: the part is not
                raise sealed.refuse(f"part {name} does not fit its authenticated place")
            if offset != filled[name] or offset + n > len(buf):
                raise WireError("parts", f"{name}: bytes [{offset}, {offset + n}) do not continue "
                                         f"{filled[name]} within {len(buf)}")
            filled[name] += n
            writes.append((buf.data[offset:offset + n], frame))
        for i, (out, frame) in enumerate(writes):
            if sealed is not None:
                sealed.open_into(i, frame, out)
            else:
                out[:] = frame  # a memoryview slice copy runs at memcpy speed
        self.filled = filled
        self.next_seq += 1

    def _allocate(self, name: str, dtype: str, shape: tuple[int, ...], total: int) -> None:
        if self.expected is not None:
            want = self.expected.get(name)
            if want is None:
                raise WireError("parts", f"{name!r:.80} is not a tensor of this model")
            if tuple(want) != shape:
                raise WireError("parts", f"{name}: shape {list(shape)}, the model has {list(want)}")
        if self.max_total_bytes and self.allocated + total > self.max_total_bytes:
            raise WireError("parts", f"version {self.version} needs more than {self.max_total_bytes} bytes")
        buf = self.spare.pop(name, None)
        if buf is None or buf.nbytes != total:
            buf = np.empty(total, np.uint8)  # not zero-filled: every byte is written before use
        self.allocated += total
        self.buffers[name] = (dtype, shape, buf)
        self.filled[name] = 0

    def complete(self) -> bool:
        return self.next_seq == self.n_chunks and all(
            self.filled[n] == len(b[2]) for n, b in self.buffers.items())

    def result(self) -> WeightSet:
        return WeightSet(self.version, {n: TensorBytes(n, d, s, b.data) for n, (d, s, b) in self.buffers.items()})
