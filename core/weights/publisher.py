"""ZeroMQ weights channel: one publisher (learner rank 0) to every generator, versioned, chunked, acknowledged.

Protocol (every control payload is msgpack, core.weights.control; tensor bytes travel as raw zero-copy frames):
  subscriber -> publisher  [b"H", {"name", "relay"?, "nonce"}]     hello: register to receive weights
  publisher -> subscriber  [b"K", {"nonce", "version", "key", "digests"}]
                                                                   the answer to a hello, and before each version's
                                                                   chunks: the version (aes-gcm: its chunk key;
                                                                   auth off with relay: its chunks' digests), for
                                                                   the incarnation that sent the nonce
  publisher -> subscriber  [b"C", header, part_0, ..., part_k]     one chunk of version `header.version`
  subscriber -> publisher  [b"A", {"version", "ok", "error"}]       ack after the caller applied the version
  subscriber -> publisher  [b"P", {...}], publisher -> it [b"L", {...}]   relay progress and links
  publisher -> subscriber  [b"M", {"path"}], subscriber -> it [b"M", {"token"}]   same-node probe (shm=True)
  publisher -> subscriber  [b"S", {"version", "path", "index"}]      a version on the shelf (core.weights.shm)

Fan-out: `star` sends every chunk to every subscriber; `relay` (core.weights.relay) sends each chunk once, to
the head of a chain of subscribers, each forwarding it to the next, so the publisher's cost does not grow with
the number of replicas.

A chunk header is {"version", "seq", "n_chunks", "parts": [[name, dtype, shape, offset, total_nbytes], ...]}:
part i holds bytes [offset, offset + len(frame_i)) of tensor `name`. Tensors larger than `chunk_bytes` span
several chunks; small ones share a chunk. dtype is a string ("float32", "bfloat16", ...): the channel moves
bytes and never interprets them, so core needs no torch. A subscriber exposes a version only once every
byte of every tensor has arrived; a version that is superseded mid-transfer is discarded.

Under the run's keys every message above is sealed over plain TCP (transport.cipher=aes-gcm, core.weights.seal:
chunks once, under a key per version that the publisher sends each subscriber in a "K" message), and every
connection first passes core.admission's handshake (a token only a holder of a subscriber key can make), so an
outsider makes the publisher hold at most one handshake frame of `MAX_CONTROL_BYTES` and delivers nothing; or
the sockets use CurveZMQ (`curvezmq`). Without keys (auth off, loopback only) frames are capped at
`MAX_CONTROL_BYTES`, but a local process can still send one unfinished multipart message of any size.
"""
from __future__ import annotations

import logging
import struct
import time
from typing import Iterable

import msgpack
import zmq

from core.admission import serve_admission
from core.curve import CurveServer, peer_name, release_handler, serve_curve
from core.seal import SealError
from core.trajectory import WireError
from core.transport import LOOPBACK, DropLog, bind_endpoint
from core.weights.control import (MAX_CONTROL_BYTES, MAX_DIGESTS, Progress, chunk_digest, control, endpoint_field,
                                  field, hello_nonce, key_message, parse_progress)
from core.weights.seal import PublisherSeal, SealedChunks
from core.weights.shm import Shelf
from core.weights.tensors import TensorBytes, byte_view, chunk_tensors

log = logging.getLogger("agentgym.weights")

POLL_BUDGET = 256  # control messages handled per `poll` call at most: a flood cannot keep `poll` from returning
ROUND_BUDGET = 4  # ... and per send round of a publish, so a flood costs a publish a few messages per round
PACE_S = 0.0005  # a send round that found that many waiting lasts at least this long (`_paced_poll`)
CONNECTION_EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED
SUBSCRIBED_AFTER = "stalled: subscribed after"  # the ack reason of a version sent before a subscriber's hello


def parse_event(message: list[bytes]) -> tuple[int, int]:
    """(event, value) of a ZeroMQ socket-monitor message (the value of a connection's event is its fd)."""
    event, value = struct.unpack("=HI", message[0][:6])
    return event, value


def srcfd(frame: zmq.Frame) -> int:
    """The fd of the connection a frame came on (-1 where unknown)."""
    try:
        return frame.get(zmq.SRCFD)
    except (zmq.ZMQError, AttributeError):
        return -1


def _chunk_messages(version: int, tensors: list[TensorBytes], chunk_bytes: int) -> list[list]:
    """`version` as chunk messages [b"C", header, part, ...] (zero-copy views of the tensors' bytes)."""
    chunks = list(chunk_tensors(tensors, chunk_bytes))
    return [[b"C", msgpack.packb({"version": version, "seq": seq, "n_chunks": len(chunks),
                                  "parts": [[t.name, t.dtype, list(t.shape), off, byte_view(t.data).nbytes]
                                            for t, off, _ in chunk]})] + [view for _, _, view in chunk]
            for seq, chunk in enumerate(chunks)]


class WeightPublisher:
    """The learner's end. Binds; generators connect and say hello.

    What must hold:
    - Only registered subscribers receive weights and are heard: a hello names a subscriber; with CURVE its
      name must be the one its key was issued under, without CURVE it must be one of `expected` (when given).
      Acks count only from the connection that said hello under that name.
    - A malformed control message is dropped and counted (`drops`); nothing a peer sends raises here.
    - A flood on one connection cannot stall a publish: `poll` handles at most `POLL_BUDGET` messages per call,
      and a publish at most `ROUND_BUDGET` per send round (ZeroMQ's ROUTER takes them from its connections in
      turn, so the subscribers' own messages still come through).
    - Without keys (auth off, loopback), a hello under the name of a subscriber whose connection is still open
      is refused, counted in `drops` (reason "name") and logged: another local process cannot displace a live
      subscriber; a restarted one (its old connection closed) takes its place. With keys, the name is the
      key's, and a new connection under the same key replaces the old (the same holder, restarted).
    - A subscriber that stops reading cannot stall the others: each peer is fed as far as its queue allows,
      and one that takes no chunk for `stall_timeout_s` is skipped for the rest of that version, named in
      the log and in `stalled[version]`. With `fanout="relay"` the same holds of a chain member that dies or
      stalls: the chain is re-linked around it (core.weights.relay), counted in `relinked`.
    - Nobody waits for an ack that cannot come: a subscriber that says hello again under its name (a restarted
      process) counts as having skipped the versions it had not acked, and `wait_acks` does not wait for the
      subscribers the caller names as down (`excused`). Publishing a version again sends it to them anew.
    """

    def __init__(self, host: str = LOOPBACK, port: int = 0, chunk_bytes: int = 4 << 20,
                 hwm: int = 8, ctx: zmq.Context | None = None, curve: CurveServer | None = None,
                 expected: Iterable[str] | None = None, stall_timeout_s: float = 30.0, fanout: str = "star",
                 shm: bool = False, await_expected: bool = False):
        """`shm`: serve subscribers on this node through shared memory (core.weights.shm) once they prove it.
        `await_expected`: `wait_acks` waits for every `expected` name, connected or not (see there)."""
        # Chunks stay well under glibc's 32 MB mmap threshold, so the receiver's per-message buffers are
        # recycled from the heap instead of being mapped (and page-faulted) afresh for every chunk.
        # Weights go out zero-copy: an own context, terminated on close, outlives every queued frame.
        self._own_ctx = ctx is None
        self._ctx = ctx or zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a full or unknown peer raises instead of dropping
        self._sock.setsockopt(zmq.SNDHWM, hwm)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, MAX_CONTROL_BYTES)
        # transport.cipher: aes-gcm seals every message in this thread (core.weights.seal) over plain TCP, behind
        # core.admission's handshake; curvezmq has ZeroMQ encrypt. Either way the ZAP handler names each peer.
        sealed = curve is not None and curve.cipher == "aes-gcm"
        self.seal = PublisherSeal(curve, MAX_CONTROL_BYTES) if sealed else None
        self.zap = serve_curve(self._sock, self._ctx, curve) if curve is not None and not sealed else None
        if sealed:
            self.zap = serve_admission(self._sock, self._ctx, curve, MAX_CONTROL_BYTES)
        # Without keys: which connection each hello came on, and which are still open (see `_alive`).
        self._monitor = self._sock.get_monitor_socket(CONNECTION_EVENTS) if curve is None else None
        self._open: dict[int, int] = {}  # fd -> serial number of the connection now on it
        self._serials = 0
        self._connection_of: dict[bytes, tuple[int, int]] = {}  # routing id -> (fd, serial) of its hello
        self._hello_fd = -1  # the fd of the message being handled
        self.refusals = DropLog("unauthenticated weights message (not sealed with the run's keys)", log)
        # routing id -> (subscriber, version) whose K message is still to be sent; routing id -> its hello's nonce
        self._keys_owed: dict[bytes, tuple[str, int]] = {}
        self._nonces: dict[bytes, str] = {}
        self.endpoint = bind_endpoint(self._sock, host, port)
        self.chunk_bytes = chunk_bytes
        self.expected = set(expected) if expected is not None else None
        self.await_expected = await_expected and self.expected is not None  # see `wait_acks`
        self.authenticated = curve is not None  # names come from keys, not from what a peer says
        self.stall_timeout_s = stall_timeout_s
        if fanout not in ("star", "relay"):
            raise ValueError(f"fanout must be star or relay, got {fanout!r}")
        self.fanout = fanout
        # Relay sockets admit by key (CURVE with curvezmq, core.admission with aes-gcm; sealed chunks are
        # forwarded as they are): their keys.
        self.keys = {name: public.decode() for public, name in curve.clients.items()} if self.zap is not None else {}
        self.relays: dict[str, str] = {}  # subscriber name -> its forwarding endpoint (relay subscribers)
        self.progress: dict[str, Progress] = {}
        self.heard: dict[str, float] = {}  # subscriber name -> when it last sent anything
        self.links: dict[str, str] = {}  # subscriber name -> the successor it was told to forward to
        self.suspects: set[str] = set()  # lost in the last relayed version: placed at the chain's tail
        self.relinked = 0  # times a relay chain was re-linked around a member
        self.chunks_sent = 0
        self.link_epoch = 0
        self.peers: dict[bytes, str] = {}
        self.acks: dict[int, dict[str, tuple[bool, str]]] = {}
        self.stalled: dict[int, dict[str, str]] = {}
        self.published = -1
        self._digests: tuple[int, bytes] = (-1, b"")  # auth off, relay: the version being published, its digests
        self.drops = DropLog("weights control message", log)
        self.shelf = Shelf() if shm else None
        self.same_node: set[str] = set()  # subscribers that proved they read this process's shared memory
        self.acked: dict[str, int] = {}  # subscriber -> the latest version it acked
        self.shelved: frozenset[str] = frozenset()  # subscribers served by the shelf in the current version

    # -- control messages -------------------------------------------------------------------------------------

    def _handle(self, parts: list[zmq.Frame]) -> None:
        routing = bytes(parts[0].buffer)
        frames = [p.buffer for p in parts[1:]]
        user = peer_name(parts[-1])
        if self.seal is not None:
            try:
                user, frames = self.seal.open(frames)
            except SealError as exc:
                self.refusals.drop(self.peers.get(routing) or routing[:16].hex(), exc.reason, str(exc))
                return
        sender = user or self.peers.get(routing) or routing[:16].hex()
        try:
            kind, body = control(frames)
            if kind == b"H":
                self._hello(routing, user, body)
            elif kind == b"A":
                self._ack(routing, user, body)
            elif kind == b"M":
                self._same_node(routing, user, body)
            else:
                self._progress(routing, user, body)
        except WireError as exc:
            self.drops.drop(sender, exc.field, str(exc))

    def _hello(self, routing: bytes, user: str, body: dict) -> None:
        name = field(body, "name", str)
        if not 0 < len(name) <= 128:
            raise WireError("name", "expected 1 to 128 characters")
        if self.authenticated and name != user:
            raise WireError("name", f"{name!r:.40} said hello with the key issued to {user!r}")
        if not self.authenticated and self.expected is not None and name not in self.expected:
            raise WireError("name", f"{name!r:.40} is not a subscriber of this run")
        relay = endpoint_field(body, "relay") if "relay" in body else ""
        nonce = hello_nonce(body)
        if not self.authenticated:
            self._connection_of[routing] = self._connection(routing)
            live = [old for old, known in self.peers.items() if known == name and old != routing and self._alive(old)]
            if live:
                self._connection_of.pop(routing, None)
                raise WireError("name", f"{name!r:.40} said hello on a second connection while its first is still "
                                        "open (refused: without keys a name cannot be taken over)")
        for old, known in list(self.peers.items()):  # a reconnecting subscriber replaces its old connection
            if known == name and old != routing:
                del self.peers[old]
                self._connection_of.pop(old, None)
        if routing not in self.peers:  # a new connection: it holds nothing published before its hello
            self._missed(name)
        self.peers[routing] = name
        self.relays[name] = relay
        self.links.pop(name, None)  # a new connection has no link yet
        self.progress.pop(name, None)
        self.heard[name] = time.monotonic()
        self.same_node.discard(name)
        self.acked.pop(name, None)
        # Its K message, answering this hello's nonce: the version this publisher is at (a restarted subscriber
        # never goes back) and with aes-gcm its chunk key; before anything else on this connection.
        self._nonces = {r: n for r, n in self._nonces.items() if r in self.peers}
        self._nonces[routing] = nonce
        self._keys_owed[routing] = (name, self.published)
        self._send_keys()
        if self.shelf is not None and body.get("shm") is True:
            try:
                self.send_to(routing, name, [b"M", msgpack.packb(self.shelf.offer())])
            except zmq.ZMQError:  # a full queue: this subscriber is served over TCP
                pass

    def _connection(self, routing: bytes) -> tuple[int, int]:
        """(fd, serial) of the connection a hello from `routing` came on (call while handling it)."""
        self._track_connections()
        fd = self._hello_fd
        return fd, self._open.get(fd, -1)

    def _track_connections(self) -> None:
        while self._monitor is not None and self._monitor.poll(0):
            event, fd = parse_event(self._monitor.recv_multipart())
            if event == zmq.EVENT_ACCEPTED:
                self._serials += 1
                self._open[fd] = self._serials
            elif event == zmq.EVENT_DISCONNECTED:
                self._open.pop(fd, None)

    def _alive(self, routing: bytes) -> bool:
        """Whether the connection `routing` said hello on is still open (an fd reused since counts as closed)."""
        self._track_connections()
        fd, serial = self._connection_of.get(routing, (-1, -1))
        return serial >= 0 and self._open.get(fd) == serial

    def _missed(self, name: str) -> None:
        """A subscriber that says hello (a restarted process, or one whose hello came after a version was sent)
        holds none of the versions published before: each one it had not acked counts as answered, skipped
        (reason "stalled: subscribed after ..."), so nobody waits for an ack that cannot come. It gets the
        current weights when the run publishes them again for it (launch.job.generator_watch, or
        actors.weights.publication when the acks name it so)."""
        for version in range(max(0, self.published - 4), self.published + 1):
            if name not in self.acks.get(version, {}):
                self.stalled.setdefault(version, {})[name] = f"{SUBSCRIBED_AFTER} version {version} was sent"

    def _send_keys(self) -> None:
        for routing in list(self._keys_owed):
            try:
                self._send_key(routing)
            except zmq.ZMQError:  # its queue is full (tried again before anything else goes to it), or it is gone
                continue

    def _send_key(self, routing: bytes) -> None:
        """The K message owed to `routing` (core.weights.control), if any; zmq.Again if its queue is full."""
        owed = self._keys_owed.get(routing)
        if owed is None:
            return
        name, version = owed
        key = self.seal.chunks.key(version) if self.seal is not None and version >= 0 else b""
        digests = self._digests[1] if self._digests[0] == version else b""
        message = key_message(self._nonces.get(routing, ""), version, key, digests)
        if self.seal is not None:
            message = self.seal.to(name, message)
        try:
            self._sock.send_multipart([routing] + message, flags=zmq.NOBLOCK)
        except zmq.Again:
            raise
        except zmq.ZMQError:  # EHOSTUNREACH: it went away
            self._keys_owed.pop(routing, None)
            raise
        self._keys_owed.pop(routing, None)

    def send_to(self, routing: bytes, name: str, message: list) -> None:
        """A control message for one subscriber (sealed for it alone with aes-gcm), after the K message owed to
        it; never blocks (zmq.Again)."""
        self._send_key(routing)
        if self.seal is not None:
            message = self.seal.to(name, message)
        self._sock.send_multipart([routing] + message, flags=zmq.NOBLOCK)

    def send_chunk(self, routing: bytes, message: list) -> None:
        """A chunk for one subscriber, after the K message owed to it (its version's key); zmq.Again if its
        queue is full."""
        self._send_key(routing)
        self._sock.send_multipart([routing] + message, copy=False, flags=zmq.NOBLOCK)

    @property
    def auth_refused(self) -> int:
        """Messages or handshakes refused for want of the run's keys."""
        refused = sum(self.seal.refused.values()) if self.seal is not None else 0
        return refused + (sum(self.zap.refused.values()) if self.zap is not None else 0)

    def _registered(self, routing: bytes, user: str, what: str) -> str:
        name = self.peers.get(routing)
        if name is None or (self.authenticated and name != user):
            raise WireError(what, "from a connection that is not a registered subscriber")
        self.heard[name] = time.monotonic()
        return name

    def _ack(self, routing: bytes, user: str, body: dict) -> None:
        name = self._registered(routing, user, "ack")
        version = field(body, "version", int)
        if not 0 <= version <= self.published:
            raise WireError("version", f"ack for version {version}, latest published is {self.published}")
        ok, error = field(body, "ok", bool), field(body, "error", str)
        self.acks.setdefault(version, {})[name] = (ok, error[:1000])
        self.acked[name] = max(self.acked.get(name, -1), version)

    def _same_node(self, routing: bytes, user: str, body: dict) -> None:
        name = self._registered(routing, user, "probe")
        if self.shelf is not None and self.shelf.admits(field(body, "token", str)):
            self.same_node.add(name)
            log.info("weights publisher: %s reads this node's shared memory; it gets versions from there", name)

    def _progress(self, routing: bytes, user: str, body: dict) -> None:
        name = self._registered(routing, user, "progress")
        self.progress[name] = parse_progress(body)

    def poll(self, timeout_ms: int = 0, budget: int = POLL_BUDGET) -> int:
        """Process pending hellos and acks: up to `budget` messages, waiting up to `timeout_ms` for the first.
        Returns how many it handled."""
        if self._keys_owed:
            self._send_keys()
        self._track_connections()  # the monitor's queue is bounded: read it as often as the socket
        handled = 0
        while handled < budget and self._sock.poll(timeout_ms):
            parts = self._sock.recv_multipart(copy=False)
            if self._monitor is not None:
                self._hello_fd = srcfd(parts[-1])
            self._handle(parts)
            timeout_ms = 0
            handled += 1
        return handled

    def _paced_poll(self, timeout_ms: int) -> None:
        """A few control messages, then, where more are waiting (a flood), a pause as long as a quiet socket's
        wait: a flood can neither take this thread's time nor keep it from waiting for the subscribers."""
        start = time.monotonic()
        if self.poll(timeout_ms, ROUND_BUDGET) >= ROUND_BUDGET:
            left = PACE_S - (time.monotonic() - start)
            if left > 0:
                time.sleep(left)

    def wait_for_peers(self, n: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.peers) < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(self.peers)} of {n} weight subscribers said hello")
            self.poll(50)

    # -- publishing -------------------------------------------------------------------------------------------

    def publish(self, version: int, tensors: Iterable[TensorBytes]) -> int:
        """Send `version` to every registered peer; returns the number of bytes per peer.

        Each peer's queue is bounded by `hwm` chunks, so memory stays bounded; a peer whose queue stays full
        for `stall_timeout_s` is skipped for this version (see the class docstring).
        """
        self.poll(0, ROUND_BUDGET + 2 * len(self.peers))  # hellos waiting (a flood takes its turn only)
        if not self.peers:
            log.warning("weights publisher: version %d has no subscribers", version)
        self.published = max(self.published, version)
        tensors = list(tensors)
        # Auth off, relay: a relayed chunk is checked against its digest, sent on the publisher's own connection
        # (which nobody else can write to), so nothing pushed into a relay socket can alter a version. Two
        # subscribers over TCP or more: none of them is served from the shelf alone, so the chunks are needed.
        over_tcp = [n for n in self.peers.values() if n not in self.same_node]
        relayed = self.fanout == "relay" and not self.authenticated and len(over_tcp) > 1
        messages = _chunk_messages(version, tensors, self.chunk_bytes) if relayed else None
        relayed = relayed and len(messages) <= MAX_DIGESTS
        self._digests = (version, b"".join(chunk_digest(m[1:]) for m in messages) if relayed else b"")
        for routing, name in self.peers.items():  # the version (and its chunk key) before any of its chunks
            self._keys_owed[routing] = (name, version)
        self._send_keys()
        self.stalled.pop(version, None)  # sent again (to a restarted subscriber): whoever skipped it gets it now
        for old in [v for v in self.acks if v < version - 4]:  # bounded bookkeeping
            self.acks.pop(old, None)
            self.stalled.pop(old, None)
        self.shelved = self._shelve(version, tensors)
        if self.shelved and self.shelved.issuperset(self.peers.values()):
            return sum(byte_view(t.data).nbytes for t in tensors)
        if messages is None:
            messages = _chunk_messages(version, tensors, self.chunk_bytes)
        sent = sum(len(part) for m in messages for part in m[2:])
        if self.seal is not None:
            messages = SealedChunks(version, messages, self.seal.chunks, self.seal.buffers)
        if self.fanout == "relay":
            from core.weights.relay import RelayFanout

            RelayFanout(self, version, messages).run()
        else:
            self._fan_out(version, messages)
        return sent

    def _shelve(self, version: int, tensors: list[TensorBytes]) -> frozenset[str]:
        """Put `version` on the shelf for the same-node subscribers; the names it was announced to."""
        names = frozenset(n for n in self.peers.values() if n in self.same_node)
        if self.shelf is None or not names:
            return frozenset()
        live = set(self.peers.values())

        def released(held: int, readers: frozenset[str]) -> bool:
            skipped = self.stalled.get(held, {})
            return all(self.acked.get(n, -1) >= held or n not in live or n in skipped for n in readers)

        placed = self.shelf.put(version, tensors, names, released)
        if placed is None:
            log.info("weights publisher: no shelf slot free (a generator still loads an older version); "
                     "version %d goes over TCP", version)
            return frozenset()
        path, index = placed
        message = [b"S", msgpack.packb({"version": version, "path": path, "index": index})]
        sent = set()
        for routing, name in list(self.peers.items()):
            if name in names:
                try:
                    self.send_to(routing, name, message)
                    sent.add(name)
                except zmq.ZMQError:  # a full or vanished peer: chunks over TCP instead (or nothing)
                    pass
        return frozenset(sent)

    def _fan_out(self, version: int, messages: list[list]) -> None:
        now = time.monotonic()
        cursor = {peer: 0 for peer, name in self.peers.items() if name not in self.shelved}
        progress = {peer: now for peer in self.peers}
        while cursor:
            moved = False
            for peer in list(cursor):
                i = cursor[peer]
                while i < len(messages):
                    try:
                        self.send_chunk(peer, messages[i])
                    except zmq.Again:  # this peer's queue is full: serve the others meanwhile
                        break
                    except zmq.ZMQError as exc:  # EHOSTUNREACH: the peer went away
                        log.warning("weights publisher: dropping peer %s (%s)", self.peers.pop(peer, "?"), exc)
                        i = -1
                        break
                    i += 1
                    moved = True
                    self.chunks_sent += 1
                    progress[peer] = time.monotonic()
                if i < 0 or i >= len(messages):
                    del cursor[peer]
                    continue
                cursor[peer] = i
                idle = time.monotonic() - progress[peer]
                if idle > self.stall_timeout_s:
                    name = self.peers.get(peer, peer.hex())
                    self.stalled.setdefault(version, {})[name] = f"stalled: took no chunk for {idle:.1f} s"
                    log.warning("weights publisher: %s took no chunk of version %d for %.1f s; skipping it "
                                "for this version (%d of %d chunks sent)", name, version, idle, i, len(messages))
                    del cursor[peer]
            # acks and hellos keep flowing, a few per round; a short wait when nobody moved (paced: a flood
            # makes the poll return at once)
            if moved:
                self.poll(0, ROUND_BUDGET)
            else:
                self._paced_poll(1)

    def wait_acks(self, version: int, timeout_s: float, excused: Iterable[str] = ()) -> dict[str, tuple[bool, str]]:
        """Wait until every registered peer acked `version`; returns {peer name: (ok, error)}.

        A peer skipped as stalled for this version counts as answered, with (False, "stalled: ..."); so does
        one named in `excused` (the run knows its process is down) that has not acked. With `await_expected` (a
        run's publisher: every `expected` name is a replica of the run), one not connected now is waited for
        too, unless excused: a restarted one says hello, and a hello after the
        version went out answers for it ("stalled: subscribed after ...", `_missed`), so the run sends it again.
        Raises TimeoutError naming the peers that did not answer in time.
        """
        deadline = time.monotonic() + timeout_s
        excused = frozenset(excused)
        flooded = False
        while True:
            got = dict(self.acks.get(version, {}))
            for name, why in self.stalled.get(version, {}).items():
                got.setdefault(name, (False, why))
            for name in excused & set(self.peers.values()):
                got.setdefault(name, (False, "stalled: its process is down"))
            registered = set(self.peers.values())
            absent = self.expected - registered - excused if self.await_expected else set()
            missing = [n for n in sorted(registered | absent) if n not in got]
            if not missing:
                return got
            if time.monotonic() > deadline:
                raise TimeoutError(f"weights version {version}: no ack from {', '.join(sorted(missing))}")
            if flooded:  # the last poll found more waiting than it took, and no answer among them: a pause
                time.sleep(PACE_S)
            # the answers are checked every few messages, flood or not
            flooded = self.poll(50, ROUND_BUDGET) >= ROUND_BUDGET

    def close(self, linger_ms: int = 0) -> None:
        if self.shelf is not None:
            self.shelf.close()
        if self._monitor is not None:
            self._sock.disable_monitor()
            self._monitor.close(0)
        self._sock.close(linger_ms)
        if self._own_ctx:
            release_handler(self._ctx)
            self._ctx.term()
