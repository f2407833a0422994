"""`python -m launch.bench transport`: our ZeroMQ path vs Ray's object store vs memcpy, side by side.

- Trajectory frames of 64 KB and 1 MB: a producer process encodes and sends records; this process receives,
  decodes and validates them (the whole path a trajectory takes), over the same-node Unix socket (`zmq`, what
  a pool on the coordinator's node uses) and over loopback TCP (`zmq tcp`, what crosses nodes). Ray:
  `ray.get(ray.put(record))` of the same record (one process, serial: the lower bound of Ray's cost), and Ray
  across processes as it would carry trajectories (`ray xproc`: a producer actor's records taken with `ray.get`
  on refs, 64 in flight, validated as the receiver validates), and as a Ray user would batch them (`ray batched
  xproc`, figure `zmq_over_ray_batched_xproc_*`: the actor returns 16 records a call, 4 calls in flight, each
  taken as soon as it is ready with `ray.wait`, every record validated). memcpy: a copy of a buffer of the same size,
  hot (one buffer, cached) and cold (rings four times the last-level cache, as a received message's bytes are).
- A 256 MB weights payload: the weights channel to a subscriber process, until its ack; Ray put + get of the same
  array; memcpy of the same bytes.
- The TCP paths under the run's CURVE keys (authenticated and encrypted, as off loopback by default): side by
  side with the plain TCP ones, `curve_over_plain_1mb` and `curve_over_plain_weights` (throughput ratios).
  Both channels as a run uses them (`transport.cipher=aes-gcm`: sealed by the sender, opened by the receiver,
  core.seal and core.weights.seal), and with `curvezmq` beside them (`curvezmq_over_plain_*`).
Throughput ratios are measured in this one run. The last line is the JSON of the figures.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time

import numpy as np

from core.codec import encode
from launch.bench.report import emit, table
from launch.bench.samples import trajectory_of_bytes

KB, MB = 1 << 10, 1 << 20


def _produce(endpoint: str, size: int, count: int, curve=None) -> None:
    from core.transport import TrajectorySender

    tx = TrajectorySender(endpoint, name="bench-producer", hwm=64, curve=curve)
    traj = trajectory_of_bytes(size)
    for _ in range(count):
        tx.send(traj)
    tx.close()


def _keys(client: str, cipher: str = "aes-gcm"):
    from core.curve import RunKeys

    return RunKeys.generate([client], cipher=cipher)


def zmq_trajectories(size: int, count: int, warmup: int, curve: str | None = None, same_node: bool = False) -> float:
    """Seconds for `count` records after `warmup`, producer in another process: over TCP (encrypted with the
    run's keys by `curve`: "aes-gcm" or "curvezmq", see transport.cipher), or over the same-node Unix socket a
    pool on the coordinator's node takes (`same_node`)."""
    from core.codec import WireLimits
    from core.transport import TrajectoryReceiver

    keys = _keys("bench-producer", curve) if curve else None
    rx = TrajectoryReceiver(hwm=64, limits=WireLimits(max_tokens=1 << 22),
                            curve=keys.trajectory_server_side(["bench-producer"]) if keys else None)
    client = keys.trajectory_client("bench-producer") if keys else None
    endpoint = rx.endpoints if same_node else rx.endpoint
    if same_node and endpoint == rx.endpoint:
        raise RuntimeError("no same-node socket on this machine (see core.transport.local_ipc_dir)")
    proc = mp.get_context("spawn").Process(target=_produce, args=(endpoint, size, warmup + count, client))
    proc.start()
    for _ in range(warmup):
        assert rx.recv(60_000) is not None
    start = time.perf_counter()
    for _ in range(count):
        assert rx.recv(60_000) is not None
    elapsed = time.perf_counter() - start
    proc.join()
    rx.close()
    assert rx.stats.dropped == 0
    return elapsed


def ray_put_get(obj, count: int, warmup: int) -> float:
    import ray

    for _ in range(warmup):
        ray.get(ray.put(obj))
    start = time.perf_counter()
    for _ in range(count):
        ray.get(ray.put(obj))
    return time.perf_counter() - start


class _RayProducer:
    """The Ray way to carry trajectories across processes: an actor returns records, the consumer gets refs."""

    def __init__(self, size: int):
        self.traj = trajectory_of_bytes(size)

    def make(self):
        return self.traj


def _timed_takes(take, warmup: int, count: int, producer) -> float:
    """Seconds `take(count)` takes after `take(warmup)`; the producer actor is killed afterwards."""
    import ray

    take(warmup)
    start = time.perf_counter()
    take(count)
    elapsed = time.perf_counter() - start
    ray.kill(producer)
    return elapsed


def ray_xproc(size: int, count: int, warmup: int, window: int = 64) -> float:
    """Seconds for `count` records from a producer actor (another process), taken here with `ray.get` on their
    refs with `window` calls in flight (the trajectory channel's high-water mark), each validated as our
    receiver validates (`Trajectory.validate`, the check `core.codec.decode` ends with)."""
    import collections

    import ray

    from core.codec import WireLimits

    limits = WireLimits(max_tokens=1 << 22)
    producer = ray.remote(_RayProducer).options(num_cpus=0).remote(size)

    def take(n: int) -> None:
        pending = collections.deque(producer.make.remote() for _ in range(min(window, n)))
        issued = len(pending)
        while pending:
            ray.get(pending.popleft()).validate(max_tokens=limits.max_tokens, max_turns=limits.max_turns)
            if issued < n:
                pending.append(producer.make.remote())
                issued += 1

    return _timed_takes(take, warmup, count, producer)


def last_level_cache_bytes() -> int:
    try:
        with open("/sys/devices/system/cpu/cpu0/cache/index3/size") as f:
            text = f.read().strip()
        return int(text[:-1]) * {"K": KB, "M": MB}[text[-1]] if text[-1] in "KM" else int(text)
    except (OSError, ValueError, KeyError):
        return 32 * MB  # a common server L3; the figure then says what it assumed


def memcpy_cold(nbytes: int, count: int) -> float:
    """Seconds for `count` copies of `nbytes`, each from and to a part of two rings four times the last-level
    cache, so no copy finds its bytes cached (as a received message's bytes are not)."""
    ring = max(4 * last_level_cache_bytes(), 2 * nbytes)
    slots = ring // nbytes
    src = np.random.default_rng(0).integers(0, 255, slots * nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    start = time.perf_counter()
    for i in range(count):
        k = (i % slots) * nbytes
        np.copyto(dst[k:k + nbytes], src[k:k + nbytes])
    return time.perf_counter() - start


def memcpy(nbytes: int, count: int) -> float:
    src = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    start = time.perf_counter()
    for _ in range(count):
        np.copyto(dst, src)
    return time.perf_counter() - start


def _subscribe(endpoint: str, versions: int, curve=None) -> None:
    from core.weights.subscriber import WeightSubscriber

    sub = WeightSubscriber(endpoint, name="bench-generator", curve=curve)
    for _ in range(versions):
        ws = sub.poll(120_000)
        sub.ack(ws.version)
    sub.close()


def zmq_weights(nbytes: int, count: int, curve: str | None = None) -> float:
    from core.weights.publisher import WeightPublisher
    from core.weights.tensors import TensorBytes

    keys = _keys("bench-generator", curve) if curve else None
    pub = WeightPublisher(curve=keys.weights_server_side(["bench-generator"]) if keys else None)
    client = keys.weights_client("bench-generator") if keys else None
    proc = mp.get_context("spawn").Process(target=_subscribe, args=(pub.endpoint, count + 1, client))
    proc.start()
    pub.wait_for_peers(1, timeout_s=60)
    arr = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    tensors = [TensorBytes("w", "uint8", (nbytes,), arr.data)]
    pub.publish(0, tensors)
    pub.wait_acks(0, timeout_s=120)
    start = time.perf_counter()
    for v in range(1, count + 1):
        pub.publish(v, tensors)
        pub.wait_acks(v, timeout_s=120)
    elapsed = time.perf_counter() - start
    proc.join()
    pub.close()
    return elapsed


class _RayBatchProducer:
    """What a Ray user would write to move many records: one call returns a list of them. The records are
    distinct objects, made once: a list of one object repeated would be pickled once (pickle's memo), carrying
    one record's bytes for many."""

    def __init__(self, size: int, batch: int):
        self.records = [trajectory_of_bytes(size, seed=i, trajectory_id=f"traj-{i}") for i in range(batch)]

    def make_batch(self, n: int):
        return self.records[:n]


def ray_batched_xproc(size: int, count: int, warmup: int, batch: int = 16, window: int = 4) -> float:
    """Seconds for `count` records from a producer actor, `batch` records a call, `window` calls in flight, each
    call's list taken with `ray.wait` as soon as it is ready and every record validated (as `ray_xproc`)."""
    import ray

    from core.codec import WireLimits

    limits = WireLimits(max_tokens=1 << 22)
    producer = ray.remote(_RayBatchProducer).options(num_cpus=0).remote(size, batch)

    def take(n: int) -> None:
        sizes = [min(batch, n - i) for i in range(0, n, batch)]
        pending = [producer.make_batch.remote(k) for k in sizes[:window]]
        issued = len(pending)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for record in ray.get(ready[0]):
                record.validate(max_tokens=limits.max_tokens, max_turns=limits.max_turns)
            if issued < len(sizes):
                pending.append(producer.make_batch.remote(sizes[issued]))
                issued += 1

    return _timed_takes(take, warmup, count, producer)


def paired(*runs, trials: int) -> list[float]:
    """Median seconds of each of `runs`, run in turn `trials` times each after one untimed run of each (the
    first spawn of a process pays for imports and page faults the others do not)."""
    for run in runs:
        run()
    times: list[list[float]] = [[] for _ in runs]
    for _ in range(trials):
        for run, seconds in zip(runs, times):
            seconds.append(run())
    return [statistics.median(seconds) for seconds in times]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="launch.bench transport", description=__doc__.splitlines()[0])
    parser.add_argument("--count-64k", type=int, default=4000)
    parser.add_argument("--count-1m", type=int, default=600)
    parser.add_argument("--weights-mb", type=int, default=256)
    parser.add_argument("--weights-count", type=int, default=3)
    parser.add_argument("--trials", type=int, default=3, help="alternating timed runs of plain and CURVE paths")
    args = parser.parse_args(argv)

    from launch.job.ray_cluster import connect, shutdown

    connect(num_cpus=2)
    rows, figures = [], {}
    cases = [("64kb", 64 * KB, args.count_64k), ("1mb", MB, args.count_1m)]
    for label, size, count in cases:
        traj = trajectory_of_bytes(size)
        wire = sum(len(f) for f in encode(traj))
        plain, curve, curvezmq = paired(
            lambda: zmq_trajectories(size, count, warmup=count // 10),
            lambda: zmq_trajectories(size, count, warmup=count // 10, curve="aes-gcm"),
            lambda: zmq_trajectories(size, count, warmup=count // 10, curve="curvezmq"), trials=args.trials)
        # The cold copy's rate swings with what else the host's memory serves (6 to 11 GB/s on this machine
        # within minutes), so it is timed in turn with the path it is compared with, the median of each.
        local, cold = paired(lambda: zmq_trajectories(size, count, warmup=count // 10, same_node=True),
                             lambda: memcpy_cold(wire, count), trials=args.trials)
        times = {"zmq": local, "zmq tcp": plain, "zmq+curve": curve, "zmq+curvezmq": curvezmq,
                 "ray": ray_put_get(traj, count, warmup=count // 10),
                 "ray xproc": statistics.median(ray_xproc(size, count, warmup=count // 10) for _ in range(args.trials)),
                 "ray batched xproc": statistics.median(ray_batched_xproc(size, count, warmup=count // 10)
                                                        for _ in range(args.trials)),
                 "memcpy": memcpy(wire, count), "memcpy cold": cold}
        for path, seconds in times.items():
            rows.append([f"trajectory {label}", path, count / seconds, wire * count / seconds / 1e9,
                         times["ray"] / times["zmq"] if path == "zmq" else "",
                         times["ray xproc"] / times["zmq"] if path == "zmq" else "",
                         times["memcpy"] / times["zmq"] if path == "zmq" else "",
                         times["memcpy cold"] / times["zmq"] if path == "zmq" else ""])
        figures[f"curve_over_plain_{label}"] = times["zmq tcp"] / times["zmq+curve"]
        figures[f"curvezmq_over_plain_{label}"] = times["zmq tcp"] / times["zmq+curvezmq"]
        figures[f"zmq_over_ray_{label}"] = times["ray"] / times["zmq"]
        figures[f"zmq_over_ray_xproc_{label}"] = times["ray xproc"] / times["zmq"]
        figures[f"zmq_over_ray_batched_xproc_{label}"] = times["ray batched xproc"] / times["zmq"]
        figures[f"zmq_tcp_over_ray_xproc_{label}"] = times["ray xproc"] / times["zmq tcp"]
        figures[f"zmq_over_memcpy_{label}"] = times["memcpy"] / times["zmq"]
        figures[f"zmq_over_memcpy_cold_{label}"] = times["memcpy cold"] / times["zmq"]
        figures[f"zmq_gbps_{label}"] = wire * count / times["zmq"] / 1e9

    nbytes, count = args.weights_mb * MB, args.weights_count
    arr = np.random.default_rng(1).integers(0, 255, nbytes, dtype=np.uint8)
    plain, curve, curvezmq = paired(lambda: zmq_weights(nbytes, count),
                                    lambda: zmq_weights(nbytes, count, curve="aes-gcm"),
                                    lambda: zmq_weights(nbytes, count, curve="curvezmq"), trials=args.trials)
    times = {"zmq": plain, "zmq+curve": curve, "zmq+curvezmq": curvezmq, "ray": ray_put_get(arr, count, warmup=1),
             "memcpy": memcpy(nbytes, count)}
    for path, seconds in times.items():
        rows.append([f"weights {args.weights_mb} MB", path, count / seconds, nbytes * count / seconds / 1e9,
                     times["ray"] / times["zmq"] if path == "zmq" else "", "",
                     times["memcpy"] / times["zmq"] if path == "zmq" else "", ""])
    figures["curve_over_plain_weights"] = times["zmq"] / times["zmq+curve"]
    figures["curvezmq_over_plain_weights"] = times["zmq"] / times["zmq+curvezmq"]
    figures["zmq_over_ray_weights"] = times["ray"] / times["zmq"]
    figures["zmq_over_memcpy_weights"] = times["memcpy"] / times["zmq"]
    shutdown()

    print(table(["payload", "path", "msgs/s", "GB/s", "zmq/ray", "zmq/ray xproc", "zmq/memcpy", "zmq/memcpy cold"],
                rows))
    print("zmq: producer process -> encode -> the same-node Unix socket (what a pool on the coordinator's node")
    print("  takes) -> decode + validate; zmq tcp: the same over loopback TCP; weights: TCP until the receiver's ack.")
    print("zmq+curve: TCP under the run's CURVE keys as a run uses them (transport.cipher=aes-gcm: each message")
    print("  sealed by the sender and opened by the receiver, chunks of weights sealed once); zmq+curvezmq: the same")
    print("  with transport.cipher=curvezmq; curve_over_plain = the zmq+curve throughput / the plain TCP one's;")
    print(f"zmq tcp and zmq+curve* rows are medians of {args.trials} runs each, taken in turn after one untimed run;")
    print(f"zmq, ray xproc and ray batched xproc rows are medians of {args.trials} runs.")
    print("ray: ray.get(ray.put(x)) in one process; ray xproc: a producer actor's records taken with ray.get on")
    print("  their refs, 64 in flight, each validated as the zmq receiver validates; ray batched xproc: 16 records")
    print("  a call (a list), 4 calls in flight, taken with ray.wait as each is ready; memcpy: np.copyto of the same")
    print(f"  number of bytes (hot: one buffer; cold: rings of 4 x the {last_level_cache_bytes() // MB} MB "
          "last-level cache).")
    emit(figures)
    return 0
