"""What a weights subscriber does with chunks that are genuine but out of place, replayed, altered, or numbered to
wedge it (core.weights.subscriber, core.weights.assembly, core.weights.seal), on loopback with real publishers:

- a genuine chunk arriving early, late or twice, and an altered copy, on a relay hop: the version still completes
  at once (well under the stall timeout), and the early and duplicate copies are counted, not taken;
- captured chunks and chunk keys replayed into a restarted subscriber: refused, it never goes back in versions;
- plain mode (auth off): a version numbered far ahead of the publisher, or a chunk 0 that never continues, does
  not wedge a subscriber; a well-formed forged chunk on a relay hop is refused by the digest the publisher sent;
  a header claiming a 1 TiB tensor is refused with the constructor's defaults.
"""
from __future__ import annotations

import threading
import time

import msgpack
import numpy as np
import pytest
import zmq

from core.curve import RunKeys
from core.weights.control import chunk_digest, key_message
from core.weights.publisher import WeightPublisher
from core.weights.subscriber import WeightSubscriber
from core.weights.tensors import TensorBytes

LOOPBACK = "127.0.0.1"
RELAY = "a relay predecessor"


class Received:
    """What `recv_multipart(copy=False)` gives: objects with a `buffer`."""

    def __init__(self, data: bytes):
        self.buffer = memoryview(data)


def tensors_of(version: int, n: int = 1 << 17) -> list[TensorBytes]:
    big = np.arange(n, dtype=np.float32) * version
    small = np.full((3, 5), version, np.int64)
    return [TensorBytes("big", "float32", big.shape, big.data), TensorBytes("small", "int64", small.shape, small.data)]


def digest(ws) -> dict[str, bytes]:
    return {name: bytes(t.data) for name, t in ws.tensors.items()}


def reader(sub: WeightSubscriber, out: dict, timeout_ms: int = 30_000) -> threading.Thread:
    def run():
        ws = sub.poll(timeout_ms)
        if ws is not None:
            out[sub.name] = (ws.version, digest(ws), time.monotonic())
            sub.ack(ws.version)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _copy(frames) -> list[bytes]:
    return [bytes(f.buffer) if hasattr(f, "buffer") else bytes(f) for f in frames]


def _altered(frames: list[bytes]) -> list[bytes]:
    last = bytearray(frames[-1])
    last[len(last) // 2] ^= 0x10
    return frames[:-1] + [bytes(last)]


@pytest.mark.parametrize("cipher", ["aes-gcm", None])
def test_early_duplicate_and_altered_chunks_on_a_relay_hop_do_not_hold_up_the_version(cipher):
    """An on-path attacker (here: the predecessor's outbound stream) pushes into generator-1's relay socket a
    genuine chunk of the version in flight before its turn, copies of chunks it already has and (sealed) a copy
    with its data altered. Before, the early chunk made it drop the version until the publisher re-fed it after
    the stall timeout; now it is ignored and the version completes as fast as generator-0's."""
    gens = ["generator-0", "generator-1"]
    keys = RunKeys.generate(gens, cipher=cipher) if cipher else None
    pub = WeightPublisher(chunk_bytes=64 << 10, fanout="relay", stall_timeout_s=20.0, expected=gens,
                          curve=keys.weights_server_side(gens) if keys else None)
    subs = []
    for i, name in enumerate(gens):
        subs.append(WeightSubscriber(pub.endpoint, name=name, relay_host=LOOPBACK,
                                     curve=keys.weights_client(name) if keys else None))
        pub.wait_for_peers(i + 1, timeout_s=5)
    head = subs[0]
    original = head.relay.forward
    held: list[list[bytes]] = []
    seen: list[list[bytes]] = []

    def forward(frames):  # chunks 2.. of the version are held until chunk 4 is in, then sent after injections
        frames = _copy(frames)
        seen.append(frames)
        if len(seen) < 3:
            return original(frames)
        held.append(frames)
        if len(seen) == 5:
            original(seen[4])  # early: generator-1 expects chunk 2
            if cipher:
                original(_altered(seen[2]))  # its turn, its data altered
                original(_altered(seen[4]))  # early and altered
            original(seen[0])  # twice
            for chunk in held:
                original(chunk)
            original(seen[3])  # late
            held.clear()
        elif len(seen) > 5:
            held.clear()
            original(frames)

    head.relay.forward = forward
    got: dict = {}
    threads = [reader(s, got) for s in subs]
    start = time.monotonic()
    pub.publish(1, tensors_of(1))
    for t in threads:
        t.join(30)
    assert len(seen) >= 8  # the version has enough chunks for the injections above
    want = {t.name: bytes(t.data) for t in tensors_of(1)}
    assert [got[name][0] for name in gens] == [1, 1]
    assert got["generator-0"][1] == want and got["generator-1"][1] == want, "the bytes differ"
    took = got["generator-1"][2] - start
    assert took < 5.0, f"generator-1 took {took:.1f} s (the stall timeout is 20 s)"
    assert pub.wait_acks(1, timeout_s=10) == {name: (True, "") for name in gens}
    assert pub.relinked == 0 and not pub.stalled
    late = subs[1]
    assert late.ignored.by_reason["early"] >= 1 and late.ignored.by_reason["duplicate"] >= 2
    if cipher:
        assert late.drops.by_reason["auth"] == 2  # the altered copies: refused, not taken
    for s in subs:
        s.close()
    pub.close()


@pytest.mark.parametrize("cipher", ["aes-gcm", None])
def test_chunks_and_keys_replayed_into_a_restarted_subscriber_are_refused(cipher):
    """Everything generator-0 received for versions 1 and 2 (chunk keys, chunks) is captured; Ray restarts it
    while the publisher is at 3, and the capture is replayed into the new process, on its connection to the
    publisher (sealed only: an on-path attacker) and on its relay socket. It loads neither version, and takes the
    publisher's next one."""
    keys = RunKeys.generate(["generator-0"], cipher=cipher) if cipher else None
    server = keys.weights_server_side(["generator-0"]) if keys else None
    client = keys.weights_client("generator-0") if keys else None
    pub = WeightPublisher(chunk_bytes=32 << 10, curve=server, expected=["generator-0"])
    first = WeightSubscriber(pub.endpoint, name="generator-0", curve=client)
    captured: list[list[bytes]] = []
    receive = first._receive

    def spy(received, source):
        captured.append(_copy(received))
        receive(received, source)

    first._receive = spy
    pub.wait_for_peers(1, timeout_s=5)
    for version in (1, 2, 3):
        pub.publish(version, tensors_of(version, 1 << 14))
        ws = first.poll(10_000)
        assert ws is not None and ws.version == version
        first.ack(version)
        assert pub.wait_acks(version, timeout_s=5) == {"generator-0": (True, "")}
        if version == 2:
            replay = list(captured)
    first.close()
    before = set(pub.peers)
    again = WeightSubscriber(pub.endpoint, name="generator-0", curve=client, relay_host=LOOPBACK)
    deadline = time.monotonic() + 5
    while set(pub.peers) == before:  # until the publisher took its hello (said again if it came too early)
        pub.poll(20)
        again.poll(0)
        assert time.monotonic() < deadline
    assert again.poll(300) is None  # and it read the publisher's answer
    sources = ["the publisher", RELAY] if cipher else [RELAY]
    for source in sources:
        for frames in replay:
            again._receive([Received(f) for f in frames], source)
        assert again._ready is None and again._assembly is None, source
    assert again.poll(300) is None  # nothing captured completes a version
    pub.publish(4, tensors_of(4, 1 << 14))
    ws = again.poll(10_000)
    assert ws is not None and ws.version == 4
    assert digest(ws) == {t.name: bytes(t.data) for t in tensors_of(4, 1 << 14)}, "the bytes differ"
    again.close()
    pub.close()


def _relay_socket(sub: WeightSubscriber) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(sub.relay.endpoint)
    return sock


def _one_chunk(version: int, n_chunks: int = 1) -> list[bytes]:
    small = np.full((3, 5), 9, np.int64)
    return [b"C", msgpack.packb({"version": version, "seq": 0, "n_chunks": n_chunks,
                                 "parts": [["small", "int64", [3, 5], 0, 120]]}), small.tobytes()]


@pytest.mark.parametrize("attack", ["complete", "stalled"])
def test_plain_mode_a_version_numbered_far_ahead_does_not_wedge_a_subscriber(attack):
    """Auth off on loopback: anyone can write into a relay socket. A one-chunk version numbered 2**40 + 1 (or a
    chunk 0 of it that never continues) used to be taken (or waited on), and every later version ignored."""
    pub = WeightPublisher(chunk_bytes=32 << 10, fanout="relay", stall_timeout_s=10.0)
    sub = WeightSubscriber(pub.endpoint, name="gen-0", relay_host=LOOPBACK)
    pub.wait_for_peers(1, timeout_s=5)
    assert sub.poll(200) is None  # reads the publisher's answer to its hello
    intruder = _relay_socket(sub)
    intruder.send_multipart(_one_chunk((1 << 40) + 1, 1 if attack == "complete" else 2))
    intruder.send_multipart(_one_chunk(1000, 2))
    first = sub.poll(500)
    assert first is None, f"took version {first.version} from the relay socket"
    for version in (1, 2):
        got: dict = {}
        thread = reader(sub, got, 10_000)
        pub.publish(version, tensors_of(version, 1 << 12))
        thread.join(15)
        assert got.get("gen-0", (None,))[0] == version
        assert got["gen-0"][1] == {t.name: bytes(t.data) for t in tensors_of(version, 1 << 12)}, "the bytes differ"
    assert sub.drops.by_reason["version"] == 2  # both numbers far ahead of what the publisher announced
    intruder.close(0)
    sub.close()
    pub.close()


def test_a_header_claiming_a_terabyte_tensor_is_refused_with_the_constructor_defaults():
    fake = zmq.Context.instance().socket(zmq.ROUTER)
    port = fake.bind_to_random_port(f"tcp://{LOOPBACK}")
    sub = WeightSubscriber(f"tcp://{LOOPBACK}:{port}", name="g")  # no `expected`, no `max_total_bytes`
    peer = fake.recv_multipart()[0]
    huge = [b"C", msgpack.packb({"version": 1, "seq": 0, "n_chunks": 2,
                                 "parts": [["w", "uint8", [1 << 40], 0, 1 << 40]]}), b"\x00" * 64]
    fake.send_multipart([peer] + huge)
    assert sub.poll(300) is None  # nothing raised out of poll
    assert sub.drops.by_reason["parts"] == 1
    fine = [b"C", msgpack.packb({"version": 2, "seq": 0, "n_chunks": 1,
                                 "parts": [["w", "float32", [2], 0, 8]]}), np.array([1.5, 2.5], np.float32).tobytes()]
    fake.send_multipart([peer] + fine)
    ws = sub.poll(5000)
    assert ws is not None and ws.version == 2
    sub.close()
    fake.close(0)


def test_plain_mode_a_well_formed_forged_chunk_on_a_relay_hop_is_refused_and_the_genuine_one_taken():
    """Auth off on loopback: anyone can write into a relay socket. A well-formed chunk of the version in flight
    with other bytes, arriving before the genuine one, used to be taken (the version handed out altered). The
    publisher's K message vouches for each chunk by its digest, on a connection nobody else writes to."""
    fake = zmq.Context.instance().socket(zmq.ROUTER)
    port = fake.bind_to_random_port(f"tcp://{LOOPBACK}")
    sub = WeightSubscriber(f"tcp://{LOOPBACK}:{port}", name="gen-1", relay_host=LOOPBACK)
    peer, _, hello = fake.recv_multipart()
    nonce = msgpack.unpackb(hello)["nonce"]
    genuine = [b"C", msgpack.packb({"version": 1, "seq": 0, "n_chunks": 1, "parts": [["w", "float32", [2], 0, 8]]}),
               np.array([1.5, 2.5], np.float32).tobytes()]
    forged = genuine[:2] + [np.array([-7.0, 7.0], np.float32).tobytes()]
    fake.send_multipart([peer] + key_message(nonce, 1, digests=chunk_digest(genuine[1:])))
    intruder, predecessor = _relay_socket(sub), _relay_socket(sub)
    intruder.send_multipart(forged)
    assert sub.poll(500) is None, "the forged chunk was taken"
    assert sub.drops.by_reason["digest"] == 1
    predecessor.send_multipart(genuine)
    ws = sub.poll(5000)
    assert ws is not None and ws.version == 1 and bytes(ws.tensors["w"].data) == genuine[2]
    for sock in (intruder, predecessor, fake):
        sock.close(0)
    sub.close()
