"""The sealed weights channel (`transport.cipher=aes-gcm`): every message on plain TCP, sealed with AES-256-GCM in
the sending and receiving threads (core.seal has the primitives and why: CurveZMQ runs at a third of plain TCP on
a 256 MB model here).

Keys, all from the run's CURVE key pairs (core.curve.RunKeys); nothing new is handed out:
- Up (hello, ack, progress): sealed by each subscriber for the publisher (`core.seal.Sealer`, label
  "weights-up"). The publisher names the sender by its key, as ZAP did: a hello or an ack under another name
  is refused, and a message that is not sealed with a key of the run is refused and counted (`refused`).
- Down, to one subscriber (its relay links, the chunk key): sealed by the publisher for that subscriber's key
  (label "weights-down").
- Chunks: sealed once per chunk with a random 256-bit key of the publisher (`ChunkSealer`), which the publisher
  hands each subscriber that said hello, sealed for that subscriber alone (a "K" message). Relays forward the
  sealed frames as they came, so a chain costs one encryption per chunk, not one per hop, and a relay's inbound
  socket admits frames from anyone but opens only chunks sealed with the key.

A chunk's nonce is (frame index, a counter of the sealer), unique per key. A replayed chunk is a genuine chunk
of a version and sequence number the subscriber already handles (old versions and chunks it holds are ignored),
so there is no replay window to keep. A chunk whose parts do not authenticate is refused without touching what
the assembly counts as filled (core.weights_subscriber), so a forger cannot make a subscriber drop a version.
"""
from __future__ import annotations

import collections
import os
import struct

import zmq
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from core.curve import CurveClient, CurveServer
from core.seal import TAG_BYTES, Opener, Sealer, SealError

CHUNK_MAGIC = b"AGC1"
CHUNK_HEADER = struct.Struct("<4s16sQ")  # magic, key id, counter
_NONCE = struct.Struct("<IQ")  # frame index, counter
_COUNT = struct.Struct("<I")
KEY_MESSAGE = b"K"
UP, DOWN = b"weights-up", b"weights-down"
PUBLISHER = "the publisher"


def is_chunk(frames: list) -> bool:
    return len(frames) >= 2 and len(frames[0]) == CHUNK_HEADER.size and bytes(frames[0][:4]) == CHUNK_MAGIC


class ChunkSealer:
    """The publisher's chunk key: seals a chunk [b"C", header, parts...] as [seal header, header, parts...]."""

    def __init__(self):
        self.key_id, self.key = os.urandom(16), AESGCM.generate_key(256)
        self._cipher = AESGCM(self.key)
        self._counter = 0

    def seal(self, message: list, pool: BufferPool | None = None) -> list:
        """`pool`: large frames are sealed into its recycled buffers (zero-copy zmq frames it tracks)."""
        self._counter += 1
        frames = message[1:]
        header = CHUNK_HEADER.pack(CHUNK_MAGIC, self.key_id, self._counter)
        aad = header + _COUNT.pack(len(frames))
        sealed: list = [header]
        for i, frame in enumerate(frames):
            nonce = _NONCE.pack(i, self._counter)
            size = memoryview(frame).nbytes + TAG_BYTES
            if pool is None or size < pool.min_bytes:
                sealed.append(self._cipher.encrypt(nonce, frame, aad))
            else:
                out = pool.take(size)
                self._cipher.encrypt_into(nonce, frame, aad, out)
                sealed.append(pool.frame(out))
        return sealed

    def key_message(self) -> list[bytes]:
        return [KEY_MESSAGE, self.key_id + self.key]


class ChunkOpener:
    """A subscriber's chunk keys (the last few publishers'): opens a sealed chunk's header, then its parts straight
    into the buffers they belong in."""

    def __init__(self, max_keys: int = 4):
        self._keys: collections.OrderedDict[bytes, AESGCM] = collections.OrderedDict()
        self.max_keys = max_keys
        self.refused: collections.Counter[str] = collections.Counter()

    def learn(self, body: bytes) -> None:
        if len(body) != 48:
            raise self.refuse("malformed", f"a chunk key message of {len(body)} bytes, expected 48")
        self._keys[bytes(body[:16])] = AESGCM(bytes(body[16:]))
        while len(self._keys) > self.max_keys:
            self._keys.popitem(last=False)

    def knows(self, frames: list) -> bool:
        return bytes(frames[0][4:20]) in self._keys

    @property
    def has_key(self) -> bool:
        return bool(self._keys)

    def refuse(self, reason: str, message: str) -> SealError:
        self.refused[reason] += 1
        return SealError(reason, message)

    def open(self, frames: list) -> OpenChunk:
        """The chunk's plain header, and a way to open its parts; SealError if it is not one of ours."""
        header = bytes(frames[0])
        _, key_id, counter = CHUNK_HEADER.unpack(header)
        cipher = self._keys.get(key_id)
        if cipher is None:
            raise self.refuse("unknown_key", "a chunk sealed with a key this subscriber was not given")
        chunk = OpenChunk(self, cipher, header + _COUNT.pack(len(frames) - 1), counter)
        chunk.header = chunk.plain(0, frames[1])
        return chunk


class OpenChunk:
    def __init__(self, opener: ChunkOpener, cipher: AESGCM, aad: bytes, counter: int):
        self._opener, self._cipher, self._aad, self._counter = opener, cipher, aad, counter
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
    """A subscriber's keys: seals what it sends up, opens what the publisher sends it and the chunks."""

    def __init__(self, client: CurveClient, max_control_bytes: int):
        self._up = Sealer(client, UP)
        self._down = Opener(CurveServer(client.keys, {client.server_public: PUBLISHER}), DOWN)
        self._max = max_control_bytes
        self.chunks = ChunkOpener()

    @property
    def refused(self) -> int:
        return sum(self._down.refused.values()) + sum(self.chunks.refused.values())

    def seal(self, message: list) -> list:
        return self._up.seal(message)

    def open_control(self, frames: list) -> list[bytes]:
        """[kind, body] of a message the publisher sealed for this subscriber; a chunk key is learned here."""
        _, plain = self._down.open(frames, 2, self._max)
        if plain[0] == KEY_MESSAGE:
            self.chunks.learn(plain[1])
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

    def __init__(self, messages: list[list], sealer: ChunkSealer, pool: BufferPool | None = None, window: int = 24):
        self._messages, self._sealer, self._pool, self.window = messages, sealer, pool, window
        self._sealed: dict[int, list] = {}

    def __len__(self) -> int:
        return len(self._messages)

    def __getitem__(self, i: int) -> list:
        sealed = self._sealed.get(i)
        if sealed is None:
            sealed = self._sealed[i] = self._sealer.seal(self._messages[i], self._pool)
            while len(self._sealed) > self.window:
                del self._sealed[next(iter(self._sealed))]
        return sealed
