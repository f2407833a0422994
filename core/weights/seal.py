"""The sealed weights channel (`transport.cipher=aes-gcm`): every message on plain TCP, sealed with AES-256-GCM in
the sending and receiving threads (core.seal has the primitives and why: CurveZMQ runs at a third of plain TCP on
a 256 MB model here).

Keys, all from the run's CURVE key pairs (core.curve.RunKeys) and one random secret of the publisher:
- Up (hello, ack, progress): sealed by each subscriber for the publisher (`core.seal.Sealer`, label
  "weights-up"). The publisher names the sender by its key, as ZAP did: a hello or an ack under another name
  is refused, and a message that is not sealed with a key of the run is refused and counted (`refused`).
- Down, to one subscriber (its relay links, its K messages): sealed by the publisher for that subscriber's key
  (label "weights-down").
- Chunks: sealed once per chunk with the key of their version, HKDF(the publisher's secret, version)
  (`ChunkSealer`); the clear seal header names the version, and is part of what the tag authenticates. Relays
  forward the sealed frames as they came, so a chain costs one encryption per chunk, not one per hop.

The K message [b"K", {"nonce", "version", "key"}] (core.weights.control; sent in every mode, a key only with
aes-gcm): the publisher answers each hello with one (the version it is at), and sends one to every subscriber
before the chunks of each version it publishes (that version and its chunk key, sealed for that subscriber
alone). "nonce" repeats the random nonce of the hello it answers: valid for one incarnation of a subscriber.

What must hold:
- A subscriber holds the keys of versions the publisher announced to *this* incarnation, no other: a K message
  whose nonce is not its own (a capture from an earlier incarnation) is refused, and so is every message of the
  publisher's down session sealed before the first K message that carries its nonce (`SubscriberSeal`). A
  restarted subscriber therefore cannot open chunks of versions older than the one the publisher was at when
  it said hello, and does not go back to them (core.weights.subscriber).
- A chunk's nonce is (frame index, a counter of the sealer), unique per key: the counter never repeats within a
  publisher, and keys are per version and per publisher.
- A chunk is opened before anything reads its header; a part that does not authenticate is refused without
  touching what the assembly counts as filled (core.weights.assembly), so a forger cannot make a subscriber drop
  or complete a version. A genuine chunk replayed (early, late, twice, or from an old version) is authentic but
  out of place: the subscriber ignores and counts it; there is no replay window to keep.
"""
from __future__ import annotations

import collections
import os
import struct

import zmq
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from core.curve import CurveClient, CurveServer
from core.seal import HEADER, TAG_BYTES, Opener, Sealer, SealError
from core.trajectory import WireError
from core.weights.control import read_key_message

CHUNK_MAGIC = b"AGC2"
CHUNK_HEADER = struct.Struct("<4sqQ")  # magic, version, counter
_NONCE = struct.Struct("<IQ")  # frame index, counter
_COUNT = struct.Struct("<I")
KEY_MESSAGE = b"K"  # core.weights.control has its format
UP, DOWN = b"weights-up", b"weights-down"
PUBLISHER = "the publisher"
def is_chunk(frames: list) -> bool:
    return len(frames) >= 2 and len(frames[0]) == CHUNK_HEADER.size and bytes(frames[0][:4]) == CHUNK_MAGIC


def chunk_version(frames: list) -> int:
    """The version a sealed chunk's clear header claims (authenticated only once the chunk is opened)."""
    return CHUNK_HEADER.unpack(bytes(frames[0]))[1]


def _derive(secret: bytes, version: int) -> bytes:
    info = b"agentgym weights chunk v2 " + struct.pack("<q", version)
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(secret)


class ChunkSealer:
    """The publisher's chunk keys: seals a chunk [b"C", header, parts...] of `version` as [seal header, header,
    parts...] under that version's key."""

    def __init__(self, max_keys: int = 4):
        self._secret = os.urandom(32)
        self._ciphers: collections.OrderedDict[int, AESGCM] = collections.OrderedDict()
        self.max_keys = max_keys
        self._counter = 0

    def key(self, version: int) -> bytes:
        return _derive(self._secret, version)

    def _cipher(self, version: int) -> AESGCM:
        cipher = self._ciphers.get(version)
        if cipher is None:
            cipher = self._ciphers[version] = AESGCM(self.key(version))
            while len(self._ciphers) > self.max_keys:
                self._ciphers.popitem(last=False)
        return cipher

    def seal(self, version: int, message: list, pool: BufferPool | None = None) -> list:
        """`pool`: large frames are sealed into its recycled buffers (zero-copy zmq frames it tracks)."""
        cipher = self._cipher(version)
        self._counter += 1
        frames = message[1:]
        header = CHUNK_HEADER.pack(CHUNK_MAGIC, version, self._counter)
        aad = header + _COUNT.pack(len(frames))
        sealed: list = [header]
        for i, frame in enumerate(frames):
            nonce = _NONCE.pack(i, self._counter)
            size = memoryview(frame).nbytes + TAG_BYTES
            if pool is None or size < pool.min_bytes:
                sealed.append(cipher.encrypt(nonce, frame, aad))
            else:
                out = pool.take(size)
                cipher.encrypt_into(nonce, frame, aad, out)
                sealed.append(pool.frame(out))
        return sealed


class ChunkOpener:
    """A subscriber's chunk keys (of the last few versions announced to it): opens a sealed chunk's header, then
    its parts straight into the buffers they belong in."""

    def __init__(self, max_keys: int = 4):
        self._keys: dict[int, AESGCM] = {}
        self.max_keys = max_keys
        self.refused: collections.Counter[str] = collections.Counter()

    def learn(self, version: int, key: bytes) -> None:
        if len(key) != 32:
            raise self.refuse("malformed", f"a chunk key of {len(key)} bytes, expected 32")
        if version not in self._keys:
            self._keys[version] = AESGCM(key)
            for old in sorted(self._keys)[:-self.max_keys]:  # the newest versions are kept
                del self._keys[old]

    def knows(self, version: int) -> bool:
        return version in self._keys

    def refuse(self, reason: str, message: str) -> SealError:
        self.refused[reason] += 1
        return SealError(reason, message)

    def open(self, frames: list) -> OpenChunk:
        """The chunk's plain header, and a way to open its parts; SealError if it is not one of ours."""
        header = bytes(frames[0])
        _, version, counter = CHUNK_HEADER.unpack(header)
        cipher = self._keys.get(version)
        if cipher is None:
            raise self.refuse("unknown_key", f"a chunk of version {version}, whose key this subscriber was not given")
        chunk = OpenChunk(self, cipher, header + _COUNT.pack(len(frames) - 1), version, counter)
        chunk.header = chunk.plain(0, frames[1])
        return chunk


class OpenChunk:
    def __init__(self, opener: ChunkOpener, cipher: AESGCM, aad: bytes, version: int, counter: int):
        self._opener, self._cipher, self._aad, self._counter = opener, cipher, aad, counter
        self.version = version  # authenticated: the header is part of the associated data
        self.header = b""

    def plain(self, index: int, frame) -> bytes:
        try:
            return self._cipher.decrypt(_NONCE.pack(index, self._counter), frame, self._aad)
        except (InvalidTag, ValueError, TypeError, OverflowError) as exc:
            raise self._opener.refuse("forged", f"chunk frame {index} does not authenticate "
                                                 f"({type(exc).__name__})") from None

    def part_size(self, frame) -> int:
        return len(frame) - TAG_BYTES

    def refuse(self, message: str) -> SealError:
        return self._opener.refuse("forged", message)

    def verify(self, parts: list) -> None:
        """Authenticate every part without keeping it (a chunk that is then ignored); SealError if one fails."""
        for i, frame in enumerate(parts):
            self.plain(i + 1, frame)

    def open_into(self, part: int, frame, out: memoryview) -> None:
        """Open part `part` (frame part + 1) into `out` (exactly its plain size). On a refusal `out` holds
        garbage: the caller counts nothing of it as filled."""
        try:
            self._cipher.decrypt_into(_NONCE.pack(part + 1, self._counter), frame, self._aad, out)
        except (InvalidTag, ValueError, TypeError, OverflowError) as exc:
            raise self._opener.refuse("forged", f"chunk part {part} does not authenticate "
                                                 f"({type(exc).__name__})") from None


class PublisherSeal:
    """The publisher's keys: opens what subscribers send, seals what goes to one of them, and seals chunks."""

    def __init__(self, server: CurveServer, max_control_bytes: int):
        self._up = Opener(server, UP)
        self._server, self._max = server, max_control_bytes
        self._publics = {name: public for public, name in server.clients.items()}
        self._down: dict[str, Sealer] = {}
        self.chunks = ChunkSealer()
        self.buffers = BufferPool()

    @property
    def refused(self) -> collections.Counter[str]:
        return self._up.refused

    def open(self, frames: list) -> tuple[str, list[bytes]]:
        """(the sender's name, [kind, body]) of a subscriber's sealed message; SealError otherwise."""
        return self._up.open(frames, 2, self._max)

    def to(self, name: str, message: list) -> list:
        """`message` sealed for the subscriber `name` alone."""
        sealer = self._down.get(name)
        if sealer is None:
            sealer = self._down[name] = Sealer(CurveClient(self._publics[name], self._server.keys), DOWN)
        return sealer.seal(message)


class SubscriberSeal:
    """A subscriber's keys: seals what it sends up, opens what the publisher sends it and the chunks.

    `nonce`: the one this incarnation's hello carries. Of the publisher's down messages, only a K message with
    that nonce is taken first; it pins the publisher's down session (its salt), and every later message must
    come from that session with a growing counter (core.seal.Opener), so nothing sealed for an earlier
    incarnation, before this one said hello, opens here."""

    def __init__(self, client: CurveClient, max_control_bytes: int, nonce: str):
        self._up = Sealer(client, UP)
        self._down = Opener(CurveServer(client.keys, {client.server_public: PUBLISHER}), DOWN)
        self._max = max_control_bytes
        self.nonce = nonce
        self._session: bytes | None = None
        self.chunks = ChunkOpener()

    @property
    def refused(self) -> int:
        return sum(self._down.refused.values()) + sum(self.chunks.refused.values())

    def seal(self, message: list) -> list:
        return self._up.seal(message)

    def open_control(self, frames: list) -> list[bytes]:
        """[kind, body] of a message the publisher sealed for this incarnation; a chunk key is learned here.
        SealError (reason "replayed") for one sealed for an earlier incarnation."""
        _, plain = self._down.open(frames, 2, self._max)
        salt = HEADER.unpack(bytes(frames[0]))[2]
        if plain[0] == KEY_MESSAGE:
            try:
                version, key, _ = read_key_message(plain, self.nonce, sealed=True)
            except WireError as exc:
                raise self.chunks.refuse("replayed" if exc.field == "nonce" else "malformed", str(exc)) from None
            if self._session is None:
                self._session = salt
            if version >= 0:
                self.chunks.learn(version, key)
        if salt != self._session:
            raise self.chunks.refuse("replayed", "a message of the publisher sealed before this subscriber's "
                                                 "hello was answered")
        return plain


class BufferPool:
    """Buffers for sealed chunks, reused once ZeroMQ has released every send of them: a fresh 4 MB buffer per
    chunk costs page faults that make sealing take about three times as long (measured: 83 vs 30 ms to seal
    256 MB). Holds at most `max_buffers` free ones."""

    def __init__(self, min_bytes: int = 64 << 10, max_buffers: int = 48):
        self.min_bytes, self.max_buffers = min_bytes, max_buffers
        self._busy: list[tuple[bytearray, zmq.MessageTracker]] = []
        self._free: dict[int, list[bytearray]] = collections.defaultdict(list)

    def take(self, size: int) -> bytearray:
        if self._busy:
            still = []
            for buf, tracker in self._busy:
                if tracker.done:
                    if sum(map(len, self._free.values())) < self.max_buffers:
                        self._free[len(buf)].append(buf)
                else:
                    still.append((buf, tracker))
            self._busy = still
        free = self._free.get(size)
        return free.pop() if free else bytearray(size)

    def frame(self, buf: bytearray) -> zmq.Frame:
        """A zero-copy frame of `buf`; `buf` is free again once the frame and every send of it are gone."""
        frame = zmq.Frame(buf, track=True)
        self._busy.append((buf, frame.tracker))
        return frame


class SealedChunks:
    """A version's chunks for the publisher, each sealed when it is first sent: only the last `window` sealed
    copies are kept, so sealing never holds a second copy of the model; a chunk sent again later (a slow peer,
    a re-feed) is sealed again, under a new counter."""

    def __init__(self, version: int, messages: list[list], sealer: ChunkSealer, pool: BufferPool | None = None,
                 window: int = 24):
        self.version, self._messages, self._sealer, self._pool, self.window = version, messages, sealer, pool, window
        self._sealed: dict[int, list] = {}

    def __len__(self) -> int:
        return len(self._messages)

    def __getitem__(self, i: int) -> list:
        sealed = self._sealed.get(i)
        if sealed is None:
            sealed = self._sealed[i] = self._sealer.seal(self.version, self._messages[i], self._pool)
            while len(self._sealed) > self.window:
                del self._sealed[next(iter(self._sealed))]
        return sealed
