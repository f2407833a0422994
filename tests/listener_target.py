"""A listener of the run, alone in its process, for the admission tests: `python -m tests.listener_target KIND
CIPHER`. KIND: trajectory (the receiver's ROUTER), weights (the publisher's), relay (a relay subscriber's inbound
socket); CIPHER: aes-gcm, curvezmq or none (auth off). It prints {"endpoint", "pid"} as one JSON line, then serves
(receives and drops what comes, as the run would) until its stdin closes, and prints what it refused."""
from __future__ import annotations

import json
import select
import sys

from core.curve import RunKeys
from core.transport import LOOPBACK, TrajectoryReceiver
from core.weights.publisher import WeightPublisher
from core.weights.subscriber import WeightSubscriber, chunk_frame_cap

POOLS, GENS = ["envpool-0"], ["generator-0", "generator-1"]
CHUNK_BYTES = 4 << 20  # transport.weights_chunk_mb's default


def main(kind: str, cipher: str) -> int:
    keys = RunKeys.generate(POOLS + GENS, cipher=cipher) if cipher != "none" else None
    closers = []
    if kind == "trajectory":
        rx = TrajectoryReceiver(curve=keys.trajectory_server_side(POOLS) if keys else None, same_node=False)
        endpoint, serve, closers = rx.endpoint, lambda: rx.recv(50), [rx.close]
        refused = lambda: rx.auth_refused  # noqa: E731
    else:
        pub = WeightPublisher(curve=keys.weights_server_side(GENS) if keys else None, fanout="relay")
        endpoint, closers = pub.endpoint, [pub.close]
        serve = lambda: pub.poll(50)  # noqa: E731
        refused = lambda: pub.auth_refused  # noqa: E731
        if kind == "relay":
            # capped as a generator replica caps it (actors/weights/generator_end.py), for 4 MiB chunks
            sub = WeightSubscriber(pub.endpoint, name="generator-0", relay_host=LOOPBACK,
                                   curve=keys.weights_client("generator-0") if keys else None,
                                   max_chunk_bytes=chunk_frame_cap(CHUNK_BYTES))
            pub.wait_for_peers(1, timeout_s=10)
            endpoint, closers = sub.relay.endpoint, [sub.close, pub.close]

            def serve():
                pub.poll(0)
                sub.poll(50)
            refused = lambda: sub.relay.zap.refused if sub.relay.zap is not None else 0  # noqa: E731
    print(json.dumps({"endpoint": endpoint}), flush=True)
    while not select.select([sys.stdin], [], [], 0)[0]:
        serve()
    print(json.dumps({"refused": str(refused())}), flush=True)
    for close in closers:
        close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
