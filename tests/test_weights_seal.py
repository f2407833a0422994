"""The sealed weights channel (core.weights.seal, transport.cipher=aes-gcm): a version arrives intact and
encrypted; a fuzz of sealed chunks (bit flips, truncation, extension, frames dropped, added, swapped, replayed
under other counters or keys) in which nothing altered is taken and nothing alters what is being assembled."""
from __future__ import annotations

import random
import time

import msgpack
import numpy as np
import zmq

from core.curve import RunKeys
from core.weights.control import key_message
from core.weights.publisher import WeightPublisher
from core.weights.seal import CHUNK_HEADER, BufferPool, ChunkOpener, ChunkSealer, PublisherSeal
from core.weights.subscriber import WeightSubscriber
from core.weights.tensors import TensorBytes

N = 20_000
SEED = 20261204
EXPECTED = {"w": (6,), "v": (2, 2)}


class Received:
    """What `recv_multipart(copy=False)` gives: objects with a `buffer`."""

    def __init__(self, data: bytes):
        self.buffer = memoryview(data)


def test_a_sealed_version_arrives_intact_and_nothing_of_it_is_readable_on_the_wire():
    keys = RunKeys.generate(["generator-0"], cipher="aes-gcm")
    pub = WeightPublisher(chunk_bytes=1 << 16, curve=keys.weights_server_side(["generator-0"]))
    sub = WeightSubscriber(pub.endpoint, name="generator-0", curve=keys.weights_client("generator-0"))
    pub.wait_for_peers(1, timeout_s=5)
    values = np.arange(100_000, dtype=np.float32)  # 400 KB: seven chunks
    sealed = pub.seal.chunks.seal(1, [b"C", b"header", values.tobytes()[:4096]])
    assert values.tobytes()[:64] not in b"".join(sealed)  # encrypted, not only authenticated
    pub.publish(1, [TensorBytes("w", "float32", values.shape, values.data)])
    got = sub.poll(10_000)
    assert got.version == 1 and bytes(got.tensors["w"].data) == values.tobytes()
    sub.ack(1)
    assert pub.wait_acks(1, timeout_s=5) == {"generator-0": (True, "")}
    assert pub.auth_refused == 0 and sub.drops.total == 0
    sub.close()
    pub.close()


def version_of(sealed: list) -> int:
    return CHUNK_HEADER.unpack(bytes(sealed[0]))[1]


def _mutate(rng: random.Random, sealed: list[bytes], other: list[bytes]) -> list[bytes]:
    """`sealed` altered in one of nine ways (never left as it was)."""
    frames = [bytes(f) for f in sealed]
    kind = rng.randrange(9)
    i = rng.randrange(len(frames))
    if kind == 0:  # a bit flip anywhere
        j = rng.randrange(len(frames[i]))
        frames[i] = frames[i][:j] + bytes([frames[i][j] ^ (1 << rng.randrange(8))]) + frames[i][j + 1:]
    elif kind == 1:  # truncated
        frames[i] = frames[i][:rng.randrange(len(frames[i]))]
    elif kind == 2:  # extended
        frames[i] = frames[i] + rng.randbytes(rng.randrange(1, 64))
    elif kind == 3 and len(frames) > 2:  # a frame dropped
        del frames[max(1, i)]
    elif kind == 4:  # a frame added
        frames.insert(rng.randrange(1, len(frames) + 1), rng.randbytes(rng.randrange(0, 40)))
    elif kind == 5 and len(frames) > 3:  # two parts swapped
        frames[2], frames[3] = frames[3], frames[2]
    elif kind == 6:  # the header of another sealed chunk (another counter)
        frames[0] = other[0]
    elif kind == 7:  # a part of another sealed chunk, in the same place
        if len(other) == len(frames):
            frames[i] = other[i] if i else frames[i] + b"\x00"
        else:
            frames[-1] = frames[-1] + b"\x01"
    else:  # sealed under a key the subscriber was never given
        frames = ChunkSealer().seal(version_of(sealed), [b"C"] + [b"x"] * (len(frames) - 1))
    if frames == [bytes(f) for f in sealed]:  # e.g. a flip that cancelled out: alter it for sure
        frames[-1] = frames[-1] + b"\x02"
    return frames


def _version(version: int) -> list[list[bytes]]:
    """A valid version of the two tensors of EXPECTED in two chunks."""
    w, v = np.arange(6, dtype=np.float32) * version, np.full((2, 2), version, np.float32)
    return [[b"C", msgpack.packb({"version": version, "seq": 0, "n_chunks": 2,
                                  "parts": [["w", "float32", [6], 0, 24], ["v", "float32", [2, 2], 0, 16]]}),
             w.tobytes(), v.tobytes()[:8]],
            [b"C", msgpack.packb({"version": version, "seq": 1, "n_chunks": 2,
                                  "parts": [["v", "float32", [2, 2], 8, 16]]}), v.tobytes()[8:]]]


def test_sealed_chunk_fuzz_nothing_altered_is_taken_and_the_assembly_is_untouched():
    """Genuine chunks of valid versions, each preceded by an altered copy: every altered one is refused as
    unauthentic or (a version number altered to an older one) ignored, counted either way, leaves the version
    being assembled exactly as it was, and every version completes."""
    keys = RunKeys.generate(["g"], cipher="aes-gcm")
    ctx = zmq.Context()
    fake = ctx.socket(zmq.ROUTER)
    fake.bind("inproc://fuzz-sealed-weights")
    sub = WeightSubscriber("inproc://fuzz-sealed-weights", name="g", ctx=ctx, expected=EXPECTED,
                           curve=keys.weights_client("g"))
    fake.recv_multipart()  # its sealed hello
    seal = PublisherSeal(keys.weights_server_side(["g"]), 64 << 10)
    sub.key_wait_s = 0  # no publisher here to wait for: a chunk of a version not announced is refused at once
    rng = random.Random(SEED)
    completed = 0
    previous = seal.chunks.seal(1, _version(1)[0])
    for i in range(N // 2):
        version = i + 2
        announce = key_message(sub.nonce, version, seal.chunks.key(version))
        sub._receive([Received(f) for f in seal.to("g", announce)], "the publisher")
        assert sub.seal.chunks.knows(version)
        for chunk in _version(version):
            genuine = seal.chunks.seal(version, chunk)
            context = f"seed {SEED} version {version}"
            before = sub._assembly, sub.latest_version, sub.drops.by_reason["auth"] + sub.ignored.total, \
                sub.drops.total + sub.ignored.total
            state = (before[0].next_seq, dict(before[0].filled)) if before[0] is not None else None
            sub._receive([Received(f) for f in _mutate(rng, genuine, previous)],
                         rng.choice(["the publisher", "a relay predecessor"]))
            after = sub.drops.by_reason["auth"] + sub.ignored.total, sub.drops.total + sub.ignored.total
            assert after == (before[2] + 1, before[3] + 1), (context, sub.drops.last_error)
            assert sub._assembly is before[0] and sub.latest_version == before[1], context
            if state is not None:
                assert (sub._assembly.next_seq, sub._assembly.filled) == state, context
            sub._receive([Received(f) for f in genuine], "a relay predecessor")  # the genuine one goes through
            previous = genuine
        ready = sub._ready
        assert ready is not None and ready.version == version, context
        assert bytes(ready.tensors["w"].data) == (np.arange(6, dtype=np.float32) * version).tobytes(), context
        sub._hand_out()
        completed += 1
    assert completed == N // 2 and sub.seal.refused + sub.ignored.total == N
    sub.close()
    fake.close(0)
    ctx.term()


def test_a_chunk_header_is_only_the_magic_version_and_counter():
    sealer = ChunkSealer()
    first, second = sealer.seal(7, [b"C", b"h", b"p"]), sealer.seal(7, [b"C", b"h", b"p"])
    magic, version, counter = CHUNK_HEADER.unpack(first[0])
    assert magic == b"AGC2" and version == 7 and counter == 1
    assert sealer.key(7) != sealer.key(8) and sealer.key(7) != ChunkSealer().key(7)  # per version, per publisher
    assert CHUNK_HEADER.unpack(second[0])[2] == 2 and first[1:] != second[1:]  # a new nonce for every seal


def test_a_sealed_chunk_buffer_is_reused_only_once_zeromq_has_released_it():
    pool, sealer = BufferPool(), ChunkSealer()  # frames of 64 KB or more: ZeroMQ sends them zero-copy
    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    pull.bind("inproc://sealed-buffers")
    push.connect("inproc://sealed-buffers")
    part = bytes(range(256)) * 400
    sealed = sealer.seal(1, [b"C", b"header", part], pool)
    assert isinstance(sealed[1], bytes) and isinstance(sealed[2], zmq.Frame)  # small frames are plain bytes
    first = pool._busy[0][0]
    push.send_multipart(sealed, copy=False)
    assert pool.take(len(first)) is not first  # still held by the frame (and maybe by ZeroMQ)
    got = pull.recv_multipart()
    del sealed
    deadline = time.monotonic() + 5
    while not pool._busy[0][1].done and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pool.take(len(first)) is first  # released: recycled
    opener = ChunkOpener()
    opener.learn(1, sealer.key(1))
    chunk = opener.open(got)
    out = bytearray(len(part))
    chunk.open_into(0, got[2], memoryview(out))
    assert chunk.header == b"header" and bytes(out) == part
    push.close(0)
    pull.close(0)
    ctx.term()
