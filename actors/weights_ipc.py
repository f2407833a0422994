"""CUDA IPC for the weights group (actors.weights_collective) when every worker sees learner rank 0's GPU.

Written against torch's own `reduce_tensor` / `rebuild_cuda_tensor` (torch/multiprocessing/reductions.py), the
same pair vLLM's IPC weight transfer uses. Runs only on CUDA; `launch.gpu_check` step `collective_update` is its
check.

What must hold:
- Rank 0 owns one staging buffer (grown when a bucket needs more, then kept), so its IPC handle stays valid for
  as long as any worker may open it; a bucket is reused only after the all-reduce that says every worker copied
  it out.
- A handle travels as plain values (sizes, ints, bytes) in msgpack, never as a pickle: the rebuild function and
  the tensor and storage classes are fixed on the receiving side. The receiving worker opens the handle on its
  own index of the GPU with rank 0's UUID (CUDA_VISIBLE_DEVICES differs between processes), copies each tensor
  to its own device, and drops the mapping before the all-reduce.
"""
from __future__ import annotations

import msgpack
import torch

from actors.weights_collective import Announcement, Group, dtype_name, tensor_bytes, to_wire, torch_dtype
from core.trajectory import WireError

ALIGN = 256  # CUDA allocations and vector loads like 256-byte alignment
BUCKET_BYTES = 1 << 30


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def plan(tensors: list[tuple[str, tuple[int, ...]]], dtype: torch.dtype, bucket_bytes: int = BUCKET_BYTES
         ) -> list[list[int]]:
    """Byte offsets of the tensors, in order, bucket by bucket (a tensor larger than a bucket fills one alone)."""
    buckets: list[list[int]] = [[]]
    used = 0
    for _, shape in tensors:
        n = _aligned(tensor_bytes(shape, dtype))
        if buckets[-1] and used + n > bucket_bytes:
            buckets.append([])
            used = 0
        buckets[-1].append(used)
        used += n
    return buckets if buckets[-1] else buckets[:-1]


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
        it = iter(tensors)
        k = 0
        for b, offsets in enumerate(ann.buckets):
            last = offsets[-1] + _aligned(tensor_bytes(ann.tensors[k + len(offsets) - 1][1], wire))
            self._reserve(last)
            for off in offsets:
                name, shape = ann.tensors[k]
                t = next(it)
                if tuple(t.shape) != shape:
                    raise ValueError(f"{name}: shape {tuple(t.shape)}, announced {shape}")
                n = tensor_bytes(shape, wire)
                self.staging[off:off + n].view(wire).view(shape).copy_(to_wire(t, wire, self.device))
                k += 1
            torch.cuda.synchronize(self.device)
            group.store.set(f"ipc/{ann.seq}/{b}", self.handle)
            group.barrier()  # every worker has copied this bucket out

    def _reserve(self, nbytes: int) -> None:
        if self.staging is None or self.staging.numel() < nbytes:
            self.staging = None
            self.staging = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
            self.handle = encode_handle(self.staging)


class Importer:
    """A worker's side: opens each bucket's handle, copies its tensors to this worker's device."""

    def __init__(self, source_index: int):
        self.source_index = source_index

    def receive(self, group: Group, ann: Announcement) -> list[tuple[str, torch.Tensor]]:
        wire = torch_dtype(ann.dtype)
        out, k = [], 0
        for b, offsets in enumerate(ann.buckets):
            raw = group.wait_key(f"ipc/{ann.seq}/{b}")
            src = open_handle(raw, self.source_index)
            for off in offsets:
                name, shape = ann.tensors[k]
                n = tensor_bytes(shape, wire)
                if off + n > src.numel():
                    raise WireError("buckets", f"{name} lies outside the shared buffer")
                out.append((name, src[off:off + n].view(wire).view(shape).to(group.device, copy=True)))
                k += 1
            torch.cuda.synchronize(group.device)
            del src  # the mapping is released before rank 0 may refill the buffer
            group.barrier()
        return out
