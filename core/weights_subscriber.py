"""The generator's end of the weights channel (core.weights_channel has the protocol and the publisher).

What must hold:
- Nothing the publisher's socket delivers stops the subscriber: every malformed chunk raises `WireError`
  inside, is dropped and counted (`dropped`), and the version it belonged to is abandoned; `poll` goes on.
- Every header number is an integer in range before it is used, shapes, dtypes and byte counts agree, and a
  version's buffers are checked against what this subscriber expects (`expected`: tensor name -> shape, the
  model's own parameters) and against `max_total_bytes` *before* anything is allocated (core.weights_assembly).
- Sealed (`curve` with cipher aes-gcm, core.weights_seal): every message is opened before anything reads it;
  one that does not open is dropped and counted (reason "auth") and leaves what is being assembled as it was.
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

from core.admission import apply_admission
from core.curve import CurveClient, release_handler
from core.seal import SealError
from core.trajectory import WireError
from core.transport import DropLog
from core.weights_assembly import Assembly, parse_chunk_header
from core.weights_channel import MAX_CONTROL_BYTES, WeightSet
from core.weights_control import parse_link, progress_message, unpack_map
from core.weights_forward import Forwarder
from core.weights_seal import OpenChunk, SubscriberSeal, is_chunk

log = logging.getLogger("agentgym.weights")

KEY_WAIT_S = 2.0  # how long a relayed chunk sealed with a key not yet known waits for it on the publisher's path


class WeightSubscriber:
    """A generator's end. Connects, says hello, and hands out complete versions.

    `expected` (tensor name -> shape) and `max_total_bytes` bound what a version may allocate; `curve` makes
    the connection authenticated and encrypted (core.curve). Buffers are reused: a `WeightSet` returned by
    `poll` stays valid until the *second* version after it completes (apply it, or copy it, before then).
    """

    def __init__(self, endpoint: str, name: str | None = None, ctx: zmq.Context | None = None,
                 curve: CurveClient | None = None, expected: dict[str, tuple[int, ...]] | None = None,
                 max_total_bytes: int = 0, max_chunk_bytes: int = 1 << 30, relay_host: str | None = None,
                 relay_advertise: str = "", heartbeat_s: float = 0.25, shm: bool = False):
        """`relay_host`: bind a forwarding socket there and take part in a relay chain (None: receive only from
        the publisher); `relay_advertise`: the address others reach it at when `relay_host` is a wildcard.
        `shm`: take versions from the publisher's shared memory when it is on this node (core.weights_shm)."""
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
        # aes-gcm: every message sealed here (core.weights_seal), chunks forwarded still sealed; curvezmq: CURVE
        # on this socket and on the relay sockets.
        sealed = curve is not None and curve.cipher == "aes-gcm"
        self.seal = SubscriberSeal(curve, MAX_CONTROL_BYTES) if sealed else None
        curve_sockets = curve is not None and self.seal is None
        if curve_sockets:
            curve.apply(self._sock)
        elif self.seal is not None:  # the admission handshake before any message (core.admission)
            apply_admission(self._sock, curve)
        self.relay: Forwarder | None = None
        if relay_host is not None:
            self.relay = Forwarder(self._ctx, self.name, relay_host, curve.keys if curve is not None else None,
                                   max(max_chunk_bytes, MAX_CONTROL_BYTES), advertise=relay_advertise,
                                   cipher=curve.cipher if curve is not None else "curvezmq")
        self._sock.connect(endpoint)
        hello = {"name": self.name, **({"relay": self.relay.endpoint} if self.relay is not None else {}),
                 **({"shm": True} if shm else {})}
        self.shm = shm
        self.shelved = 0  # versions taken from the publisher's shared memory
        self._send([b"H", msgpack.packb(hello)])
        self._assembly: Assembly | None = None
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

    def _send(self, message: list, flags: int = 0) -> None:
        self._sock.send_multipart(self.seal.seal(message) if self.seal is not None else message, flags=flags)

    def _receive(self, received: list, source: str) -> None:
        frames = [f.buffer for f in received]
        try:
            if self.seal is not None:
                frames, chunk = self._open(frames, source)
            else:
                chunk = None
        except SealError as exc:
            self.drops.drop(f"{source} (at {self.name})", "auth", str(exc))
            return
        if frames and bytes(frames[0][:2]) == b"L" and source == "the publisher":
            try:
                self._link(frames)
            except WireError as exc:
                self.drops.drop(f"{source} (at {self.name})", exc.field, str(exc))
            return
        if frames and bytes(frames[0][:2]) == b"K" and self.seal is not None:
            return  # the chunk key, learned in `_open`
        if frames and bytes(frames[0][:2]) in (b"M", b"S") and source == "the publisher" and self.shm:
            try:
                self._same_node(frames)
            except WireError as exc:
                self.drops.drop(f"{source} (at {self.name})", exc.field, str(exc))
            return
        try:
            done = self._accept(frames, chunk)
        except SealError as exc:  # a forged part: refused, the assembly untouched
            self.drops.drop(f"{source} (at {self.name})", "auth", str(exc))
            return
        except WireError as exc:
            if self._assembly is not None:  # a version with a bad chunk cannot be trusted
                self._spare.update({n: b for n, (_, _, b) in self._assembly.buffers.items()})
                self._assembly = None
            self.drops.drop(f"{source} (at {self.name})", exc.field, str(exc))
            return
        if self._accepted and self.relay is not None:
            self.relay.forward(received)
        if done is not None:
            self._ready = done
            if self.relay is not None:
                self._report()

    def _open(self, frames: list, source: str):
        """(plain frames, None) of a message sealed for this subscriber, or ([b"C", header], OpenChunk) of a
        sealed chunk; SealError if it is neither."""
        if not is_chunk(frames):
            if source != "the publisher":
                raise self.seal.chunks.refuse("malformed", "not a sealed chunk")
            return self.seal.open_control(frames), None
        if not self.seal.chunks.has_key and source != "the publisher":
            # A predecessor's chunk can overtake the key, sent on the publisher's connection: read that first
            # (only before the key has come: a chunk with another key is refused at once).
            deadline = time.monotonic() + KEY_WAIT_S
            while not self.seal.chunks.knows(frames) and \
                    self._sock.poll(max(0, int((deadline - time.monotonic()) * 1000))):
                self._receive(self._sock.recv_multipart(copy=False), "the publisher")
        chunk = self.seal.chunks.open(frames)
        return [b"C", chunk.header] + frames[2:], chunk

    def _same_node(self, frames: list) -> None:
        """The publisher's probe (answered with the token read from its memory) or a version on its shelf."""
        from core.weights_shm import parse_shelved, read_probe, unpack_shelved

        if len(frames) != 2:
            raise WireError("frames", f"expected 2 frames, got {len(frames)}")
        if bytes(frames[0]) == b"M":
            path = unpack_map(frames[1]).get("path")
            token = read_probe(path) if isinstance(path, str) and path.startswith("/") else b""
            if token:
                self._send([b"M", msgpack.packb({"token": token.hex()})])
            return
        shelved = parse_shelved(unpack_shelved(frames[1]), self.expected, self.max_total_bytes)
        if shelved.version <= self.latest_version:
            return
        if self._assembly is not None and self._assembly.version < shelved.version:
            self.abandoned += 1  # superseded over TCP: its buffers go back to the spares
            self._spare.update({n: b for n, (_, _, b) in self._assembly.buffers.items()})
            self._assembly = None
        self._spare.update(self._ready_buffers)  # a TCP version not yet handed out is superseded too
        self._ready, self._ready_buffers = shelved, {}
        self.latest_version = shelved.version
        self.shelved += 1

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
            self._send(progress_message(*have, self._epoch, blocked), flags=zmq.NOBLOCK)
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

    def _accept(self, frames: list, sealed: OpenChunk | None = None) -> WeightSet | None:
        """Take one chunk (`sealed`: its parts are still sealed); the version it completes, else None.
        `_accepted` says whether it was new here."""
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
            current = Assembly(version, n_chunks, self._spare, self.expected, self.max_total_bytes)
        elif n_chunks != current.n_chunks:
            raise WireError("n_chunks", f"version {version} changed its chunk count")
        elif seq < current.next_seq:
            return None  # a chunk this subscriber has: the version was fed again after a re-link
        try:
            current.add(seq, parts, frames[2:], sealed)
        except WireError:  # a forged part (SealError) leaves what was being assembled as it was
            if current is not self._assembly:
                self._spare.update({n: b for n, (_, _, b) in current.buffers.items()})
            raise
        if current is not self._assembly:
            if self._assembly is not None:  # abandoned by the publisher: a version that began later supersedes it
                self.abandoned += 1
                self._spare.update({n: b for n, (_, _, b) in self._assembly.buffers.items()})
            self._assembly = current
        self._accepted = True
        if not current.complete():
            return None
        done = current.result()
        self._ready_buffers = {n: b for n, (_, _, b) in current.buffers.items()}
        self._assembly = None
        self.latest_version = version
        return done

    def ack(self, version: int, ok: bool = True, error: str = "") -> None:
        self._send([b"A", msgpack.packb({"version": version, "ok": ok, "error": error[:1000]})])

    def close(self) -> None:
        if self.relay is not None:
            self.relay.close()
        self._sock.close(1000)
        if self._own_ctx:
            release_handler(self._ctx)
            self._ctx.term()
