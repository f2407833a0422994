"""A weight version through the weights group (actors.weights.group) in bounded buckets.

A version is cut into consecutive buckets of at most `bucket_bytes` (transport.weights_bucket_mb): the tensors in
the announced order, in the wire dtype, at 256-byte aligned offsets; a tensor larger than a bucket fills one
alone. Rank 0 packs a bucket into one of two send buffers and broadcasts it; each receiver broadcasts into one
of two receive buffers and hands the bucket's tensors, as views, to its loader while the next bucket arrives in
the other buffer (vLLM 0.33 streams its own NCCL weight transfer the same way, through two packed buffers).

What must hold:
- No member holds a whole version: at most two bucket buffers each (`BucketBuffers` counts every byte it
  allocates, so a test can check the peak), plus, on a receiver whose loader keeps tensors, that loader's own
  copies (vLLM's reload keeps a layer's tensors until the layer is complete).
- The plan is a pure function of (names and shapes, wire dtype, bucket_bytes): a receiver recomputes it from the
  announcement and refuses one whose offsets differ (actors.weights.group.Announcement.unpack).
- A bucket counts as moved only when its Work reports completion on the host (`Group.finish`; under NCCL the
  collective's end event on the GPU) within the version's deadline, `timeout_s` after the version started.
  Past it, or on any error, the group is aborted and WeightsGroupError names the version and the bucket, so
  `send_version` never returns before the bytes moved, and no member waits on NCCL's own timeout.
- A tensor a `VersionStream` yields is a view of a receive buffer (or of rank 0's staging bucket under CUDA IPC),
  valid until the loader takes the first tensor of the next bucket: the buffer is refilled then. `copies=True`
  yields copies, for a loader that keeps what it is given.
- Every bucket of an announced version is taken part in, whatever the loader does (`drain`): a member that left
  the sequence would hold every other member until the deadline. Rank 0 likewise runs its tensor iterator to the
  end after a failure, since under ZeRO-3 the other learner ranks gather alongside it.
"""
from __future__ import annotations

import math
import time
from typing import Iterable, Iterator

import torch

ALIGN = 256  # CUDA allocations and vector loads like 256-byte alignment


def aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def nbytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    return math.prod(shape) * dtype.itemsize


def plan(tensors: list[tuple[str, tuple[int, ...]]], dtype: torch.dtype, bucket_bytes: int) -> list[list[int]]:
    """Byte offsets of the tensors, in order, bucket by bucket (a tensor larger than a bucket fills one alone)."""
    buckets: list[list[int]] = [[]]
    used = 0
    for _, shape in tensors:
        n = aligned(nbytes(tuple(shape), dtype))
        if buckets[-1] and used + n > bucket_bytes:
            buckets.append([])
            used = 0
        buckets[-1].append(used)
        used += n
    return buckets if buckets[-1] else buckets[:-1]


def bucket_sizes(ann) -> list[int]:
    """Bytes of each bucket of an announcement: its last tensor's offset plus that tensor's size."""
    wire = getattr(torch, ann.dtype)
    sizes, k = [], 0
    for offsets in ann.buckets:
        k += len(offsets)
        sizes.append(offsets[-1] + nbytes(ann.tensors[k - 1][1], wire))
    return sizes


class BucketBuffers:
    """Two (`slots`) byte buffers of `capacity` each, allocated on first use and counted: `allocated` bytes live
    now, `peak` the most at once, `allocations` how many were made."""

    def __init__(self, device: torch.device, capacity: int, slots: int = 2):
        self.device, self.capacity = device, capacity
        self._slots: list[torch.Tensor | None] = [None] * slots
        self.allocated = self.peak = self.allocations = 0

    def slot(self, i: int) -> torch.Tensor:
        i %= len(self._slots)
        if self._slots[i] is None:
            self._slots[i] = torch.empty(self.capacity, dtype=torch.uint8, device=self.device)
            self.allocated += self.capacity
            self.allocations += 1
            self.peak = max(self.peak, self.allocated)
        return self._slots[i]

    def release(self) -> None:
        self._slots = [None] * len(self._slots)
        self.allocated = 0


def send_version(group, ann, tensors: Iterable[torch.Tensor], device: torch.device,
                 buffers: BucketBuffers | None = None) -> BucketBuffers:
    """Rank 0's side of a broadcast-mode version: packs the tensors (in announced order and shapes) bucket by
    bucket into two send buffers on `device` and broadcasts each; returns once every bucket has completed
    (WeightsGroupError past the deadline). Returns the buffers, whose counts say what was allocated."""
    wire = getattr(torch, ann.dtype)
    sizes = bucket_sizes(ann)
    buffers = buffers or BucketBuffers(device, max(sizes, default=0))
    deadline = time.monotonic() + group.timeout_s
    it = iter(tensors)
    works: dict[int, object] = {}
    k = 0
    what = f"weights version {ann.version}: bucket %d of {len(sizes)}"
    try:
        for b, offsets in enumerate(ann.buckets):
            if b - 2 in works:  # this slot's previous bucket must have left before it is refilled
                group.finish(works.pop(b - 2), deadline, what % (b - 1))
            slot = buffers.slot(b)
            for off in offsets:
                name, shape = ann.tensors[k]
                t = next(it, None)
                if t is None or tuple(t.shape) != tuple(shape):
                    raise ValueError(f"version {ann.version}: {name} announced with shape {shape}, got "
                                     f"{None if t is None else tuple(t.shape)}")
                slot[off:off + nbytes(shape, wire)].view(wire).view(shape).copy_(t.detach())
                k += 1
            works[b] = group.start_broadcast(slot[:sizes[b]])
        for b in sorted(works):
            group.finish(works.pop(b), deadline, what % (b + 1))
    except BaseException:
        for _ in it:  # the other learner ranks gather each tensor alongside rank 0 (ZeRO-3): let them finish
            pass
        raise
    finally:
        buffers.release()
    return buffers


class VersionStream:
    """A receiver's side of one announced version, as an iterator of (name, tensor) in the engine's dtype:
    each announced tensor, then at once its aliases (the same tensor). See the module's rules on views."""

    def __init__(self, group, ann, engine_dtype: torch.dtype, ipc=None, copies: bool = False,
                 extra_aliases: Iterable[tuple[str, str]] = ()):
        """`ipc`: an actors.weights.cuda_ipc.Importer when the announcement's mode is ipc. `extra_aliases`: more
        (name, source name) pairs to yield, for names the engine needs and the learner did not send."""
        if ann.mode == "ipc" and ipc is None:
            raise RuntimeError("an IPC version reached a member that cannot open IPC handles")
        self.group, self.ann, self.engine_dtype, self.ipc, self.copies = group, ann, engine_dtype, ipc, copies
        self.wire = getattr(torch, ann.dtype)
        self.sizes = bucket_sizes(ann)
        self.buffers = BucketBuffers(group.comm_device, max(self.sizes, default=0))
        self.deadline = time.monotonic() + group.timeout_s
        sent = {n for n, _ in ann.tensors}
        self.aliases: dict[str, list[str]] = {}
        for alias, src in list(ann.aliases) + [tuple(a) for a in extra_aliases]:
            if src in sent and alias not in sent and alias not in sum(self.aliases.values(), []):
                self.aliases.setdefault(src, []).append(alias)
        self.count = 0  # tensors yielded (aliases included)
        self._buckets = self._ipc_buckets() if ann.mode == "ipc" else self._broadcast_buckets()

    def names(self) -> list[str]:
        """Every name this stream yields, known before any data."""
        return [m for n, _ in self.ann.tensors for m in [n] + self.aliases.get(n, [])]

    def _what(self, b: int) -> str:
        return f"weights version {self.ann.version}: bucket {b + 1} of {len(self.sizes)}"

    def _broadcast_buckets(self) -> Iterator[tuple[int, torch.Tensor]]:
        n = len(self.sizes)
        works = {0: self.group.start_broadcast(self.buffers.slot(0)[:self.sizes[0]])} if n else {}
        try:
            for b in range(n):
                if b + 1 < n:  # its slot held bucket b - 1, whose tensors the loader is done with
                    works[b + 1] = self.group.start_broadcast(self.buffers.slot(b + 1)[:self.sizes[b + 1]])
                self.group.finish(works.pop(b), self.deadline, self._what(b))
                yield b, self.buffers.slot(b)[:self.sizes[b]]
        finally:
            self.buffers.release()

    def _ipc_buckets(self) -> Iterator[tuple[int, torch.Tensor]]:
        for b in range(len(self.sizes)):
            raw = self.group.wait_key(f"ipc/{self.ann.seq}/{b}", deadline=self.deadline)
            yield b, self.ipc.bucket(raw, self.sizes[b])
            torch.cuda.synchronize(self.group.device)  # the loader's copies out of rank 0's bucket are done
            self.group.barrier(self.deadline, self._what(b))  # rank 0 may refill it now

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        k = 0
        for b, raw in self._buckets:
            for off in self.ann.buckets[b]:
                name, shape = self.ann.tensors[k]
                k += 1
                t = raw[off:off + nbytes(shape, self.wire)].view(self.wire).view(shape)
                if t.dtype != self.engine_dtype or t.device != self.group.device:
                    t = t.to(self.group.device, self.engine_dtype)
                elif self.copies:
                    t = t.clone()
                for out in [name] + self.aliases.get(name, []):
                    self.count += 1
                    yield out, t

    def drain(self) -> None:
        """Take part in every bucket not yet received, dropping the data."""
        for _ in self._buckets:
            pass
