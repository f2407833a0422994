"""The ZeroMQ trajectory channel on loopback: delivery, sender identity, fuzzing, backpressure."""
from __future__ import annotations

import random
import threading

import msgpack
import pytest

from configs.run import TransportConfig
from core.codec import WireLimits, decode, encode
from core.trajectory import WireError
from core.transport import TrajectoryReceiver, TrajectorySender
from core.weights.publisher import WeightPublisher
from launch.bench.samples import make_trajectory


@pytest.fixture
def receiver():
    rx = TrajectoryReceiver(hwm=1000, limits=WireLimits(max_header_bytes=64 << 10, max_tokens=1 << 16))
    yield rx
    rx.close()


def test_endpoints_bind_loopback_by_default():
    assert TransportConfig().host == "127.0.0.1"
    rx, pub = TrajectoryReceiver(), WeightPublisher()
    try:
        assert rx.endpoint.startswith("tcp://127.0.0.1:")
        assert pub.endpoint.startswith("tcp://127.0.0.1:")
    finally:
        rx.close()
        pub.close()


def test_many_producers_one_consumer(receiver):
    senders = [TrajectorySender(receiver.endpoint, name=f"pool-{i}") for i in range(3)]
    for i, tx in enumerate(senders):
        for j in range(5):
            tx.send(make_trajectory(num_tokens=50 + j, trajectory_id=f"t{i}-{j}"))
    got = {receiver.recv(5000).trajectory_id for _ in range(15)}
    assert got == {f"t{i}-{j}" for i in range(3) for j in range(5)}
    assert receiver.recv(50) is None
    assert receiver.stats.received == 15 and receiver.stats.dropped == 0
    for tx in senders:
        tx.close()


def _fuzz_messages(rng: random.Random, n: int) -> list[list[bytes]]:
    """Random and mutated messages; most are invalid, a few mutations may happen to stay valid."""
    base = [bytes(f) for f in encode(make_trajectory(num_tokens=200, num_turns=3))]
    out = []
    for _ in range(n):
        kind = rng.randrange(9)
        frames = list(base)
        if kind == 0:  # random bytes as every frame
            frames = [rng.randbytes(rng.randrange(0, 300)) for _ in range(rng.randrange(1, 7))]
        elif kind == 1:  # flip bytes in the header
            h = bytearray(frames[0])
            for _ in range(rng.randrange(1, 6)):
                h[rng.randrange(len(h))] = rng.randrange(256)
            frames[0] = bytes(h)
        elif kind == 2:  # truncate one frame
            i = rng.randrange(len(frames))
            frames[i] = frames[i][: rng.randrange(len(frames[i]) or 1)]
        elif kind == 3:  # drop or add frames
            frames = frames[: rng.randrange(1, len(frames))] if rng.random() < 0.5 else frames + [b"extra"]
        elif kind == 4:  # oversized: header over the receiver's limit
            frames[0] = msgpack.packb({"schema": 1, "pad": b"x" * (80 << 10)})
        elif kind == 5:  # a declared length far beyond the token limit
            header = msgpack.unpackb(frames[0], raw=False)
            header["arrays"][0][2] = 1 << 40
            frames[0] = msgpack.packb(header, use_bin_type=True)
        elif kind == 6:  # wrong types in the header
            header = msgpack.unpackb(frames[0], raw=False)
            key = rng.choice(sorted(header))
            header[key] = rng.choice([None, 3.5, "s", [1], {"a": 1}, b"b"])
            frames[0] = msgpack.packb(header, use_bin_type=True)
        elif kind == 7:  # garbage in a per-token frame (values out of range)
            frames[2] = bytes([rng.randrange(2, 256)]) * len(frames[2])
        else:  # a header that is valid msgpack but not a map
            frames[0] = msgpack.packb(rng.choice([[1, 2], 7, "x", None]))
        out.append(frames)
    return out


def _is_valid(frames: list[bytes], limits: WireLimits) -> bool:
    try:
        decode(frames, limits)
        return True
    except WireError:
        return False


def test_fuzzed_frames_never_stop_the_receiver(receiver):
    rng = random.Random(1234)
    fuzz = _fuzz_messages(rng, 1200)
    expected_bad = sum(not _is_valid(f, receiver.limits) for f in fuzz)
    assert expected_bad >= 1100  # the fuzzer really produces bad frames
    good_ids = []
    good_tx = TrajectorySender(receiver.endpoint, name="good-pool")
    bad_tx = TrajectorySender(receiver.endpoint, name="fuzzer")
    for i, frames in enumerate(fuzz):
        bad_tx.send_frames(frames)
        if i % 10 == 0:
            good_ids.append(f"good-{i}")
            good_tx.send(make_trajectory(num_tokens=100, trajectory_id=good_ids[-1]))
    arrived = []
    while (traj := receiver.recv(3000)) is not None:
        arrived.append(traj.trajectory_id)
    assert [i for i in arrived if i.startswith("good-")] == good_ids  # every valid one, in order
    assert receiver.stats.dropped == expected_bad
    assert receiver.stats.dropped_by_sender == {"fuzzer": expected_bad}
    assert receiver.stats.received == len(arrived) == len(good_ids) + (len(fuzz) - expected_bad)
    good_tx.close()
    bad_tx.close()


def test_high_water_mark_backpressures_the_producer():
    rx = TrajectoryReceiver(hwm=2)
    tx = TrajectorySender(rx.endpoint, name="fast-pool", hwm=2)
    big = make_trajectory(num_tokens=80_000)  # about 1 MB on the wire
    sent = 0
    with pytest.raises(TimeoutError):
        for _ in range(200):
            tx.send(big, timeout_ms=300)
            sent += 1
    # Bounded by the two queues (2 + 2 messages) plus what the kernel's socket buffers hold.
    assert 4 <= sent <= 20, sent
    drained = 0
    while rx.recv(1000) is not None:
        drained += 1
    assert drained == sent
    tx.send(big, timeout_ms=2000)  # the consumer caught up: the producer moves again
    assert rx.recv(2000) is not None
    tx.close(0)
    rx.close()


def test_sender_thread_blocks_until_consumer_reads():
    rx = TrajectoryReceiver(hwm=1)
    tx = TrajectorySender(rx.endpoint, hwm=1)
    big = make_trajectory(num_tokens=80_000)
    done = threading.Event()

    def produce():
        for _ in range(40):
            tx.send(big)
        done.set()

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    assert not done.wait(1.0)  # blocked: nobody reads
    got = 0
    while got < 40:
        assert rx.recv(5000) is not None
        got += 1
    assert done.wait(5.0)
    thread.join()
    tx.close(0)
    rx.close()
