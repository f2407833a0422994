"""Fuzzing the channels' decoders and the threads that run them: 20,000 seeded hostile inputs each for the
trajectory decoder, the weights subscriber and the publisher's control path. Every input is either delivered
consistent (and then safe for every consumer downstream) or rejected with the project's own `WireError`; the
receiving loops survive; memory stays bounded. A failure prints its seed and index, so it replays."""
from __future__ import annotations

import random
import threading
import tracemalloc

import msgpack
import numpy as np
import zmq

from core.advantages import compute_advantages, steps_of
from core.codec import WireLimits, decode
from core.trajectory import WireError
from core.transport import TrajectoryReceiver, TrajectorySender, frame_cap
from core.weights.assembly import MAX_VERSION
from core.weights.publisher import WeightPublisher
from core.weights.subscriber import WeightSubscriber
from core.weights.tensors import TensorBytes
from launch.bench.samples import make_trajectory
from tests.fuzz_inputs import chunk_message, control_message, trajectory_frames

N = 20_000
SEED = 20261203
LIMITS = WireLimits(max_header_bytes=64 << 10, max_tokens=1 << 16, max_turns=256, vocab_size=50_000)


def test_trajectory_decoder_accepts_only_records_every_consumer_can_use():
    rng = random.Random(SEED)
    accepted = rejected = 0
    tracemalloc.start()
    try:
        for i in range(N):
            frames = trajectory_frames(rng)
            try:
                traj = decode(frames, LIMITS)
            except WireError as exc:
                assert exc.field, (SEED, i)
                rejected += 1
                continue
            except Exception as exc:  # noqa: BLE001 - the property under test
                raise AssertionError(f"seed {SEED} input {i}: {type(exc).__name__} escaped decode: {exc}")
            accepted += 1
            # What the coordinator and the learner do with an accepted record must not fail.
            traj.validate(LIMITS.max_tokens, LIMITS.max_turns, LIMITS.vocab_size)
            steps_of(traj, gamma=0.99)
            for estimator in ("grpo", "rloo", "reinforce_pp"):
                for adv in compute_advantages([traj, traj], estimator):
                    assert np.isfinite(adv).all(), (SEED, i, estimator)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert rejected >= N // 2, (accepted, rejected)  # the generator really produces bad input
    assert accepted > 100  # and some that is fine (bit flips in token frames stay valid)
    assert peak < 64 << 20, f"decoding peaked at {peak >> 20} MiB"


def test_receiver_thread_survives_hostile_messages_and_whole_message_cap():
    rx = TrajectoryReceiver(hwm=10_000, limits=LIMITS)
    errors: list[BaseException] = []
    got: list[str] = []
    stop = threading.Event()

    def pump():  # what the coordinator's pump does
        try:
            while not stop.is_set():
                traj = rx.recv(100)
                if traj is not None:
                    got.append(traj.trajectory_id)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    bad, good = TrajectorySender(rx.endpoint, name="fuzzer"), TrajectorySender(rx.endpoint, name="pool")
    rng = random.Random(SEED + 1)
    for i in range(2_000):
        bad.send_frames(trajectory_frames(rng), timeout_ms=30_000)
        if i % 100 == 0:
            good.send(make_trajectory(num_tokens=50, trajectory_id=f"good-{i}"), timeout_ms=30_000)
    # Every frame under the cap (the largest a valid frame can be), all of them together far over the whole
    # message's: never reaches the decoder.
    cap = rx.max_message_bytes
    piece = b"\x00" * min(cap // 3, frame_cap(LIMITS))
    bad.send_frames([piece] * 5, timeout_ms=30_000)
    bad.send_frames([piece] * 7, timeout_ms=30_000)
    # The receiver takes the two connections in turn, so the fuzzer's backlog can end after the pool's last
    # message: a valid one from the fuzzer, after the oversized ones, says its backlog was read (order holds
    # within a connection).
    bad.send(make_trajectory(num_tokens=50, trajectory_id="fuzzer-last"), timeout_ms=30_000)
    good.send(make_trajectory(num_tokens=50, trajectory_id="good-last"), timeout_ms=30_000)
    deadline = threading.Event()
    for _ in range(300):
        if "good-last" in got and "fuzzer-last" in got:
            break
        deadline.wait(0.1)
    stop.set()
    thread.join(5)
    assert not errors and "good-last" in got and "fuzzer-last" in got
    assert [g for g in got if g.startswith("good-")] == [f"good-{i}" for i in range(0, 2000, 100)] + ["good-last"]
    stats = rx.stats
    assert stats.dropped_by_reason.get("message") == 1 and stats.dropped_by_reason.get("frames", 0) >= 1
    assert set(stats.dropped_by_sender) == {"fuzzer"}
    bad.close(0)
    good.close(0)
    rx.close()


EXPECTED = {"w": (6,), "v": (2, 2)}


def test_weights_subscriber_survives_hostile_chunks_and_never_over_allocates():
    ctx = zmq.Context()
    fake = ctx.socket(zmq.ROUTER)
    fake.bind("inproc://fuzz-weights")
    sub = WeightSubscriber("inproc://fuzz-weights", name="g", ctx=ctx, expected=EXPECTED)
    peer = fake.recv_multipart()[0]
    rng = random.Random(SEED + 2)
    completed = 0
    tracemalloc.start()
    try:
        for i in range(N):
            frames = chunk_message(rng, version=i + 1)
            try:
                done = sub._accept(frames)  # the decode step of poll(); poll() below runs it on the socket
            except WireError:
                sub._assembly = None
                continue
            except Exception as exc:  # noqa: BLE001
                raise AssertionError(f"seed {SEED + 2} input {i}: {type(exc).__name__} escaped: {exc}")
            if sub._assembly is not None:
                assert sub._assembly.allocated <= sub.max_total_bytes
            if done is not None:
                completed += 1
                # A fuzzed version number far ahead can be a valid version; rewind so that the inputs after it
                # (numbered i + 1) are not all ignored as old.
                sub.latest_version = min(sub.latest_version, i + 1)
                assert set(done.tensors) <= set(EXPECTED)
                for name, t in done.tensors.items():
                    assert t.shape == EXPECTED[name] and len(t.data) == 4 * int(np.prod(t.shape))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert 100 < completed < N // 2, completed
    assert peak < 32 << 20, f"peaked at {peak >> 20} MiB"
    # The same through the socket: the loop drops and counts, then takes the next valid version.
    before = sub.dropped
    last = N + 10
    for i in range(2_000):
        fake.send_multipart([peer] + chunk_message(rng, version=last + i))
        sub.poll(0)
    # The highest version there can be: newer than any the fuzzer may have had accepted as valid.
    good = [b"C", msgpack.packb({"version": MAX_VERSION, "seq": 0, "n_chunks": 1,
                                 "parts": [["w", "float32", [6], 0, 24]]}), np.full(6, 7.0, np.float32).tobytes()]
    fake.send_multipart([peer] + good)
    ws = None
    for _ in range(50):
        ws = sub.poll(100)
        if ws is not None and ws.version == MAX_VERSION:
            break
    assert ws is not None and ws.version == MAX_VERSION
    assert list(np.frombuffer(ws.tensors["w"].data, np.float32)) == [7.0] * 6
    assert sub.dropped > before
    sub.close()
    fake.close(0)
    ctx.term()


def test_publisher_control_path_drops_hostile_messages_and_admits_only_its_subscribers():
    pub = WeightPublisher(expected=["generator-0"])
    rng = random.Random(SEED + 3)
    for i in range(N):
        routing = rng.choice([b"r-good", b"r-evil", rng.randbytes(5)])
        try:
            pub._handle([zmq.Frame(routing)] + [zmq.Frame(f) for f in control_message(rng)])
        except Exception as exc:  # noqa: BLE001
            raise AssertionError(f"seed {SEED + 3} input {i}: {type(exc).__name__} escaped: {exc}")
        assert set(pub.peers.values()) <= {"generator-0"}
    assert pub.drops.total > N // 2
    assert all(set(acks) <= {"generator-0"} for acks in pub.acks.values())
    # Through the socket, then a real subscriber still registers, receives and acks.
    pub.peers.clear()
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.connect(pub.endpoint)
    for _ in range(2_000):
        dealer.send_multipart(control_message(rng))
    pub.poll(200)
    pub.peers = {r: n for r, n in pub.peers.items() if n != "generator-0"}  # a fuzzed hello may be valid
    sub = WeightSubscriber(pub.endpoint, name="generator-0")
    pub.wait_for_peers(1, timeout_s=5)
    pub.publish(1, [TensorBytes("w", "float32", (2,), np.ones(2, np.float32).data)])
    assert sub.poll(5000).version == 1
    sub.ack(1)
    assert pub.wait_acks(1, timeout_s=5) == {"generator-0": (True, "")}
    dealer.close(0)
    sub.close()
    pub.close()
