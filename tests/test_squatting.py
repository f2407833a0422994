"""Names on the wire cannot be taken from the run's own peers: a routing id squatted on the trajectory receiver
before a pool connects, and (auth off, loopback) a second hello under a live weights subscriber's name."""
from __future__ import annotations

import time

import numpy as np
import pytest
import zmq

from core.curve import RunKeys
from core.transport import TrajectoryReceiver, TrajectorySender
from core.weights.publisher import WeightPublisher
from core.weights.subscriber import WeightSubscriber
from core.weights.tensors import TensorBytes
from launch.bench.samples import make_trajectory


@pytest.mark.parametrize("cipher", ["none", "aes-gcm"])
def test_a_squatted_routing_id_does_not_make_a_pools_trajectories_vanish(cipher):
    """An outsider connects first under the id a pool names itself by (its actor name) and stays; the pool's
    trajectories must all arrive."""
    keys = RunKeys.generate(["envpool-0"], cipher=cipher) if cipher != "none" else None
    rx = TrajectoryReceiver(curve=keys.trajectory_server_side(["envpool-0"]) if keys else None, same_node=False)
    squatter = zmq.Context.instance().socket(zmq.DEALER)
    squatter.setsockopt(zmq.ROUTING_ID, b"envpool-0")
    squatter.linger = 0
    squatter.connect(rx.endpoint)
    squatter.send_multipart([b"hello"])  # its connection is established (and its message dropped, counted)
    rx.recv(500)
    pool = TrajectorySender(rx.endpoint, name="envpool-0", curve=keys.trajectory_client("envpool-0") if keys else None)
    for i in range(5):
        pool.send(make_trajectory(trajectory_id=f"t{i}"), timeout_ms=10_000)
    got = []
    while len(got) < 5 and (traj := rx.recv(3000)) is not None:
        got.append(traj.trajectory_id)
    assert got == [f"t{i}" for i in range(5)]
    if keys is None:  # the squatter's message came through (no keys) and was dropped as bad, under its own name
        assert rx.stats.dropped_by_sender.get("envpool-0", 0) == 1
    pool.close(0)
    squatter.close(0)
    rx.close()


def test_without_keys_a_second_hello_cannot_displace_a_live_subscriber():
    pub = WeightPublisher(expected=["generator-0"])
    real = WeightSubscriber(pub.endpoint, name="generator-0")
    pub.wait_for_peers(1, timeout_s=5)
    impostor = WeightSubscriber(pub.endpoint, name="generator-0")  # another local process, the same name
    pub.poll(500)
    assert list(pub.peers.values()) == ["generator-0"] and pub.drops.by_reason["name"] == 1
    values = np.arange(8, dtype=np.float32)
    pub.publish(1, [TensorBytes("w", "float32", values.shape, values.data)])
    assert real.poll(5000).version == 1
    assert impostor.poll(300) is None
    real.ack(1)
    assert pub.wait_acks(1, timeout_s=5) == {"generator-0": (True, "")}
    # The real one's process ends (its connection closes): a restarted generator-0 takes its place.
    real.close()
    impostor.close()
    restarted = WeightSubscriber(pub.endpoint, name="generator-0")
    routing = restarted._sock.getsockopt(zmq.ROUTING_ID)
    for _ in range(50):  # its hello may come before the old connection's close: it says it again until taken
        pub.poll(100)
        restarted.poll(0)
        if routing in pub.peers:
            break
    # the impostor's hello was refused (once, or again if it said it again while still open)
    assert pub.peers == {routing: "generator-0"} and pub.drops.by_reason["name"] >= 1
    pub.publish(2, [TensorBytes("w", "float32", values.shape, values.data)])
    assert restarted.poll(5000).version == 2
    restarted.close()
    pub.close()


def test_a_hello_refused_while_the_name_was_held_is_taken_once_the_holder_has_gone():
    """A restarted generator can say hello before the publisher has seen its old connection close (refused:
    the name is held by an open connection); it says hello again while polling, and is taken once that close
    is seen, instead of never."""
    pub = WeightPublisher(expected=["generator-0"])
    old = WeightSubscriber(pub.endpoint, name="generator-0")
    pub.wait_for_peers(1, timeout_s=5)
    new = WeightSubscriber(pub.endpoint, name="generator-0")
    routing = new._sock.getsockopt(zmq.ROUTING_ID)
    pub.poll(500)
    assert routing not in pub.peers and pub.drops.by_reason["name"] == 1  # refused: the old one is open
    old.close()
    deadline = time.monotonic() + 10
    while routing not in pub.peers:
        assert time.monotonic() < deadline, "the refused hello was never said again"
        pub.poll(50)
        new.poll(50)
    values = np.arange(8, dtype=np.float32)
    pub.publish(1, [TensorBytes("w", "float32", values.shape, values.data)])
    assert new.poll(5000).version == 1
    new.close()
    pub.close()
