"""A weights subscriber's relay hop: the socket its predecessor forwards chunks into, and the socket it forwards
accepted chunks out of, to the successor the publisher named (core.weights.relay has the chain protocol).

What must hold:
- The inbound socket is a server: under the run's keys it uses this subscriber's own key pair and admits only
  the keys the publisher named as this subscriber's predecessors (all of them keys the run issued to its
  subscribers), so an outsider cannot push a single chunk into the chain. With cipher curvezmq by CURVE; with
  aes-gcm by core.admission's handshake (a token only the predecessor's key can make), before any message: an
  outsider makes it hold at most one handshake frame (<= `max_chunk_bytes`) for at most
  `core.admission.HANDSHAKE_MS`. Without keys it is bound where the publisher is (loopback, or a network the run
  was told to trust), with frames capped at `max_chunk_bytes` but not messages.
- Forwarding never holds more than about `hwm` chunks per direction (32: deep enough that a pipeline of
  processes sharing cores does not stall at every scheduling hiccup). Frames go out zero-copy (the received
  frames themselves); when the successor's queue is full they wait in `pending`, and the subscriber reads no
  more input until they are gone (backpressure up the chain). A successor that takes nothing for
  `stall_timeout_s` is dropped here (`dropped_successors`), so a dead or stalled successor blocks its
  predecessor for at most that long; one whose connection closes after its handshake (a killed process) is
  dropped as soon as that is seen.
- A link can race the successor's admission of this subscriber's key (the publisher's link messages to the two
  arrive in either order), and libzmq never reconnects after a refused CURVE handshake. So the outbound socket
  takes chunks only over a completed handshake (ZMQ_IMMEDIATE: nothing is queued into a connection that auth
  may still refuse, so nothing is lost to it), and a refused handshake is tried again every `RETRY_S` until the
  successor admits the key or the stall timeout drops it. The same holds of core.admission's handshake.
"""
from __future__ import annotations

import collections
import logging
import time

import zmq
from zmq.utils.monitor import recv_monitor_message

from core.admission import admit_clients, apply_admission, serve_admission
from core.curve import CurveClient, CurveServer, KeyPair, serve_curve
from core.transport import bind_endpoint

log = logging.getLogger("agentgym.weights")

RETRY_S = 0.1  # after a refused handshake, how soon the successor is tried again
OUT_EVENTS = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
              | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)


class Forwarder:
    def __init__(self, ctx: zmq.Context, name: str, host: str, keys: KeyPair | None, max_chunk_bytes: int,
                 hwm: int = 32, advertise: str = "", cipher: str = "curvezmq"):
        """`keys`: this subscriber's key pair (None: no keys, no auth); `cipher`: the run's transport.cipher."""
        self._ctx, self.name, self.keys, self.hwm = ctx, name, keys, hwm
        self.cipher = cipher
        self.inbound = ctx.socket(zmq.ROUTER)
        self.inbound.setsockopt(zmq.RCVHWM, hwm)
        self.inbound.setsockopt(zmq.LINGER, 0)
        self.inbound.setsockopt(zmq.MAXMSGSIZE, max_chunk_bytes)
        self.zap = None
        if keys is not None and cipher == "aes-gcm":  # admitted by token; the chunks themselves come sealed
            self.zap = serve_admission(self.inbound, ctx, CurveServer(keys, {}, cipher), max_chunk_bytes)
        elif keys is not None:
            self.zap = serve_curve(self.inbound, ctx, CurveServer(keys, {}))
        bound = bind_endpoint(self.inbound, host)
        # A wildcard bind is advertised under the address given (the node's own), so that others can connect.
        self.endpoint = bound.replace("0.0.0.0", advertise) if advertise else bound
        self.out: zmq.Socket | None = None
        self._monitor: zmq.Socket | None = None
        self._handshaken = False
        self._retry_at = 0.0  # when a refused handshake is tried again (0: none refused)
        self._next_key = ""
        self.next = ""
        self.pending: collections.deque[list] = collections.deque()
        self.blocked_since = 0.0
        self.stall_timeout_s = 30.0
        self.forwarded = 0
        self.dropped_successors = 0

    def admit(self, public_key: str) -> None:
        """Admit a predecessor's key (Z85), named by the publisher."""
        if self.zap is not None and public_key:
            clients = {public_key.encode(): f"{self.name}-predecessor"}
            if self.cipher == "aes-gcm":
                admit_clients(self.zap, CurveServer(self.keys, clients, self.cipher))
            else:
                self.zap.admit(clients)

    def link(self, endpoint: str, server_key: str, stall_timeout_s: float) -> None:
        """Forward to `endpoint` from now on ("" : to nobody). Chunks queued for an old successor are dropped."""
        self.stall_timeout_s = stall_timeout_s
        if endpoint == self.next and (self.out is not None or not endpoint):
            return
        self._close_out()
        self.next = endpoint
        if not endpoint:
            return
        if self.keys is not None and not server_key:
            log.warning("%s: relay link to %s without its key; not forwarding", self.name, endpoint)
            self.next = ""
            return
        self._next_key = server_key
        self._open_out()

    def _open_out(self) -> None:
        self.out = self._ctx.socket(zmq.DEALER)
        self.out.setsockopt(zmq.SNDHWM, self.hwm)
        self.out.setsockopt(zmq.LINGER, 0)
        self.out.setsockopt(zmq.IMMEDIATE, 1)
        if self.keys is not None and self.cipher == "aes-gcm":
            apply_admission(self.out, CurveClient(self._next_key.encode(), self.keys, self.cipher))
        elif self.keys is not None:
            CurveClient(self._next_key.encode(), self.keys).apply(self.out)
        self._monitor = self.out.get_monitor_socket(OUT_EVENTS)
        self._handshaken = False
        self._retry_at = 0.0
        self.out.connect(self.next)

    def _reopen_out(self) -> None:
        """A new connection to the same successor, keeping what is pending (a refused handshake is final)."""
        pending, blocked_since, endpoint = self.pending, self.blocked_since, self.next
        self.pending = collections.deque()
        self._close_out()
        self.pending, self.blocked_since, self.next = pending, blocked_since, endpoint
        self._open_out()

    def forward(self, frames: list) -> None:
        """Queue a validated chunk (its received frames, [kind, header, parts...]) for the successor."""
        if self.out is not None:
            self.pending.append(frames)
            self.flush()

    def flush(self) -> bool:
        """Send what the successor's queue takes now; True when nothing is left pending."""
        while self.pending and self.out is not None:
            try:
                self.out.send_multipart(self.pending[0], copy=False, flags=zmq.NOBLOCK)
            except zmq.Again:
                now = time.monotonic()
                if not self.blocked_since:
                    self.blocked_since = now
                if self._successor_gone():
                    why = "closed its connection"
                elif self._retry_at and now >= self._retry_at:
                    self._reopen_out()
                    continue
                elif now - self.blocked_since > self.stall_timeout_s:
                    why = f"took no chunk for {now - self.blocked_since:.1f} s"
                else:
                    return False
                log.warning("%s: successor %s %s; forwarding to nobody", self.name, self.next, why)
                self.dropped_successors += 1
                self._close_out()
                return True
            self.pending.popleft()
            self.forwarded += 1
            self.blocked_since = 0.0
        return True

    @property
    def blocked(self) -> bool:
        return bool(self.pending)

    def _successor_gone(self) -> bool:
        """Whether the successor's connection closed after a completed handshake (an auth race does not count)."""
        while self._monitor is not None and self._monitor.poll(0):
            event = recv_monitor_message(self._monitor)["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._handshaken = True
            elif event == zmq.EVENT_DISCONNECTED and self._handshaken:
                return True
            elif event in (zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                           zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL) and not self._retry_at:
                self._retry_at = time.monotonic() + RETRY_S
        return False

    def _close_out(self) -> None:
        if self._monitor is not None:
            self.out.disable_monitor()
            self._monitor.close(0)
            self._monitor = None
        if self.out is not None:
            self.out.close(0)
        self.out = None
        self.pending.clear()
        self.blocked_since = 0.0
        self.next = ""

    def close(self, linger_ms: int = 5000) -> None:
        """Close; chunks already handed to the successor's queue still go out (up to `linger_ms`)."""
        if self.out is not None:
            if self._monitor is not None:
                self.out.disable_monitor()
                self._monitor.close(0)
                self._monitor = None
            self.out.close(linger_ms)
            self.out = None
        self._close_out()
        self.inbound.close(0)
