"""The generator's end of the weights channel (core.weights_channel has the protocol and the publisher).

What must hold:
- Nothing the publisher's socket delivers stops the subscriber: every malformed chunk raises `WireError`
  inside, is dropped and counted (`dropped`), and the version it belonged to is abandoned; `poll` goes on.
- Every header number is an integer in range before it is used, shapes, dtypes and byte counts agree, and a
  version's buffers are checked against what this subscriber expects (`expected`: tensor name -> shape, the
  model's own parameters) and against `max_total_bytes` *before* anything is allocated.
- Chunks of a version arrive in order (one publisher, one connection). A chunk 0 of a version newer than the
  last one handed out supersedes a partial version (counted in `abandoned`); chunks of any other version
  that do not continue the one being assembled are dropped. So a bogus or abandoned version never blocks
  the next valid one.
"""
from __future__ import annotations

import logging
import math
import uuid

import msgpack
import numpy as np
import zmq

from core.curve import CurveClient
from core.trajectory import WireError
from core.transport import DropLog, messages
from core.weights_channel import MAX_CONTROL_BYTES, TensorBytes, WeightSet, itemsize

log = logging.getLogger("agentgym.weights")

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


class _Assembly:
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

    def add(self, seq: int, parts: list, frames: list) -> None:
        if seq != self.next_seq:
            raise WireError("seq", f"chunk {seq} of version {self.version} arrived, expected {self.next_seq}")
        for (name, dtype, shape, offset, total), frame in zip(parts, frames):
            if name not in self.buffers:
                self._allocate(name, dtype, shape, total)
            elif self.buffers[name][:2] != (dtype, shape):
                raise WireError("parts", f"{name}: dtype/shape differ between chunks of version {self.version}")
            buf = self.buffers[name][2]
            n = len(frame)
            if offset != self.filled[name] or offset + n > len(buf):
                raise WireError("parts", f"{name}: bytes [{offset}, {offset + n}) do not continue "
                                         f"{self.filled[name]} within {len(buf)}")
            buf.data[offset:offset + n] = frame  # a memoryview slice copy runs at memcpy speed
            self.filled[name] += n
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


class WeightSubscriber:
    """A generator's end. Connects, says hello, and hands out complete versions.

    `expected` (tensor name -> shape) and `max_total_bytes` bound what a version may allocate; `curve` makes
    the connection authenticated and encrypted (core.curve). Buffers are reused: a `WeightSet` returned by
    `poll` stays valid until the *second* version after it completes (apply it, or copy it, before then).
    """

    def __init__(self, endpoint: str, name: str | None = None, ctx: zmq.Context | None = None,
                 curve: CurveClient | None = None, expected: dict[str, tuple[int, ...]] | None = None,
                 max_total_bytes: int = 0, max_chunk_bytes: int = 1 << 30):
        self._ctx = ctx or zmq.Context.instance()
        self.name = name or f"generator-{uuid.uuid4().hex[:8]}"
        self.expected = {k: tuple(v) for k, v in expected.items()} if expected is not None else None
        if self.expected is not None and not max_total_bytes:  # the widest dtype a version may use
            max_total_bytes = sum(math.prod(s) for s in self.expected.values()) * 8
        self.max_total_bytes = max_total_bytes
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.ROUTING_ID, f"{self.name}-{uuid.uuid4().hex[:6]}".encode())
        self._sock.setsockopt(zmq.RCVHWM, 8)
        self._sock.setsockopt(zmq.LINGER, 1000)
        self._sock.setsockopt(zmq.MAXMSGSIZE, max(max_chunk_bytes, MAX_CONTROL_BYTES))
        if curve is not None:
            curve.apply(self._sock)
        self._sock.connect(endpoint)
        self._sock.send_multipart([b"H", msgpack.packb({"name": self.name})])
        self._assembly: _Assembly | None = None
        # One buffer set: the version handed out stays untouched until the next `poll`, which lends its buffers
        # to the next assembly, so steady-state updates allocate (and page-fault) nothing and a subscriber holds
        # one model's worth of bytes. A consumer applies (copies) a version before it polls again.
        self._handed_out: dict[str, np.ndarray] = {}
        self._spare: dict[str, np.ndarray] = {}
        self.latest_version = -1
        self.drops = DropLog("weights chunk", log)
        self.abandoned = 0

    def poll(self, timeout_ms: int | None = 0) -> WeightSet | None:
        """Receive chunks until a version is complete (returned) or `timeout_ms` passes (None). The version
        returned before is released: its arrays may be overwritten from now on."""
        self._spare.update(self._handed_out)
        self._handed_out = {}
        for parts in messages(self._sock, timeout_ms):
            try:
                done = self._accept([p.buffer for p in parts])
            except WireError as exc:
                if self._assembly is not None:  # a version with a bad chunk cannot be trusted
                    self._spare.update({n: b for n, (_, _, b) in self._assembly.buffers.items()})
                    self._assembly = None
                self.drops.drop(f"the publisher (at {self.name})", exc.field, str(exc))
                continue
            if done is not None:
                return done
        return None

    @property
    def held_bytes(self) -> int:
        """Bytes of receive buffers this subscriber holds now (handed out, spare and being assembled)."""
        sets = [self._handed_out, self._spare] + ([{n: b for n, (_, _, b) in self._assembly.buffers.items()}]
                                                  if self._assembly is not None else [])
        return sum(b.nbytes for held in sets for b in held.values())

    @property
    def dropped(self) -> int:
        """Chunks dropped as malformed."""
        return self.drops.total

    def _accept(self, frames: list) -> WeightSet | None:
        if len(frames) < 2 or bytes(frames[0]) != b"C":
            raise WireError("kind", "expected a weights chunk")
        version, seq, n_chunks, parts = parse_chunk_header(frames[1], len(frames) - 2)
        if version <= self.latest_version:
            return None  # an old version finishing after a newer one was applied
        current = self._assembly
        if current is None or current.version != version:
            if seq != 0:
                raise WireError("seq", f"chunk {seq} of version {version}, which has not begun here")
            if current is not None:  # abandoned by the publisher: a version that began later supersedes it
                self.abandoned += 1
                self._spare.update({n: b for n, (_, _, b) in current.buffers.items()})
            current = self._assembly = _Assembly(version, n_chunks, self._spare, self.expected,
                                                 self.max_total_bytes)
        elif n_chunks != current.n_chunks:
            raise WireError("n_chunks", f"version {version} changed its chunk count")
        current.add(seq, parts, frames[2:])
        if not current.complete():
            return None
        done = current.result()
        self._handed_out = {n: b for n, (_, _, b) in current.buffers.items()}
        self._assembly = None
        self.latest_version = version
        return done

    def ack(self, version: int, ok: bool = True, error: str = "") -> None:
        self._sock.send_multipart([b"A", msgpack.packb({"version": version, "ok": ok, "error": error[:1000]})])

    def close(self) -> None:
        self._sock.close(1000)
