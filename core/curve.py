"""ZeroMQ CURVE for the run's channels: per-run keys, and a ZAP handler that admits only the run's clients.

What must hold:
- Keys are made in memory when a run starts (`RunKeys.generate`) and reach the actors as constructor arguments
  (through Ray's object store), never through files or the config: a key pair is a secret of its run.
- A server socket with `CurveServer` applied accepts a connection only from a client whose public key the run
  issued; the handshake of any other client is refused by the ZAP handler (counted in `refused`), and that
  client can neither send nor receive a single message. Traffic is encrypted (CurveZMQ).
- Every message a CURVE server receives carries the name the ZAP handler gave its client's key (the frame's
  `User-Id` property): receivers use it, not anything the peer says about itself, to know who sent it.
- The same handler admits the PLAIN handshakes of core.admission (transport.cipher=aes-gcm): per listener (its
  ZAP domain), a client key is admitted only with the token made from it and the listener's key (compared in
  constant time), and named by the name the key was issued under, like a CURVE client.
- The ZAP handler never dies of a malformed request: it answers 400 and goes on. Refusals are counted by reason
  and logged at most once every `LOG_EVERY_S` (a peer reconnecting in a loop cannot flood the log).
"""
from __future__ import annotations

import collections
import hmac
import logging
import threading
import time
from dataclasses import dataclass, field

import zmq
from zmq.utils import z85

log = logging.getLogger("agentgym.curve")

ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # fixed by the ZAP protocol (ZeroMQ RFC 27)
ZAP_DOMAIN = b"agentgym"
LOG_EVERY_S = 10.0


@dataclass(frozen=True)
class KeyPair:
    """A CURVE key pair, Z85-encoded (40 bytes each)."""

    public: bytes
    secret: bytes = field(repr=False)

    @classmethod
    def generate(cls) -> "KeyPair":
        public, secret = zmq.curve_keypair()
        return cls(public, secret)


CIPHERS = ("aes-gcm", "curvezmq")  # how a channel with these keys encrypts: core.seal, or ZeroMQ's CURVE


@dataclass(frozen=True)
class CurveClient:
    """What a client socket needs: its own key pair and the server's public key (and the channel's cipher)."""

    server_public: bytes
    keys: KeyPair
    cipher: str = "curvezmq"

    def apply(self, sock: zmq.Socket) -> None:
        sock.curve_serverkey = self.server_public
        sock.curve_publickey = self.keys.public
        sock.curve_secretkey = self.keys.secret


@dataclass(frozen=True)
class CurveServer:
    """What a server socket needs: its key pair and the clients it admits (public key -> client name)."""

    keys: KeyPair
    clients: dict[bytes, str]
    cipher: str = "curvezmq"

    def apply(self, sock: zmq.Socket) -> None:
        sock.curve_server = True
        sock.curve_publickey = self.keys.public
        sock.curve_secretkey = self.keys.secret
        sock.zap_domain = ZAP_DOMAIN


def curve_available() -> bool:
    return bool(zmq.has("curve"))


class ZapHandler:
    """Answers the ZAP requests of one ZeroMQ context: admits the clients of every server registered on it.

    One handler per context (ZAP binds a fixed inproc endpoint). It runs in its own daemon thread; `stop`
    ends it. `refused` counts refused handshakes by reason.
    """

    def __init__(self, ctx: zmq.Context):
        self.ctx = ctx
        self._clients: dict[bytes, str] = {}
        self._plain: dict[bytes, dict[bytes, tuple[str, bytes]]] = {}  # domain -> user name -> (name, token)
        self._logged_at = -1e18
        self._unlogged = 0
        self.refused: collections.Counter[str] = collections.Counter()
        self.admitted = 0
        self._stop = threading.Event()
        self._sock = ctx.socket(zmq.REP)
        self._sock.linger = 0
        self._sock.bind(ZAP_ENDPOINT)
        self._thread = threading.Thread(target=self._serve, name="zap-handler", daemon=True)
        self._thread.start()

    def admit(self, clients: dict[bytes, str]) -> None:
        """Admit these client public keys (Z85) under their names."""
        for public, name in clients.items():
            self._clients[z85.decode(public)] = name

    def admit_plain(self, domain: bytes, clients: dict[bytes, tuple[str, bytes]]) -> None:
        """Admit PLAIN handshakes on listeners of `domain`: user name (a public key, Z85) -> (name, token)."""
        self._plain.setdefault(domain, {}).update(clients)

    def _refuse(self, reason: str, message: str, *args) -> None:
        self.refused[reason] += 1
        now = time.monotonic()
        if now - self._logged_at < LOG_EVERY_S:
            self._unlogged += 1
            return
        more = f" ({self._unlogged} more refusals since the last report)" if self._unlogged else ""
        log.warning(message + more, *args)
        self._logged_at, self._unlogged = now, 0

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                if not self._sock.poll(100):
                    continue
                request = self._sock.recv_multipart()
            except zmq.ZMQError as exc:
                if exc.errno == zmq.ETERM:  # the context is being terminated: its term() waits for this socket
                    self._stop.set()
                    self._sock.close(0)
                elif not self._stop.is_set():
                    log.error("ZAP handler stopped: %s", exc)
                break
            try:
                reply = self._answer(request)
            except Exception as exc:  # a malformed request: refuse it, keep serving
                self.refused["malformed"] += 1
                reply = [b"1.0", request[1] if len(request) > 1 else b"", b"400", str(exc)[:100].encode(), b"", b""]
            self._sock.send_multipart(reply)

    def _answer(self, request: list[bytes]) -> list[bytes]:
        version, request_id, domain, address, _identity, mechanism, *credentials = request
        if version != b"1.0":
            raise ValueError(f"ZAP version {version!r}")

        def reply(code: bytes, text: bytes, user: bytes = b"") -> list[bytes]:
            return [b"1.0", request_id, code, text, user, b""]

        peer = address.decode(errors="replace")
        if mechanism == b"PLAIN" and domain in self._plain and len(credentials) == 2:
            return self._answer_plain(self._plain[domain], credentials, peer, reply)
        if mechanism != b"CURVE" or domain != ZAP_DOMAIN or len(credentials) != 1:
            self._refuse("mechanism", "refused a %s connection from %s (domain %r)",
                         mechanism.decode(errors="replace"), peer, domain[:64])
            return reply(b"400", b"the run's keys are required")
        name = self._clients.get(credentials[0])
        if name is None:
            # A relay predecessor can also land here once, when its link races its admission (it is retried).
            self._refuse("unknown_key", "refused a connection from %s: its CURVE key is not admitted here (not one "
                         "of this run's, or a relay predecessor not yet named)", peer)
            return reply(b"400", b"unknown client key")
        self.admitted += 1
        return reply(b"200", b"OK", name.encode())

    def _answer_plain(self, clients: dict, credentials: list[bytes], peer: str, reply) -> list[bytes]:
        """A core.admission handshake: the user name is the client's public key, the password its token."""
        user, password = credentials
        known = clients.get(user)
        if known is None:
            # A relay predecessor can also land here once, when its link races its admission (it is retried).
            self._refuse("unknown_key", "refused a connection from %s: its key is not admitted here (not one of "
                         "this run's, or a relay predecessor not yet named)", peer)
            return reply(b"400", b"unknown client key")
        name, expected = known
        if not hmac.compare_digest(password, expected):
            self._refuse("bad_token", "refused a connection from %s: it claims %s's key without its token",
                         peer, name)
            return reply(b"400", b"bad admission token")
        self.admitted += 1
        return reply(b"200", b"OK", name.encode())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._sock.close(0)


_handlers: dict[int, ZapHandler] = {}
_handlers_lock = threading.Lock()


def serve_curve(sock: zmq.Socket, ctx: zmq.Context, server: CurveServer) -> ZapHandler:
    """Make `sock` (not yet bound) a CURVE server admitting `server.clients`; returns the context's handler."""
    if not curve_available():
        raise RuntimeError("this pyzmq's libzmq was built without CURVE; transport.auth=curve cannot work")
    handler = handler_for(ctx)
    handler.admit(server.clients)
    server.apply(sock)
    return handler


def handler_for(ctx: zmq.Context) -> ZapHandler:
    """The ZAP handler of `ctx`, started on first use."""
    with _handlers_lock:
        handler = _handlers.get(id(ctx))
        if handler is None or handler.ctx is not ctx or handler._stop.is_set():
            handler = _handlers[id(ctx)] = ZapHandler(ctx)
    return handler


def release_handler(ctx: zmq.Context) -> None:
    """Stop the ZAP handler of `ctx` (before the context is terminated)."""
    with _handlers_lock:
        handler = _handlers.pop(id(ctx), None)
    if handler is not None:
        handler.stop()


def peer_name(frame: zmq.Frame) -> str:
    """The name the ZAP handler gave the sender of `frame` ("" on a socket without authentication)."""
    try:
        return frame.get("User-Id") or ""
    except zmq.ZMQError:
        return ""


@dataclass(frozen=True)
class RunKeys:
    """Every key of one run: a server pair per channel and a client pair per actor that connects."""

    trajectory_server: KeyPair
    weights_server: KeyPair
    clients: dict[str, KeyPair]  # actor name -> its key pair
    cipher: str = "aes-gcm"  # transport.cipher, for both channels

    @classmethod
    def generate(cls, client_names: list[str], cipher: str = "aes-gcm") -> "RunKeys":
        if cipher not in CIPHERS:
            raise ValueError(f"cipher {cipher!r}: expected one of {CIPHERS}")
        return cls(KeyPair.generate(), KeyPair.generate(), {n: KeyPair.generate() for n in client_names},
                   cipher)

    def _server(self, keys: KeyPair, names: list[str]) -> CurveServer:
        return CurveServer(keys, {self.clients[n].public: n for n in names}, self.cipher)

    def trajectory_server_side(self, client_names: list[str]) -> CurveServer:
        """The receiver's keys, admitting these clients (the env pools)."""
        return self._server(self.trajectory_server, client_names)

    def weights_server_side(self, client_names: list[str]) -> CurveServer:
        """The publisher's keys, admitting these clients (the generator replicas)."""
        return self._server(self.weights_server, client_names)

    def trajectory_client(self, name: str) -> CurveClient:
        return CurveClient(self.trajectory_server.public, self.clients[name], self.cipher)

    def weights_client(self, name: str) -> CurveClient:
        return CurveClient(self.weights_server.public, self.clients[name], self.cipher)
