"""Admission before memory: under transport.cipher=aes-gcm a listener admits a connection only after a handshake
that only a holder of the run's keys can complete, before ZeroMQ passes (or buffers) a single message of it.

Sealed payloads (core.seal) prove who sent a message only once the whole message has been received, and ZeroMQ
holds a multipart message whole before anyone sees it: a cap per frame (ZMQ_MAXMSGSIZE) is not a cap per
message. So the sealed channels run ZeroMQ's PLAIN mechanism with the run's own ZAP handler (core.curve) in front
of them, and carry in it a token instead of a password:

- Token. `token = HMAC-SHA256(X25519(client secret, server public), LABEL + server public + client public)`, the
  same Curve25519 keys the run already issues (core.curve.RunKeys), nothing new handed out. The client sends its
  public key (Z85) as the PLAIN user name and the token (hex) as the password; the server's ZAP handler looks the
  key up among the clients this listener admits, recomputes the token from its own secret, compares in constant
  time, and answers 200 with the name the key was issued under as the User-Id (so every message's sender is
  that name, not a routing id or a hello the peer chose). ZeroMQ re-sends the same credentials on every
  reconnect, so the token is fixed per (client, server) pair.
- What holds. Before the handshake succeeded, libzmq's decoder holds at most one handshake frame, of at most the
  listener's ZMQ_MAXMSGSIZE (`frame_cap`; the largest frame a valid message has, not the whole message), and
  delivers no message frame; a peer that sends anything but a valid HELLO, or a token that does not verify, is
  disconnected (refusals counted in the ZAP handler's `refused`). A connection that does not finish its
  handshake within `HANDSHAKE_MS` is closed. What libzmq does not bound is how many such connections are open
  at once (the process's file-descriptor limit does).
- What does not hold. PLAIN sends the token in the clear: an on-path attacker who can read the run's traffic can
  replay it (and on plain TCP could inject into a stream anyway); it can then make a receiver buffer one
  message, which the sealed layer refuses once it is whole. On such networks use transport.cipher=curvezmq
  (CURVE's handshake proves the key without revealing anything replayable, and encrypts every frame).
"""
from __future__ import annotations

import hashlib
import hmac

import zmq
from zmq.utils import z85

from core.curve import CurveClient, CurveServer, ZapHandler, handler_for
from core.seal import shared_secret

LABEL = b"agentgym admission v1 "
HANDSHAKE_MS = 10_000  # an unfinished handshake is dropped after this (libzmq's default is 30 s)


def token(shared: bytes, server_public_z85: bytes, client_public_z85: bytes) -> bytes:
    """The admission token of one (client, server) pair, from their X25519 shared secret."""
    message = LABEL + z85.decode(server_public_z85) + z85.decode(client_public_z85)
    return hmac.new(shared, message, hashlib.sha256).hexdigest().encode()


def domain_of(server_public_z85: bytes) -> bytes:
    """The ZAP domain of a listener: one per server key, so one handler serves every listener of a context."""
    return b"agentgym-admission-" + server_public_z85


def admit_clients(handler: ZapHandler, server: CurveServer) -> None:
    """Teach `handler` the tokens of `server.clients` (public key Z85 -> name) for `server`'s listener."""
    handler.admit_plain(domain_of(server.keys.public), {
        public: (name, token(shared_secret(server.keys.secret, public), server.keys.public, public))
        for public, name in server.clients.items()})


def serve_admission(sock: zmq.Socket, ctx: zmq.Context, server: CurveServer, frame_cap: int) -> ZapHandler:
    """Make `sock` (not yet bound) admit only `server.clients`, by token, before any message; its frames are
    capped at `frame_cap` bytes. Returns the context's ZAP handler (`admit_clients` adds clients later)."""
    handler = handler_for(ctx)
    admit_clients(handler, server)
    sock.setsockopt(zmq.MAXMSGSIZE, frame_cap)
    sock.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_MS)
    sock.plain_server = True
    sock.zap_domain = domain_of(server.keys.public)
    return handler


def apply_admission(sock: zmq.Socket, client: CurveClient) -> None:
    """Give a client socket (not yet connected) its credentials for `client.server_public`'s listener."""
    public = client.keys.public
    sock.plain_username = public
    sock.plain_password = token(shared_secret(client.keys.secret, client.server_public), client.server_public,
                                public)
    sock.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_MS)
