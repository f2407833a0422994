"""Sealed messages: authenticated encryption in the application, keyed by the run's CURVE key pairs.

CurveZMQ encrypts inside ZeroMQ's I/O thread with XSalsa20-Poly1305; on a 1 MB trajectory that takes about half
the channel's throughput. A sealed message carries the same guarantees over a plain TCP socket with AES-256-GCM
(hardware-accelerated, several GB/s per core), done by the sending and the receiving thread themselves:

- Keys. Nothing new is handed out: a client and a server share X25519(client secret, server public) =
  X25519(server secret, client public), the same Curve25519 keys `core.curve.RunKeys` already gives the run's
  actors. Each sender starts a session with a random 16-byte salt; its AES key is HKDF-SHA256 of the shared
  secret, the salt and the channel's label, so a key is never used by two sessions or two channels.
- Frames. `seal(frames)` returns a header frame (magic, the sender's public key, the salt, a counter) and each
  frame encrypted with nonce (frame index, counter) and the header plus the frame count as associated data: a
  frame cannot be moved to another message, another position or another sender, nor a message cut short.
- Who sent it. The receiver looks the public key up among the clients it admits (`unknown_key` if none) and
  names the sender by the name that key was issued under; a message that does not decrypt is `forged`.
- Replay. Within a session the counter must grow (`replayed` otherwise). Sessions are remembered only once a
  message of theirs authenticated, up to `max_sessions`; a whole old session replayed after being forgotten
  would deliver trajectories whose ids the coordinator has already taken (it drops duplicates).
Refusals raise `SealError` (a `WireError`, field "auth") and are counted in `refused` by reason: a receiver
counts them as refused clients, apart from the bad messages of its own clients.
"""
from __future__ import annotations

import collections
import os
import struct

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from zmq.utils import z85

from core.curve import CurveClient, CurveServer
from core.trajectory import WireError

MAGIC = b"AGS1"
HEADER = struct.Struct("<4s32s16sQ")  # magic, sender's public key (raw), session salt, message counter
TAG_BYTES = 16
_NONCE = struct.Struct("<IQ")  # frame index, message counter: 12 bytes, unique per key
_COUNT = struct.Struct("<I")


class SealError(WireError):
    """A sealed message refused: `reason` is unknown_key, forged, replayed or malformed."""

    def __init__(self, reason: str, message: str):
        super().__init__("auth", f"{reason}: {message}")
        self.reason = reason


def shared_secret(own_secret_z85: bytes, peer_public_z85: bytes) -> bytes:
    """The X25519 secret of two CURVE key pairs (Z85 keys as `zmq.curve_keypair` makes them)."""
    own = X25519PrivateKey.from_private_bytes(z85.decode(own_secret_z85))
    return own.exchange(X25519PublicKey.from_public_bytes(z85.decode(peer_public_z85)))


def session_cipher(shared: bytes, salt: bytes, label: bytes) -> AESGCM:
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=salt, info=b"agentgym seal v1 " + label).derive(shared)
    return AESGCM(key)


def overhead(frames: int) -> int:
    """Bytes a sealed message adds to `frames` plain frames."""
    return HEADER.size + TAG_BYTES * frames


class Sealer:
    """One sending session of a client (not thread-safe: one per socket)."""

    def __init__(self, client: CurveClient, label: bytes):
        self._salt = os.urandom(16)
        self._cipher = session_cipher(shared_secret(client.keys.secret, client.server_public), self._salt, label)
        self._public = z85.decode(client.keys.public)
        self._counter = 0

    def seal(self, frames: list) -> list:
        self._counter += 1
        header = HEADER.pack(MAGIC, self._public, self._salt, self._counter)
        aad = header + _COUNT.pack(len(frames))
        sealed = [header]
        for i, frame in enumerate(frames):
            sealed.append(self._cipher.encrypt(_NONCE.pack(i, self._counter), frame, aad))
        return sealed


class Opener:
    """The receiving end of every session of the clients of one server (not thread-safe: one per socket)."""

    def __init__(self, server: CurveServer, label: bytes, max_sessions: int = 4096):
        self._label = label
        self._shared = {z85.decode(public): (name, shared_secret(server.keys.secret, public))
                        for public, name in server.clients.items()}
        self._sessions: collections.OrderedDict[bytes, list] = collections.OrderedDict()  # key+salt -> [aes, n]
        self.max_sessions = max_sessions
        self.refused: collections.Counter[str] = collections.Counter()

    def _refuse(self, reason: str, message: str) -> SealError:
        self.refused[reason] += 1
        return SealError(reason, message)

    def open(self, frames: list, plain_frames: int, max_bytes: int) -> tuple[str, list[bytes]]:
        """(the sender's name, the plain frames) of a sealed message (frames: header first) that must hold
        `plain_frames` frames of at most `max_bytes` together, or SealError."""
        size = sum(map(len, frames))
        if len(frames) != plain_frames + 1 or size > max_bytes + overhead(plain_frames):
            raise self._refuse("malformed", f"not a sealed message of {plain_frames} frames within {max_bytes} "
                                            f"bytes ({len(frames)} frames, {size} bytes)")
        if len(frames[0]) != HEADER.size:
            raise self._refuse("malformed", f"no seal header (expected {HEADER.size} bytes first)")
        header = bytes(frames[0])
        magic, public, salt, counter = HEADER.unpack(header)
        if magic != MAGIC:
            raise self._refuse("malformed", f"seal magic {magic!r}")
        known = self._shared.get(public)
        if known is None:
            raise self._refuse("unknown_key", "the sender's key is not one this channel admits")
        name, shared = known
        session = self._sessions.get(public + salt)
        if session is not None and counter <= session[1]:
            raise self._refuse("replayed", f"{name}: message {counter} after {session[1]}")
        cipher = session[0] if session is not None else session_cipher(shared, salt, self._label)
        aad = header + _COUNT.pack(len(frames) - 1)
        try:
            plain = [cipher.decrypt(_NONCE.pack(i, counter), frame, aad) for i, frame in enumerate(frames[1:])]
        except (InvalidTag, ValueError, TypeError, OverflowError) as exc:
            raise self._refuse("forged", f"claims {name}'s key but does not authenticate "
                                         f"({type(exc).__name__})") from None
        if session is None:
            session = self._sessions[public + salt] = [cipher, 0]
            while len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
        else:
            self._sessions.move_to_end(public + salt)
        session[1] = counter
        return name, plain
