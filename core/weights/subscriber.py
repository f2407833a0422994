"""The generator's end of the weights channel (core.weights.publisher has the protocol and the publisher).

What must hold:
- Nothing a socket delivers stops the subscriber or raises out of `poll`: a malformed chunk raises `WireError`
  inside and is dropped and counted (`drops`, by field); a MemoryError while taking one, the last line, the
  same (field "memory"). A dropped chunk leaves what is being assembled exactly as it was.
- Every header number is an integer in range before it is used, shapes, dtypes and byte counts agree, and a
  version's buffers are checked against what this subscriber expects (`expected`: tensor name -> shape, the
  model's own parameters) and against `max_total_bytes` *before* anything is allocated (core.weights.assembly);
  without either, the budget is this machine's physical memory, so no header can ask for more.
- Authenticity before order. Sealed (`curve` with cipher aes-gcm, core.weights.seal): a message is opened, and
  a chunk's every part authenticated, before it can change anything; one that does not open is refused and
  counted (reason "auth"). An authentic chunk out of place (an older version, a chunk held already, one that
  arrives early) is ignored and counted in `ignored`, by reason ("old", "duplicate", "early"): never a reason to
  drop the version being assembled, so the genuine chunks that follow still complete it.
- Hello until answered. A hello the publisher has not answered in `HELLO_RETRY_S` is said again on each poll: a
  restarted process whose hello reached the publisher before the old connection's close did (auth off, where a
  name held by an open connection is refused) is taken at the next try instead of never.
- Versions. The publisher answers the hello with a K message bound to this incarnation's nonce, naming the
  version it is at: this subscriber never takes an older one (a restarted replica cannot be rolled back), and
  with aes-gcm it holds only the chunk keys of versions announced to it since. A chunk from a relay predecessor
  must be of a version the publisher announced (a K message before each version; one racing its chunk is
  awaited at most `KEY_WAIT_S`, once per version): a number far ahead, authenticated or not, is dropped and
  counted (field "version"), never waited on. A chunk 0 of a newer announced version supersedes a partial one,
  and any chunk 0 of an announced version supersedes one that took nothing for `stall_s` (the publisher's
  stall timeout when it relays): both counted in `abandoned` and logged. So no version number, and no chunk
  that never continues, can wedge a subscriber.
- Relay (`relay_host` given; core.weights.relay has the chain): every chunk accepted here, and only those, is
  forwarded to the successor the publisher names, before the version it completes is handed out; progress
  reports go to the publisher every `heartbeat_s` while polling, and at once when a version completes.
"""
from __future__ import annotations

import logging
import math
import os
import time
import uuid

import msgpack
import numpy as np
import zmq

from core.admission import apply_admission
from core.curve import CurveClient, release_handler
from core.seal import TAG_BYTES, SealError
from core.trajectory import WireError
from core.transport import DropLog
from core.weights.assembly import Assembly, parse_chunk_header
from core.weights.control import (DIGEST_BYTES, MAX_CONTROL_BYTES, chunk_digest, new_nonce, parse_link,
                                  progress_message, read_key_message, unpack_map)
from core.weights.forward import Forwarder
from core.weights.seal import KEY_MESSAGE, PUBLISHER, OpenChunk, SubscriberSeal, chunk_version, is_chunk
from core.weights.tensors import WeightSet

log = logging.getLogger("agentgym.weights")

KEY_WAIT_S = 2.0  # how long a relayed chunk of a version not yet announced waits for it on the publisher's path
HELLO_RETRY_S = 1.0  # a hello not answered in this long is said again (while polling)
STALL_S = 30.0  # a partial version that took nothing for this long gives way to any chunk 0 (until a link says)


def physical_memory() -> int:
    """Bytes of this machine's memory: no version can be larger."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def chunk_frame_cap(chunk_bytes: int) -> int:
    """The largest frame a genuine chunk of a publisher whose `chunk_bytes` is this can carry: a part holds at most
    `chunk_bytes` (core.weights.publisher splits larger tensors), plus a seal's tag. A subscriber's sockets cap
    frames there, so that an outsider's unfinished handshake frame is held no larger (core.admission)."""
    return max(chunk_bytes + TAG_BYTES, MAX_CONTROL_BYTES)


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
        `shm`: take versions from the publisher's shared memory when it is on this node (core.weights.shm)."""
        # A relay subscriber forwards frames zero-copy and serves CURVE: its own context (and ZAP handler).
        self._own_ctx = ctx is None and relay_host is not None
        self._ctx = zmq.Context() if self._own_ctx else (ctx or zmq.Context.instance())
        self.name = name or f"generator-{uuid.uuid4().hex[:8]}"
        self.expected = {k: tuple(v) for k, v in expected.items()} if expected is not None else None
        if self.expected is not None and not max_total_bytes:  # the widest dtype a version may use
            max_total_bytes = sum(math.prod(s) for s in self.expected.values()) * 8
        self.max_total_bytes = max_total_bytes or physical_memory()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.ROUTING_ID, f"{self.name}-{uuid.uuid4().hex[:6]}".encode())
        self._sock.setsockopt(zmq.RCVHWM, 8)
        self._sock.setsockopt(zmq.LINGER, 1000)
        self._sock.setsockopt(zmq.MAXMSGSIZE, max(max_chunk_bytes, MAX_CONTROL_BYTES))
        # aes-gcm: every message sealed here (core.weights.seal), chunks forwarded still sealed; curvezmq: CURVE
        # on this socket and on the relay sockets.
        sealed = curve is not None and curve.cipher == "aes-gcm"
        self.nonce = new_nonce()  # this incarnation's: the publisher's K message must repeat it
        self.seal = SubscriberSeal(curve, MAX_CONTROL_BYTES, self.nonce) if sealed else None
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
                 **({"shm": True} if shm else {}), "nonce": self.nonce}
        self.shm = shm
        self.shelved = 0  # versions taken from the publisher's shared memory
        self._hello = [b"H", msgpack.packb(hello)]
        self._hello_at = time.monotonic()
        try:  # never blocks: the pipe to the publisher exists from connect() until a refused handshake drops it
            self._send(self._hello, zmq.NOBLOCK)
        except zmq.Again:
            log.error("%s: no connection to the weights publisher at %s: its admission handshake refused this "
                      "subscriber (wrong or missing keys?); nothing will be received", self.name, endpoint)
        self._assembly: Assembly | None = None
        # One buffer set: the version handed out stays untouched until the next `poll`, which lends its buffers
        # to the next assembly, so steady-state updates allocate (and page-fault) nothing and a subscriber holds
        # one model's worth of bytes. A consumer applies (copies) a version before it polls again.
        self._handed_out: dict[str, np.ndarray] = {}
        self._spare: dict[str, np.ndarray] = {}
        self._ready: WeightSet | None = None  # complete, handed out once forwarded on (relay)
        self._ready_buffers: dict[str, np.ndarray] = {}
        self.latest_version = -1
        self.announced = -1  # the newest version the publisher announced to this incarnation
        self._answered = False  # whether its K message answering the hello came
        self._awaited = -1  # the last version a relayed chunk waited for the announcement of
        self.unkeyed = curve is None  # auth off: relayed chunks are checked against the publisher's digests
        self._digests: dict[int, bytes] = {}  # version -> its chunks' digests, from the publisher's K message
        self.key_wait_s, self.stall_s = KEY_WAIT_S, STALL_S
        self.drops = DropLog("weights chunk", log)
        self.ignored = DropLog("weights chunk (out of place: ignored)", log)
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
            if not self._answered:
                self._hello_again()
            left = None if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
            wait = left if relay is None else min(left if left is not None else 1 << 30, int(self.heartbeat_s * 1000))
            if not self._answered:  # wake up to say it again
                wait = min(wait if wait is not None else 1 << 30, int(HELLO_RETRY_S * 1000))
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

    def _hello_again(self) -> None:
        if time.monotonic() - self._hello_at < HELLO_RETRY_S:
            return
        self._hello_at = time.monotonic()
        try:
            self._send(self._hello, zmq.NOBLOCK)
        except zmq.Again:  # no pipe (a refused handshake): logged once, at the first hello
            pass

    def _send(self, message: list, flags: int = 0) -> None:
        self._sock.send_multipart(self.seal.seal(message) if self.seal is not None else message, flags=flags)

    def _receive(self, received: list, source: str) -> None:
        """Take one message from `source` (the receive loop's body): whatever it holds, nothing raises out."""
        where = f"{source} (at {self.name})"
        try:
            self._take(received, [f.buffer for f in received], source)
        except SealError as exc:  # not sealed with the run's keys, or forged: the assembly untouched
            self.drops.drop(where, "auth", str(exc))
        except WireError as exc:
            self.drops.drop(where, exc.field, str(exc))
        except MemoryError:  # the last line: the budget is checked before any allocation
            self.drops.drop(where, "memory", "no memory for a chunk within the budget")

    def _take(self, received: list, frames: list, source: str) -> None:
        chunk = None
        if self.seal is not None:
            if is_chunk(frames):
                version = chunk_version(frames)
                if version <= self.latest_version:  # no key needed to see it is of no use
                    self.ignored.drop(f"{source} (at {self.name})", "old", f"a chunk of version {version}")
                    return
                if source != PUBLISHER and not self.seal.chunks.knows(version):
                    self._await(version)
                chunk = self.seal.chunks.open(frames)
                frames = [b"C", chunk.header] + frames[2:]
            elif source != PUBLISHER:
                raise self.seal.chunks.refuse("malformed", "not a sealed chunk")
            else:
                frames = self.seal.open_control(frames)
        kind = bytes(frames[0][:2]) if frames else b""
        if source == PUBLISHER and (kind in (b"L", KEY_MESSAGE) or (kind in (b"M", b"S") and self.shm)):
            if kind == b"L":
                self._link(frames)
            elif kind == KEY_MESSAGE:
                self._announce(frames)
            else:
                self._same_node(frames)
            return
        done = self._accept(frames, chunk, source)
        if self._accepted and self.relay is not None:
            self.relay.forward(received)
        if done is not None:
            self._ready = done
            if self.relay is not None:
                self._report()

    def _announce(self, frames: list) -> None:
        """The publisher's K message (its key, if sealed, learned as it was opened): the version it is at, or
        publishes now. The first one answers this incarnation's hello: nothing older is taken from then on."""
        version, _, digests = read_key_message(frames, self.nonce, sealed=self.seal is not None)
        if digests and version >= 0:
            self._digests[version] = digests
            for old in [v for v in self._digests if v < version - 2]:  # bounded: a few versions' worth
                del self._digests[old]
        if not self._answered:
            self._answered = True
            self.latest_version = max(self.latest_version, version - 1)
            if self._assembly is not None and self._assembly.version <= self.latest_version:
                self._abandon(f"older than version {version}, which the publisher is at")
        self.announced = max(self.announced, version)

    def _announced(self, version: int) -> bool:
        return self.seal.chunks.knows(version) if self.seal is not None else version <= self.announced

    def _await(self, version: int) -> None:
        """Read what the publisher sent until `version` is announced: what is there now and, for the version
        after the last announced (or any before the hello was answered), up to `key_wait_s` more, once per
        version: a relayed chunk can overtake its K message, and a made-up number costs one wait at most."""
        wait = version != self._awaited and (not self._answered or version == self.announced + 1)
        if wait:
            self._awaited = version
        deadline = time.monotonic() + (self.key_wait_s if wait else 0)
        while not self._announced(version):
            if not self._sock.poll(max(0, int((deadline - time.monotonic()) * 1000))):
                return
            self._receive(self._sock.recv_multipart(copy=False), PUBLISHER)

    def _same_node(self, frames: list) -> None:
        """The publisher's probe (answered with the token read from its memory) or a version on its shelf."""
        from core.weights.shm import parse_shelved, read_probe, unpack_shelved

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
        self.stall_s = link.stall_s
        self._epoch = max(self._epoch, link.epoch)
        self._report()

    def _report(self) -> None:
        """Tell the publisher what this subscriber holds (core.weights.relay reads it)."""
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

    def _accept(self, frames: list, sealed: OpenChunk | None = None, source: str = PUBLISHER) -> WeightSet | None:
        """Take one chunk (`sealed`: its parts are still sealed); the version it completes, else None.
        `_accepted` says whether it was new here. Raises WireError (SealError) leaving the assembly as it was."""
        self._accepted = False
        if len(frames) < 2 or bytes(frames[0]) != b"C":
            raise WireError("kind", "expected a weights chunk")
        version, seq, n_chunks, parts = parse_chunk_header(frames[1], len(frames) - 2)
        if sealed is not None and version != sealed.version:
            raise sealed.refuse(f"a chunk of version {version} sealed as one of version {sealed.version}")
        if version <= self.latest_version:  # an old version finishing after a newer one was handed out
            return self._ignore("old", source, f"a chunk of version {version}", sealed, frames)
        if source == PUBLISHER:  # its own connection: it announced the version by sending it
            self.announced = max(self.announced, version)
        elif version > self.announced:
            self._await(version)
            if version > self.announced:
                raise WireError("version", f"a chunk of version {version} from {source}: the publisher announced "
                                           f"{self.announced}")
        if self.unkeyed and source != PUBLISHER:
            self._vouched(version, seq, n_chunks, frames)
        current = self._assembly
        restart = seq == 0 and current is not None and time.monotonic() - current.touched > self.stall_s
        if current is not None and version < current.version and not restart:
            return self._ignore("old", source, f"a chunk of version {version}, {current.version} began", sealed,
                                frames)
        if current is None or current.version != version or restart:
            if seq != 0:
                return self._ignore("early", source, f"chunk {seq} of version {version}, which has not begun here",
                                    sealed, frames)
            fresh = Assembly(version, n_chunks, self._spare, self.expected, self.max_total_bytes)
            fresh.add(0, parts, frames[2:], sealed)
            if current is not None:  # abandoned by the publisher, or stalled
                self._abandon("stalled" if restart else f"superseded by version {version}")
            self._assembly = current = fresh
        elif n_chunks != current.n_chunks:
            raise WireError("n_chunks", f"version {version} changed its chunk count")
        elif seq != current.next_seq:  # a re-feed after the chain was re-linked, or a replay
            why = "duplicate" if seq < current.next_seq else "early"
            return self._ignore(why, source, f"chunk {seq} of version {version}, expected {current.next_seq}",
                                sealed, frames)
        else:
            current.add(seq, parts, frames[2:], sealed)
        self._accepted = True
        if not current.complete():
            return None
        done = current.result()
        self._ready_buffers = {n: b for n, (_, _, b) in current.buffers.items()}
        self._assembly = None
        self.latest_version = version
        return done

    def _vouched(self, version: int, seq: int, n_chunks: int, frames: list) -> None:
        """Auth off: a relayed chunk is taken only as the publisher's K message vouched for it (its digest, sent on
        the publisher's own connection), before anything about its place is decided; WireError otherwise. The K
        message that announces a version carries its digests, and a relayed chunk is of an announced version (its
        K message was awaited), so there is nothing to wait for here. A publisher with one subscriber over TCP
        sends none: that subscriber heads the chain and takes nothing relayed."""
        digests = self._digests.get(version, b"")
        if len(digests) != n_chunks * DIGEST_BYTES:
            raise WireError("digest", f"chunk {seq} of version {version} from a relay predecessor: the publisher "
                                      f"vouched for {len(digests) // DIGEST_BYTES} chunks of that version")
        if chunk_digest(frames[1:]) != digests[seq * DIGEST_BYTES:(seq + 1) * DIGEST_BYTES]:
            raise WireError("digest", f"chunk {seq} of version {version} from a relay predecessor is not the one "
                                      "the publisher sent")

    def _ignore(self, reason: str, source: str, what: str, sealed: OpenChunk | None, frames: list) -> None:
        """Count an authentic chunk out of place (SealError if a sealed one's parts do not authenticate)."""
        if sealed is not None:
            sealed.verify(frames[2:])
        self.ignored.drop(f"{source} (at {self.name})", reason, what)

    def _abandon(self, why: str) -> None:
        a, self._assembly = self._assembly, None
        self.abandoned += 1
        self._spare.update({n: b for n, (_, _, b) in a.buffers.items()})
        level = logging.WARNING if why == "stalled" else logging.INFO
        log.log(level, "%s: version %d abandoned at chunk %d of %d (%s)", self.name, a.version, a.next_seq,
                a.n_chunks, why)

    def ack(self, version: int, ok: bool = True, error: str = "") -> None:
        self._send([b"A", msgpack.packb({"version": version, "ok": ok, "error": error[:1000]})])

    def close(self) -> None:
        if self.relay is not None:
            self.relay.close()
        self._sock.close(1000)
        if self._own_ctx:
            release_handler(self._ctx)
            self._ctx.term()
