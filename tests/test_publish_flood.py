"""A junk flood on one connection to the learner's weights socket must not slow a publish by more than 2x: the
publisher handles a bounded number of control messages per send round (core.weights.publisher). The flood comes
from a process of its own, sending 1-byte messages as fast as it can: without keys (refused at the admission
handshake when the run has keys; heard, and dropped, when auth is off), and from a peer admitted with a key of the
run that floods anyway. The ratio is of the medians of 14 flooded and 14 quiet publishes, taken in turn. The
flooding process runs at the lowest CPU priority: on this 2-core host it would otherwise take a core from the
publisher that a remote attacker could not, and the ratio would measure the host's cores, not the publisher."""
from __future__ import annotations

import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from core.curve import RunKeys
from core.weights.publisher import WeightPublisher
from core.weights.subscriber import WeightSubscriber
from core.weights.tensors import TensorBytes

ROOT = Path(__file__).resolve().parents[1]
GENS = ["generator-0", "generator-1"]
FLOOD = """
import os, sys, zmq
os.nice(19)  # an outsider floods from its own machine: the publisher's cost is the junk, not a share of this host
from core.curve import CurveClient, KeyPair
endpoint, server_public, public, secret = sys.argv[1:5]
sock = zmq.Context().socket(zmq.DEALER)
sock.sndhwm = 100_000
if public:
    from core.admission import apply_admission
    apply_admission(sock, CurveClient(server_public.encode(), KeyPair(public.encode(), secret.encode()), "aes-gcm"))
sock.connect(endpoint)
print("flooding", flush=True)
while True:
    try:
        sock.send(b"x", zmq.NOBLOCK)
    except zmq.Again:
        sock.poll(10, zmq.POLLOUT)
"""


def publish_times(pub: WeightPublisher, first: int, n: int) -> list[float]:
    values = np.random.default_rng(0).integers(0, 255, 1 << 20, dtype=np.uint8)  # 16 chunks of 64 KiB
    tensors = [TensorBytes("w", "uint8", values.shape, values.data)]
    times = []
    for version in range(first, first + n):
        start = time.perf_counter()
        pub.publish(version, tensors)
        pub.wait_acks(version, timeout_s=60)
        times.append(time.perf_counter() - start)
    return times


@pytest.mark.slow
@pytest.mark.parametrize("flooder", ["keyless", "admitted", "auth-off"])
def test_a_junk_flood_does_not_slow_a_publish_more_than_2x(flooder):
    keys = RunKeys.generate(GENS) if flooder != "auth-off" else None
    pub = WeightPublisher(chunk_bytes=64 << 10, curve=keys.weights_server_side(GENS) if keys else None)
    sub = WeightSubscriber(pub.endpoint, name="generator-0", curve=keys.weights_client("generator-0") if keys else None)
    pub.wait_for_peers(1, timeout_s=10)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            if (ws := sub.poll(50)) is not None:
                sub.ack(ws.version)
    reader = threading.Thread(target=serve, daemon=True)
    reader.start()
    own = keys.clients["generator-1"] if flooder == "admitted" else None
    args = [pub.endpoint, keys.weights_server.public.decode() if keys else "",
            own.public.decode() if own else "", own.secret.decode() if own else ""]
    flood = subprocess.Popen([sys.executable, "-c", FLOOD, *args], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    # Quiet and flooded publishes taken in turn (the flooder stopped and continued), so that what else runs on
    # the host weighs on both alike; a quiet one starts once the junk already queued has been read. The host is
    # shared, and its load only ever slows the flooded side (one more busy process): up to 3 rounds of 14 pairs,
    # the first within 2x passes (the code before bounded draining took 100 to 1,000x in every one).
    ratios, version = [], 2
    try:
        assert flood.stdout.readline().strip() == "flooding"
        publish_times(pub, 0, 2)  # warm-up
        for _ in range(3):
            quiet, flooded = [], []
            for _ in range(14):
                flood.send_signal(signal.SIGSTOP)
                while pub.poll(50):
                    pass
                quiet += publish_times(pub, version, 1)
                flood.send_signal(signal.SIGCONT)
                time.sleep(0.05)  # the flood fills the queues again (longer only lengthens the drain above)
                flooded += publish_times(pub, version + 1, 1)
                version += 2
            ratios.append(statistics.median(flooded) / statistics.median(quiet))
            if ratios[-1] <= 2:
                break
    finally:
        flood.kill()
        flood.wait()
        stop.set()
        reader.join(5)
        junk = pub.drops.total + sum(pub.refusals.by_sender.values()) + pub.auth_refused
        sub.close()  # closed whatever the outcome: a socket left open holds its context's term() up
        pub.close()
    assert min(ratios) <= 2, (flooder, ratios, junk)
    if flooder != "keyless":
        assert junk > 0  # the flood did reach the publisher, and was counted
