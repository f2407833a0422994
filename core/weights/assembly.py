"""One weights version being put together from its chunks (core.weights.subscriber receives them; the protocol
is in core.weights.publisher).

What must hold:
- Every header number is an integer in range before it is used; shapes, dtypes and byte counts agree; a
  version's buffers are checked against what the subscriber expects (tensor name -> shape, the model's own
  parameters) and against a byte budget *before* anything is allocated.
- Chunks are taken in order, each continuing exactly where the last one ended, in the layout the publisher
  makes (core.weights.publisher `_chunks`): every part of a chunk but its last ends its tensor; a tensor left
  unfinished continues in the next chunk's first part; the last chunk finishes every tensor. A chunk that breaks
  any of these is refused by itself, so no chunk can leave a version that can never complete.
- A chunk is taken whole or not at all: the assembly (chunks taken, bytes counted as filled, buffers, bytes
  allocated) changes only once every part of the chunk is checked and written; a sealed part that does not
  authenticate (core.weights.seal), a malformed part or a failed allocation leaves it as it was (buffers taken
  for the chunk go back to the spares).
"""
from __future__ import annotations

import math
import time

import msgpack
import numpy as np

from core.trajectory import WireError
from core.weights.seal import OpenChunk
from core.weights.tensors import TensorBytes, WeightSet, itemsize

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
        self.unfinished = ""  # the tensor the last chunk left unfinished: the next chunk's first part continues it
        self.allocated = 0
        self.spare = spare  # byte buffers of an older version, reused when the sizes match
        self.expected, self.max_total_bytes = expected, max_total_bytes
        self.touched = time.monotonic()  # when it last took a chunk

    def add(self, seq: int, parts: list, frames: list, sealed: OpenChunk | None = None) -> None:
        """Write one chunk's parts (`sealed`: opened straight into the buffers). Nothing of the assembly changes
        until every part is checked and written: WireError (SealError for a part that does not authenticate),
        or a MemoryError, leaves it as it was."""
        if seq != self.next_seq:
            raise WireError("seq", f"chunk {seq} of version {self.version} arrived, expected {self.next_seq}")
        new: dict[str, tuple[str, tuple[int, ...], np.ndarray]] = {}
        try:
            filled, unfinished, allocated, writes = self._check(parts, frames, sealed, new)
            for i, (out, frame) in enumerate(writes):
                if sealed is not None:
                    sealed.open_into(i, frame, out)
                else:
                    out[:] = frame  # a memoryview slice copy runs at memcpy speed
        except BaseException:
            self.spare.update({n: b for n, (_, _, b) in new.items()})
            raise
        self.buffers.update(new)
        self.filled, self.unfinished, self.allocated = filled, unfinished, allocated
        self.next_seq += 1
        self.touched = time.monotonic()

    def _check(self, parts: list, frames: list, sealed: OpenChunk | None, new: dict) -> tuple:
        """What the assembly would be with this chunk, and the writes to make; WireError if it does not fit."""
        filled, allocated, writes = dict(self.filled), self.allocated, []
        unfinished = self.unfinished

        def misfit(message: str) -> WireError:  # sealed, the header is genuine: a part that does not fit is not
            return sealed.refuse(message) if sealed is not None else WireError("parts", message)

        for i, ((name, dtype, shape, offset, total), frame) in enumerate(zip(parts, frames)):
            if unfinished and (i > 0 or name != unfinished):
                raise WireError("parts", f"{unfinished} was left unfinished, chunk {self.next_seq} has {name!r:.80}")
            entry = self.buffers.get(name) or new.get(name)
            if entry is None:
                self._admit(name, shape, total, allocated)
                buf = self.spare.pop(name, None)
                if buf is None or buf.nbytes != total:
                    buf = np.empty(total, np.uint8)  # not zero-filled: every byte is written before use
                entry = new[name] = (dtype, shape, buf)
                allocated += total
                filled[name] = 0
            elif entry[:2] != (dtype, shape):
                raise WireError("parts", f"{name}: dtype/shape differ between chunks of version {self.version}")
            buf = entry[2]
            n = sealed.part_size(frame) if sealed is not None else len(frame)
            if offset != filled[name]:
                raise WireError("parts", f"{name}: bytes from {offset} do not continue {filled[name]}")
            if not 0 <= n <= len(buf) - offset:
                raise misfit(f"{name}: bytes [{offset}, {offset + n}) do not fit within {len(buf)}")
            filled[name] += n
            unfinished = name if filled[name] < len(buf) else ""
            if unfinished and i < len(parts) - 1:
                raise misfit(f"{name} ends at byte {filled[name]} of {len(buf)} inside chunk {self.next_seq}")
            writes.append((buf.data[offset:offset + n], frame))
        if self.next_seq == self.n_chunks - 1 and unfinished:
            raise misfit(f"the last chunk of version {self.version} leaves {unfinished} unfinished")
        return filled, unfinished, allocated, writes

    def _admit(self, name: str, shape: tuple[int, ...], total: int, allocated: int) -> None:
        if self.expected is not None:
            want = self.expected.get(name)
            if want is None:
                raise WireError("parts", f"{name!r:.80} is not a tensor of this model")
            if tuple(want) != shape:
                raise WireError("parts", f"{name}: shape {list(shape)}, the model has {list(want)}")
        if allocated + total > self.max_total_bytes:
            raise WireError("parts", f"version {self.version} needs more than {self.max_total_bytes} bytes")

    def complete(self) -> bool:
        return self.next_seq == self.n_chunks and all(
            self.filled[n] == len(b[2]) for n, b in self.buffers.items())

    def result(self) -> WeightSet:
        return WeightSet(self.version, {n: TensorBytes(n, d, s, b.data) for n, (d, s, b) in self.buffers.items()})
