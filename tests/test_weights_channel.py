"""The weights channel on loopback: chunking, a 1 GB transfer, per-receiver acks, superseded versions."""
from __future__ import annotations

import threading
import time

import msgpack
import numpy as np
import pytest
import zmq

from core.weights.publisher import WeightPublisher
from core.weights.subscriber import WeightSubscriber
from core.weights.tensors import TensorBytes


def tensor(name: str, arr: np.ndarray) -> TensorBytes:
    return TensorBytes(name, str(arr.dtype), tuple(arr.shape), np.ascontiguousarray(arr).data)


def publish_in_thread(pub: WeightPublisher, version: int, tensors: list[TensorBytes]) -> threading.Thread:
    thread = threading.Thread(target=pub.publish, args=(version, tensors), daemon=True)
    thread.start()
    return thread


def receive(sub: WeightSubscriber, timeout_ms: int = 20_000):
    ws = sub.poll(timeout_ms)
    assert ws is not None, "no complete version arrived"
    return ws


def as_array(t: TensorBytes) -> np.ndarray:
    return np.frombuffer(t.data, dtype=t.dtype).reshape(t.shape)


def test_small_large_and_empty_tensors_are_chunked_and_reassembled():
    pub = WeightPublisher(chunk_bytes=1000)
    sub = WeightSubscriber(pub.endpoint, name="gen-0")
    pub.wait_for_peers(1, timeout_s=5)
    rng = np.random.default_rng(0)
    arrays = {"a": rng.random((3, 5), dtype=np.float32), "big": rng.random(4321).astype(np.float64),
              "empty": np.zeros((0, 4), np.float32), "i": np.arange(7, dtype=np.int64)}
    sent = pub.publish(1, [tensor(k, v) for k, v in arrays.items()])
    assert sent == sum(v.nbytes for v in arrays.values())
    ws = receive(sub)
    assert ws.version == 1 and set(ws.tensors) == set(arrays)
    for name, arr in arrays.items():
        np.testing.assert_array_equal(as_array(ws.tensors[name]), arr)
    sub.ack(1)
    assert pub.wait_acks(1, timeout_s=5) == {"gen-0": (True, "")}
    pub.close()
    sub.close()


def test_one_gigabyte_in_chunks_to_two_receivers():
    pub = WeightPublisher()  # default 4 MB chunks: 256 of them
    subs = [WeightSubscriber(pub.endpoint, name=f"gen-{i}") for i in range(2)]
    pub.wait_for_peers(2, timeout_s=5)
    big = np.arange((1 << 30) // 4, dtype=np.float32)  # 1 GiB
    big[::4097] = -1.5
    small = np.ones(1000, np.float32)
    thread = publish_in_thread(pub, 7, [tensor("model.embed_tokens.weight", big), tensor("norm", small)])
    results = {}

    def take(sub):
        results[sub.name] = sub.poll(60_000)
        sub.ack(7)

    takers = [threading.Thread(target=take, args=(s,)) for s in subs]
    for t in takers:
        t.start()
    for t in takers:
        t.join(120)
    thread.join(120)
    for sub in subs:
        ws = results[sub.name]
        assert ws is not None and ws.version == 7
        assert ws.nbytes == big.nbytes + small.nbytes
        assert np.array_equal(as_array(ws.tensors["model.embed_tokens.weight"]), big)
    assert pub.wait_acks(7, timeout_s=10) == {"gen-0": (True, ""), "gen-1": (True, "")}
    for sub in subs:
        sub.close()
    pub.close()


def test_missing_ack_names_the_silent_receiver_and_errors_are_reported():
    pub = WeightPublisher()
    good, silent = WeightSubscriber(pub.endpoint, name="good"), WeightSubscriber(pub.endpoint, name="silent")
    pub.wait_for_peers(2, timeout_s=5)
    pub.publish(3, [tensor("w", np.ones(10, np.float32))])
    assert receive(good).version == 3 and receive(silent).version == 3
    good.ack(3, ok=False, error="shape mismatch for w")
    with pytest.raises(TimeoutError, match="silent"):
        pub.wait_acks(3, timeout_s=0.5)
    silent.ack(3)
    assert pub.wait_acks(3, timeout_s=5) == {"good": (False, "shape mismatch for w"), "silent": (True, "")}
    for s in (good, silent, pub):
        s.close()


def test_a_subscriber_known_down_or_restarted_is_not_waited_for():
    """The run names a subscriber whose process is down: its ack is not awaited. A subscriber that connects
    again under its name (a restarted process) holds nothing published before: those versions count as
    skipped for it, and the next version reaches and is acked by the new connection."""
    pub = WeightPublisher()
    first, other = WeightSubscriber(pub.endpoint, name="gen-0"), WeightSubscriber(pub.endpoint, name="gen-1")
    pub.wait_for_peers(2, timeout_s=5)
    pub.publish(1, [tensor("w", np.ones(10, np.float32))])
    assert receive(first).version == 1 and receive(other).version == 1
    other.ack(1)
    with pytest.raises(TimeoutError, match="gen-0"):
        pub.wait_acks(1, timeout_s=0.3)
    assert pub.wait_acks(1, timeout_s=0.3, excused=["gen-0", "gen-9"]) == {
        "gen-0": (False, "stalled: its process is down"), "gen-1": (True, "")}
    first.close()  # died without acking; Ray starts it again
    before = set(pub.peers)
    again = WeightSubscriber(pub.endpoint, name="gen-0")
    deadline = time.monotonic() + 10
    while set(pub.peers) == before:  # its hello can beat the old connection's close: it says it again, as polled
        pub.poll(20)
        again.poll(0)
        assert time.monotonic() < deadline, "the restarted subscriber's hello was never taken"
    assert pub.wait_acks(1, timeout_s=5) == {"gen-0": (False, "stalled: subscribed after version 1 was sent"),
                                            "gen-1": (True, "")}
    assert len(pub.peers) == 2
    pub.publish(1, [tensor("w", np.ones(10, np.float32))])  # the run publishes the current version again
    assert receive(again).version == 1
    with pytest.raises(TimeoutError, match="gen-0"):  # sent to it now: its ack is awaited
        pub.wait_acks(1, timeout_s=0.3)
    again.ack(1)
    assert pub.wait_acks(1, timeout_s=5) == {"gen-0": (True, ""), "gen-1": (True, "")}
    pub.publish(2, [tensor("w", np.full(10, 2, np.float32))])
    assert receive(again).version == 2 and receive(other).version == 2
    again.ack(2)
    other.ack(2)
    assert pub.wait_acks(2, timeout_s=5) == {"gen-0": (True, ""), "gen-1": (True, "")}
    for s in (again, other, pub):
        s.close()


def test_a_hello_that_comes_after_a_version_was_sent_is_not_waited_for():
    """A restarted replica subscribes and the run publishes the current version again at once: its hello can
    reach the publisher after that version went out (to nobody). Its ack is not awaited (it cannot come: the
    ack says why), and the version published again reaches it."""
    pub = WeightPublisher(expected=["gen-0"], await_expected=True)  # as a run's learner makes it
    pub.publish(3, [tensor("w", np.ones(10, np.float32))])  # nobody has said hello yet
    with pytest.raises(TimeoutError, match="gen-0"):  # an expected subscriber not connected is waited for
        pub.wait_acks(3, timeout_s=0.3)
    assert pub.wait_acks(3, timeout_s=0.3, excused=["gen-0"]) == {}  # unless the run knows it is down
    late = WeightSubscriber(pub.endpoint, name="gen-0")
    assert pub.wait_acks(3, timeout_s=5) == {"gen-0": (False, "stalled: subscribed after version 3 was sent")}
    assert late.poll(300) is None  # nothing was sent to it
    pub.publish(3, [tensor("w", np.ones(10, np.float32))])
    assert receive(late).version == 3
    late.ack(3)
    assert pub.wait_acks(3, timeout_s=5) == {"gen-0": (True, "")}
    late.close()
    pub.close()


def _fake_publisher():
    """A raw ROUTER standing in for the publisher, so a test can deliver chunks out of order."""
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    return sock, f"tcp://127.0.0.1:{port}"


def _chunk(version: int, seq: int, n_chunks: int, offset: int, values: np.ndarray, total: int) -> list[bytes]:
    header = {"version": version, "seq": seq, "n_chunks": n_chunks,
              "parts": [["w", "float32", [total // 4], offset, total]]}
    return [b"C", msgpack.packb(header), values.astype(np.float32).tobytes()]


def test_a_newer_version_supersedes_a_partial_one_and_old_chunks_are_ignored():
    fake, endpoint = _fake_publisher()
    sub = WeightSubscriber(endpoint, name="g")
    peer = fake.recv_multipart()[0]
    fake.send_multipart([peer] + _chunk(5, 0, 2, 0, np.full(2, 5.0), 16))  # half of version 5
    fake.send_multipart([peer] + _chunk(6, 0, 1, 0, np.full(4, 6.0), 16))  # all of version 6
    fake.send_multipart([peer] + _chunk(5, 1, 2, 8, np.full(2, 5.0), 16))  # the rest of 5, too late
    ws = receive(sub, 5000)
    assert ws.version == 6 and list(as_array(ws.tensors["w"])) == [6.0] * 4
    assert sub.poll(300) is None  # version 5 never completes: it is older than what was handed out
    sub.close()
    fake.close(0)


def test_a_subscriber_holds_one_model_worth_of_receive_buffers():
    fake, endpoint = _fake_publisher()
    sub = WeightSubscriber(endpoint, name="g")
    peer = fake.recv_multipart()[0]
    seen = []
    for version in range(1, 5):
        fake.send_multipart([peer] + _chunk(version, 0, 2, 0, np.full(2, float(version)), 16))
        fake.send_multipart([peer] + _chunk(version, 1, 2, 8, np.full(2, float(version)), 16))
        ws = receive(sub, 5000)
        seen.append(list(as_array(ws.tensors["w"])))  # applied (copied) before the next poll, as a generator does
        assert sub.held_bytes == 16, sub.held_bytes  # one set: the version handed out; nothing kept beside it
    assert seen == [[float(v)] * 4 for v in range(1, 5)]
    sub.close()
    fake.close(0)


def test_malformed_chunks_are_dropped_and_counted():
    fake_pub, endpoint = _fake_publisher()
    sub = WeightSubscriber(endpoint, name="g")
    peer, kind, _ = fake_pub.recv_multipart()
    assert kind == b"H"
    header_ok = {"version": 1, "seq": 0, "n_chunks": 1, "parts": [["w", "float32", [2], 0, 8]]}
    bad = [
        [b"X", b"junk"],  # unknown kind
        [b"C", b"\xc1"],  # header not msgpack
        [b"C", msgpack.packb({**header_ok, "parts": [["w", "float32", [3], 0, 8]]}), b"\x00" * 8],  # shape/bytes
        [b"C", msgpack.packb({**header_ok, "parts": [["w", "float32", [2], 4, 8]]}), b"\x00" * 8],  # overrun
        [b"C", msgpack.packb({**header_ok, "parts": [["w", "complex256", [2], 0, 8]]}), b"\x00" * 8],  # dtype
        [b"C", msgpack.packb({**header_ok, "seq": 5}), b"\x00" * 8],  # seq out of range
    ]
    for frames in bad:
        fake_pub.send_multipart([peer] + frames)
    fake_pub.send_multipart([peer, b"C", msgpack.packb(header_ok), np.array([1.5, 2.5], np.float32).tobytes()])
    ws = receive(sub, 5000)
    assert ws.version == 1 and list(as_array(ws.tensors["w"])) == [1.5, 2.5]
    assert sub.dropped == len(bad)
    sub.close()
    fake_pub.close(0)
