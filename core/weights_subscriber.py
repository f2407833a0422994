"""The generator's end of the weights channel (core.weights_channel has the protocol and the publisher).

What must hold:
- Nothing the publisher's socket delivers stops the subscriber: every malformed chunk raises `WireError`
  inside, is dropped and counted (`dropped`), and the version it belonged to is abandoned; `poll` goes on.
- Every header number is an integer in range before it is used, shapes, dtypes and byte counts agree, and a
  version's buffers are checked against what this subscriber expects (`expected`: tensor name -> shape, the
  model's own parameters) and against `max_total_bytes` *before* anything is allocated.
- Chunks of a version arrive in order on each path (the publisher's connection, or a relay predecessor's). A
  chunk 0 of a version newer than the one being assembled and the last one handed out supersedes a partial
  version (counted in `abandoned`); a chunk this subscriber already has (a re-feed after the chain was re-linked)
  is ignored; chunks that do not continue the version being assembled are dropped. So a bogus or abandoned
  version never blocks the next valid one.
- Relay (`relay_host` given; core.weights_relay has the chain): every chunk accepted here, and only those, is
  forwarded to the successor the publisher names, before the version it completes is handed out; progress
  reports go to the publisher every `heartbeat_s` while polling, and at once when a version completes.
"""
from __future__ import annotations

import logging
import math
import time
import uuid

import msgpack
import numpy as np
import zmq

from core.curve import CurveClient, release_handler
from core.trajectory import WireError
from core.transport import DropLog
from core.weights_channel import MAX_CONTROL_BYTES, TensorBytes, WeightSet, itemsize
from core.weights_control import parse_link, progress_message
from core.weights_forward import Forwarder

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
                 max_total_bytes: int = 0, max_chunk_bytes: int = 1 << 30, relay_host: str | None = None,
                 relay_advertise: str = "", heartbeat_s: float = 0.25):
        """`relay_host`: bind a forwarding socket there and take part in a relay chain (None: receive only from
        the publisher); `relay_advertise`: the address others reach it at when `relay_host` is a wildcard."""
        # A relay subscriber forwards frames zero-copy and serves CURVE: its own context (and ZAP handler).
        self._own_ctx = ctx is None and relay_host is not None
        self._ctx = zmq.Context() if self._own_ctx else (ctx or zmq.Context.instance())
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
        self.relay: Forwarder | None = None
        if relay_host is not None:
            self.relay = Forwarder(self._ctx, self.name, relay_host, curve.keys if curve is not None else None,
                                   max(max_chunk_bytes, MAX_CONTROL_BYTES), advertise=relay_advertise)
        self._sock.connect(endpoint)
        hello = {"name": self.name, **({"relay": self.relay.endpoint} if self.relay is not None else {})}
        self._sock.send_multipart([b"H", msgpack.packb(hello)])
        self._assembly: _Assembly | None = None
        # One buffer set: the version handed out stays untouched until the next `poll`, which lends its buffers
        # to the next assembly, so steady-state updates allocate (and page-fault) nothing and a subscriber holds
        # one model's worth of bytes. A consumer applies (copies) a version before it polls again.
        self._handed_out: dict[str, np.ndarray] = {}
        self._spare: dict[str, np.ndarray] = {}
        self._ready: WeightSet | None = None  # complete, handed out once forwarded on (relay)
        self._ready_buffers: dict[str, np.ndarray] = {}
        self.latest_version = -1
        self.drops = DropLog("weights chunk", log)
        self.abandoned = 0
        self.heartbeat_s = heartbeat_s
        self._epoch = 0
        self._reported = 0.0

    def poll(self, timeout_ms: int | None = 0) -> WeightSet | None:
        """Receive chunks until a version is complete (returned) or `timeout_ms` passes (None). The version
        returned before is released: its arrays may be overwritten from now on."""
        self._spare.update(self._handed_out)
        self._handed_out = {}
        deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000
        relay = self.relay
        while True:
            drained = relay is None or relay.flush()
            if self._ready is not None and drained:
                return self._hand_out()
            if relay is not None and time.monotonic() - self._reported >= self.heartbeat_s:
                self._report()
            left = None if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
            wait = left if relay is None else min(left if left is not None else 1 << 30, int(self.heartbeat_s * 1000))
            poller = zmq.Poller()
            if drained:  # backpressure: while the successor's queue is full, nothing more is read
                poller.register(self._sock, zmq.POLLIN)
                if relay is not None:
                    poller.register(relay.inbound, zmq.POLLIN)
            elif relay.out is not None:
                poller.register(relay.out, zmq.POLLOUT)
            events = dict(poller.poll(wait)) if poller.sockets else {}
            if not events and not poller.sockets:
                time.sleep(min(wait, 5) / 1000)
            if self._sock in events:
                self._receive(self._sock.recv_multipart(copy=False), "the publisher")
            elif relay is not None and relay.inbound in events:
                self._receive(relay.inbound.recv_multipart(copy=False)[1:], "a relay predecessor")
            if not events and deadline is not None and time.monotonic() >= deadline:
                return None

    def _receive(self, frames: list, source: str) -> None:
        if frames and bytes(frames[0].buffer) == b"L" and source == "the publisher":
            try:
                self._link(frames)
            except WireError as exc:
                self.drops.drop(f"{source} (at {self.name})", exc.field, str(exc))
            return
        try:
            done = self._accept([f.buffer for f in frames])
        except WireError as exc:
            if self._assembly is not None:  # a version with a bad chunk cannot be trusted
                self._spare.update({n: b for n, (_, _, b) in self._assembly.buffers.items()})
                self._assembly = None
            self.drops.drop(f"{source} (at {self.name})", exc.field, str(exc))
            return
        if self._accepted and self.relay is not None:
            self.relay.forward(frames)
        if done is not None:
            self._ready = done
            if self.relay is not None:
                self._report()

    def _link(self, frames: list) -> None:
        link = parse_link(frames)
        if self.relay is None:
            raise WireError("kind", "a relay link for a subscriber that does not relay")
        self.relay.admit(link.prev_key)
        self.relay.link(link.next, link.next_key, link.stall_s)
        self._epoch = max(self._epoch, link.epoch)
        self._report()

    def _report(self) -> None:
        """Tell the publisher what this subscriber holds (core.weights_relay reads it)."""
        a = self._assembly
        have = (a.version, a.next_seq, False) if a is not None else (self.latest_version, 0, True)
        self._reported = time.monotonic()
        try:  # never blocks: with the publisher gone, reports are dropped, not queued without end
            blocked = self.relay is not None and self.relay.blocked
            self._sock.send_multipart(progress_message(*have, self._epoch, blocked), flags=zmq.NOBLOCK)
        except zmq.Again:
            pass

    def _hand_out(self) -> WeightSet:
        done, self._ready = self._ready, None
        self._handed_out, self._ready_buffers = self._ready_buffers, {}
        return done

    @property
    def held_bytes(self) -> int:
        """Bytes of receive buffers this subscriber holds now (handed out, spare and being assembled)."""
        assembling = self._assembly.buffers.items() if self._assembly is not None else ()
        sets = [self._handed_out, self._spare, self._ready_buffers, {n: b for n, (_, _, b) in assembling}]
        return sum(b.nbytes for held in sets for b in held.values())

    @property
    def dropped(self) -> int:
        """Chunks dropped as malformed."""
        return self.drops.total

    def _accept(self, frames: list) -> WeightSet | None:
        """Take one chunk; the version it completes, else None. `_accepted` says whether it was new here."""
        self._accepted = False
        if len(frames) < 2 or bytes(frames[0]) != b"C":
            raise WireError("kind", "expected a weights chunk")
        version, seq, n_chunks, parts = parse_chunk_header(frames[1], len(frames) - 2)
        if version <= self.latest_version:
            return None  # an old version finishing after a newer one was applied
        current = self._assembly
        if current is not None and version < current.version:
            return None  # an older version, late on a slower path
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
        elif seq < current.next_seq:
            return None  # a chunk this subscriber has: the version was fed again after a re-link
        current.add(seq, parts, frames[2:])
        self._accepted = True
        if not current.complete():
            return None
        done = current.result()
        self._ready_buffers = {n: b for n, (_, _, b) in current.buffers.items()}
        self._assembly = None
        self.latest_version = version
        return done

    def ack(self, version: int, ok: bool = True, error: str = "") -> None:
        self._sock.send_multipart([b"A", msgpack.packb({"version": version, "ok": ok, "error": error[:1000]})])

    def close(self) -> None:
        if self.relay is not None:
            self.relay.close()
        self._sock.close(1000)
        if self._own_ctx:
            release_handler(self._ctx)
            self._ctx.term()
