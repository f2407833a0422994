"""CURVE on the trajectory and weights channels (loopback), the publisher's registration rules, and a stalled
subscriber that must not hold up the others."""
from __future__ import annotations

import contextlib
import threading
import time

import msgpack
import numpy as np
import pytest
import zmq

from configs.fields import ConfigError
from configs.load import load_config
from core.admission import apply_admission
from core.codec import encode
from core.curve import CurveClient, KeyPair, RunKeys
from core.transport import TrajectoryReceiver, TrajectorySender
from core.weights.publisher import WeightPublisher
from core.weights.subscriber import WeightSubscriber
from core.weights.tensors import TensorBytes
from launch.bench.samples import make_trajectory

POOLS, GENS = ["envpool-0", "envpool-1"], ["generator-0", "generator-1"]


@pytest.fixture
def keys() -> RunKeys:
    return RunKeys.generate(POOLS + GENS)


def tensor(values: np.ndarray, name: str = "w") -> TensorBytes:
    return TensorBytes(name, str(values.dtype), values.shape, values.data)


def test_only_the_runs_clients_can_push_trajectories_curvezmq():
    keys = RunKeys.generate(POOLS + GENS, cipher="curvezmq")
    rx = TrajectoryReceiver(curve=keys.trajectory_server_side(POOLS))
    good = TrajectorySender(rx.endpoint, name="pool-chosen-id", curve=keys.trajectory_client("envpool-1"))
    plain = TrajectorySender(rx.endpoint, name="plain")  # no CURVE at all
    stranger = TrajectorySender(rx.endpoint, name="stranger",  # CURVE, the server's real public key, own keys
                                curve=CurveClient(keys.trajectory_server.public, KeyPair.generate()))
    generator_key = TrajectorySender(rx.endpoint, name="gen",  # a key of the run, but not one of this channel's
                                     curve=CurveClient(keys.trajectory_server.public, keys.clients["generator-0"]))
    for tx in (plain, stranger, generator_key):
        for _ in range(3):
            try:
                tx.send(make_trajectory(trajectory_id=f"forged-{tx.name}"), timeout_ms=100)
            except TimeoutError:
                pass  # no connection was admitted, so nothing can be queued past the high-water mark
    good.send(make_trajectory(trajectory_id="genuine"), timeout_ms=30_000)
    got = []
    while (traj := rx.recv(1500)) is not None:
        got.append(traj.trajectory_id)
    assert got == ["genuine"], (got, rx.zap.admitted, rx.zap.refused)
    assert rx.auth_refused >= 2  # the stranger and the generator's key; the plain client fails its handshake
    assert rx.zap.refused["unknown_key"] >= 2
    for tx in (good, plain, stranger, generator_key):
        tx.close(0)
    rx.close()


def test_only_the_runs_clients_can_push_sealed_trajectories(keys):
    """The default cipher (aes-gcm): outsiders are refused at the admission handshake (core.admission), before
    any message of theirs is read, named why; none reaches the decoder or the run's bad-message count. A peer that
    replays a genuine client's token (an on-path reader of plain TCP) is admitted, but a captured message cannot be
    replayed through it."""
    rx = TrajectoryReceiver(curve=keys.trajectory_server_side(POOLS), same_node=False)
    good = TrajectorySender(rx.endpoint, name="pool-chosen-id", curve=keys.trajectory_client("envpool-1"))
    real = keys.clients["envpool-0"]
    senders = {
        "plain": TrajectorySender(rx.endpoint, name="plain"),  # no keys at all: no PLAIN handshake
        "stranger": TrajectorySender(rx.endpoint, name="stranger", curve=CurveClient(  # keys of its own
            keys.trajectory_server.public, KeyPair.generate(), "aes-gcm")),
        "generator": TrajectorySender(rx.endpoint, name="gen", curve=CurveClient(  # a run key, not this channel's
            keys.trajectory_server.public, keys.clients["generator-0"], "aes-gcm")),
        # claims envpool-0's public key (which is no secret) without its secret key
        "impostor": TrajectorySender(rx.endpoint, name="envpool-0", curve=CurveClient(
            keys.trajectory_server.public, KeyPair(real.public, KeyPair.generate().secret), "aes-gcm")),
    }
    for tx in senders.values():
        with contextlib.suppress(TimeoutError):  # a refused connection takes nothing (or queues it for nobody)
            tx.send(make_trajectory(trajectory_id=f"forged-{tx.name}"), timeout_ms=1000)
    good.send(make_trajectory(trajectory_id="genuine"), timeout_ms=30_000)
    got = [rx.recv(5000).trajectory_id]
    sealed = good._sealer.seal(encode(make_trajectory(trajectory_id="once")))
    replayer = zmq.Context.instance().socket(zmq.DEALER)
    apply_admission(replayer, keys.trajectory_client("envpool-1"))  # the token, as read off the wire
    replayer.connect(rx.endpoint)
    for _ in range(2):  # a sealed message of the genuine session, then the same bytes again
        replayer.send_multipart(sealed)
    while (traj := rx.recv(1500)) is not None:
        got.append(traj.trajectory_id)
    assert got == ["genuine", "once"]
    assert rx._opener.refused == {"replayed": 1}, rx._opener.refused
    handshakes = rx.zap.refused
    assert handshakes["unknown_key"] >= 2 and handshakes["bad_token"] >= 1, handshakes
    assert rx.auth_refused >= 4 and rx.stats.dropped == 0
    replayer.close(0)
    for tx in (good, *senders.values()):
        tx.close(0)
    rx.close()


def test_sender_name_is_the_one_its_key_was_issued_under(keys):
    rx = TrajectoryReceiver(curve=keys.trajectory_server_side(POOLS))
    tx = TrajectorySender(rx.endpoint, name="i-claim-to-be-envpool-0", curve=keys.trajectory_client("envpool-1"))
    bad = make_trajectory()
    bad.tokens[0] = -3
    tx.send(bad, timeout_ms=30_000)
    tx.send(make_trajectory(trajectory_id="ok"), timeout_ms=30_000)
    assert rx.recv(3000).trajectory_id == "ok"
    assert rx.stats.dropped_by_sender == {"envpool-1": 1}
    tx.close(0)
    rx.close()


@pytest.mark.parametrize("cipher", ["aes-gcm", "curvezmq"])
def test_weights_reach_only_authenticated_subscribers_and_acks_need_the_right_key(cipher):
    keys = RunKeys.generate(POOLS + GENS, cipher=cipher)
    pub = WeightPublisher(curve=keys.weights_server_side(GENS), expected=GENS)
    sub = WeightSubscriber(pub.endpoint, name="generator-0", curve=keys.weights_client("generator-0"))
    spoof = WeightSubscriber(pub.endpoint, name="generator-1", curve=keys.weights_client("generator-0"))
    outsider = WeightSubscriber(pub.endpoint, name="generator-1")  # no keys
    stranger = WeightSubscriber(pub.endpoint, name="generator-1",
                                curve=CurveClient(keys.weights_server.public, KeyPair.generate(), cipher))
    pub.wait_for_peers(1, timeout_s=5)
    pub.poll(500)
    assert sorted(pub.peers.values()) == ["generator-0"]  # the spoofed hello named a key it does not hold
    pub.publish(1, [tensor(np.arange(4, dtype=np.float32))])
    assert sub.poll(5000).version == 1
    for other in (outsider, stranger):
        assert other.poll(500) is None
    spoof.ack(1, ok=False, error="forged")  # an ack under generator-0's key from a connection never registered
    sub.ack(1)
    assert pub.wait_acks(1, timeout_s=5) == {"generator-0": (True, "")}
    assert pub.drops.total >= 2 and pub.auth_refused >= 1
    if cipher == "aes-gcm":  # the stranger is refused at the admission handshake, the keyless outsider before it
        assert pub.zap.refused["unknown_key"] >= 1 and sum(pub.seal.refused.values()) == 0
        assert outsider.latest_version == stranger.latest_version == -1
    for s in (sub, spoof, outsider, stranger):
        s.close()
    pub.close()


def test_without_curve_only_expected_names_register_and_acks_only_from_them():
    pub = WeightPublisher(expected=["generator-0"])
    sub = WeightSubscriber(pub.endpoint, name="generator-0")
    intruder = WeightSubscriber(pub.endpoint, name="intruder")
    pub.wait_for_peers(1, timeout_s=5)
    pub.poll(300)
    assert list(pub.peers.values()) == ["generator-0"]
    rogue = zmq.Context.instance().socket(zmq.DEALER)
    rogue.connect(pub.endpoint)
    rogue.send_multipart([b"A", msgpack.packb({"version": 0, "ok": False, "error": "x"})])  # never said hello
    pub.poll(300)
    assert pub.acks == {} and pub.drops.by_reason["ack"] >= 1
    rogue.close(0)
    intruder.close()
    sub.close()
    pub.close()


def test_a_stalled_subscriber_does_not_hold_up_the_others():
    pub = WeightPublisher(chunk_bytes=256 << 10, hwm=2, stall_timeout_s=1.0)
    fast = WeightSubscriber(pub.endpoint, name="fast")
    stalled = WeightSubscriber(pub.endpoint, name="stalled")  # never reads
    pub.wait_for_peers(2, timeout_s=5)
    data = np.arange((64 << 20) // 4, dtype=np.float32)  # 64 MiB: far more than queues and socket buffers hold

    got = {}
    reader = threading.Thread(target=lambda: got.setdefault("ws", fast.poll(30_000)), daemon=True)
    reader.start()
    started = time.monotonic()
    pub.publish(1, [tensor(data)])
    publish_s = time.monotonic() - started
    reader.join(30)
    assert got["ws"] is not None and got["ws"].version == 1
    assert np.array_equal(np.frombuffer(got["ws"].tensors["w"].data, np.float32), data)
    assert publish_s < 1.0 + 4.0, publish_s  # the stall timeout plus the transfer, not forever
    assert "stalled" in pub.stalled[1]
    fast.ack(1)
    acks = pub.wait_acks(1, timeout_s=5)
    assert acks["fast"] == (True, "") and acks["stalled"][0] is False and acks["stalled"][1].startswith("stalled:")
    stalled.close()
    fast.close()
    pub.close()


@pytest.mark.parametrize("overrides, ok", [
    (["transport.host=0.0.0.0", "transport.auth=off"], False),
    (["transport.host=0.0.0.0", "transport.auth=off", "transport.allow_insecure=true"], True),
    (["transport.host=127.0.0.1", "transport.auth=off"], True),
    (["transport.host=0.0.0.0"], True),
])
def test_auth_off_off_loopback_needs_allow_insecure(overrides, ok):
    if ok:
        cfg = load_config(None, overrides)
        assert cfg.transport.uses_curve() == ("transport.auth=off" not in overrides)
    else:
        with pytest.raises(ConfigError) as err:
            load_config(None, overrides)
        assert "transport.auth" in str(err.value) and "allow_insecure" in str(err.value)


def test_a_send_with_a_timeout_returns_when_its_connection_is_refused_under_it():
    """The connection a sender's poll saw can be refused before the send (CurveZMQ ends it for good): a send with
    a timeout must still return in time. The poll is held until the refusal has happened, which is the race a
    full test run hit now and then, made certain."""
    keys = RunKeys.generate(POOLS, cipher="curvezmq")
    rx = TrajectoryReceiver(curve=keys.trajectory_server_side(POOLS), same_node=False)
    stranger = TrajectorySender(rx.endpoint, name="stranger",
                                curve=CurveClient(keys.trajectory_server.public, KeyPair.generate(), "curvezmq"))
    sock = stranger._sock

    class HeldPoll:  # the real socket, whose poll answers only after the handshake was refused
        def __getattr__(self, name):
            return getattr(sock, name)

        def poll(self, *args, **kwargs):
            ready = sock.poll(*args, **kwargs)
            deadline = time.monotonic() + 10
            while not rx.zap.refused and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.2)  # the refused connection is torn down
            return ready

    stranger._sock = HeldPoll()
    outcome: list[str] = []

    def send():
        try:
            for _ in range(3):
                stranger.send(make_trajectory(trajectory_id="forged"), timeout_ms=300)
            outcome.append("queued")
        except TimeoutError:
            outcome.append("timeout")

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    thread.join(15)
    assert not thread.is_alive(), "a send with a 300 ms timeout blocked"
    deadline = time.monotonic() + 10
    while not rx.zap.refused and time.monotonic() < deadline:
        time.sleep(0.01)
    assert outcome and rx.zap.refused["unknown_key"] >= 1 and rx.recv(200) is None
    stranger._sock = sock
    stranger.close(0)
    rx.close()


def test_a_context_with_a_zap_handler_terminates():
    """A context whose ZAP handler is serving can be terminated (as its garbage collection does, when a receiver is
    dropped without close): the handler's thread closes its socket on ETERM, so term() returns instead of waiting
    on it for ever."""
    from core.curve import handler_for

    ctx = zmq.Context()
    handler = handler_for(ctx)
    done = threading.Event()
    threading.Thread(target=lambda: (ctx.term(), done.set()), daemon=True).start()
    assert done.wait(10), "zmq.Context.term() hung on the ZAP handler's socket"
    handler._thread.join(5)
    assert not handler._thread.is_alive()
