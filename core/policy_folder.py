"""Writing a trained policy as a Hugging Face folder: the base model's config and tokenizer, new weights.

A checkpoint's `policy/` folder is what `launch.eval --model <checkpoint>` and a fresh generator load. The
weights come from the learner as `TensorBytes` (what the weights channel carries), written as one safetensors
file through a temporary name, so a crash never leaves half a folder behind a complete checkpoint marker.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Sequence

from core.weights_channel import TensorBytes

_WEIGHT_FILES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def _torch_tensor(t: TensorBytes):
    import torch

    dtype = getattr(torch, t.dtype)
    return torch.frombuffer(bytearray(t.data), dtype=dtype).reshape(t.shape) if len(t.data) else \
        torch.empty(t.shape, dtype=dtype)


def save_policy_folder(tensors: Sequence[TensorBytes], base_model_dir: str | Path, folder: str | Path) -> Path:
    """Write `tensors` as model.safetensors beside a copy of the base model's non-weight files."""
    from safetensors.torch import save_file

    base, out = Path(base_model_dir), Path(folder)
    if not tensors:
        raise ValueError("save_policy_folder: no tensors to write")
    out.mkdir(parents=True, exist_ok=True)
    for path in base.iterdir():
        if path.is_file() and not path.name.endswith(_WEIGHT_FILES) and not path.name.endswith(".index.json") \
                and not path.name.startswith("."):
            shutil.copy2(path, out / path.name)
    tmp = out / "model.safetensors.tmp"
    save_file({t.name: _torch_tensor(t) for t in tensors}, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, out / "model.safetensors")
    (out / "agentgym_policy.json").write_text(json.dumps({"base_model": str(base), "tensors": len(tensors)}))
    return out
