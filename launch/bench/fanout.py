"""`python -m launch.bench fanout`: publish-to-last-ack time of one weight version to 1, 2, 4 and 8 subscriber
processes, relay and star fan-out side by side (core.weights.relay, core.weights.publisher).

Each subscriber is a real process that receives, validates, assembles and acks (no engine); under relay it also
forwards every chunk to the next. Per subscriber count, relay and star alternate, each timed over `--versions`
versions after one untimed version (which pays for page faults of the receive buffers); the figure is the median.
`fanout_8_over_1` (relay) and `star_8_over_1` are the time to 8 subscribers over the time to 1.

Where the fan-out's cost lies: a star sends every byte once per replica through the publisher's NIC, a relay
once, whatever N is. So by default (as root, with iproute2) every process runs on a host of its own: a network
namespace whose link is shaped to `--link-gbps` both ways (launch/bench/netlab.py), and the channel runs as a
multi-node run's would, over non-loopback addresses with CURVE on (`transport.auth=auto`). `--link-gbps 0` runs
every process on loopback instead, where relay and star move the same bytes through one kernel and all
processes share the machine's cores, so both grow with N: that measures this machine's memory bandwidth, not a
fan-out.

The lab's hosts still share this machine's cores, so the link rate must leave the CPU out of the figure: each
relay hop receives, decrypts, re-encrypts and sends at the link rate. On 2 cores, 0.5 Gbit/s (the default) kept
about 1.6 cores busy with 8 subscribers; at 1 Gbit/s the cores saturated and the relay's time grew with N for
that reason. The bench prints the busy cores per case and warns when they pass 90 %.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np

from launch.bench import netlab
from launch.bench.report import emit, table

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Hosts:
    """Where the publisher and each subscriber run: namespace prefixes and addresses (a NetLab's), or loopback."""

    publisher_ip: str = LOOPBACK
    subscriber_ips: tuple[str, ...] = ()
    prefixes: tuple[tuple[str, ...], ...] = ()  # the command prefix per subscriber host
    curve: bool = False


def _subscriber(endpoint: str, name: str, versions: int, relay_host: str, keys: dict | None) -> None:
    from core.curve import CurveClient, KeyPair
    from core.weights.subscriber import WeightSubscriber

    curve = None
    if keys:
        curve = CurveClient(keys["server"].encode(), KeyPair(keys["public"].encode(), keys["secret"].encode()),
                            keys["cipher"])
    sub = WeightSubscriber(endpoint, name=name, relay_host=relay_host, max_chunk_bytes=64 << 20, curve=curve)
    for _ in range(versions):
        ws = sub.poll(600_000)
        if ws is None:
            break
        sub.ack(ws.version)
    sub.close()


def _start(hosts: Hosts, i: int, endpoint: str, name: str, versions: int, keys: dict | None):
    if not hosts.prefixes:  # loopback: a spawned process
        proc = mp.get_context("spawn").Process(target=_subscriber, args=(endpoint, name, versions, LOOPBACK, keys),
                                               daemon=True)
        proc.start()
        return proc
    spec = {"endpoint": endpoint, "name": name, "versions": versions, "relay_host": hosts.subscriber_ips[i],
            "keys": keys}
    proc = subprocess.Popen([*hosts.prefixes[i], sys.executable, "-m", "launch.bench.fanout", "--subscriber"],
                            stdin=subprocess.PIPE, text=True)
    proc.stdin.write(json.dumps(spec))  # keys through a pipe, never a file or argv
    proc.stdin.close()
    return proc


def _stop(proc) -> None:
    if isinstance(proc, subprocess.Popen):
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        return
    proc.join(30)
    if proc.is_alive():
        proc.kill()


def busy_jiffies() -> tuple[int, int]:
    """(busy, total) CPU time of the whole machine so far, in clock ticks (/proc/stat)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def fan_out(fanout: str, n_subs: int, payload: np.ndarray, versions: int, chunk_bytes: int,
            hosts: Hosts = Hosts(), load: dict | None = None) -> list[float]:
    """Seconds from publish to the last subscriber's ack, for each of `versions` versions after a warm-up;
    `load["cores_busy"]`, when given, is set to the machine's mean busy cores over the timed versions."""
    from core.curve import RunKeys
    from core.weights.publisher import WeightPublisher
    from core.weights.tensors import TensorBytes

    names = [f"sub-{i}" for i in range(n_subs)]
    keys = RunKeys.generate(names) if hosts.curve else None
    pub = WeightPublisher(host=hosts.publisher_ip, chunk_bytes=chunk_bytes, fanout=fanout, stall_timeout_s=120.0,
                          curve=keys.weights_server_side(names) if keys else None, expected=names if keys else None)
    procs = []
    try:
        for i, name in enumerate(names):  # one after the other: the relay chain follows registration order
            client = None
            if keys:
                pair = keys.clients[name]
                client = {"server": keys.weights_server.public.decode(), "public": pair.public.decode(),
                          "secret": pair.secret.decode(), "cipher": keys.cipher}
            procs.append(_start(hosts, i, pub.endpoint, name, versions + 1, client))
            pub.wait_for_peers(i + 1, timeout_s=120)
        tensors = [TensorBytes("w", "float32", payload.shape, payload.data)]
        times = []
        for version in range(versions + 1):
            if version == 1:
                cpu0 = busy_jiffies()
            started = time.perf_counter()
            pub.publish(version, tensors)
            acks = pub.wait_acks(version, timeout_s=600)
            elapsed = time.perf_counter() - started
            bad = {n: a for n, a in acks.items() if not a[0]}
            if bad or len(acks) != n_subs:
                raise RuntimeError(f"{fanout} to {n_subs}: version {version} acks {acks}")
            if version:
                times.append(elapsed)
        if load is not None and versions:
            busy, total = (b - a for a, b in zip(cpu0, busy_jiffies()))
            load["cores_busy"] = (os.cpu_count() or 1) * busy / max(1, total)
    finally:
        for p in procs:
            _stop(p)
        pub.close()
    return times


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="launch.bench fanout", description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=int, default=538, help="version size in MB (10^6 bytes), float32")
    p.add_argument("--subscribers", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--versions", type=int, default=2, help="timed versions per case (after one untimed)")
    p.add_argument("--chunk-mb", type=int, default=4, help="chunk size (transport.weights_chunk_mb)")
    p.add_argument("--link-gbps", type=float, default=0.5,
                   help="each host's link rate, both ways; 0: all processes on loopback (default 0.5, or 0 when "
                        "network namespaces cannot be made here)")
    p.add_argument("--in-lab", default="", help=argparse.SUPPRESS)  # JSON Hosts: the run inside the publisher's host
    p.add_argument("--subscriber", action="store_true", help=argparse.SUPPRESS)
    return p


def measure(args: argparse.Namespace, hosts: Hosts) -> int:
    payload = np.random.default_rng(0).random(args.mb * 10**6 // 4, dtype=np.float32)
    seconds: dict[tuple[str, int], float] = {}
    busy: dict[tuple[str, int], float] = {}
    for n in args.subscribers:
        for fanout in ("relay", "star"):
            load: dict = {}
            seconds[(fanout, n)] = statistics.median(
                fan_out(fanout, n, payload, args.versions, args.chunk_mb << 20, hosts, load))
            busy[(fanout, n)] = load["cores_busy"]
    base = args.subscribers[0]
    rows = []
    for n in args.subscribers:
        relay, star = seconds[("relay", n)], seconds[("star", n)]
        rows.append([n, relay, star, relay / seconds[("relay", base)], star / seconds[("star", base)], star / relay,
                     payload.nbytes * n / relay / 1e9, busy[("relay", n)], busy[("star", n)]])
    cpus = os.cpu_count() or 0
    print(table(["subscribers", "relay s", "star s", f"relay / {base}", f"star / {base}", "star / relay",
                 "relay GB/s delivered", "relay cores busy", "star cores busy"], rows))
    saturated = [n for n in args.subscribers if busy[("relay", n)] > 0.9 * cpus]
    if saturated:
        print(f"WARNING: relay to {saturated} subscribers kept this machine's {cpus} cores over 90% busy: the figure "
              "measures the shared CPU, not the fan-out (a lower --link-gbps leaves the hosts' CPUs out of it)")
    where = (f"each process on a host of its own (network namespaces), links shaped to {args.link_gbps:g} Gbit/s "
             f"both ways, CURVE on; the hosts share this machine's {cpus} cores" if hosts.prefixes else
             f"all processes on loopback, sharing this machine's {cpus} cores: every hop's copies compete for them, "
             "so this measures one machine's memory bandwidth, not replicas each on their own node")
    print(f"{payload.nbytes / 1e6:.0f} MB float32 version, {args.chunk_mb} MB chunks, publish -> last ack; medians "
          f"of {args.versions} versions after one untimed; {where}.")
    figures = {f"relay_{n}_s": seconds[("relay", n)] for n in args.subscribers}
    figures.update({f"star_{n}_s": seconds[("star", n)] for n in args.subscribers})
    last = max(args.subscribers)
    figures[f"fanout_{last}_over_{base}"] = seconds[("relay", last)] / seconds[("relay", base)]
    figures[f"star_{last}_over_{base}"] = seconds[("star", last)] / seconds[("star", base)]
    figures["cpus"] = cpus
    figures["version_mb"] = round(payload.nbytes / 1e6)
    figures["link_gbps"] = args.link_gbps if hosts.prefixes else 0
    figures["curve"] = hosts.curve
    figures[f"relay_{last}_cores_busy"] = busy[("relay", last)]
    figures["cpu_saturated"] = bool(saturated)
    emit(figures)
    return 0


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if args.in_lab:
        spec = json.loads(args.in_lab)
        return measure(args, Hosts(spec["publisher_ip"], tuple(spec["subscriber_ips"]),
                                   tuple(tuple(p) for p in spec["prefixes"]), curve=True))
    why = netlab.available() if args.link_gbps > 0 else "--link-gbps 0"
    if why:
        print(f"fan-out on loopback ({why})", flush=True)
        args.link_gbps = 0.0
        return measure(args, Hosts())
    with netlab.NetLab(max(args.subscribers) + 1, args.link_gbps) as lab:
        spec = {"publisher_ip": lab.ips[0], "subscriber_ips": lab.ips[1:],
                "prefixes": [lab.prefix(i) for i in range(1, len(lab.ips))]}
        inner = [*lab.prefix(0), sys.executable, "-m", "launch.bench", "fanout", *argv, "--in-lab", json.dumps(spec)]
        return subprocess.run(inner).returncode


if __name__ == "__main__" and "--subscriber" in sys.argv:
    _spec = json.loads(sys.stdin.read())
    _subscriber(_spec["endpoint"], _spec["name"], _spec["versions"], _spec["relay_host"], _spec["keys"])
