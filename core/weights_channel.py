"""ZeroMQ weights channel: one publisher (learner rank 0) to every generator, versioned, chunked, acknowledged.

Protocol (every control payload is msgpack; tensor bytes travel as raw zero-copy frames):
  subscriber -> publisher  [b"H", {"name"}]                        hello: register to receive weights
  publisher -> subscriber  [b"C", header, part_0, ..., part_k]     one chunk of version `header.version`
  subscriber -> publisher  [b"A", {"version", "ok", "error"}]       ack after the caller applied the version

A chunk header is {"version", "seq", "n_chunks", "parts": [[name, dtype, shape, offset, total_nbytes], ...]}:
part i holds bytes [offset, offset + len(frame_i)) of tensor `name`. Tensors larger than `chunk_bytes` span
several chunks; small ones share a chunk. dtype is a string ("float32", "bfloat16", ...): the channel moves
bytes and never interprets them, so core needs no torch. A subscriber exposes a version only once every
byte of every tensor has arrived; a version that is superseded mid-transfer is discarded.
"""
from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from typing import Iterable, Iterator

import msgpack
import numpy as np
import zmq

from core.transport import LOOPBACK, bind_endpoint
from core.trajectory import WireError

log = logging.getLogger("agentgym.weights")


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

    @property
    def nbytes(self) -> int:
        return sum(len(t.data) for t in self.tensors.values())


def byte_view(data) -> memoryview:
    """A flat byte view of a C-contiguous buffer (an empty buffer of any shape gives an empty view)."""
    view = memoryview(data)
    return view.cast("B") if view.nbytes else memoryview(b"")


def _chunks(tensors: Iterable[TensorBytes], chunk_bytes: int) -> Iterator[list[tuple[TensorBytes, int, memoryview]]]:
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


class WeightPublisher:
    """The learner's end. Binds; generators connect and say hello."""

    def __init__(self, host: str = LOOPBACK, port: int = 0, chunk_bytes: int = 4 << 20,
                 hwm: int = 8, ctx: zmq.Context | None = None):
        # Chunks stay well under glibc's 32 MB mmap threshold, so the receiver's per-message buffers are
        # recycled from the heap instead of being mapped (and page-faulted) afresh for every chunk.
        # Weights go out zero-copy: an own context, terminated on close, outlives every queued frame.
        self._own_ctx = ctx is None
        self._ctx = ctx or zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # an unknown peer raises instead of dropping silently
        self._sock.setsockopt(zmq.SNDHWM, hwm)
        self._sock.setsockopt(zmq.LINGER, 0)
        self.endpoint = bind_endpoint(self._sock, host, port)
        self.chunk_bytes = chunk_bytes
        self.peers: dict[bytes, str] = {}
        self.acks: dict[int, dict[str, tuple[bool, str]]] = {}

    def _handle(self, parts: list[bytes]) -> None:
        if len(parts) != 3 or parts[1] not in (b"H", b"A"):
            log.warning("weights publisher: ignoring a malformed message of %d parts", len(parts))
            return
        try:
            body = msgpack.unpackb(parts[2], raw=False, max_str_len=4096, max_map_len=16)
        except Exception as exc:
            log.warning("weights publisher: bad control payload from %r: %s", parts[0], exc)
            return
        if parts[1] == b"H":
            self.peers[parts[0]] = str(body.get("name", parts[0].hex()))
        else:
            name = self.peers.get(parts[0], parts[0].hex())
            self.acks.setdefault(int(body["version"]), {})[name] = (bool(body["ok"]), str(body.get("error", "")))

    def poll(self, timeout_ms: int = 0) -> None:
        """Process pending hellos and acks."""
        while self._sock.poll(timeout_ms):
            self._handle(self._sock.recv_multipart())
            timeout_ms = 0

    def wait_for_peers(self, n: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.peers) < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(self.peers)} of {n} weight subscribers said hello")
            self.poll(50)

    def publish(self, version: int, tensors: Iterable[TensorBytes]) -> int:
        """Send `version` to every registered peer; returns the number of bytes per peer.

        Blocks while a peer's queue is full (it is bounded by `hwm` chunks), so memory stays bounded.
        """
        self.poll(0)
        if not self.peers:
            log.warning("weights publisher: version %d has no subscribers", version)
        tensors = list(tensors)
        chunks = list(_chunks(tensors, self.chunk_bytes))
        total = 0
        for seq, chunk in enumerate(chunks):
            header = msgpack.packb({
                "version": version, "seq": seq, "n_chunks": len(chunks),
                "parts": [[t.name, t.dtype, list(t.shape), off, byte_view(t.data).nbytes]
                          for t, off, _ in chunk],
            })
            frames = [b"C", header] + [view for _, _, view in chunk]
            total += sum(len(v) for _, _, v in chunk)
            for peer in list(self.peers):
                try:
                    self._sock.send_multipart([peer] + frames, copy=False)
                except zmq.ZMQError as exc:  # EHOSTUNREACH: the peer went away
                    log.warning("weights publisher: dropping peer %s (%s)", self.peers.pop(peer), exc)
                self.poll(0)
        return total

    def wait_acks(self, version: int, timeout_s: float) -> dict[str, tuple[bool, str]]:
        """Wait until every registered peer acked `version`; returns {peer name: (ok, error)}.

        Raises TimeoutError naming the peers that did not answer in time.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            got = self.acks.get(version, {})
            missing = [n for n in self.peers.values() if n not in got]
            if not missing:
                return dict(got)
            if time.monotonic() > deadline:
                raise TimeoutError(f"weights version {version}: no ack from {', '.join(sorted(missing))}")
            self.poll(50)

    def close(self, linger_ms: int = 0) -> None:
        self._sock.close(linger_ms)
        if self._own_ctx:
            self._ctx.term()


class _Assembly:
    """Buffers for one version while its chunks arrive."""

    def __init__(self, version: int, n_chunks: int, spare: dict[str, np.ndarray] | None = None):
        self.version = version
        self.n_chunks = n_chunks
        self.seen: set[int] = set()
        self.buffers: dict[str, tuple[str, tuple[int, ...], np.ndarray]] = {}
        self.filled: dict[str, int] = {}
        self.spare = spare or {}  # byte buffers of an older version, reused when the sizes match

    def add(self, header: dict, frames: list) -> None:
        seq = header["seq"]
        if seq in self.seen or not 0 <= seq < self.n_chunks:
            raise WireError("seq", f"chunk {seq} repeated or outside [0, {self.n_chunks})")
        parts = header["parts"]
        if len(parts) != len(frames):
            raise WireError("parts", f"{len(parts)} part descriptors for {len(frames)} frames")
        for (name, dtype, shape, offset, total), frame in zip(parts, frames):
            if name not in self.buffers:
                expected = int(np.prod(shape, dtype=np.int64)) * _itemsize(dtype)
                if expected != total:
                    raise WireError("parts", f"{name}: shape {shape} of {dtype} is {expected} bytes, not {total}")
                buf = self.spare.pop(name, None)
                if buf is None or buf.nbytes != total:
                    buf = np.empty(total, np.uint8)  # not zero-filled: every byte is written before use
                self.buffers[name] = (dtype, tuple(shape), buf)
                self.filled[name] = 0
            elif self.buffers[name][:2] != (dtype, tuple(shape)) or len(self.buffers[name][2]) != total:
                raise WireError("parts", f"{name}: dtype/shape differ between chunks of version {self.version}")
            buf = self.buffers[name][2]
            n = len(frame)
            if offset < 0 or offset + n > len(buf):
                raise WireError("parts", f"{name}: bytes [{offset}, {offset + n}) outside 0..{len(buf)}")
            buf.data[offset:offset + n] = frame  # a memoryview slice copy runs at memcpy speed
            self.filled[name] += n
        self.seen.add(seq)

    def complete(self) -> bool:
        return len(self.seen) == self.n_chunks and all(
            self.filled[n] == len(b[2]) for n, b in self.buffers.items())

    def result(self) -> WeightSet:
        return WeightSet(self.version, {n: TensorBytes(n, d, s, b.data) for n, (d, s, b) in self.buffers.items()})


_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4, "int8": 1,
             "uint8": 1, "bool": 1, "int16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}


def _itemsize(dtype: str) -> int:
    if dtype not in _ITEMSIZE:
        raise WireError("dtype", f"unsupported dtype {dtype!r}")
    return _ITEMSIZE[dtype]


class WeightSubscriber:
    """A generator's end. Connects, says hello, and hands out complete versions.

    Buffers are reused: a `WeightSet` returned by `poll` stays valid until the *second* version after it
    completes (apply it, or copy what you keep, before then).
    """

    def __init__(self, endpoint: str, name: str | None = None, ctx: zmq.Context | None = None):
        self._ctx = ctx or zmq.Context.instance()
        self.name = name or f"generator-{uuid.uuid4().hex[:8]}"
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.ROUTING_ID, f"{self.name}-{uuid.uuid4().hex[:6]}".encode())
        self._sock.setsockopt(zmq.RCVHWM, 8)
        self._sock.setsockopt(zmq.LINGER, 1000)
        self._sock.connect(endpoint)
        self._sock.send_multipart([b"H", msgpack.packb({"name": self.name})])
        self._assembly: _Assembly | None = None
        # Double buffering: the version handed out last stays untouched; the one before it lends its buffers
        # to the next assembly, so steady-state updates allocate (and page-fault) nothing.
        self._handed_out: dict[str, np.ndarray] = {}
        self._spare: dict[str, np.ndarray] = {}
        self.latest_version = -1
        self.dropped = 0

    def poll(self, timeout_ms: int | None = 0) -> WeightSet | None:
        """Receive chunks until a version is complete (returned) or `timeout_ms` passes (None)."""
        deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000
        while True:
            wait = None if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
            if not self._sock.poll(wait):
                return None
            parts = self._sock.recv_multipart(copy=False)
            try:
                done = self._accept([p.buffer for p in parts])
            except (WireError, KeyError, TypeError, ValueError) as exc:
                self.dropped += 1
                self._assembly = None  # a version with a bad chunk cannot be trusted; wait for the next one
                log.warning("weights subscriber %s: dropped a bad chunk: %s", self.name, exc)
                continue
            if done is not None:
                return done

    def _accept(self, parts: list) -> WeightSet | None:
        if len(parts) < 2 or bytes(parts[0]) != b"C":
            raise WireError("kind", "expected a weights chunk")
        header = msgpack.unpackb(parts[1], raw=False, max_array_len=1 << 20)
        version, n_chunks = int(header["version"]), int(header["n_chunks"])
        if version <= self.latest_version:
            return None  # an old version finishing after a newer one was applied
        if self._assembly is None or self._assembly.version != version:
            if self._assembly is not None and version < self._assembly.version:
                return None
            self._assembly = _Assembly(version, n_chunks, self._spare)  # a newer version supersedes a partial one
        self._assembly.add(header, parts[2:])
        if not self._assembly.complete():
            return None
        done = self._assembly.result()
        self._spare, self._handed_out = self._handed_out, {n: b for n, (_, _, b) in self._assembly.buffers.items()}
        self._assembly = None
        self.latest_version = version
        return done

    def ack(self, version: int, ok: bool = True, error: str = "") -> None:
        self._sock.send_multipart([b"A", msgpack.packb({"version": version, "ok": ok, "error": error})])

    def close(self) -> None:
        self._sock.close(1000)
