"""CUDA IPC for the weights group (actors.weights.group) when every worker sees learner rank 0's GPU.

Written against torch's own `reduce_tensor` / `rebuild_cuda_tensor` (torch/multiprocessing/reductions.py), the
same pair vLLM's IPC weight transfer uses. Runs only on CUDA; `launch.gpu_check` step `collective_update` is its
check.

What must hold:
- Rank 0 owns one staging buffer of one bucket (actors.weights.group_buckets: transport.weights_bucket_mb, grown
  only for a tensor larger than that, then kept), so its IPC handle stays valid for as long as any worker may
  open it; it is refilled only after the all-reduce that says every worker has loaded the bucket from it.
  Workers allocate nothing for a bucket: their loader reads it in place (actors.weights.group_buckets.VersionStream).
- A handle travels as plain values (sizes, ints, bytes) in msgpack, never as a pickle: the rebuild function and
  the tensor and storage classes are fixed on the receiving side. The receiving worker opens the handle on its
  own index of the GPU with rank 0's UUID (CUDA_VISIBLE_DEVICES differs between processes) once per handle and
  keeps that mapping while rank 0 keeps announcing the same handle (torch pairs one export with one rebuild and
  release; opening it per bucket would unbalance that count).
- Rank 0's copies into a bucket are complete on the host (a synchronize) before its handle is announced, and
  every wait has the version's deadline (WeightsGroupError past it, actors.weights.group).
"""
from __future__ import annotations

import time

import msgpack
import torch

from actors.weights.group_buckets import bucket_sizes, nbytes
from actors.weights.group import Announcement, Group, dtype_name, torch_dtype
from core.trajectory import WireError


def encode_handle(t: torch.Tensor) -> bytes:
    from torch.multiprocessing.reductions import reduce_tensor

    _, args = reduce_tensor(t)
    (_, size, stride, offset, _, dtype, device, handle, storage_bytes, storage_offset, _, ref_handle, ref_offset,
     event_handle, event_sync) = args
    return msgpack.packb([list(size), list(stride), offset, dtype_name(dtype), device, handle, storage_bytes,
                          storage_offset, ref_handle, ref_offset, event_handle, bool(event_sync)])


def open_handle(raw: bytes, device_index: int) -> torch.Tensor:
    """A tensor mapping rank 0's buffer, opened on this process's `device_index` (rank 0's GPU, seen here)."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    try:
        (size, stride, offset, dtype, _, handle, storage_bytes, storage_offset, ref_handle, ref_offset, event_handle,
         event_sync) = msgpack.unpackb(raw)
    except Exception as exc:
        raise WireError("ipc_handle", f"not a handle ({type(exc).__name__})") from None
    if dtype != "uint8" or not isinstance(handle, bytes) or not isinstance(ref_handle, bytes):
        raise WireError("ipc_handle", "expected a uint8 buffer with byte handles")
    return rebuild_cuda_tensor(torch.Tensor, torch.Size(size), tuple(stride), offset, torch.storage.TypedStorage,
                               torch.uint8, device_index, handle, storage_bytes, storage_offset, False, ref_handle,
                               ref_offset, event_handle, event_sync)


class Exporter:
    """Rank 0's side: fills the staging buffer bucket by bucket and announces its handle."""

    def __init__(self, device: torch.device):
        self.device = device
        self.staging: torch.Tensor | None = None
        self.handle = b""

    def send(self, group: Group, ann: Announcement, tensors) -> None:
        wire = torch_dtype(ann.dtype)
        sizes = bucket_sizes(ann)
        deadline = time.monotonic() + group.timeout_s
        it = iter(tensors)
        k = 0
        try:
            self._reserve(max(sizes, default=0))  # one buffer, one handle for the whole version
            for b, offsets in enumerate(ann.buckets):
                for off in offsets:
                    name, shape = ann.tensors[k]
                    t = next(it, None)
                    if t is None or tuple(t.shape) != tuple(shape):
                        raise ValueError(f"{name}: shape {None if t is None else tuple(t.shape)}, announced {shape}")
                    self.staging[off:off + nbytes(shape, wire)].view(wire).view(shape).copy_(t.detach())
                    k += 1
                torch.cuda.synchronize(self.device)
                group.store.set(f"ipc/{ann.seq}/{b}", self.handle)
                group.barrier(deadline, f"weights version {ann.version}: IPC bucket {b + 1} of {len(sizes)}")
        except BaseException:
            for _ in it:  # the other learner ranks gather alongside rank 0 (ZeRO-3)
                pass
            raise

    def _reserve(self, nbytes: int) -> None:
        if self.staging is None or self.staging.numel() < nbytes:
            self.staging = None
            self.staging = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
            self.handle = encode_handle(self.staging)


class Importer:
    """A worker's side: maps rank 0's staging buffer (once per handle) and hands out each bucket of it."""

    def __init__(self, source_index: int):
        self.source_index = source_index
        self._raw, self._mapped = b"", None

    def bucket(self, raw: bytes, size: int) -> torch.Tensor:
        """The first `size` bytes of the buffer `raw` names, read in place."""
        if raw != self._raw:
            self._mapped = None  # the previous mapping is released before the new one is opened
            self._mapped, self._raw = open_handle(raw, self.source_index), raw
        if size > self._mapped.numel():
            raise WireError("buckets", f"a bucket of {size} bytes lies outside the shared buffer "
                            f"({self._mapped.numel()} bytes)")
        return self._mapped[:size]
