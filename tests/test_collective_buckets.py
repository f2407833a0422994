"""The weights group's bounded receive (actors.weights.group_buckets) between real processes over gloo on 127.0.0.1:
learner rank 0 (CollectivePublisher, in this process) and receiver processes that load each version as it streams.

Checked:
- a version four times the bucket (and more than four buckets) arrives bit-exact (SHA-256 of every tensor's
  bytes, computed by the receiver without keeping the tensor), while each side holds at most two bucket buffers:
  the buffers count what they allocate, and every tensor the receiver's loader is given lies inside one of them,
  so nothing else was allocated for it;
- a replica that dies mid-version fails the version on rank 0 with WeightsGroupError, naming the version and the
  bucket, within the timeout; the other replica's receive fails the same way instead of waiting on, and the
  failed group refuses the next version at once;
- a replica that stalls mid-version (alive, no longer taking its part) fails rank 0's publish the same way.
"""
from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import time

import pytest
import torch

from actors.weights.group_publisher import CollectivePublisher
from actors.weights.group import WeightsGroupError

BUCKET = 1 << 20
TIMEOUT_S = 4.0


def version_state(seed: int, nbytes: int) -> list[tuple[str, torch.Tensor]]:
    """Float32 tensors of mixed sizes (some a bucket or larger) totalling at least `nbytes`."""
    g = torch.Generator().manual_seed(seed)
    out, total, i = [], 0, 0
    sizes = [300_000, 70_000, 262_144, 5, 90_000, 400_000, 17]  # elements: 1.2 MB down to 68 bytes
    while total < nbytes:
        n = sizes[i % len(sizes)]
        out.append((f"layers.{i}.weight", torch.randn(n, generator=g)))
        total += 4 * n
        i += 1
    return out


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def receiver(endpoint: str, name: str, rank: int, world: int, behaviour: str, out) -> None:
    """Join as `rank`; for each version stream it, hashing each tensor. `behaviour`: ok, die (exit after the
    first bucket's tensors) or stall (sleep there)."""
    from actors.weights.group_buckets import VersionStream
    from actors.weights.group_subscriber import CollectiveSubscriber
    from actors.weights.group import Group

    try:
        sub = CollectiveSubscriber(endpoint, name, timeout_s=60)
        group = Group(sub.host, sub.port, rank, world, torch.device("cpu"), timeout_s=60)
        group.timeout_s = TIMEOUT_S
        while True:
            item = sub.next(lambda: False)
            seq, _, ann, _ = item
            stream = VersionStream(group, ann, torch.float32)
            hashes, outside = {}, []
            started = time.monotonic()
            try:
                for k, (tname, t) in enumerate(stream):
                    slots = [stream.buffers.slot(i) for i in range(2)]
                    if not any(s.data_ptr() <= t.data_ptr() and t.data_ptr() + t.nbytes <= s.data_ptr() + s.nbytes
                               for s in slots):
                        outside.append(tname)
                    hashes[tname] = digest(t)
                    if k == 2 and behaviour == "die":
                        os._exit(3)
                    if k == 2 and behaviour == "stall":
                        time.sleep(60)
            except WeightsGroupError as exc:
                out.put((name, "error", str(exc), time.monotonic() - started))
                return
            finally:
                stream.drain() if not group.failed else None
            out.put((name, ann.version, hashes, outside, stream.buffers.peak, stream.buffers.allocations,
                     stream.buffers.capacity))
            sub.ack(seq, True)
    except BaseException as exc:
        out.put((name, "crash", repr(exc), 0.0))


def start(behaviours: list[str]):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    names = [f"replica-{i}" for i in range(len(behaviours))]
    pub = CollectivePublisher("127.0.0.1", 0, names, 1, torch.device("cpu"), "float32", timeout_s=TIMEOUT_S,
                              bucket_bytes=BUCKET)
    procs = [ctx.Process(target=receiver, args=(pub.endpoint, n, 1 + i, 1 + len(names), b, out), daemon=True)
             for i, (n, b) in enumerate(zip(names, behaviours))]
    for p in procs:
        p.start()
    pub.wait_for_peers(len(names), timeout_s=60)
    return pub, procs, out


def stop(pub, procs) -> None:
    pub.close()
    for p in procs:
        p.join(3)
        if p.is_alive():
            p.kill()


def test_a_version_four_times_the_bucket_arrives_bit_exact_through_two_buffers():
    pub, procs, out = start(["ok"])
    try:
        for version in (1, 2):
            sent = version_state(version, 4 * BUCKET)
            nbytes = pub.publish(version, sent)
            assert nbytes >= 4 * BUCKET
            name, got_version, hashes, outside, peak, allocations, capacity = out.get(timeout=60)
            assert got_version == version
            assert hashes == {n: digest(t) for n, t in sent}  # every tensor, bit-exact
            assert outside == []  # each one handed over inside a receive buffer: no copy was made
            largest = max(t.nbytes for _, t in sent)
            assert capacity == max(BUCKET, largest) <= 2 * BUCKET
            assert allocations == 2 and peak == 2 * capacity  # two buffers, whatever the number of buckets
            assert len(plan_of(pub, sent)) > 4
            assert pub.wait_acks(version, timeout_s=30) == {"replica-0": (True, "")}
        assert pub.peak_buffer_bytes <= 2 * max(BUCKET, largest)  # rank 0's send side holds two as well
    finally:
        stop(pub, procs)


def plan_of(pub, sent):
    from actors.weights.group_buckets import plan

    return plan([(n, tuple(t.shape)) for n, t in sent], torch.float32, pub.bucket_bytes)


def test_a_replica_that_dies_mid_version_fails_it_by_name_within_the_timeout_everywhere():
    pub, procs, out = start(["die", "ok"])
    try:
        sent = version_state(5, 6 * BUCKET)
        t0 = time.monotonic()
        with pytest.raises(WeightsGroupError, match=r"weights version 5: bucket \d+ of \d+") as err:
            pub.publish(5, sent)
        assert time.monotonic() - t0 < TIMEOUT_S + 3, "rank 0 waited past the timeout"
        assert "weights group rank 0" in str(err.value)
        name, status, message, waited = out.get(timeout=TIMEOUT_S + 10)  # the replica that stayed
        assert (name, status) == ("replica-1", "error"), (name, status, message)
        assert "weights version 5: bucket" in message and waited < TIMEOUT_S + 3
        assert procs[0].join(5) is None and procs[0].exitcode == 3
        with pytest.raises(WeightsGroupError, match="failed before"):
            pub.publish(6, sent)
    finally:
        stop(pub, procs)


def test_a_replica_that_stalls_mid_version_fails_rank_0_within_the_timeout():
    pub, procs, out = start(["stall"])
    try:
        sent = version_state(7, 24 * BUCKET)  # more than the sockets' buffers can take without the receiver
        t0 = time.monotonic()
        with pytest.raises(WeightsGroupError, match=r"weights version 7: bucket \d+ of \d+: not completed"):
            pub.publish(7, sent)
        assert TIMEOUT_S - 0.5 < time.monotonic() - t0 < TIMEOUT_S + 3
    finally:
        for p in procs:
            p.kill()
        stop(pub, procs)
