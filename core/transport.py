"""ZeroMQ trajectory channel: many env-pool producers, one coordinator consumer.

Sockets: each producer is a DEALER with its own routing id (so the consumer knows who sent every frame);
the consumer is a ROUTER bound to one endpoint. Backpressure comes from bounded high-water marks on both
ends: once `hwm` messages wait in the sender's queue and the receiver's, `send` blocks (or raises
`TimeoutError` after `timeout_ms`), so a slow consumer slows producers instead of growing memory.

What must hold:
- Nothing a peer sends stops the receiver: a malformed, truncated or oversized message is dropped, counted per
  sender (`stats.dropped_by_sender`, by reason in `stats.dropped_by_reason`) and logged at most once per sender
  every `log_every_s`; `recv` never raises for a peer's bytes.
- No message larger than a valid one can be (`WireLimits.max_message_bytes`, all frames together) reaches the
  decoder: ZeroMQ cuts any single frame over the largest a valid frame can be (`frame_cap`, dropping the
  connection), and the receiver drops a message whose frames add up to more, or that has more frames than a
  record. A cap per frame is not a cap per message (ZeroMQ holds a multipart message whole before `recv`), so
  without the run's keys (auth off: loopback only) a local process can still make the receiver hold one
  unfinished message of any size; with them, no unadmitted peer gets that far (next point).
- With the run's CURVE keys (`core.curve`), only the run's clients deliver anything over TCP, encrypted, and the
  sender of each message is the name its key was issued under, not the routing id it chose. Cipher `aes-gcm`
  (default): every message is sealed by the sender and opened by the receiver (`core.seal`); one that does not
  open is dropped before the decoder and counted in `auth_refused` (not among the bad messages of the run's own
  senders); and before any message, the connection must pass core.admission's handshake (a token only the
  holder of a client key can make), so a peer without the run's keys makes the receiver hold at most one
  handshake frame (<= `frame_cap`) for at most `core.admission.HANDSHAKE_MS`, and delivers nothing. Cipher
  `curvezmq`: ZeroMQ's CURVE handshake refuses other clients before any message.
- A routing id cannot be squatted: each sender's id is its name plus 64 random bits (fixed per socket, so its
  reconnects keep it), and the receiver hands an id over to the newest connection that presents it
  (ZMQ_ROUTER_HANDOVER), so neither an outsider who took a pool's name first nor a pool's own stale connection
  can make the pool's trajectories vanish. Under the run's keys the sender's name is its key's in any case.
- Same-node fast path: the receiver also binds an `ipc://` socket (a Unix socket in a directory only its own
  user may enter, named after this kernel's boot id and network namespace) and advertises `endpoints`, TCP
  first. A sender takes the `ipc://` one only where that socket exists under the same kernel and network
  namespace (`pick_endpoint`; a process of another user cannot even see the socket), and TCP otherwise. The
  Unix socket carries no CURVE: the file system admits only the run's user, whose processes can read the run's
  keys anyway; nothing changes for senders on other nodes. A driver killed outright leaves its empty folder.
"""
from __future__ import annotations

import collections
import logging
import os
import shutil
import stat
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import Iterator

import zmq

from core.codec import ARRAY_FIELDS, WireLimits, decode, encode
from core.admission import apply_admission, serve_admission
from core.curve import CurveClient, CurveServer, peer_name, release_handler, serve_curve
from core.seal import TAG_BYTES, Opener, Sealer, SealError
from core.trajectory import Trajectory, WireError

log = logging.getLogger("agentgym.transport")

LOOPBACK = "127.0.0.1"
MAX_TRACKED_SENDERS = 1024  # per-sender counters beyond this many senders are pooled under "other"
ID_SEPARATOR = "#"  # a sender's routing id: its name, this, 16 random hex digits


def frame_cap(limits: WireLimits) -> int:
    """The largest a single frame of a valid (or sealed) trajectory message can be: the header or one array."""
    largest_array = limits.max_tokens * max(dtype.itemsize for _, dtype in ARRAY_FIELDS)
    return max(limits.max_header_bytes, largest_array) + TAG_BYTES


def is_loopback(host: str) -> bool:
    return host == "localhost" or host.startswith("127.") or host in ("::1", "[::1]")


def bind_endpoint(sock: zmq.Socket, host: str = LOOPBACK, port: int = 0) -> str:
    """Bind `sock` to tcp://host:port (port 0 picks a free one) and return the connectable endpoint.

    Binding to 0.0.0.0 is allowed only when asked for explicitly; the endpoint returned then still names
    the wildcard, and callers advertise their node's address instead.
    """
    if port:
        sock.bind(f"tcp://{host}:{port}")
        return f"tcp://{host}:{port}"
    bound = sock.bind_to_random_port(f"tcp://{host}")
    return f"tcp://{host}:{bound}"


def node_id() -> str:
    """Who counts as this node: the kernel's boot id and the network namespace, "" where unknown. Processes in
    other network namespaces of the same kernel (containers, the tests' own hosts) are other nodes: they use
    TCP like any remote node, even where they could reach the same Unix socket."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            kernel = f.read().strip().replace("-", "")[:16]
        return f"{kernel}n{os.stat('/proc/self/ns/net').st_ino}"
    except OSError:
        return ""


def local_ipc_dir() -> str | None:
    """A fresh directory for a same-node socket (mode 0700), or None where this machine cannot have one."""
    node = node_id()
    if not node or not hasattr(zmq, "IPC_PATH_MAX_LEN") or not zmq.has("ipc"):
        return None
    path = tempfile.mkdtemp(prefix=f"agentgym-{node}-", dir="/tmp" if os.path.isdir("/tmp") else None)
    if len(path) + 16 > zmq.IPC_PATH_MAX_LEN:  # a Unix socket's path is short (107 bytes on Linux)
        os.rmdir(path)
        return None
    return path


def pick_endpoint(endpoints: str) -> str:
    """The endpoint to connect to from a space-separated list (TCP first): an `ipc://` one where its socket
    exists on this very node (its directory names the node: `node_id`), else the first."""
    options = endpoints.split()
    node = node_id()
    for endpoint in options:
        if endpoint.startswith("ipc://") and node and f"/agentgym-{node}-" in endpoint:
            try:
                if stat.S_ISSOCK(os.stat(endpoint[len("ipc://"):]).st_mode):
                    return endpoint
            except OSError:
                continue
    return options[0]


def messages(poller: zmq.Poller, timeout_ms: int | None) -> Iterator[tuple[zmq.Socket, list[zmq.Frame]]]:
    """(socket, message) from the sockets on `poller` as they arrive, until `timeout_ms` passes in all (None:
    forever)."""
    deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000
    while True:
        wait = None if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
        ready = poller.poll(wait)
        if not ready:
            return
        for sock, _ in ready:
            yield sock, sock.recv_multipart(copy=False)


class DropLog:
    """Counts dropped messages per sender and reason; logs at most once per sender every `every_s`."""

    def __init__(self, what: str, logger: logging.Logger, every_s: float = 10.0):
        self.what, self.log, self.every_s = what, logger, every_s
        self.total = 0
        self.by_sender: collections.Counter[str] = collections.Counter()
        self.by_reason: collections.Counter[str] = collections.Counter()
        self.last_error = ""
        self._last_logged: dict[str, tuple[float, int]] = {}

    def drop(self, sender: str, field_name: str, reason: str) -> None:
        if sender not in self.by_sender and len(self.by_sender) >= MAX_TRACKED_SENDERS:
            sender = "other"
        self.total += 1
        self.by_sender[sender] += 1
        self.by_reason[field_name[:64]] += 1
        self.last_error = f"{sender}: {reason}"[:500]
        now = time.monotonic()
        logged_at, count_then = self._last_logged.get(sender, (-1e18, 0))
        if now - logged_at >= self.every_s:
            since = self.by_sender[sender] - count_then - 1
            more = f" ({since} more since the last report)" if since > 0 else ""
            self.log.warning("dropped a bad %s from %s: %s%s", self.what, sender, reason[:300], more)
            self._last_logged[sender] = (now, self.by_sender[sender])


@dataclass
class ReceiverStats:
    received: int = 0
    dropped: int = 0
    dropped_by_sender: dict[str, int] = field(default_factory=dict)
    dropped_by_reason: dict[str, int] = field(default_factory=dict)
    last_error: str = ""


class TrajectoryReceiver:
    """The consumer end. Binds; call `recv` in a loop. `curve`: admit only these clients over TCP (see
    core.curve). `same_node`: also bind the same-node `ipc://` socket; senders get `endpoints`."""

    def __init__(self, host: str = LOOPBACK, port: int = 0, hwm: int = 64,
                 limits: WireLimits = WireLimits(), ctx: zmq.Context | None = None,
                 curve: CurveServer | None = None, same_node: bool = True):
        # Own context under CURVE: its ZAP handler admits exactly this receiver's clients.
        self._own_ctx = ctx is None and curve is not None
        self._ctx = zmq.Context() if self._own_ctx else (ctx or zmq.Context.instance())
        self.limits = limits
        self.max_message_bytes = limits.max_message_bytes
        self._frames = 2 + len(ARRAY_FIELDS)  # routing id, header, arrays
        sealed = curve is not None and curve.cipher == "aes-gcm"
        self._opener = Opener(curve, b"trajectory") if sealed else None
        self._sock = self._router(hwm)
        self.zap = serve_curve(self._sock, self._ctx, curve) if curve is not None and not sealed else None
        if sealed:  # nothing of an unadmitted peer's beyond one handshake frame (core.admission)
            self.zap = serve_admission(self._sock, self._ctx, curve, frame_cap(limits))
        self.endpoint = bind_endpoint(self._sock, host, port)
        self.endpoints = self.endpoint
        self._ipc_dir = local_ipc_dir() if same_node else None
        self._local: zmq.Socket | None = None
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)
        if self._ipc_dir is not None:
            self._local = self._router(hwm)
            self.local_endpoint = f"ipc://{self._ipc_dir}/trajectories"
            self._local.bind(self.local_endpoint)
            self.endpoints = f"{self.endpoint} {self.local_endpoint}"
            self._poller.register(self._local, zmq.POLLIN)
        self._drops = DropLog("trajectory message", log)
        self._refusals = DropLog("unauthenticated trajectory message (not sealed with the run's keys)", log)
        self._received = 0

    def _router(self, hwm: int) -> zmq.Socket:
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.RCVHWM, hwm)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # an id goes to its newest connection (see the docstring)
        # ZeroMQ drops the connection of a peer that sends any frame over this before buffering it.
        sock.setsockopt(zmq.MAXMSGSIZE, frame_cap(self.limits))
        return sock

    @property
    def stats(self) -> ReceiverStats:
        d = self._drops
        return ReceiverStats(self._received, d.total, dict(d.by_sender), dict(d.by_reason), d.last_error)

    @property
    def auth_refused(self) -> int:
        """Clients refused for want of the run's keys: handshakes, and with aes-gcm messages."""
        refused = sum(self._opener.refused.values()) if self._opener is not None else 0
        return refused + (sum(self.zap.refused.values()) if self.zap is not None else 0)

    def recv(self, timeout_ms: int | None = None) -> Trajectory | None:
        """Return the next valid trajectory, or None when `timeout_ms` passes with none (None waits forever).

        Bad messages are dropped and counted on the way; they never raise here.
        """
        for sock, parts in messages(self._poller, timeout_ms):
            sender = peer_name(parts[-1]) or \
                bytes(parts[0].buffer)[:160].decode("utf-8", "replace").rsplit(ID_SEPARATOR, 1)[0][:64]
            body = [p.buffer for p in parts[1:]]
            if self._opener is not None and sock is self._sock:  # TCP under the run's keys: sealed
                try:
                    sender, body = self._opener.open(body, self._frames - 1, self.max_message_bytes)
                except SealError as exc:
                    self._refusals.drop(sender, exc.reason, str(exc))
                    continue
            try:
                if len(body) != self._frames - 1:
                    self._drops.drop(sender, "frames", f"frames: expected {self._frames - 1}, got {len(body)}")
                    continue
                size = sum(map(len, body))
                if size > self.max_message_bytes:
                    self._drops.drop(sender, "message", f"message: {size} bytes exceed {self.max_message_bytes}")
                    continue
                traj = decode(body, self.limits)
            except WireError as exc:
                self._drops.drop(sender, exc.field, str(exc))
                continue
            self._received += 1
            return traj
        return None

    def drain(self, max_items: int, timeout_ms: int = 0) -> list[Trajectory]:
        """Up to `max_items` trajectories: waits `timeout_ms` for the first, then takes what is queued."""
        out: list[Trajectory] = []
        first = self.recv(timeout_ms)
        while first is not None:
            out.append(first)
            if len(out) >= max_items:
                break
            first = self.recv(0)
        return out

    def close(self) -> None:
        self._sock.close(0)
        if self._local is not None:
            self._local.close(0)
        if self._ipc_dir is not None:
            shutil.rmtree(self._ipc_dir, ignore_errors=True)
        if self._own_ctx:
            release_handler(self._ctx)
            self._ctx.term()


class TrajectorySender:
    """A producer end. Connects to the receiver (`endpoint`: one, or its `endpoints`, of which it takes the
    same-node one where it can: `pick_endpoint`); `send` blocks under backpressure."""

    def __init__(self, endpoint: str, name: str | None = None, hwm: int = 64,
                 ctx: zmq.Context | None = None, curve: CurveClient | None = None):
        # Frames go out zero-copy, so the sender's own context is terminated on close: that blocks until
        # every queued frame is on the wire (or `linger` passed) and nothing is freed under the I/O thread.
        self._own_ctx = ctx is None
        self._ctx = ctx or zmq.Context()
        self.name = name or f"sender-{uuid.uuid4().hex[:8]}"
        self._sock = self._ctx.socket(zmq.DEALER)
        # Unguessable, so nobody can take it first (see the module docstring); the receiver strips the suffix.
        self.routing_id = f"{self.name[:128]}{ID_SEPARATOR}{os.urandom(8).hex()}".encode()
        self._sock.setsockopt(zmq.ROUTING_ID, self.routing_id)
        self._sock.setsockopt(zmq.SNDHWM, hwm)
        self._sock.setsockopt(zmq.LINGER, 5000)
        self.endpoint = pick_endpoint(endpoint)
        remote = curve is not None and not self.endpoint.startswith("ipc://")
        self._sealer = Sealer(curve, b"trajectory") if remote and curve.cipher == "aes-gcm" else None
        if remote and self._sealer is None:
            curve.apply(self._sock)
        elif self._sealer is not None:
            apply_admission(self._sock, curve)
        self._sock.connect(self.endpoint)
        self.sent = 0

    def send(self, traj: Trajectory, timeout_ms: int | None = None) -> None:
        """Send one record. Raises TimeoutError if the channel stays full for `timeout_ms`."""
        self.send_frames(encode(traj), timeout_ms)

    def send_frames(self, frames: list, timeout_ms: int | None = None) -> None:
        """Send already-encoded frames (benchmarks and fuzz tests use this directly)."""
        if self._sealer is not None:
            frames = self._sealer.seal(frames)
        if timeout_ms is None:
            self._sock.send_multipart(frames, copy=False)
        else:
            # Never a blocking send after a poll: the connection the poll saw can be gone by the send (a refused
            # handshake ends it for good), and a blocking send would then wait forever.
            deadline = time.monotonic() + timeout_ms / 1000
            while True:
                try:
                    self._sock.send_multipart(frames, copy=False, flags=zmq.NOBLOCK)
                    break
                except zmq.Again:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError(f"trajectory channel full for {timeout_ms} ms (consumer too slow, "
                                           "or no connection admitted)") from None
                    self._sock.poll(max(1, int(left * 1000)), zmq.POLLOUT)
        self.sent += 1

    def close(self, linger_ms: int = 5000) -> None:
        self._sock.close(linger_ms)
        if self._own_ctx:
            self._ctx.term()
