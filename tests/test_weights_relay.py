"""The relay fan-out on loopback: each chunk leaves the publisher once and every subscriber gets identical bytes;
a subscriber killed mid-version (SIGKILL) or one that stops reading is re-linked around, counted and named,
within the stall timeout; with CURVE, nobody outside the run can push a chunk into the chain."""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time

import msgpack
import numpy as np
import pytest
import zmq

from core.admission import apply_admission
from core.curve import CurveClient, KeyPair, RunKeys, release_handler
from core.weights.publisher import WeightPublisher
from core.weights.seal import ChunkSealer
from core.weights.subscriber import WeightSubscriber
from core.weights.tensors import TensorBytes

LOOPBACK = "127.0.0.1"


def tensors_of(version: int, n: int = (8 << 20) // 4) -> list[TensorBytes]:
    big = np.arange(n, dtype=np.float32) * version
    small = np.full((3, 5), version, np.int64)
    return [TensorBytes("big", "float32", big.shape, big.data), TensorBytes("small", "int64", small.shape, small.data)]


def digest(ws) -> dict[str, bytes]:
    return {name: bytes(t.data) for name, t in ws.tensors.items()}


def reader(sub: WeightSubscriber, versions: int, out: dict, timeout_ms: int = 30_000) -> threading.Thread:
    def run():
        for _ in range(versions):
            ws = sub.poll(timeout_ms)
            if ws is None:
                return
            out[(sub.name, ws.version)] = (digest(ws), time.monotonic())
            sub.ack(ws.version)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_relay_sends_each_chunk_once_and_every_subscriber_gets_identical_bytes():
    pub = WeightPublisher(chunk_bytes=256 << 10, fanout="relay", stall_timeout_s=5.0)
    subs = []
    for i in range(4):  # registered one after the other: the chain is gen-0 -> gen-1 -> gen-2 -> gen-3
        subs.append(WeightSubscriber(pub.endpoint, name=f"gen-{i}", relay_host=LOOPBACK))
        pub.wait_for_peers(i + 1, timeout_s=5)
    got: dict = {}
    threads = [reader(s, 3, got) for s in subs]
    sent_before = 0
    for version in (1, 2, 3):
        pub.publish(version, tensors_of(version))
        assert pub.wait_acks(version, timeout_s=20) == {f"gen-{i}": (True, "") for i in range(4)}
        n_chunks = (8 << 20) // (256 << 10) + 1
        assert pub.chunks_sent - sent_before == n_chunks  # once, to the head: not once per subscriber
        sent_before = pub.chunks_sent
    for t in threads:
        t.join(10)
    for version in (1, 2, 3):
        want = {t.name: bytes(t.data) for t in tensors_of(version)}
        assert all(got[(f"gen-{i}", version)][0] == want for i in range(4)), version
    assert [s.relay.forwarded for s in subs] == [3 * n_chunks] * 3 + [0]  # each hop forwards; the tail does not
    assert pub.relinked == 0 and not pub.stalled
    for s in subs:
        s.close()
    pub.close()


def _subscriber_process(endpoint: str, name: str, stop_after: int, holding, versions: int, results) -> None:
    """A subscriber in its own process. With `stop_after`, it stops reading once it holds that many chunks of
    version 1 (mid-version) and says so, then waits to be killed."""
    sub = WeightSubscriber(endpoint, name=name, relay_host=LOOPBACK)
    if stop_after:
        accept = sub._accept

        def accept_then_freeze(*args):
            done = accept(*args)
            if sub._assembly is not None and sub._assembly.next_seq >= stop_after:
                holding.set()  # it holds (and has forwarded) part of the version; now it waits to be killed
                time.sleep(3600)
            return done

        sub._accept = accept_then_freeze
    done = 0
    while done < versions:
        ws = sub.poll(50)
        if ws is not None:
            results.put((name, ws.version, bytes(ws.tensors["big"].data[-64:]), len(ws.tensors["big"].data)))
            sub.ack(ws.version)
            done += 1
    sub.close()


def test_a_subscriber_killed_mid_version_is_relinked_around_and_counted():
    ctx = mp.get_context("spawn")
    stall = 10.0  # far longer than the test may take: the closed connection gives the dead one away
    pub = WeightPublisher(chunk_bytes=128 << 10, fanout="relay", stall_timeout_s=stall)
    holding, results = ctx.Event(), ctx.Queue()
    procs = {}
    for i, name in enumerate(["gen-0", "victim", "gen-2"]):
        procs[name] = ctx.Process(target=_subscriber_process, daemon=True,
                                  args=(pub.endpoint, name, 10 if name == "victim" else 0, holding, 2, results))
        procs[name].start()
        pub.wait_for_peers(i + 1, timeout_s=60)
    killer = threading.Thread(target=lambda: holding.wait(30) and os.kill(procs["victim"].pid, signal.SIGKILL))
    killer.start()
    started = time.monotonic()
    pub.publish(1, tensors_of(1))  # 64 chunks; the victim stops after 10, then dies
    publish_s = time.monotonic() - started
    killer.join(30)
    assert holding.is_set() and procs["victim"].exitcode == -signal.SIGKILL
    acks = pub.wait_acks(1, timeout_s=20)
    assert acks["gen-0"] == (True, "") and acks["gen-2"] == (True, "")
    assert acks["victim"][0] is False and acks["victim"][1].startswith("stalled:")
    assert "victim" in pub.stalled[1] and pub.relinked >= 1
    assert publish_s < stall / 2, publish_s  # found dead when its connection closed, not after the stall timeout
    # The next version goes around the dead one at once (it was dropped or sits at the chain's tail).
    pub.publish(2, tensors_of(2))
    assert pub.wait_acks(2, timeout_s=20).get("gen-2") == (True, "")
    got = sorted(results.get(timeout=10)[:2] for _ in range(4))
    assert got == [("gen-0", 1), ("gen-0", 2), ("gen-2", 1), ("gen-2", 2)]
    for p in procs.values():
        p.join(10)
        if p.is_alive():
            p.kill()
    pub.close()


def test_a_stalled_head_does_not_hold_up_the_chain_beyond_the_stall_timeout():
    stall = 1.0
    pub = WeightPublisher(chunk_bytes=256 << 10, hwm=2, fanout="relay", stall_timeout_s=stall)
    stalled = WeightSubscriber(pub.endpoint, name="stalled", relay_host=LOOPBACK)  # the head; never reads
    pub.wait_for_peers(1, timeout_s=5)
    subs = [WeightSubscriber(pub.endpoint, name=f"gen-{i}", relay_host=LOOPBACK) for i in (1, 2)]
    pub.wait_for_peers(3, timeout_s=5)
    got: dict = {}
    threads = [reader(s, 2, got) for s in subs]
    try:
        for version in (1, 2):
            started = time.monotonic()
            pub.publish(version, tensors_of(version, (32 << 20) // 4))  # far more than queues and buffers hold
            want = {t.name: bytes(t.data) for t in tensors_of(version, (32 << 20) // 4)}
            for s in subs:
                data, at = got.get((s.name, version)) or (None, None)
                if data is None:
                    pub.wait_acks(version, timeout_s=10)
                    data, at = got[(s.name, version)]
                assert data == want
                # At most: the wait for links to be confirmed (first version), the stall timeout, and the transfer
                # (on a loaded 2-core machine), never the stalled subscriber's own pace.
                assert at - started < stall * 2 + 8.0, (version, at - started)
            acks = pub.wait_acks(version, timeout_s=10)
            assert acks["stalled"][0] is False and acks["stalled"][1].startswith("stalled:")
            assert "stalled" in pub.stalled[version]
        assert pub.relinked >= 1
    finally:  # closed even after a failed assertion: a context left open blocks the interpreter's exit
        for t in threads:
            t.join(35)  # a reader polls at most 30 s: its socket is closed only once it is done with it
        for s in subs + [stalled]:
            s.close()
        pub.close()


@pytest.mark.parametrize("cipher", ["aes-gcm", "curvezmq"])
def test_with_curve_an_outsider_cannot_push_chunks_into_the_chain(cipher):
    gens = ["generator-0", "generator-1"]
    keys = RunKeys.generate(gens, cipher=cipher)
    pub = WeightPublisher(chunk_bytes=64 << 10, curve=keys.weights_server_side(gens), expected=gens,
                          fanout="relay", stall_timeout_s=5.0)
    subs = []
    for i, name in enumerate(gens):
        subs.append(WeightSubscriber(pub.endpoint, name=name, curve=keys.weights_client(name), relay_host=LOOPBACK))
        pub.wait_for_peers(i + 1, timeout_s=5)
    got: dict = {}
    threads = [reader(s, 1, got) for s in subs]
    pub.publish(1, tensors_of(1, 1 << 16))
    for t in threads:
        t.join(20)
    assert pub.wait_acks(1, timeout_s=10) == {name: (True, "") for name in gens}
    # Strangers at generator-1's forwarding socket: one with its own keys, one with no CURVE, and one holding a key
    # of the run that the publisher never named as generator-1's predecessor (the publisher's own server key).
    forged = [b"C", msgpack.packb({"version": 999, "seq": 0, "n_chunks": 1,
                                   "parts": [["small", "int64", [3, 5], 0, 120]]}), np.zeros(15, np.int64).tobytes()]
    # Sealed ones too: with a chunk key of its own, and a genuine sealed chunk of version 1 with its part altered.
    own_key = ChunkSealer().seal(999, forged)
    altered = pub.seal.chunks.seal(999, forged) if cipher == "aes-gcm" else forged
    altered[-1] = bytes([altered[-1][0] ^ 1]) + bytes(altered[-1][1:])
    target = subs[1].relay.endpoint
    ctx = zmq.Context()
    outsiders = []
    for curve in (CurveClient(KeyPair.generate().public, KeyPair.generate()), None,
                  CurveClient(KeyPair.generate().public, keys.weights_server)):
        sock = ctx.socket(zmq.DEALER)
        sock.linger = 0
        if curve is not None and cipher == "curvezmq":
            CurveClient(keys.clients["generator-1"].public, curve.keys).apply(sock)
        elif curve is not None:  # core.admission's handshake, with tokens of keys not admitted there
            apply_admission(sock, CurveClient(keys.clients["generator-1"].public, curve.keys, cipher))
        sock.connect(target)
        for message in (forged, own_key, altered):
            try:
                sock.send_multipart(message, flags=zmq.NOBLOCK)
            except zmq.Again:
                pass
        outsiders.append(sock)
    assert subs[1].poll(1500) is None  # version 999 never arrives
    # refused at the handshake (CURVE, or core.admission's with aes-gcm): not one message reached it
    assert subs[1].relay.zap.refused["unknown_key"] >= 2
    assert subs[1].drops.by_reason["auth"] == 0
    threads = [reader(s, 1, got) for s in subs]
    pub.publish(2, tensors_of(2, 1 << 16))
    for t in threads:
        t.join(20)
    assert pub.relinked == 0 and not pub.stalled
    want = {t.name: bytes(t.data) for t in tensors_of(2, 1 << 16)}
    assert got[("generator-0", 2)][0] == want and got[("generator-1", 2)][0] == want
    assert subs[0].relay.forwarded > 0 and subs[1].latest_version == 2  # the authenticated hop carried it
    for sock in outsiders:
        sock.close(0)
    ctx.term()
    for s in subs:
        s.close()
    pub.close()


def test_fanout_bench_measures_both_fan_outs_on_real_processes():
    from launch.bench.fanout import fan_out

    payload = np.arange((4 << 20) // 4, dtype=np.float32)
    for fanout in ("relay", "star"):
        times = fan_out(fanout, 2, payload, versions=1, chunk_bytes=1 << 20)
        assert len(times) == 1 and 0 < times[0] < 30, (fanout, times)


def test_a_link_that_races_its_successors_admission_still_delivers_every_chunk_in_order():
    """The predecessor's link can arrive before the successor admits its key; libzmq never retries a refused
    CURVE handshake, so the forwarder must (and must lose nothing queued meanwhile)."""
    from core.weights.forward import Forwarder

    ctx = zmq.Context()
    a_keys, b_keys = KeyPair.generate(), KeyPair.generate()
    b = Forwarder(ctx, "b", LOOPBACK, b_keys, max_chunk_bytes=1 << 20)
    a = Forwarder(ctx, "a", LOOPBACK, a_keys, max_chunk_bytes=1 << 20)
    a.link(b.endpoint, b_keys.public.decode(), stall_timeout_s=20.0)
    for i in range(5):
        a.forward([b"C", str(i).encode()])
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:  # the handshake is refused meanwhile: b has not admitted a's key
        a.flush()
        time.sleep(0.02)
    assert b.zap.refused["unknown_key"] >= 1 and not b.inbound.poll(0)
    b.admit(a_keys.public.decode())
    got = []
    deadline = time.monotonic() + 10
    while len(got) < 5 and time.monotonic() < deadline:
        a.flush()
        if b.inbound.poll(50):
            got.append(b.inbound.recv_multipart()[1:])
    assert got == [[b"C", str(i).encode()] for i in range(5)]
    assert a.dropped_successors == 0 and a.forwarded == 5
    a.close(0)
    b.close(0)
    release_handler(ctx)
    ctx.term()
