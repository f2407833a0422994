"""The weights channel's same-node path (core.weights.shm) over real ZeroMQ on loopback, in this process.

Checked: a subscriber that proves it reads the publisher's memory gets versions from the shelf (no chunk sent)
with the exact bytes; one that does not (shm off) gets the same version over TCP; a slot is not rewritten
while a subscriber that was offered it has not acked it (the version goes over TCP instead); and a shelved
announcement naming bytes outside its file, a wrong size, a foreign tensor or a non-shared-memory path is
refused, naming the field.
"""
from __future__ import annotations

import time

import msgpack
import numpy as np
import pytest

from core.trajectory import WireError
from core.weights.publisher import WeightPublisher
from core.weights.shm import WeightStaging, parse_shelved, read_probe, unpack_shelved
from core.weights.subscriber import WeightSubscriber
from core.weights.tensors import TensorBytes

SHAPES = {"a": (64, 32), "b": (1000,), "c": (3, 5, 7)}


def tensors(seed: int) -> list[TensorBytes]:
    rng = np.random.default_rng(seed)
    arrays = {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}
    return [TensorBytes(n, "float32", a.shape, a.data) for n, a in arrays.items()]


def receive(pub: WeightPublisher, sub: WeightSubscriber, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pub.poll(0)
        got = sub.poll(20)
        if got is not None:
            return got
    raise TimeoutError("no version arrived")


def proven(pub: WeightPublisher, sub: WeightSubscriber, name: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while name not in pub.same_node:
        assert time.monotonic() < deadline, "the subscriber never proved it shares this node's memory"
        pub.poll(10)
        sub.poll(10)


def wire(body: dict) -> dict:
    return unpack_shelved(msgpack.packb(body))


def same_bytes(got, sent: list[TensorBytes]) -> bool:
    return all(bytes(got.tensors[t.name].data) == bytes(t.data) for t in sent)


@pytest.fixture
def channel():
    pub = WeightPublisher(shm=True, chunk_bytes=4096)
    subs = []

    def subscriber(name: str, shm: bool = True) -> WeightSubscriber:
        sub = WeightSubscriber(pub.endpoint, name=name, expected=SHAPES, shm=shm)
        subs.append(sub)
        pub.wait_for_peers(len(subs), timeout_s=10)
        return sub

    yield pub, subscriber
    for sub in subs:
        sub.close()
    pub.close()


def test_a_proven_subscriber_takes_versions_from_the_shelf(channel):
    pub, subscriber = channel
    sub = subscriber("near")
    proven(pub, sub, "near")
    for version in (1, 2, 3):
        sent = tensors(version)
        pub.publish(version, sent)
        got = receive(pub, sub)
        assert got.version == version and got.shelf is not None and same_bytes(got, sent)
        sub.ack(version)
        assert pub.wait_acks(version, 10) == {"near": (True, "")}
    assert pub.chunks_sent == 0 and sub.shelved == 3


def test_an_unproven_subscriber_gets_the_same_version_over_tcp(channel):
    pub, subscriber = channel
    near, far = subscriber("near"), subscriber("far", shm=False)
    proven(pub, near, "near")
    sent = tensors(7)
    pub.publish(1, sent)
    got_near, got_far = receive(pub, near), receive(pub, far)
    assert got_near.shelf is not None and got_far.shelf is None
    assert same_bytes(got_near, sent) and same_bytes(got_far, sent)
    assert pub.chunks_sent > 0 and "far" not in pub.same_node


def test_a_slot_still_being_read_is_not_rewritten(channel):
    pub, subscriber = channel
    sub = subscriber("near")
    proven(pub, sub, "near")
    first, second, third = tensors(1), tensors(2), tensors(3)
    pub.publish(1, first)
    got1 = receive(pub, sub)  # not acked: its slot stays as it is
    pub.publish(2, second)
    got2 = receive(pub, sub)
    assert got2.shelf is not None and got2.shelf[0] != got1.shelf[0]  # the other slot
    pub.publish(3, third)  # both slots held by unacked versions: over TCP
    got3 = receive(pub, sub)
    assert got3.shelf is None and same_bytes(got3, third)
    assert same_bytes(got1, first) and same_bytes(got2, second)  # neither slot was overwritten
    sub.ack(3)  # a later version's ack releases both slots
    pub.wait_acks(3, 10)
    pub.publish(4, tensors(4))
    assert receive(pub, sub).shelf is not None


def test_bad_shelved_announcements_are_refused_naming_the_field(tmp_path):
    staging = WeightStaging(str(tmp_path), "t")
    try:
        sent = tensors(0)
        path, index = staging.write(sent)
        good = wire({"version": 1, "path": path, "index": index})
        index = good["index"]
        assert same_bytes(parse_shelved(good, SHAPES, 0), sent)
        a = index[0]
        cases = {
            "offset": {**good, "index": [[a[0], a[1], a[2], 1 << 40, a[4]], *index[1:]]},
            "offset ": {**good, "index": [[a[0], a[1], a[2], a[3], a[4] - 4], *index[1:]]},
            "shape": {**good, "index": [["z", a[1], a[2], a[3], a[4]], *index[1:]]},
            "path": {**good, "path": "/etc/passwd"},
            "path ": {**good, "path": "/proc/self/fd/0"},  # not a regular file: refused, never opened blocking
            "path  ": {**good, "path": "/tmp/a\x00b"},
            "version": {**good, "version": -1},
            "dtype": {**good, "index": [[a[0], "object", a[2], a[3], a[4]], *index[1:]]},
        }
        for field, body in cases.items():
            with pytest.raises(WireError) as err:
                parse_shelved(wire(body), SHAPES, 0)
            assert err.value.field == field.strip(), (field, err.value)
        assert read_probe("/proc/self/fd/0") == b"" and read_probe("/tmp/a\x00b") == b""
        with pytest.raises(WireError) as err:
            parse_shelved(good, SHAPES, 100)
        assert err.value.field == "index"
    finally:
        staging.close()


@pytest.mark.parametrize("cipher", ["aes-gcm", "curvezmq"])
def test_the_shelf_works_under_the_run_keys(cipher):
    from core.curve import RunKeys

    keys = RunKeys.generate(["near"], cipher=cipher)
    pub = WeightPublisher(shm=True, curve=keys.weights_server_side(["near"]))
    sub = WeightSubscriber(pub.endpoint, name="near", expected=SHAPES, shm=True, curve=keys.weights_client("near"))
    try:
        pub.wait_for_peers(1, timeout_s=10)
        proven(pub, sub, "near")
        sent = tensors(5)
        pub.publish(1, sent)
        got = receive(pub, sub)
        assert got.shelf is not None and same_bytes(got, sent) and pub.chunks_sent == 0
    finally:
        sub.close()
        pub.close()
