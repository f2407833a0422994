"""ZeroMQ trajectory channel: many env-pool producers, one coordinator consumer.

Sockets: each producer is a DEALER with its own routing id (so the consumer knows who sent every frame);
the consumer is a ROUTER bound to one endpoint. Backpressure comes from bounded high-water marks on both
ends: once `hwm` messages wait in the sender's queue and the receiver's, `send` blocks (or raises
`TimeoutError` after `timeout_ms`), so a slow consumer slows producers instead of growing memory.

A malformed, truncated or oversized message is dropped, counted per sender and logged; the receiver keeps
running. Frames larger than the hard per-frame cap (`hard_frame_cap`) are cut by ZeroMQ itself, which drops
the offending connection; everything under the cap is checked by `core.codec.decode`.
"""
from __future__ import annotations

import collections
import logging
import time
import uuid
from dataclasses import dataclass, field

import zmq

from core.codec import WireLimits, decode, encode
from core.trajectory import Trajectory, WireError

log = logging.getLogger("agentgym.transport")

LOOPBACK = "127.0.0.1"


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


@dataclass
class ReceiverStats:
    received: int = 0
    dropped: int = 0
    dropped_by_sender: dict[str, int] = field(default_factory=lambda: collections.defaultdict(int))
    last_error: str = ""


class TrajectoryReceiver:
    """The consumer end. Binds; call `recv` in a loop."""

    def __init__(self, host: str = LOOPBACK, port: int = 0, hwm: int = 64,
                 limits: WireLimits = WireLimits(), ctx: zmq.Context | None = None):
        self._ctx = ctx or zmq.Context.instance()
        self.limits = limits
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.RCVHWM, hwm)
        self._sock.setsockopt(zmq.LINGER, 0)
        # Hard cap per frame, well above what the decoder accepts, so it only stops memory blow-ups.
        self.hard_frame_cap = 2 * max(limits.max_header_bytes, limits.max_tokens * 4)
        self._sock.setsockopt(zmq.MAXMSGSIZE, self.hard_frame_cap)
        self.endpoint = bind_endpoint(self._sock, host, port)
        self.stats = ReceiverStats()

    def recv(self, timeout_ms: int | None = None) -> Trajectory | None:
        """Return the next valid trajectory, or None when `timeout_ms` passes with none (None waits forever).

        Bad messages are dropped and counted on the way; they never raise here.
        """
        deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000
        while True:
            wait = None if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
            if not self._sock.poll(wait):
                return None
            parts = self._sock.recv_multipart(copy=False)
            sender = bytes(parts[0].buffer).decode("utf-8", "replace")
            try:
                traj = decode([p.buffer for p in parts[1:]], self.limits)
            except WireError as exc:
                self._drop(sender, str(exc))
                continue
            self.stats.received += 1
            return traj

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

    def _drop(self, sender: str, reason: str) -> None:
        self.stats.dropped += 1
        self.stats.dropped_by_sender[sender] += 1
        self.stats.last_error = f"{sender}: {reason}"
        log.warning("dropped a bad trajectory message from %s: %s", sender, reason)

    def close(self) -> None:
        self._sock.close(0)


class TrajectorySender:
    """A producer end. Connects to the receiver's endpoint; `send` blocks under backpressure."""

    def __init__(self, endpoint: str, name: str | None = None, hwm: int = 64,
                 ctx: zmq.Context | None = None):
        # Frames go out zero-copy, so the sender's own context is terminated on close: that blocks until
        # every queued frame is on the wire (or `linger` passed) and nothing is freed under the I/O thread.
        self._own_ctx = ctx is None
        self._ctx = ctx or zmq.Context()
        self.name = name or f"sender-{uuid.uuid4().hex[:8]}"
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.ROUTING_ID, self.name.encode())
        self._sock.setsockopt(zmq.SNDHWM, hwm)
        self._sock.setsockopt(zmq.LINGER, 5000)
        self._sock.connect(endpoint)
        self.sent = 0

    def send(self, traj: Trajectory, timeout_ms: int | None = None) -> None:
        """Send one record. Raises TimeoutError if the channel stays full for `timeout_ms`."""
        self.send_frames(encode(traj), timeout_ms)

    def send_frames(self, frames: list, timeout_ms: int | None = None) -> None:
        """Send already-encoded frames (benchmarks and fuzz tests use this directly)."""
        if timeout_ms is not None and not self._sock.poll(timeout_ms, zmq.POLLOUT):
            raise TimeoutError(f"trajectory channel full for {timeout_ms} ms (consumer too slow)")
        self._sock.send_multipart(frames, copy=False)
        self.sent += 1

    def close(self, linger_ms: int = 5000) -> None:
        self._sock.close(linger_ms)
        if self._own_ctx:
            self._ctx.term()
