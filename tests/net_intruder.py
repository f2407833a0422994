"""An outsider on the run's network, for the two-node test: `python -m tests.net_intruder RUN_DIR SECONDS OUT`.

It waits for the run's `transport.json` (endpoints and public server keys, which an outsider may well know),
then for a bounded time, about twice a second, tries what the threat model says must fail without the run's
keys: push a forged trajectory (plain ZeroMQ, CURVE with keys of its own, and sealed as the run's pools seal
them, core.seal, under keys of its own), subscribe to the weights
channel and ack a version (the same three ways). It counts its attempts and every weight chunk it managed to receive,
and writes them to OUT as JSON. It sends only to the endpoints the run advertises (addresses of the test's own
network namespaces)."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import msgpack
import zmq

from core.checkpoint import write_text_durably
from core.codec import encode
from core.curve import CurveClient, KeyPair
from core.seal import Sealer
from launch.bench.samples import make_trajectory


def _socket(ctx: zmq.Context, endpoint: str, server_public: str | None) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.sndtimeo = 200
    if server_public:
        CurveClient(server_public.encode(), KeyPair.generate()).apply(sock)
    sock.connect(endpoint)
    return sock


def main(run_dir: str, seconds: float, out: str) -> int:
    record = Path(run_dir) / "transport.json"
    deadline = time.monotonic() + seconds
    while not record.exists():
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    stats = {"trajectory_attempts": 0, "weights_attempts": 0, "chunks_received": 0, "saw_transport_json": False}
    write_text_durably(Path(out), json.dumps(stats))
    if record.exists():
        stats["saw_transport_json"] = True
        info = json.loads(record.read_text())
        ctx = zmq.Context()
        forged = make_trajectory(num_tokens=64, trajectory_id="g0000000-babyai_0.a0.s0")
        forged.turn_rewards[:] = 1e5
        frames = [bytes(f) for f in encode(forged)]
        server_public = info["trajectory_server_public"].encode()
        sealed = Sealer(CurveClient(server_public, KeyPair.generate(), "aes-gcm"), b"trajectory").seal(frames)
        while time.monotonic() < deadline:
            for public, message in ((None, frames), (info["trajectory_server_public"], frames), (None, sealed)):
                sock = _socket(ctx, info["trajectory_endpoint"], public)
                try:
                    sock.send_multipart(message)
                except zmq.Again:
                    pass
                stats["trajectory_attempts"] += 1
                sock.close(300)  # time to deliver what was queued (a sealed message is refused only on arrival)
            weights_public = info["weights_server_public"]
            for public, seal in ((None, False), (weights_public, False), (None, True)):
                sock = _socket(ctx, info["weights_endpoint"], public)
                sealer = Sealer(CurveClient(weights_public.encode(), KeyPair.generate(), "aes-gcm"), b"weights-up")
                for message in ([b"H", msgpack.packb({"name": "generator-0"})],
                                [b"A", msgpack.packb({"version": 1, "ok": False, "error": "forged"})]):
                    try:
                        sock.send_multipart(sealer.seal(message) if seal else message)
                    except zmq.Again:
                        pass
                if sock.poll(300):
                    stats["chunks_received"] += 1
                stats["weights_attempts"] += 1
                sock.close(0)
            # as it goes, whole or not at all: the test ends it with SIGTERM at any moment
            write_text_durably(Path(out), json.dumps(stats))
            time.sleep(0.2)
        ctx.term()
    write_text_durably(Path(out), json.dumps(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], float(sys.argv[2]), sys.argv[3]))
