"""`python -m launch.bench fanout`: publish-to-last-ack time of one weight version to 1, 2, 4 and 8 subscriber
processes, relay and star fan-out side by side (core.weights_relay, core.weights_channel).

Each subscriber is a real process that receives, validates, assembles and acks (no engine); under relay it also
forwards every chunk to the next. Per subscriber count, relay and star alternate, each timed over `--versions`
versions after one untimed version (which pays for page faults of the receive buffers); the figure is the median.
`fanout_8_over_1` (relay) and `star_8_over_1` are the time to 8 subscribers over the time to 1.

All processes share this machine's cores: relay moves the same bytes through the kernel as star (each subscriber
receives the version once, and all but the last send it once), so on a machine with fewer cores than processes
both grow with N; the relay's gain is that the publisher's own cost is one transfer, whatever N is.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time

import numpy as np

from launch.bench.report import emit, table

LOOPBACK = "127.0.0.1"


def _subscriber(endpoint: str, name: str, versions: int) -> None:
    from core.weights_subscriber import WeightSubscriber

    sub = WeightSubscriber(endpoint, name=name, relay_host=LOOPBACK, max_chunk_bytes=64 << 20)
    for _ in range(versions):
        ws = sub.poll(300_000)
        if ws is None:
            break
        sub.ack(ws.version)
    sub.close()


def fan_out(fanout: str, n_subs: int, payload: np.ndarray, versions: int, chunk_bytes: int) -> list[float]:
    """Seconds from publish to the last subscriber's ack, for each of `versions` versions after a warm-up."""
    from core.weights_channel import TensorBytes, WeightPublisher

    pub = WeightPublisher(chunk_bytes=chunk_bytes, fanout=fanout, stall_timeout_s=120.0)
    ctx = mp.get_context("spawn")
    procs = []
    for i in range(n_subs):  # one after the other: the relay chain follows registration order
        procs.append(ctx.Process(target=_subscriber, args=(pub.endpoint, f"sub-{i}", versions + 1), daemon=True))
        procs[-1].start()
        pub.wait_for_peers(i + 1, timeout_s=120)
    tensors = [TensorBytes("w", "float32", payload.shape, payload.data)]
    times = []
    try:
        for version in range(versions + 1):
            started = time.perf_counter()
            pub.publish(version, tensors)
            acks = pub.wait_acks(version, timeout_s=300)
            elapsed = time.perf_counter() - started
            bad = {n: a for n, a in acks.items() if not a[0]}
            if bad or len(acks) != n_subs:
                raise RuntimeError(f"{fanout} to {n_subs}: version {version} acks {acks}")
            if version:
                times.append(elapsed)
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
        pub.close()
    return times


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="launch.bench fanout", description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=538, help="version size in MB (10^6 bytes), float32")
    parser.add_argument("--subscribers", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--versions", type=int, default=2, help="timed versions per case (after one untimed)")
    parser.add_argument("--chunk-mb", type=int, default=4, help="chunk size (transport.weights_chunk_mb)")
    args = parser.parse_args(argv)

    payload = np.random.default_rng(0).random(args.mb * 10**6 // 4, dtype=np.float32)
    seconds: dict[tuple[str, int], float] = {}
    for n in args.subscribers:
        for fanout in ("relay", "star"):
            seconds[(fanout, n)] = statistics.median(
                fan_out(fanout, n, payload, args.versions, args.chunk_mb << 20))
    base = args.subscribers[0]
    rows = []
    for n in args.subscribers:
        relay, star = seconds[("relay", n)], seconds[("star", n)]
        rows.append([n, relay, star, relay / seconds[("relay", base)], star / seconds[("star", base)], star / relay,
                     payload.nbytes * n / relay / 1e9])
    print(table(["subscribers", "relay s", "star s", f"relay / {base}", f"star / {base}", "star / relay",
                 "relay GB/s delivered"], rows))
    cpus = os.cpu_count() or 0
    print(f"{payload.nbytes / 1e6:.0f} MB float32 version, {args.chunk_mb} MB chunks, publish -> last ack; medians of "
          f"{args.versions} versions after one untimed. Publisher and {max(args.subscribers)} subscriber processes "
          f"share this machine's {cpus} cores: every hop's copies compete for them, so this measures the fan-out "
          "on one machine, not replicas each on their own node.")
    figures = {f"relay_{n}_s": seconds[("relay", n)] for n in args.subscribers}
    figures.update({f"star_{n}_s": seconds[("star", n)] for n in args.subscribers})
    last = max(args.subscribers)
    figures[f"fanout_{last}_over_{base}"] = seconds[("relay", last)] / seconds[("relay", base)]
    figures[f"star_{last}_over_{base}"] = seconds[("star", last)] / seconds[("star", base)]
    figures["cpus"] = cpus
    figures["version_mb"] = round(payload.nbytes / 1e6)
    emit(figures)
    return 0
