"""The weights publisher's control plane: who may subscribe, on which connection, and what they say.

`Peers` owns the publisher's ROUTER socket and everything about its subscribers but the chunks: admission (the
run's keys through core.admission or CurveZMQ; without keys, the expected names and one live connection per
name), the hellos and the "K" message each is owed (the version, its chunk key, its digests), the acks, the
relay's progress reports, the same-node probe, and the budgeted, paced polling that keeps a flood from taking
the thread. core.weights.publisher's `WeightPublisher` adds the data plane (a version's chunks, the shelf, the
star and relay fan-outs) on top; the protocol and what must hold are described there.
"""
from __future__ import annotations

import logging
import struct
import time
from collections.abc import Iterable

import msgpack
import zmq

from core.admission import serve_admission
from core.curve import CurveServer, peer_name, serve_curve
from core.seal import SealError
from core.trajectory import WireError
from core.transport import DropLog, bind_endpoint
from core.weights.control import (MAX_CONTROL_BYTES, Progress, control, endpoint_field, field, hello_nonce,
                                  key_message, parse_progress)
from core.weights.seal import PublisherSeal
from core.weights.shm import Shelf

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


class Peers:
    """The subscribers of one weights publisher and its socket (see the module docstring and WeightPublisher's
    "What must hold")."""

    def __init__(self, host: str, port: int, hwm: int, ctx: zmq.Context | None, curve: CurveServer | None,
                 expected: Iterable[str] | None, shm: bool, await_expected: bool):
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
        self.expected = set(expected) if expected is not None else None
        self.await_expected = await_expected and self.expected is not None  # see `wait_acks`
        self.authenticated = curve is not None  # names come from keys, not from what a peer says
        # Relay sockets admit by key (CURVE with curvezmq, core.admission with aes-gcm; sealed chunks are
        # forwarded as they are): their keys.
        self.keys = {name: public.decode() for public, name in curve.clients.items()} if self.zap is not None else {}
        self.relays: dict[str, str] = {}  # subscriber name -> its forwarding endpoint (relay subscribers)
        self.progress: dict[str, Progress] = {}
        self.heard: dict[str, float] = {}  # subscriber name -> when it last sent anything
        self.links: dict[str, str] = {}  # subscriber name -> the successor it was told to forward to
        self.peers: dict[bytes, str] = {}
        self.acks: dict[int, dict[str, tuple[bool, str]]] = {}
        self.stalled: dict[int, dict[str, str]] = {}
        self.published = -1
        self._digests: tuple[int, bytes] = (-1, b"")  # auth off, relay: the version being published, its digests
        self.drops = DropLog("weights control message", log)
        self.shelf = Shelf() if shm else None
        self.same_node: set[str] = set()  # subscribers that proved they read this process's shared memory
        self.acked: dict[str, int] = {}  # subscriber -> the latest version it acked

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
        if self.peers.get(routing) == name and self._nonces.get(routing) == nonce:
            # said again before its answer came (core.weights.subscriber retries): answer again, change nothing
            self._keys_owed[routing] = (name, self.published)
            self._send_keys()
            return
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
